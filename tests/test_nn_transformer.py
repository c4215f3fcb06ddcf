"""The encoder and encoder-decoder layers (notes 8.7): float64 gradchecks, reference formulas,
the weights' (target x source) shape, padding masks, cached decoding, sinusoidal positions, the
Numba path against the numpy reference on cross-attention shapes, and errors naming the layer."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import autograd
import autograd.functional as F
import nn
from autograd import Tensor, kernels
from tests.test_nn_layers import gradcheck_module, layer_norm_ref, rand, randomize


@pytest.fixture
def f64():
    autograd.set_default_dtype(np.float64)


def softmax_rows(s):
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def heads(a, n_head):
    B, T, C = a.shape
    return a.reshape(B, T, n_head, C // n_head).transpose(0, 2, 1, 3)


def reference_attention(q, k, v, key_mask, layer):
    """softmax(q k^T / sqrt(D)) v over the allowed keys, heads merged, then W_O (notes 7.4, 8.1)."""
    H = layer.n_head
    q, k, v = heads(q, H), heads(k, H), heads(v, H)
    s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(q.shape[-1])
    if key_mask is not None:
        s = np.where(key_mask[:, None, None, :], s, -np.inf)
    z = softmax_rows(s) @ v
    B, _, T, D = z.shape
    z = z.transpose(0, 2, 1, 3).reshape(B, T, H * D)
    return z @ layer.c_proj.weight.data + layer.c_proj.bias.data


def project(x, linear):
    return x @ linear.weight.data + linear.bias.data


MASK = np.array([[True] * 5, [True, True, True, False, False]])  # batch row 1: 2 padding keys


# --- bidirectional self-attention -------------------------------------------------------------


@pytest.mark.parametrize("key_mask", [None, MASK])
def test_self_attention_reads_both_ways_and_gradchecks(f64, key_mask):
    attn = randomize(nn.SelfAttention(8, 2), scale=0.3)
    x = rand(2, 5, 8)
    q, k, v = np.split(project(x.data, attn.c_attn), 3, axis=-1)
    expected = reference_attention(q, k, v, key_mask, attn)
    np.testing.assert_allclose(attn(x, key_mask).data, expected, atol=1e-12)
    # The first position sees the last one (no causal mask); a padded key is seen by no one.
    changed = x.data.copy()
    changed[:, 4] += 1.0
    out, out_changed = attn(x, key_mask).data, attn(Tensor(changed), key_mask).data
    assert not np.allclose(out[0, 0], out_changed[0, 0])
    if key_mask is not None:
        np.testing.assert_allclose(out[1, :4], out_changed[1, :4], atol=1e-12)
    gradcheck_module(randomize(nn.SelfAttention(4, 2), scale=0.4), rand(2, 5, 4), key_mask=key_mask)


# --- cross-attention ----------------------------------------------------------------------------


@pytest.mark.parametrize("tq", [1, 3, 9])  # fewer, as many... more target than source positions
def test_cross_attention_weights_are_target_by_source(f64, tq):
    attn = randomize(nn.CrossAttention(8, 2), scale=0.3)
    x, memory = rand(2, tq, 8, seed=1), rand(2, 5, 8, seed=2)
    weights = attn.attention_weights(x, memory, MASK)
    assert weights.shape == (2, 2, tq, 5)  # (B, H, target length, source length), notes 8.7
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-12)
    assert (weights[1, :, :, 3:] == 0).all()  # padding gets no weight
    # Q from the decoder stream, K/V from the encoder output: not one X projected three times.
    k, v = np.split(project(memory.data, attn.c_kv), 2, axis=-1)
    z = (weights @ heads(v, 2)).transpose(0, 2, 1, 3).reshape(2, tq, 8)
    expected = z @ attn.c_proj.weight.data + attn.c_proj.bias.data
    np.testing.assert_allclose(attn(x, memory, MASK).data, expected, atol=1e-12)
    np.testing.assert_allclose(
        attn(x, memory, MASK).data,
        reference_attention(project(x.data, attn.c_q), k, v, MASK, attn),
        atol=1e-12,
    )


@pytest.mark.parametrize("tq, key_mask", [(3, MASK), (7, None), (1, MASK)])
def test_cross_attention_gradcheck(f64, tq, key_mask):
    attn = randomize(nn.CrossAttention(4, 2), scale=0.4)
    gradcheck_module(attn, rand(2, tq, 4, seed=1), rand(2, 5, 4, seed=2), key_mask=key_mask)


def test_cross_attention_memory_kv_once_equals_memory(f64):
    attn = randomize(nn.CrossAttention(8, 2), scale=0.3)
    x, memory = rand(2, 4, 8, seed=1, requires_grad=False), rand(2, 5, 8, seed=2)
    kv = attn.memory_kv(memory)
    assert kv[0].shape == kv[1].shape == (2, 2, 5, 4)
    full = attn(x, memory, MASK).data
    np.testing.assert_array_equal(attn(x, key_mask=MASK, memory_kv=kv).data, full)


@pytest.mark.parametrize("tq", [1, 2, 63, 65, 130])
@given(tk=st.integers(1, 70), padded=st.booleans(), seed=st.integers(0, 2**32 - 1))
@settings(deadline=None, max_examples=6)
def test_cross_attention_numba_path_matches_numpy_reference(tq, tk, padded, seed):
    # Cross-attention shapes through both backends: Tq > Tk without causality, Tq = 1 (a decoding
    # step), lengths off the 64-row query blocks, with and without a source padding mask.
    autograd.set_default_dtype(np.float64)
    rng = np.random.default_rng(seed)
    attn = randomize(nn.CrossAttention(8, 2), seed=seed % 1000, scale=0.5)
    x, memory = rng.standard_normal((2, tq, 8)), rng.standard_normal((2, tk, 8))
    key_mask = np.arange(tk)[None, :] < np.array([[tk], [rng.integers(1, tk + 1)]])
    results = []
    for backend in kernels.BACKENDS:
        kernels.set_backend(backend)
        xt, mt = Tensor(x, requires_grad=True), Tensor(memory, requires_grad=True)
        attn.zero_grad()
        out = attn(xt, mt, key_mask if padded else None)
        (out * Tensor(np.cos(out.data))).sum().backward()
        results.append([out.data, xt.grad, mt.grad, attn.c_q.weight.grad, attn.c_kv.weight.grad])
    for got, want in zip(*results, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-11)


# --- the blocks (notes 8.5, 8.7) ----------------------------------------------------------------


@pytest.mark.parametrize("pre_ln", [True, False])
def test_encoder_block_formula_and_gradcheck(f64, pre_ln):
    block = randomize(nn.EncoderBlock(8, 2, pre_ln=pre_ln), scale=0.3)
    x = rand(2, 5, 8, requires_grad=False)

    def attn(h):
        return block.attn(Tensor(h), MASK).data

    def mlp(h):
        return block.mlp(Tensor(h)).data

    if pre_ln:
        t = x.data + attn(layer_norm_ref(x.data, block.ln_1))
        expected = t + mlp(layer_norm_ref(t, block.ln_2))
    else:
        t = layer_norm_ref(x.data + attn(x.data), block.ln_1)
        expected = layer_norm_ref(t + mlp(t), block.ln_2)
    np.testing.assert_allclose(block(x, MASK).data, expected, atol=1e-12)
    small = randomize(nn.EncoderBlock(4, 2, pre_ln=pre_ln), scale=0.4)
    gradcheck_module(small, rand(2, 5, 4), key_mask=MASK)


@pytest.mark.parametrize("pre_ln", [True, False])
def test_decoder_block_formula_and_gradcheck(f64, pre_ln):
    block = randomize(nn.DecoderBlock(8, 2, pre_ln=pre_ln, max_len=8), scale=0.3)
    x, memory = rand(2, 3, 8, requires_grad=False), rand(2, 5, 8, seed=2, requires_grad=False)

    def attn(h):
        return block.attn(Tensor(h)).data

    def cross(h):
        return block.cross_attn(Tensor(h), memory, MASK).data

    def mlp(h):
        return block.mlp(Tensor(h)).data

    ln = [lambda h, m=m: layer_norm_ref(h, m) for m in (block.ln_1, block.ln_2, block.ln_3)]
    if pre_ln:
        t = x.data + attn(ln[0](x.data))
        u = t + cross(ln[1](t))
        expected = u + mlp(ln[2](u))
    else:
        t = ln[0](x.data + attn(x.data))
        u = ln[1](t + cross(t))
        expected = ln[2](u + mlp(u))
    np.testing.assert_allclose(block(x, memory, MASK).data, expected, atol=1e-12)
    small = randomize(nn.DecoderBlock(4, 2, pre_ln=pre_ln, max_len=8), scale=0.4)
    gradcheck_module(small, rand(2, 3, 4), rand(2, 5, 4, seed=2), key_mask=MASK)


@pytest.mark.parametrize("pre_ln", [True, False])
def test_decoder_block_cached_steps_equal_full_target(f64, pre_ln):
    block = randomize(nn.DecoderBlock(8, 2, pre_ln=pre_ln, max_len=8), scale=0.3)
    x, memory = rand(2, 6, 8, requires_grad=False), rand(2, 5, 8, seed=2, requires_grad=False)
    with autograd.no_grad():
        full = block(x, memory, MASK).data
        kv, cache = block.cross_attn.memory_kv(memory), nn.LayerKVCache(2, 2, 8, 4, np.float64)
        steps = [
            block(Tensor(x.data[:, i : i + 1]), None, MASK, kv_cache=cache, memory_kv=kv).data
            for i in range(6)
        ]
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, rtol=0, atol=1e-12)


def test_encoder_blocks_without_positions_are_permutation_equivariant(f64):
    # notes 8.6: no positions and no causal mask -> permuting the positions permutes the output.
    blocks = [randomize(nn.EncoderBlock(8, 2), seed=i, scale=0.3) for i in range(2)]
    x = rand(2, 5, 8, requires_grad=False).data
    perm = np.random.default_rng(3).permutation(5)

    def run(h, key_mask):
        h = Tensor(h)
        for block in blocks:
            h = block(h, key_mask)
        return h.data

    np.testing.assert_allclose(run(x[:, perm], MASK[:, perm]), run(x, MASK)[:, perm], atol=1e-12)


# --- sinusoidal positions (the 2017 paper) --------------------------------------------------------


def test_sinusoidal_table_formula_and_fixed_rotation(f64):
    table = nn.sinusoidal_table(50, 8)
    p, i = 7, 2
    w = 10000.0 ** (-2 * i / 8)
    assert table[p, 2 * i] == pytest.approx(math.sin(p * w))
    assert table[p, 2 * i + 1] == pytest.approx(math.cos(p * w))
    # PE[p + k] is the same rotation of PE[p] for every p: pair (sin, cos) turns by k * w.
    k = 5
    c, s = math.cos(k * w), math.sin(k * w)
    for p in (0, 13, 40):
        sin_p, cos_p = table[p, 2 * i], table[p, 2 * i + 1]
        assert table[p + k, 2 * i] == pytest.approx(sin_p * c + cos_p * s)
        assert table[p + k, 2 * i + 1] == pytest.approx(cos_p * c - sin_p * s)
    with pytest.raises(ValueError, match="n_embd must be even"):
        nn.sinusoidal_table(4, 5)


def test_sinusoidal_positions_module_and_gradcheck(f64):
    pos = nn.SinusoidalPositions(16, 4)
    assert list(pos.parameters()) == [] and pos.state_dict() == {}
    np.testing.assert_array_equal(pos(np.arange(3, 6)).data, nn.sinusoidal_table(16, 4)[3:6])
    # e_i + p_i (notes 8.6): the gradient reaches the token embedding, the table stays fixed.
    wte, ids = randomize(nn.Embedding(5, 4)), np.array([[0, 4, 2]])
    autograd.gradcheck(lambda w: F.embedding(w, ids) + pos(np.arange(3)), [wte.weight])
    with pytest.raises(
        ValueError, match="SinusoidalPositions: positions up to 16 exceed max_len 16"
    ):
        pos(np.arange(17))
    assert isinstance(nn.position_embedding("learned", 8, 4), nn.Embedding)
    assert isinstance(nn.position_embedding("sinusoidal", 8, 4), nn.SinusoidalPositions)
    assert nn.position_embedding("none", 8, 4) is None
    with pytest.raises(ValueError, match="kind must be one of"):
        nn.position_embedding("rotary", 8, 4)


# --- bad input: the error names the layer and the shapes ------------------------------------------


def test_errors_name_the_layer_and_shapes(f64):
    cross = nn.CrossAttention(8, 2)
    x, memory = rand(2, 3, 8), rand(2, 5, 8)
    with pytest.raises(
        ValueError, match=r"CrossAttention: memory must be \(B, T, n_embd=8\), got \("
    ):
        cross(x, rand(2, 5, 6))
    with pytest.raises(ValueError, match=r"CrossAttention: x must be \(B, T, n_embd=8\), got"):
        cross(rand(2, 3, 4), memory)
    batch = r"CrossAttention: x \(3, 3, 8\) and the memory's keys \(2, 2, 5, 4\) must have the same"
    with pytest.raises(ValueError, match=batch):
        cross(rand(3, 3, 8), memory)
    shape = r"CrossAttention: key_mask must be a boolean \(B, Tk\) = \(2, 5\) .* shape \(2, 3\)"
    with pytest.raises(ValueError, match=shape):
        cross(x, memory, MASK[:, :3])
    with pytest.raises(ValueError, match=r"key_mask must be a boolean .* got dtype int64"):
        cross(x, memory, MASK.astype(np.int64))
    with pytest.raises(ValueError, match="CrossAttention: key_mask row 1 allows no key"):
        cross(x, memory, np.array([[True] * 5, [False] * 5]))
    with pytest.raises(ValueError, match="exactly one of memory and memory_kv"):
        cross(x)
    with pytest.raises(ValueError, match=r"SelfAttention: key_mask must be .* \(2, 5\)"):
        nn.SelfAttention(8, 2)(memory, MASK.T)
    with pytest.raises(ValueError, match=r"SelfAttention: x must be \(B, T, n_embd=8\)"):
        nn.SelfAttention(8, 2)(rand(5, 8))
    for layer in (nn.SelfAttention, nn.CrossAttention):
        with pytest.raises(
            ValueError, match=f"{layer.__name__}: n_embd 8 .* divisible by n_head 3"
        ):
            layer(8, 3)
    with pytest.raises(ValueError, match=r"CrossAttention: memory must be \(B, T, n_embd=8\)"):
        nn.DecoderBlock(8, 2)(x, rand(2, 5, 4))


def test_rotary_decoder_block_rotates_its_self_attention_only():
    block = nn.DecoderBlock(8, 2, rotary=True, max_len=8)
    assert block.attn.rotary is not None and block.cross_attn.rotary is None
