"""Layers and Transformer pieces: float64 gradchecks through every module, reference formulas,
GPT-2 initialisation, KV cache == full attention, rotary relative positions, Pre-/Post-LN."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import autograd
import autograd.functional as F
import nn
from autograd import Tensor


@pytest.fixture
def f64():
    autograd.set_default_dtype(np.float64)


def randomize(module, seed=0, scale=0.5):
    """Non-trivial values everywhere (ones/zeros init would hide bugs in the weight/bias paths)."""
    rng = np.random.default_rng(seed)
    with autograd.no_grad():
        for p in module.parameters():
            p.data = rng.normal(0.0, scale, size=p.shape)
    return module


def gradcheck_module(module, *inputs, **kwargs):
    """Central differences on the module's inputs (those requiring grad) and all its parameters."""
    params = list(module.parameters())
    n = len(inputs)
    autograd.gradcheck(lambda *ts: module(*ts[:n], **kwargs), [*inputs, *params])


def rand(*shape, seed=1, requires_grad=True):
    return Tensor(np.random.default_rng(seed).normal(size=shape), requires_grad=requires_grad)


def reference_attention(x, attn):
    """Multi-head causal attention written out with numpy (notes 7.4, 8.1), row vectors."""
    B, T, C = x.shape
    H, D = attn.n_head, attn.head_dim
    qkv = x @ attn.c_attn.weight.data + attn.c_attn.bias.data
    q, k, v = (
        qkv[..., i * C : (i + 1) * C].reshape(B, T, H, D).transpose(0, 2, 1, 3) for i in (0, 1, 2)
    )
    s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(D)
    s = np.where(np.tril(np.ones((T, T), bool)), s, -np.inf)
    a = np.exp(s - s.max(-1, keepdims=True))
    a /= a.sum(-1, keepdims=True)
    z = (a @ v).transpose(0, 2, 1, 3).reshape(B, T, C)
    return z @ attn.c_proj.weight.data + attn.c_proj.bias.data


def layer_norm_ref(x, ln):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)  # population variance (notes 8.4)
    return (x - mu) / np.sqrt(var + ln.eps) * ln.weight.data + ln.bias.data


# --- basic layers ---------------------------------------------------------------------------------


def test_linear_is_x_at_w_plus_b_with_w_in_out(f64):
    lin = randomize(nn.Linear(3, 5))
    assert lin.weight.shape == (3, 5) and lin.bias.shape == (5,)
    for shape in [(3,), (4, 3), (2, 4, 3)]:
        x = np.random.default_rng(0).normal(size=shape)
        np.testing.assert_allclose(lin(Tensor(x)).data, x @ lin.weight.data + lin.bias.data)
    with pytest.raises(ValueError, match=r"linear: x's last dimension 4 .* in_features 3"):
        lin(Tensor(np.ones((2, 4))))


@pytest.mark.parametrize("bias", [True, False])
def test_linear_gradcheck(f64, bias):
    gradcheck_module(randomize(nn.Linear(3, 4, bias=bias)), rand(2, 3, 3))


def test_embedding_gradcheck_and_lookup(f64):
    emb = randomize(nn.Embedding(5, 3))
    idx = np.array([[0, 4, 4], [2, 0, 1]])
    np.testing.assert_array_equal(emb(idx).data, emb.weight.data[idx])
    np.testing.assert_array_equal(emb(Tensor(idx)).data, emb.weight.data[idx])
    gradcheck_module(emb, Tensor(idx))


@pytest.mark.parametrize("bias", [True, False])
def test_layer_norm_matches_notes_and_gradchecks(f64, bias):
    ln = randomize(nn.LayerNorm(6, bias=bias))
    x = rand(2, 3, 6)
    if bias:
        np.testing.assert_allclose(ln(x).data, layer_norm_ref(x.data, ln), atol=1e-12)
    else:
        assert [n for n, _ in ln.named_parameters()] == ["weight"]
    gradcheck_module(ln, x)


