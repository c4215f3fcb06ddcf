"""Int8 activations (autograd/kernels/quantized_int8.py): x's blocks quantized to int8 and
multiplied by a q8_0 / q4_0 / q4_1 weight's integers, as llama.cpp decodes. The AVX2 kernel (LLVM
IR) and the portable Numba loop against the numpy reference, the reference against its meaning
(x~ @ W), and the decode step that runs them."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import autograd
from autograd import kernels
from autograd.kernels import _common
from autograd.kernels import quantized_int8 as I8
from autograd.quantized import QuantizedWeight, quantize
from tests.test_decode import BLOCK, VOCAB
from tests.test_decode import quantized_llama as tiny_quantized_llama

FORMATS = I8.FORMATS
PATHS = ["avx2", "portable"] if I8.AVX2 else ["portable"]


def use_path(path, monkeypatch):
    monkeypatch.setattr(I8, "AVX2", path == "avx2")


def awkward_x(rng, n_in, dtype, scale):
    """x (n_in,) with a zero block, a block whose scaled values are exact halves (ties for rint:
    dx = 1 there), a block of one sign and repeated extremes, at magnitude `scale`."""
    x = (rng.standard_normal(n_in) * scale).astype(dtype)
    x[:32] = 0.0
    if n_in >= 64:
        x[32:64] = np.arange(32) % 8 - 3.5  # halves: rint goes to even
        x[32] = 127.0  # dx = 127 / 127 = 1
    if n_in >= 96:
        x[64:96] = np.abs(x[64:96])
        x[64], x[65] = x[64:96].max(), x[64:96].max()
    return x


def block_sum_bound(x, weight):
    """The sum of |terms| each output's float sums run over, the scale of their rounding: per
    block |d dx| sum |q xq| + |m sx| (q4_0's m = -8 d, so its two terms may cancel)."""
    q, d, m = I8._block_values(weight)
    xq, dx, sx = I8.quantize_activations(x)
    sums = np.einsum("obj,bj->ob", np.abs(q), np.abs(xq.reshape(-1, 32)).astype(np.int64))
    return (np.abs(d * dx) * sums + np.abs(m * sx)).sum(axis=1) + 1e-30


@settings(deadline=None, max_examples=30)
@given(
    st.sampled_from(FORMATS),
    st.integers(1, 7),  # blocks along `in`: 32 .. 224 values, not a multiple of the 8 lanes' 64
    st.sampled_from([1, 2, 9, 67]),  # outputs
    st.sampled_from([1e-3, 1.0, 1e4]),
    st.integers(0, 2**32 - 1),
)
def test_kernels_are_the_reference_on_both_paths_and_builds(fmt, blocks, n_out, scale, seed):
    rng = np.random.default_rng(seed)
    n_in = 32 * blocks
    w = rng.standard_normal((n_in, n_out)) * rng.choice([1e-3, 1.0, 1e3])
    w[:32, 0] = 0.0  # a weight block of zeros: d = 0
    weight = quantize(w, fmt)
    for dtype in (np.float32, np.float64):
        x = np.stack([awkward_x(rng, n_in, dtype, scale), rng.standard_normal(n_in).astype(dtype)])
        want = I8.quantized_matvec_int8_numpy(x, weight)
        bound = np.stack([block_sum_bound(row, weight) for row in x])
        for path in PATHS:
            for build in ("serial", "parallel"):
                with pytest.MonkeyPatch.context() as mp:
                    use_path(path, mp)
                    mp.setattr(_common, "PARALLEL_MIN_WORK", 0 if build == "parallel" else 2**62)
                    got = I8.quantized_matvec_int8_numba(x, weight)
                assert got.dtype == dtype and got.shape == want.shape
                # float64 x takes the portable path, its sums in float64 as the reference's
                tol = 1e-6 if dtype == np.float32 else 1e-13
                assert np.all(np.abs(got - want) <= tol * bound), (path, build, dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_activations_are_quantized_as_the_reference_bit_for_bit(dtype):
    rng = np.random.default_rng(0)
    x = awkward_x(rng, 320, dtype, 1e3)
    x[96:128] *= 1e-30  # tiny: dx subnormal-adjacent, still a normal float32
    xq, dx, sx = I8.quantize_activations(x)
    got = np.empty(320, np.int8), np.empty(10, np.float32), np.empty(10, np.float32)
    I8._quantize_activations(x, *got)
    for g, w in zip(got, (xq, dx, sx), strict=True):
        np.testing.assert_array_equal(g, w)
    assert not xq[:32].any() and dx[0] == 0 and sx[0] == 0  # a zero block
    # dx = 1: the halves -3.5 .. 3.5 round to even, as llama.cpp's AVX2 quantizer (rint)
    np.testing.assert_array_equal(xq[33:40], [-2, -2, -0, 0, 2, 2, 4])
    assert dx[1] == 1 and np.abs(xq).max() == 127
    np.testing.assert_array_equal(sx, dx * xq.reshape(-1, 32).sum(1).astype(np.float32))


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_product_is_x_rounded_to_int8_times_w(fmt):
    """What the reference computes: x~ @ W, x~ = dx * xq, within the float32 rounding of W's
    values (d * q + m) that the integer sums do not make; and x~ within half a step of x."""
    rng = np.random.default_rng(1)
    weight = quantize(rng.standard_normal((128, 50)), fmt)
    x = rng.standard_normal((1, 128))
    xq, dx, _ = I8.quantize_activations(x[0])
    x_tilde = (xq.reshape(-1, 32) * dx[:, None].astype(np.float64)).reshape(1, -1)
    assert np.all(np.abs(x_tilde - x).reshape(-1, 32) <= dx[:, None] / 2 * (1 + 1e-6))
    want = x_tilde @ weight.dequantize().astype(np.float64)
    got = I8.quantized_matvec_int8_numpy(x, weight)
    bound = np.abs(x_tilde) @ np.abs(weight.dequantize().astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6 * bound.max())


@pytest.mark.parametrize("path", PATHS)
def test_a_q8_0_value_of_minus_128_from_a_file_is_multiplied_as_it_is(path, monkeypatch):
    # ggml's quantizer never writes -128, but a file may hold it: |q| is then 128 read unsigned
    use_path(path, monkeypatch)
    quants = np.full((3, 2, 32), -128, np.int8)
    quants[1:] = 127
    quants[2, :, ::2] = -128
    scales = np.full((3, 2), 0.5, np.float16)
    weight = QuantizedWeight("q8_0", (64, 3), scales, quants)
    x = np.full((1, 64), -127.0, np.float32)  # xq = -127, dx = 1
    want = I8.quantized_matvec_int8_numpy(x, weight)
    np.testing.assert_array_equal(
        want[0],
        [0.5 * 128 * 127 * 64, -0.5 * 127 * 127 * 64, 0.5 * (128 * 127 * 32 - 127 * 127 * 32)],
    )
    np.testing.assert_array_equal(I8.quantized_matvec_int8_numba(x, weight), want)


def test_bad_input_names_the_op_the_format_and_the_shapes():
    weight = quantize(np.ones((64, 4)), "q5_0")
    with pytest.raises(
        ValueError,
        match=r"quantized_matvec_int8: int8 activations need a weight in q8_0, q4_0, q4_1, "
        r"got q5_0 \(64, 4\)",
    ):
        I8.quantized_matvec_int8_numba(np.ones((1, 64), np.float32), weight)
    with pytest.raises(
        ValueError,
        match=r"quantized_matvec_int8: x must be a float32/float64 \(N, 64\) array "
        r".*got float32 \(1, 32\)",
    ):
        kernels.quantized_matvec_int8(
            np.ones((1, 32), np.float32), quantize(np.ones((64, 4)), "q8_0")
        )


def test_into_runs_the_int8_product_where_the_format_has_one_and_the_float_one_elsewhere():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 64)).astype(np.float32)
    for fmt in ("q4_1", "q5_1"):
        weight = quantize(rng.standard_normal((64, 40)), fmt)
        out = np.empty((1, 40), np.float32)
        kernels.quantized_matmul_into(x, weight, out, int8_activations=True)
        if fmt in FORMATS:
            want = I8.quantized_matvec_int8_numpy(x, weight)
        else:
            want = kernels.quantized_matmul(x, weight)
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
        with kernels.use_backend("numpy"):  # the numpy backend runs the references
            kernels.quantized_matmul_into(x, weight, out, int8_activations=True)
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# the decode step
# ---------------------------------------------------------------------------------------------