def test_rms_norm_gradcheck(f64):
    rms = randomize(nn.RMSNorm(5))
    x = rand(3, 5)
    expected = x.data / np.sqrt((x.data**2).mean(-1, keepdims=True) + 1e-5) * rms.weight.data
    np.testing.assert_allclose(rms(x).data, expected, atol=1e-12)
    gradcheck_module(rms, x)


@pytest.mark.parametrize("approximate", ["tanh", "none"])
def test_gelu_gradcheck(f64, approximate):
    gelu = nn.GELU(approximate)
    x = rand(4, 3)
    autograd.gradcheck(gelu, [x])
    with pytest.raises(ValueError, match="GELU: approximate"):
        nn.GELU("fast")


def test_relu_gradcheck(f64):
    x = Tensor(np.array([[-1.5, 0.3], [2.0, -0.2]]), requires_grad=True)
    autograd.gradcheck(nn.ReLU(), [x])
    np.testing.assert_array_equal(nn.ReLU()(x).data, [[0, 0.3], [2.0, 0]])


def test_dropout_modes_and_gradcheck(f64):
    x = Tensor(np.ones((200, 50)), requires_grad=True)
    drop = nn.Dropout(0.3, rng=np.random.default_rng(0))
    y = drop(x).data
    assert set(np.unique(y)) == {0.0, 1 / 0.7}
    assert abs((y == 0).mean() - 0.3) < 0.02
    drop.eval()
    assert drop(x) is x
    # A fresh, identically seeded module per call keeps the mask fixed across the differences.
    small = rand(3, 4)
    autograd.gradcheck(lambda t: nn.Dropout(0.5, rng=np.random.default_rng(3))(t), [small])
    with pytest.raises(ValueError, match="Dropout: p must be in"):
        nn.Dropout(1.5)


def test_mlp_gradcheck_and_formula(f64):
    mlp = randomize(nn.MLP(4))
    assert mlp.c_fc.weight.shape == (4, 16) and mlp.c_proj.weight.shape == (16, 4)
    x = rand(2, 3, 4)
    h = F.gelu(Tensor(x.data @ mlp.c_fc.weight.data + mlp.c_fc.bias.data)).data
    np.testing.assert_allclose(
        mlp(x).data, h @ mlp.c_proj.weight.data + mlp.c_proj.bias.data, atol=1e-12
    )
    gradcheck_module(mlp, x)


# --- initialisation -------------------------------------------------------------------------------


def test_gpt2_init_and_seeding():
    block = nn.Block(64, 4, n_layer=8, rng=np.random.default_rng(0))
    assert all(p.dtype == np.float32 for p in block.parameters())
    assert abs(block.attn.c_attn.weight.data.std() - 0.02) < 0.001
    assert abs(block.mlp.c_fc.weight.data.std() - 0.02) < 0.001
    scaled = 0.02 / math.sqrt(16)
    assert abs(block.attn.c_proj.weight.data.std() - scaled) < 0.05 * scaled
    assert abs(block.mlp.c_proj.weight.data.std() - scaled) < 0.05 * scaled
    assert not block.attn.c_attn.bias.data.any() and (block.ln_1.weight.data == 1).all()
    emb = nn.Embedding(1000, 16)
    assert abs(emb.weight.data.std() - 0.02) < 0.001
    same = nn.Block(64, 4, n_layer=8, rng=np.random.default_rng(0)).state_dict()
    other = nn.Block(64, 4, n_layer=8, rng=np.random.default_rng(1)).state_dict()
    for name, value in block.state_dict().items():
        np.testing.assert_array_equal(value, same[name])
    assert not np.array_equal(block.attn.c_attn.weight.data, other["attn.c_attn.weight"])
    autograd.set_default_dtype(np.float64)
    assert all(p.dtype == np.float64 for p in nn.Block(8, 2).parameters())


# --- attention ------------------------------------------------------------------------------------


def test_attention_matches_reference_and_hf_layout(f64):
    attn = randomize(nn.CausalSelfAttention(8, 2), scale=0.3)
    assert attn.c_attn.weight.shape == (8, 24) and attn.c_proj.weight.shape == (8, 8)
    x = rand(2, 5, 8)
    np.testing.assert_allclose(attn(x).data, reference_attention(x.data, attn), atol=1e-12)
    with pytest.raises(ValueError, match=r"CausalSelfAttention: x must be \(B, T, n_embd=8\)"):
        attn(rand(2, 5, 6))
    with pytest.raises(ValueError, match="divisible by n_head"):
        nn.CausalSelfAttention(8, 3)


@pytest.mark.parametrize("rotary", [False, True])
def test_attention_gradcheck(f64, rotary):
    attn = randomize(nn.CausalSelfAttention(4, 2, rotary=rotary, max_len=8), scale=0.4)
    gradcheck_module(attn, rand(2, 3, 4))


@pytest.mark.parametrize("rotary", [False, True])
def test_attention_is_causal(f64, rotary):
    attn = randomize(nn.CausalSelfAttention(8, 2, rotary=rotary, max_len=8))
    x = rand(1, 6, 8, requires_grad=False)
    changed = x.data.copy()
    changed[:, 4:] += 1.0
    before, after = attn(x).data, attn(Tensor(changed)).data
    np.testing.assert_array_equal(before[:, :4], after[:, :4])
    assert not np.allclose(before[:, 4:], after[:, 4:])


@pytest.mark.parametrize("rotary", [False, True])
@pytest.mark.parametrize("chunks", [[1] * 7, [3, 1, 2, 1]])
def test_kv_cache_equals_full_sequence(f64, rotary, chunks):
    attn = randomize(nn.CausalSelfAttention(8, 2, rotary=rotary, max_len=16), scale=0.3)
    x = rand(2, sum(chunks), 8, requires_grad=False)
    with autograd.no_grad():
        full = attn(x).data
        cache = nn.LayerKVCache(2, 2, 16, 4, np.float64)
        pieces, start = [], 0
        for t in chunks:
            pieces.append(attn(Tensor(x.data[:, start : start + t]), cache).data)
            start += t
    assert cache.length == sum(chunks)
    np.testing.assert_allclose(np.concatenate(pieces, axis=1), full, rtol=0, atol=1e-12)


def test_block_kv_cache_equals_full_sequence(f64):
    blocks = [randomize(nn.Block(8, 2, rotary=True, max_len=8), seed=i, scale=0.3) for i in (0, 1)]
    x = rand(1, 5, 8, requires_grad=False)
    with autograd.no_grad():
        full = x
        for block in blocks:
            full = block(full)
        caches = [nn.LayerKVCache(1, 2, 8, 4, np.float64) for _ in blocks]
        steps = []
        for i in range(5):
            h = Tensor(x.data[:, i : i + 1])
            for block, cache in zip(blocks, caches, strict=True):
                h = block(h, cache)
            steps.append(h.data)
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full.data, rtol=0, atol=1e-12)


def test_kv_cache_appends_in_place_and_checks(f64):
    cache = nn.LayerKVCache(1, 2, 4, 3, np.float64)
    k = np.ones((1, 2, 3, 3))
    k_all, v_all = cache.append(k, 2 * k)
    assert k_all.shape == (1, 2, 3, 3) and np.shares_memory(k_all, cache.k)
    k_all, _ = cache.append(np.zeros((1, 2, 1, 3)), np.zeros((1, 2, 1, 3)))
    assert cache.length == 4 and k_all[0, 0, :, 0].tolist() == [1, 1, 1, 0]
    with pytest.raises(ValueError, match="exceed max_len 4"):
        cache.append(np.zeros((1, 2, 1, 3)), np.zeros((1, 2, 1, 3)))
    cache.reset()
    assert cache.length == 0
    with pytest.raises(ValueError, match=r"must be \(B, H, t, D\) = \(1, 2, 1, 3\)"):
        cache.append(np.zeros((1, 3, 1, 3)), np.zeros((1, 3, 1, 3)))
    attn = nn.CausalSelfAttention(6, 2)
    with pytest.raises(RuntimeError, match="no_grad"):
        attn(rand(1, 1, 6), cache)