def quantized_llama(fmt, dtype):
    return tiny_quantized_llama(fmt, dtype).eval()


def step_logits(model, ids, steps, **options):
    caches = model.new_kv_caches(ids.shape[0])
    with autograd.no_grad():
        first, _ = model(ids, kv_caches=caches)
        step = model.compile_decoder(caches, **options)
        token, out = first.data[:, -1].argmax(-1), []
        for _ in range(steps):
            out.append(step(token).copy())
            token = out[-1].argmax(-1)
    return np.array(out)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("batch", [1, 2])
def test_the_step_s_int8_products_are_the_reference_s(fmt, dtype, batch, monkeypatch):
    """Every product of an int8 step is quantized_matvec_int8 (the numpy backend runs the
    reference in the same step), and its logits stay near the float step's."""
    model = quantized_llama(fmt, dtype)
    ids = np.random.default_rng(0).integers(0, VOCAB, (batch, 3))
    steps = BLOCK - 3
    got = step_logits(model, ids, steps, int8_activations=True)
    with kernels.use_backend("numpy"):
        want = step_logits(model, ids, steps, int8_activations=True)
    tol = 1e-4 if dtype == np.float32 else 1e-11
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    floats = step_logits(model, ids, steps)
    assert 0 < np.abs(got - floats).max() < 0.05 * np.abs(floats).max()