# --- rotary position embedding (notes 8.6) ----------------------------------------------------


@settings(deadline=None)
@given(
    i=st.integers(0, 40),
    j=st.integers(0, 40),
    shift=st.integers(0, 20),
    seed=st.integers(0, 2**32 - 1),
)
def test_rotary_dot_depends_only_on_relative_position(i, j, shift, seed):
    autograd.set_default_dtype(np.float64)
    rng = np.random.default_rng(seed)
    q = Tensor(rng.normal(size=(1, 1, 1, 8)))
    k = Tensor(rng.normal(size=(1, 1, 1, 8)))
    cos, sin = nn.rotary_tables(64, 8)

    def score(pi, pj):
        rq = nn.apply_rotary(q, cos, sin, offset=pi).data
        rk = nn.apply_rotary(k, cos, sin, offset=pj).data
        return float((rq * rk).sum())

    # q_i . k_j = q^T R_i^T R_j k = q^T R(j - i) k: shifting both positions changes nothing.
    assert score(i, j) == pytest.approx(score(i + shift, j + shift), abs=1e-12)
    rotated = nn.apply_rotary(q, cos, sin, offset=i).data
    assert np.linalg.norm(rotated) == pytest.approx(np.linalg.norm(q.data), rel=1e-12)


def test_rotary_gradcheck_and_errors(f64):
    cos, sin = nn.rotary_tables(8, 4)
    autograd.gradcheck(lambda t: nn.apply_rotary(t, cos, sin, offset=2), [rand(2, 1, 3, 4)])
    with pytest.raises(ValueError, match="exceed the table's max_len 8"):
        nn.apply_rotary(rand(1, 1, 3, 4), cos, sin, offset=6)
    with pytest.raises(ValueError, match="head_dim must be even"):
        nn.rotary_tables(8, 5)


# --- the block (notes 8.5) ------------------------------------------------------------------------


@pytest.mark.parametrize("pre_ln", [True, False])
def test_block_gradcheck(f64, pre_ln):
    block = randomize(nn.Block(4, 2, pre_ln=pre_ln), scale=0.4)
    gradcheck_module(block, rand(1, 3, 4))


def test_pre_ln_block_formula(f64):
    block = randomize(nn.Block(8, 2), scale=0.3)
    x = rand(2, 4, 8, requires_grad=False)
    t = x.data + reference_attention(layer_norm_ref(x.data, block.ln_1), block.attn)
    expected = t + block.mlp(Tensor(layer_norm_ref(t, block.ln_2))).data
    np.testing.assert_allclose(block(x).data, expected, atol=1e-12)


def test_post_ln_block_formula(f64):
    block = randomize(nn.Block(8, 2, pre_ln=False), scale=0.3)
    assert "post_ln" in repr(block).splitlines()[1]
    x = rand(2, 4, 8, requires_grad=False)
    t = layer_norm_ref(x.data + reference_attention(x.data, block.attn), block.ln_1)
    expected = layer_norm_ref(t + block.mlp(Tensor(t)).data, block.ln_2)
    out = block(x).data
    np.testing.assert_allclose(out, expected, atol=1e-12)
    pre = nn.Block(8, 2)
    pre.load_state_dict(block.state_dict())
    assert not np.allclose(pre(x).data, out)


def test_block_dropout_follows_train_and_eval():
    block = nn.Block(8, 2, dropout=0.5)
    x = rand(1, 4, 8, requires_grad=False)
    block.eval()
    np.testing.assert_array_equal(block(x).data, block(x).data)
    block.train()
    assert not np.array_equal(block(x).data, block(x).data)


def test_float32_path_stays_float32():
    block = nn.Block(8, 2, rotary=True, max_len=8)
    out = block(Tensor(np.ones((1, 3, 8), np.float32), requires_grad=True))
    assert out.dtype == np.float32
    out.sum().backward()
    assert all(p.grad.dtype == np.float32 for p in block.parameters())