def test_generate_and_chat_take_int8_and_refuse_it_with_exact():
    model = quantized_llama("q8_0", np.float32)
    ids = np.random.default_rng(1).integers(0, VOCAB, (1, 3))
    tokens = model.generate(ids, 6, temperature=0, eos_id=[], compiled="int8")
    assert tokens.shape == (1, 9)
    caches = model.new_kv_caches(1)
    streamed = list(model.stream(ids[0], caches, 6, temperature=0, compiled="int8"))
    assert streamed == tokens[0, 3 : 3 + len(streamed)].tolist()
    with pytest.raises(ValueError, match="exact .* and int8_activations .* exclude each other"):
        model.compile_decoder(model.new_kv_caches(1), exact=True, int8_activations=True)
    with pytest.raises(ValueError, match="compiled must be False, True or 'int8'"):
        list(model.stream(ids[0], model.new_kv_caches(1), 2, compiled="exact"))


@pytest.mark.parametrize("fmt", ["q4_1", "q8_0", "q5_0"])
@pytest.mark.parametrize("int8", [False, True])
@pytest.mark.parametrize("rows", [1, 2])
def test_a_bound_product_is_the_unbound_call_on_the_arrays_it_was_bound_to(fmt, int8, rows):
    """bind_quantized_matmul_into (the decode step's products): made once, it computes what
    quantized_matmul_into computes on whatever the bound x holds at each call."""
    rng = np.random.default_rng(4)
    weight = quantize(rng.standard_normal((64, 40)), fmt)
    x, out, want = np.empty((rows, 64), np.float32), *np.empty((2, rows, 40), np.float32)
    product = kernels.bind_quantized_matmul_into(x, weight, out, int8)
    for _ in range(2):  # new values in the bound x: the call reads them
        x[...] = rng.standard_normal(x.shape)
        product()
        kernels.quantized_matmul_into(x, weight, want, int8)
        np.testing.assert_array_equal(out, want)
