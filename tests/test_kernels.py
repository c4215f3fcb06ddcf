"""autograd.kernels: every Numba kernel against its numpy reference, gradient checks of both
backwards by central differences, backend dispatch, error messages, and the attention memory bound.
"""

import ctypes.util
import json
import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import autograd
from autograd import Tensor, kernels
from autograd import functional as F
from autograd.kernels import (
    _common,
    attention,
    embedding,
    gelu,
    layernorm,
    matvec,
    rotary,
    silu,
    softmax,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BACKENDS = ("numpy", "numba")
dtypes = st.sampled_from([np.float32, np.float64])
seeds = st.integers(0, 2**32 - 1)


def assert_close(actual, expected, dtype, scale=1.0):
    """float64: 1e-10 relative; float32: 1e-4, with the absolute part scaled to the data."""
    tol = 1e-10 if dtype == np.float64 else 1e-4
    assert actual.dtype == dtype, (actual.dtype, dtype)
    np.testing.assert_allclose(actual, expected, rtol=tol, atol=tol * scale)


def rows_shape(draw, max_rows=4):
    lead = draw(st.lists(st.integers(1, max_rows), min_size=0, max_size=2))
    return (*lead, draw(st.integers(1, 70)))


# ---------------------------------------------------------------------------------------------
# softmax family
# ---------------------------------------------------------------------------------------------


@st.composite
def softmax_inputs(draw):
    """Rows with -inf entries, some fully -inf rows, and magnitudes up to 1e4."""
    shape = rows_shape(draw)
    rng = np.random.default_rng(draw(seeds))
    scale = draw(st.sampled_from([1.0, 30.0, 1e4]))
    x = rng.standard_normal(shape) * scale
    x[rng.random(shape) < draw(st.sampled_from([0.0, 0.3]))] = -np.inf
    if draw(st.booleans()):
        x.reshape(-1, shape[-1])[0] = -np.inf  # a fully masked row
    return x.astype(draw(dtypes)), scale


@given(softmax_inputs(), seeds)
@settings(deadline=None)
def test_softmax_family_matches_reference(inputs, seed):
    x, scale = inputs
    dt = x.dtype.type
    gy = np.random.default_rng(seed).standard_normal(x.shape).astype(dt)
    x_before = x.copy()
    checks = (
        ("softmax_forward", 1.0),
        ("log_softmax_forward", scale),
        ("logsumexp_forward", scale),
    )
    for name, s in checks:
        ref = getattr(softmax, f"{name}_numpy")(x)
        assert_close(getattr(softmax, f"{name}_numba")(x), ref, dt, s)
        assert not np.isnan(ref).any()  # -inf rows give documented values, never NaN
    y = softmax.softmax_forward_numpy(x)
    ref = softmax.softmax_backward_numpy(y, gy)
    assert_close(softmax.softmax_backward_numba(y, gy), ref, dt, 10.0)
    y = softmax.log_softmax_forward_numpy(x)
    ref = softmax.log_softmax_backward_numpy(y, gy)
    assert_close(softmax.log_softmax_backward_numba(y, gy), ref, dt, 10.0 * x.shape[-1])
    np.testing.assert_array_equal(x, x_before)  # inputs are never modified


@pytest.mark.parametrize("backend", BACKENDS)
def test_softmax_special_rows(backend):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # documented results come without warnings
        x = np.array([[-np.inf, -np.inf, -np.inf], [0.0, -np.inf, 0.0]])
        sm = kernels.get_kernel("softmax_forward", backend)
        lsm = kernels.get_kernel("log_softmax_forward", backend)
        lse = kernels.get_kernel("logsumexp_forward", backend)
        np.testing.assert_array_equal(sm(x), [[0, 0, 0], [0.5, 0, 0.5]])
        np.testing.assert_array_equal(lsm(x)[0], [-np.inf] * 3)
        np.testing.assert_allclose(lsm(x)[1], [-np.log(2), -np.inf, -np.log(2)])
        np.testing.assert_array_equal(lse(x), [-np.inf, np.log(2)])
        gy = np.array([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]])
        gx = kernels.get_kernel("log_softmax_backward", backend)(lsm(x), gy)
        np.testing.assert_allclose(gx, [[1, 2, 3], [-2, 2, 0]])  # fully -inf row: gx = gy
        # shapes: 0-d leading dims, 1-element rows
        assert sm(np.zeros((0, 5))).shape == (0, 5)
        assert lse(np.ones(4)).shape == ()
        np.testing.assert_array_equal(sm(np.full((2, 1), 7.0)), [[1.0], [1.0]])
    with np.errstate(invalid="ignore"):  # +inf and NaN make their row NaN, and do not crash
        bad = np.array([[1.0, np.inf, 0.0], [1.0, np.nan, 0.0], [1.0, 2.0, 3.0]])
        for f in (sm, lsm):
            out = f(bad)
            assert np.isnan(out[:2]).all() and np.isfinite(out[2]).all()
        assert np.isnan(lse(bad)[:2]).all()


@st.composite
def cross_entropy_inputs(draw):
    n, vocab = draw(st.integers(1, 40)), draw(st.integers(1, 70))
    rng = np.random.default_rng(draw(seeds))
    scale = draw(st.sampled_from([1.0, 30.0, 1e4]))
    logits = (rng.standard_normal((n, vocab)) * scale).astype(draw(dtypes))
    targets = rng.integers(0, vocab, n)
    targets[rng.random(n) < draw(st.sampled_from([0.0, 0.3, 1.0]))] = -100
    return logits, targets, scale


@given(cross_entropy_inputs(), st.booleans(), st.sampled_from([1.0, 0.25, -3.0]))
@settings(deadline=None)
def test_cross_entropy_matches_reference(inputs, need_grad, grad_scale):
    # grad_scale: the backward's incoming dL/dloss, folded into the one pass
    logits, targets, scale = inputs
    dt = logits.dtype.type
    args = (logits, targets, -100, need_grad, grad_scale)
    loss_ref, d_ref = softmax.cross_entropy_forward_numpy(*args)
    loss, d = softmax.cross_entropy_forward_numba(*args)
    assert isinstance(loss, float)
    tol = 1e-10 if dt == np.float64 else 1e-5
    assert loss == pytest.approx(loss_ref, rel=tol, abs=tol * scale)
    if not need_grad:
        assert d is None and d_ref is None
        return
    assert_close(d, d_ref, dt, abs(grad_scale) / len(targets))
    assert not d[targets == -100].any()
    if (targets == -100).all():
        assert loss == 0.0


@pytest.mark.parametrize("backend", BACKENDS)
def test_cross_entropy_errors(backend):
    ce = kernels.get_kernel("cross_entropy_forward", backend)
    logits = np.zeros((3, 5))
    with pytest.raises(ValueError, match=r"target 5 out of range \[0, 5\) at row 1"):
        ce(logits, np.array([0, 5, 1]))
    with pytest.raises(ValueError, match=r"target -1 out of range"):
        ce(logits, np.array([0, 1, -1]))
    with pytest.raises(ValueError, match=r"logits \(3, 5\) and targets \(2,\)"):
        ce(logits, np.array([0, 1]))
    loss, d = ce(logits, np.array([7, 7, 7]), ignore_index=7)
    assert loss == 0.0 and not d.any()


# ---------------------------------------------------------------------------------------------
# layernorm and embedding
# ---------------------------------------------------------------------------------------------


@st.composite
def layer_norm_inputs(draw):
    shape = rows_shape(draw)
    rng = np.random.default_rng(draw(seeds))
    offset, spread = draw(st.sampled_from([(0.0, 1.0), (50.0, 1e-2), (-3.0, 10.0)]))
    dt = draw(dtypes)
    x = (offset + spread * rng.standard_normal(shape)).astype(dt)
    w, b = (rng.standard_normal(shape[-1]).astype(dt) for _ in range(2))
    gy = rng.standard_normal(shape).astype(dt)
    return x, w, b, gy, abs(offset) / spread + 1  # the last: how much rounding of x is amplified


@given(layer_norm_inputs())
@settings(deadline=None)
def test_layer_norm_matches_reference(inputs):
    x, w, b, gy, cond = inputs
    dt = x.dtype.type
    y, mean, rstd = layernorm.layer_norm_forward_numpy(x, w, b, 1e-5)
    y2, mean2, rstd2 = layernorm.layer_norm_forward_numba(x, w, b, 1e-5)
    assert mean.dtype == rstd.dtype == np.float64 and mean.shape == x.shape[:-1]
    assert_close(y2, y, dt, cond)
    np.testing.assert_allclose(mean2, mean, rtol=1e-12, atol=1e-12 * cond)
    np.testing.assert_allclose(rstd2, rstd, rtol=1e-10)
    ref = layernorm.layer_norm_backward_numpy(gy, x, w, mean, rstd)
    for got, want in zip(
        layernorm.layer_norm_backward_numba(gy, x, w, mean, rstd), ref, strict=True
    ):
        assert_close(got, want, dt, cond * np.sqrt(x.size))


@pytest.mark.parametrize("backend", BACKENDS)
def test_layer_norm_two_pass_variance(backend):
    # A large offset with a tiny spread: E[x^2] - E[x]^2 would lose every digit here.
    x = 1e4 + 1e-3 * np.random.default_rng(0).standard_normal((3, 50))
    _, mean, rstd = kernels.get_kernel("layer_norm_forward", backend)(
        x, np.ones(50), np.zeros(50), 0.0
    )
    np.testing.assert_allclose(mean, x.mean(axis=1), rtol=1e-14)
    np.testing.assert_allclose(rstd, 1 / x.std(axis=1), rtol=1e-8)


@given(seeds, dtypes, st.integers(1, 12), st.lists(st.integers(1, 5), min_size=0, max_size=3))
@settings(deadline=None)
def test_embedding_backward_matches_reference(seed, dt, num, idx_shape):
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, num, idx_shape)  # few ids, so repeats are common
    gy = rng.standard_normal((*idx_shape, 1 + seed % 9)).astype(dt)
    ref = embedding.embedding_backward_numpy(idx, gy, num)
    got = embedding.embedding_backward_numba(idx, gy, num)
    assert_close(got, ref, dt, np.sqrt(max(idx.size, 1)))
    np.testing.assert_array_equal(embedding.embedding_backward_numba(idx, gy, num), got)


@given(seeds, dtypes, st.integers(1, 12), st.lists(st.integers(1, 5), min_size=0, max_size=3))
@settings(deadline=None)
def test_embedding_backward_adds_into_a_given_gradient(seed, dt, num, idx_shape):
    # out= (a tied head's gradient there first): out + the table numba's own call makes, bit for
    # bit (each id's rows summed, rounded, then added), and the numpy reference's out + table
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, num, idx_shape)
    gy = rng.standard_normal((*idx_shape, 1 + seed % 9)).astype(dt)
    head = rng.standard_normal((num, gy.shape[-1])).astype(dt)
    table = embedding.embedding_backward_numba(idx, gy, num)
    got = embedding.embedding_backward_numba(idx, gy, num, out=head.copy())
    np.testing.assert_array_equal(got, head + table)
    ref = embedding.embedding_backward_numpy(idx, gy, num, out=head.copy())
    assert_close(got, ref, dt, np.sqrt(max(idx.size, 1)))
    wrong = (num + 1, gy.shape[-1])  # one row too many: never the right shape (a fixed (2, 1) was)
    with pytest.raises(ValueError, match=rf"embedding_backward: out \({wrong[0]}, {wrong[1]}\)"):
        embedding.embedding_backward_numba(idx, gy, num, out=np.zeros(wrong, dt))


@pytest.mark.parametrize("backend", BACKENDS)
def test_embedding_sums_repeats_and_checks_ids(backend):
    emb = kernels.get_kernel("embedding_backward", backend)
    gy = np.arange(8.0).reshape(2, 2, 2)
    np.testing.assert_array_equal(emb(np.array([[1, 1], [0, 1]]), gy, 3), [[4, 5], [8, 11], [0, 0]])
    with pytest.raises(ValueError, match=r"id 3 out of range \[0, 3\)"):
        emb(np.array([[1, 3], [0, 1]]), gy, 3)
    with pytest.raises(ValueError, match=r"gy \(2, 2, 2\) must be idx.shape \+ \(C,\)"):
        emb(np.array([1, 2]), gy, 3)


# ---------------------------------------------------------------------------------------------
# attention
# ---------------------------------------------------------------------------------------------


@st.composite
def attention_inputs(draw):
    causal = draw(st.booleans())
    tq = draw(st.sampled_from([1, 2, 5, 63, 64, 65, 130]))
    tk = tq + draw(st.sampled_from([0, 1, 7, 64])) if causal else draw(st.integers(1, 70))
    b, h, d = draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.sampled_from([1, 3, 8, 17]))
    group = draw(st.sampled_from([1, 1, 2, 3]))  # query heads per K/V head (grouped-query)
    rng = np.random.default_rng(draw(seeds))
    dt = draw(dtypes)
    q, go = (rng.standard_normal((b, h * group, tq, d)).astype(dt) for _ in range(2))
    k, v = (rng.standard_normal((b, h, tk, d)).astype(dt) for _ in range(2))
    block_q = draw(st.sampled_from([64, 8, 5, 1]))  # small blocks cross block edges
    return q, k, v, go, causal, block_q


@given(attention_inputs())
@settings(deadline=None, max_examples=30)
def test_attention_matches_reference(inputs):
    q, k, v, go, causal, block_q = inputs
    dt = q.dtype.type
    o, lse = attention.attention_forward_numpy(q, k, v, causal)
    saved = attention.BLOCK_Q
    attention.BLOCK_Q = block_q
    try:
        o2, lse2 = attention.attention_forward_numba(q, k, v, causal)
        grads = attention.attention_backward_numba(q, k, v, o, lse, go, causal)
    finally:
        attention.BLOCK_Q = saved
    assert_close(o2, o, dt)
    assert_close(lse2, lse, dt, 10.0)
    for got, want in zip(
        grads, attention.attention_backward_numpy(q, k, v, o, lse, go, causal), strict=True
    ):
        assert_close(got, want, dt, np.sqrt(k.shape[2]))


@pytest.mark.parametrize("backend", BACKENDS)
def test_attention_causal_alignment_and_errors(backend):
    fwd = kernels.get_kernel("attention_forward", backend)
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((1, 1, 2, 4)), *rng.standard_normal((2, 1, 1, 5, 4))
    o, _ = fwd(q, k, v, causal=True)  # KV-cache decoding: the 2 queries are positions 3 and 4
    o_full, _ = fwd(np.concatenate([rng.standard_normal((1, 1, 3, 4)), q], axis=2), k, v)
    np.testing.assert_allclose(o, o_full[:, :, 3:], rtol=1e-12)
    with pytest.raises(ValueError, match=r"q \(2, 4, 8, 16\), k \(2, 4, 8, 8\).*agree in B and D"):
        fwd(np.zeros((2, 4, 8, 16)), np.zeros((2, 4, 8, 8)), np.zeros((2, 4, 8, 8)))
    with pytest.raises(ValueError, match=r"k's heads must divide q's"):  # 3 K/V heads, 4 queries
        fwd(np.zeros((2, 4, 8, 8)), np.zeros((2, 3, 8, 8)), np.zeros((2, 3, 8, 8)))
    with pytest.raises(ValueError, match=r"no allowed key"):
        fwd(np.zeros((1, 1, 3, 4)), np.zeros((1, 1, 2, 4)), np.zeros((1, 1, 2, 4)))
    with pytest.raises(ValueError, match=r"must be \(B, H, T, D\)"):
        fwd(np.zeros((3, 4)), np.zeros((3, 4)), np.zeros((3, 4)))


@pytest.mark.parametrize("block_q", [64, 4])
@pytest.mark.parametrize(
    "tq, tk, causal",
    [
        (1, 1, True),
        (1, 9, True),
        (1, 9, False),
        (13, 13, True),
        (13, 20, True),
        (12, 5, False),
        (0, 3, True),
    ],
)
def test_attention_block_edges(tq, tk, causal, block_q, monkeypatch):
    # T = 1, T not a multiple of the block, Tq < Tk (KV-cache decoding), Tq > Tk without causal,
    # no query at all
    monkeypatch.setattr(attention, "BLOCK_Q", block_q)
    rng = np.random.default_rng(tq * 100 + tk)
    heads = 2 * (1 + block_q % 3)  # 2 or 4 query heads on the 2 K/V heads (grouped when 4)
    q, go = rng.standard_normal((2, heads, tq, 8)), rng.standard_normal((2, heads, tq, 8))
    k, v = rng.standard_normal((2, 2, tk, 8)), rng.standard_normal((2, 2, tk, 8))
    o, lse = attention.attention_forward_numpy(q, k, v, causal)
    o2, lse2 = attention.attention_forward_numba(q, k, v, causal)
    assert_close(o2, o, np.float64)
    assert_close(lse2, lse, np.float64)
    want = attention.attention_backward_numpy(q, k, v, o, lse, go, causal)
    got = attention.attention_backward_numba(q, k, v, o, lse, go, causal)
    for g, w in zip(got, want, strict=True):
        assert_close(g, w, np.float64)


# ---------------------------------------------------------------------------------------------
# serial and parallel builds: both agree with the reference, and the threshold picks between them
# ---------------------------------------------------------------------------------------------


def _all_kernel_calls(rng, dt):
    """(name, args) for every kernel of the table, on inputs big enough to split across threads."""
    return [(name, kernel.example(rng, dt, 37, 50)) for name, kernel in kernels.KERNELS.items()]


@pytest.mark.parametrize("dt", [np.float32, np.float64])
@pytest.mark.parametrize("build", ["serial", "parallel"])
def test_serial_and_parallel_builds_match_reference(build, dt, monkeypatch):
    monkeypatch.setattr(_common, "PARALLEL_MIN_WORK", 2**62 if build == "serial" else 0)
    for name, args in _all_kernel_calls(np.random.default_rng(7), dt):
        want = kernels.get_kernel(name, "numpy")(*args)
        got = kernels.get_kernel(name, "numba")(*args)
        want, got = (r if isinstance(r, tuple) else (r,) for r in (want, got))
        for g, w in zip(got, want, strict=True):
            if isinstance(w, float):  # the cross-entropy loss
                assert g == pytest.approx(w, rel=1e-5 if dt == np.float32 else 1e-12), name
            else:
                np.testing.assert_allclose(
                    g,
                    w,
                    rtol=1e-4 if dt == np.float32 else 1e-10,
                    atol=1e-5 if dt == np.float32 else 1e-12,
                    err_msg=name,
                )


def test_work_threshold_picks_the_build(monkeypatch, request):
    import numba

    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("needs at least 2 Numba threads")

    def thread_ids(out):
        for i in numba.prange(out.size):
            out[i] = numba.get_thread_id()

    kernel = _common.Kernel(thread_ids)
    out = np.empty(1000, np.int64)
    _common.start_threads()
    threads = numba.get_num_threads()
    numba.set_num_threads(2)  # whatever an earlier test left
    request.addfinalizer(lambda: numba.set_num_threads(threads))
    monkeypatch.setattr(_common, "PARALLEL_MIN_WORK", 1001)
    kernel(out.size, out)
    assert not out.any()  # serial build: everything on the calling thread
    monkeypatch.setattr(_common, "PARALLEL_MIN_WORK", 1000)
    kernel(out.size, out)
    assert len(set(out.tolist())) > 1  # parallel build: prange shared among threads


def test_start_threads_leaves_the_environment_as_it_was():
    code = """
        import json, os
        import numba
        import autograd.kernels as K
        K.start_threads()
        K.start_threads()  # once per process
        print(json.dumps([os.environ.get("OMP_WAIT_POLICY"), numba.threading_layer()]))
    """
    out = run_python(code, OMP_WAIT_POLICY=None)
    assert out.returncode == 0, out.stderr
    policy, layer = json.loads(out.stdout)
    assert policy is None and layer in ("omp", "tbb", "workqueue")
    out = run_python(code, OMP_WAIT_POLICY="ACTIVE")  # a user's choice is kept
    assert json.loads(out.stdout)[0] == "ACTIVE", out.stderr


def test_start_threads_spin_is_chosen_once_and_leaves_the_environment():
    # DecodeStep asks for polling workers (start_threads("spin")); the first call in a process
    # decides, a later request changes nothing, and libgomp's variables are restored
    code = """
        import json, os
        import numba
        import autograd.kernels as K
        first = K.start_threads("spin")
        later = K.start_threads("sleep")
        names = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
        print(json.dumps([first, later, [os.environ.get(n) for n in names]]))
    """
    out = run_python(code, OMP_WAIT_POLICY=None, GOMP_SPINCOUNT=None, NUMBA_THREADING_LAYER=None)
    assert out.returncode == 0, out.stderr
    first, later, environment = json.loads(out.stdout)
    assert first == later == "spin" and environment == [None, None]
    with pytest.raises(ValueError, match="start_threads: wait must be 'sleep' or 'spin'"):
        _common.start_threads("busy")


def test_quantizing_a_weight_leaves_numba_s_threads_unstarted():
    # a model loaded with quantize="q8_0" ran the quantizer's parallel build, which started
    # Numba's workers asleep; the decode step built next could no longer have them poll (SmolLM2
    # Q8_0 on 2 threads: 45 instead of ~70 tokens/s). The quantizer runs serially (kernels.serially)
    code = """
        import json
        import numpy as np
        import autograd.kernels as K
        from autograd.quantized import quantize
        quantize(np.random.default_rng(0).standard_normal((1024, 512)), "q8_0")  # > 2^17 values
        started = dict(K._common._STARTED)
        print(json.dumps([started, K.start_threads("spin")]))
    """
    out = run_python(code, OMP_WAIT_POLICY=None, GOMP_SPINCOUNT=None, NUMBA_THREADING_LAYER=None)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [{}, "spin"]


def test_threads_sleep_when_another_openmp_runtime_was_loaded_first():
    # torch imported first brings its own libgomp, set up without the passive wait policy:
    # Numba must not run its loops on it (they would spin), so start_threads picks the workqueue
    # layer. The system libgomp, loaded by hand, stands in for torch's.
    if ctypes.util.find_library("gomp") is None:
        pytest.skip("no libgomp on this system")
    code = """
        import ctypes, ctypes.util, json, sys
        if sys.argv[1] == "first":
            ctypes.CDLL(ctypes.util.find_library("gomp"))
        import numba
        import autograd.kernels as K
        before = K._common.openmp_already_loaded()
        K.start_threads()
        print(json.dumps([before, numba.threading_layer()]))
    """
    for order, expected in (("first", [True, "workqueue"]), ("none", [False, "omp"])):
        out = run_python(code, order, NUMBA_THREADING_LAYER=None)
        assert out.returncode == 0, out.stderr
        before, layer = json.loads(out.stdout)
        assert before == expected[0]
        if expected[0]:
            assert layer == "workqueue"
        else:
            assert layer != "workqueue" or not _omp_layer_available()


def _omp_layer_available() -> bool:
    try:
        import numba.np.ufunc.omppool  # noqa: F401
    except ImportError:
        return False
    return True


# ---------------------------------------------------------------------------------------------
# central differences in float64: each backward (both backends) against its own forward
# ---------------------------------------------------------------------------------------------


def assert_vjp(loss, inputs, grads):
    """`grads` (a kernel backward's output at `inputs`) against central differences of the scalar
    `loss`, through autograd.gradcheck: the pair is wrapped as one Function for the check."""

    class KernelLoss(autograd.Function):
        def forward(self, *arrays):
            return np.asarray(loss(*arrays), dtype=np.float64)

        def backward(self, g):
            return tuple(g * np.asarray(grad, dtype=np.float64) for grad in grads)

    tensors = [Tensor(x, requires_grad=True, dtype=np.float64) for x in inputs]
    autograd.gradcheck(lambda *ts: KernelLoss.apply(*ts), tensors)


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradients_by_central_differences(backend):
    k = lambda name: kernels.get_kernel(name, backend)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 5))
    x[0, 0, 1] = -np.inf  # masked entries must not disturb the others' gradients
    g = rng.standard_normal(x.shape)
    y = k("softmax_forward")(x)
    assert_vjp(lambda x: np.sum(k("softmax_forward")(x) * g), [x], [k("softmax_backward")(y, g)])
    y = k("log_softmax_forward")(x)
    g = np.where(np.isinf(y), 0, g)  # a -inf output takes no part in the loss
    finite = lambda x: np.sum(np.where(np.isinf(y), 0, k("log_softmax_forward")(x)) * g)
    assert_vjp(finite, [x], [k("log_softmax_backward")(y, g)])

    x, w, b = rng.standard_normal((2, 3, 6)), rng.standard_normal(6), rng.standard_normal(6)
    g = rng.standard_normal(x.shape)
    _, mean, rstd = k("layer_norm_forward")(x, w, b, 1e-5)
    assert_vjp(
        lambda x, w, b: np.sum(k("layer_norm_forward")(x, w, b, 1e-5)[0] * g),
        [x, w, b],
        k("layer_norm_backward")(g, x, w, mean, rstd),
    )

    logits, targets = rng.standard_normal((5, 7)), np.array([1, -100, 6, 0, 6])
    _, dlogits = k("cross_entropy_forward")(logits, targets)
    ce = lambda logits: k("cross_entropy_forward")(logits, targets, need_grad=False)[0]
    assert_vjp(ce, [logits], [dlogits])

    idx, weight = np.array([[0, 2, 2], [3, 0, 2]]), rng.standard_normal((5, 4))
    g = rng.standard_normal((2, 3, 4))
    assert_vjp(lambda w: np.sum(w[idx] * g), [weight], [k("embedding_backward")(idx, g, 5)])

    x = rng.standard_normal((3, 7)) * 3
    g = rng.standard_normal(x.shape)
    _, t = k("gelu_forward")(x)
    assert_vjp(lambda x: np.sum(k("gelu_forward")(x)[0] * g), [x], [k("gelu_backward")(g, x, t)])

    for causal, tq in ((True, 3), (True, 5), (False, 4)):
        q, (kk, v) = rng.standard_normal((2, 1, tq, 3)), rng.standard_normal((2, 2, 1, 5, 3))
        go = rng.standard_normal(q.shape)
        o, lse = k("attention_forward")(q, kk, v, causal)
        grads = k("attention_backward")(q, kk, v, o, lse, go, causal)
        att = lambda q, kk, v, c=causal, go=go: np.sum(k("attention_forward")(q, kk, v, c)[0] * go)
        assert_vjp(att, [q, kk, v], grads)


# ---------------------------------------------------------------------------------------------
# dispatch
# ---------------------------------------------------------------------------------------------


def run_python(code, *args, **env):
    """Run `code` in a fresh interpreter; env values of None remove that variable."""
    env = {**os.environ, "PYTHONPATH": ROOT, **env}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        cwd=ROOT,
        env={k: v for k, v in env.items() if v is not None},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_backend_from_environment_and_lazy_numba():
    code = """
        import json, sys
        import autograd, autograd.kernels as K
        print(json.dumps([K.get_backend(), "numba" in sys.modules]))
    """
    for env, backend in (("numpy", "numpy"), (None, "numba")):
        out = run_python(code, GLASSGRAD_KERNELS=env)
        assert json.loads(out.stdout) == [backend, False], out.stderr
    out = run_python("import autograd.kernels", GLASSGRAD_KERNELS="cuda")
    assert out.returncode != 0 and "valid backends: numba, numpy" in out.stderr


def test_set_and_use_backend(monkeypatch):
    calls = []
    monkeypatch.setattr(softmax, "softmax_forward_numpy", lambda x: calls.append("numpy"))
    monkeypatch.setattr(softmax, "softmax_forward_numba", lambda x: calls.append("numba"))
    kernels.set_backend("numba")
    kernels.softmax_forward(np.zeros(3))
    with kernels.use_backend("numpy"):
        assert kernels.get_backend() == "numpy"
        kernels.softmax_forward(np.zeros(3))
    assert kernels.get_backend() == "numba"
    with pytest.raises(RuntimeError), kernels.use_backend("numpy"):
        raise RuntimeError  # the previous backend comes back on error too
    assert kernels.get_backend() == "numba"
    assert calls == ["numba", "numpy"]
    with pytest.raises(ValueError, match="valid backends: numba, numpy"):
        kernels.set_backend("torch")
    with pytest.raises(ValueError, match="valid backends"), kernels.use_backend("jax"):
        pass
    assert kernels.get_kernel("attention_forward", "numpy") is attention.attention_forward_numpy
    with pytest.raises(ValueError, match="unknown kernel 'conv'"):
        kernels.get_kernel("conv")


# ---------------------------------------------------------------------------------------------
# memory: the Numba attention never builds a (T, T) buffer
# ---------------------------------------------------------------------------------------------

MEMORY_SCRIPT = """
    import json, sys, tracemalloc
    import numpy as np
    from autograd.kernels import _common, attention

    def peak_kib():
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM"):
                return int(line.split()[1])

    def peak_growth_mib(backend, T=2048, D=32):
        fwd = getattr(attention, "attention_forward_" + backend)
        bwd = getattr(attention, "attention_backward_" + backend)
        small = np.ones((1, 1, 8, D), np.float32)
        _common.PARALLEL_MIN_WORK = 0  # so that the warm-up compiles the parallel builds
        bwd(small, small, small, *fwd(small, small, small), small)  # and starts the threads
        a = np.ones((1024, 1024), np.float32)
        a @ a, a.T @ a  # OpenBLAS touches its own work buffers once per process: do it now
        del a
        rng = np.random.default_rng(0)
        q, k, v, go = (rng.standard_normal((1, 1, T, D)).astype(np.float32) for _ in range(4))
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset the high-water mark to the current RSS
        base = peak_kib()
        o, lse = fwd(q, k, v, True)
        grads = bwd(q, k, v, o, lse, go, True)
        rss = (peak_kib() - base) / 1024
        del o, lse, grads
        tracemalloc.start()  # numpy reports its allocations to tracemalloc; a second run
        bwd(q, k, v, *fwd(q, k, v, True), go, True)
        return rss, tracemalloc.get_traced_memory()[1] / 2**20

    print(json.dumps(peak_growth_mib(sys.argv[1])))
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux /proc")
def test_attention_memory_stays_far_below_t_by_t():
    # Forward + backward at T=2048, where one (T, T) float32 buffer alone is 16 MiB. Two probes:
    # peak RSS growth (sees every allocation, Numba's and BLAS's too) and tracemalloc's peak of
    # numpy's allocations (outputs, the O(B*H*BLOCK_Q*T) scratch and the gk/gv partials: ~3 MiB).
    def growth(backend):
        out = run_python(MEMORY_SCRIPT, backend)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    assert max(growth("numba")) < 4.0
    assert min(growth("numpy")) > 16.0  # the reference does hold (T, T) buffers: the probes work


@given(seeds, dtypes, st.sampled_from([1.0, 10.0, 1e3]))
@settings(deadline=None)
def test_gelu_matches_reference(seed, dt, scale):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((3, 41)) * scale).astype(dt)
    x[0, :3] = [0.0, 1e-8, -1e-8]  # tanh near 0 comes from 1 - exp(-2|u|): check it there too
    gy = rng.standard_normal(x.shape).astype(dt)
    y, t = gelu.gelu_forward_numba(x)
    y_ref, t_ref = gelu.gelu_forward_numpy(x)
    assert_close(y, y_ref, dt, scale)
    assert_close(t, t_ref, dt)
    gx = gelu.gelu_backward_numba(gy, x, t)
    assert_close(gx, gelu.gelu_backward_numpy(gy, x, t_ref), dt, 3)
    # the compiled step's loops (y without t; gx with t recomputed): the same values, bit for bit
    s, a_s, a3_s = gelu.constants(x.dtype)
    y_only, gx_of_x = np.empty_like(x), np.empty_like(x)
    gelu._gelu_output(x.size, x.reshape(-1), y_only.reshape(-1), s, a_s)
    gelu._gelu_grads_of_x(x.size, gy.reshape(-1), x.reshape(-1), gx_of_x.reshape(-1), s, a_s, a3_s)
    assert np.array_equal(y_only, y) and np.array_equal(gx_of_x, gx)


@given(seeds, dtypes, st.integers(1, 200), st.sampled_from([1.0, 10.0, 1e3]))
@settings(deadline=None)
def test_silu_times_is_silu_then_the_product_bit_for_bit(seed, dt, n, scale):
    # the compiled decode step's silu(gate) * up in one call: eager's two calls' values exactly
    # (both builds), and the numpy reference's within rounding
    rng = np.random.default_rng(seed)
    x, u = ((rng.standard_normal(n) * scale).astype(dt) for _ in range(2))
    x[: min(n, 3)] = [0.0, -0.0, 1e-8][: min(n, 3)]
    want = np.empty_like(x)
    silu._silu_values.serial(x, want)
    want = want * u
    for build in (silu._silu_times.serial, silu._silu_times.parallel):
        y = np.empty_like(x)
        build(x, u, y)
        np.testing.assert_array_equal(y, want)
    assert_close(y, silu.silu_forward_numpy(x) * u, dt, scale * scale)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_swiglu_forward_is_silu_then_the_product_bit_for_bit(backend, dt):
    # F.swiglu (the gated MLP's op) keeps the values of F.silu(a) * b that it replaced, so the
    # models' logits, the decode step (silu._silu_times) and HF's stay as they were
    x, u = kernels.examples.swiglu_forward(np.random.default_rng(0), dt, 37, 50)
    want = kernels.get_kernel("silu_forward", backend)(x) * u
    np.testing.assert_array_equal(kernels.get_kernel("swiglu_forward", backend)(x, u), want)


@given(
    seeds,
    dtypes,
    st.tuples(st.integers(1, 3), st.integers(1, 4), st.integers(1, 9)),
    st.integers(1, 40),
    st.integers(0, 5000),
)
@settings(deadline=None)
def test_rotary_kernel_gives_the_eager_rotation_bit_for_bit(seed, dt, bht, half, offset):
    # kernels.rotary turns (B, H, T, D) heads by positions offset.. (a compiled training step's
    # Rotary forward and backward; the decode step's one new position, in place): the values of
    # its reference and of eager's F.apply_rotary forward and VJP, in both builds, on strided x
    rng = np.random.default_rng(seed)
    b, h, t = bht
    scale = rng.choice([1.0, 1e3], (b, 1, t, 1))
    x = (rng.standard_normal((b, t, h, 2 * half)) * scale.transpose(0, 2, 1, 3)).astype(dt)
    x = x.transpose(0, 2, 1, 3)  # (B, H, T, D) as attention's heads: a view, not contiguous
    x[0, 0, 0, 0] = 0.0
    cos_table, sin_table = F.rotary_tables(offset + t, 2 * half)
    cos, sin = cos_table[offset:].astype(dt), sin_table[offset:].astype(dt)
    want = rotary.rotate_numpy(x, cos, sin)
    xt = Tensor(x.copy(), requires_grad=True, dtype=dt)
    eager = F.apply_rotary(xt, cos_table, sin_table, offset)
    g = rng.standard_normal(eager.shape).astype(dt)
    eager.backward(g)
    np.testing.assert_array_equal(eager.data, want)
    np.testing.assert_array_equal(xt.grad, rotary.rotate_numpy(g, cos, -sin))
    for build in (rotary._rotate.serial, rotary._rotate.parallel):

        def rotate(a, cos, sin, out, build=build):  # rotate_into's dispatch, with this build
            (av, a_swapped), (ov, o_swapped) = map(rotary._position_major, (a, out))
            build(av, a_swapped, cos, sin, ov, o_swapped)

        # out contiguous (the forward), or a transposed view like x (the backward's gradient)
        for out in (np.empty(x.shape, dt), np.empty((b, t, h, 2 * half), dt).transpose(0, 2, 1, 3)):
            out[...] = np.nan
            rotate(x, cos, sin, out)
            np.testing.assert_array_equal(out, want)
            rotate(g, cos, -sin, out)
            np.testing.assert_array_equal(out, xt.grad)
        for inplace in (x.copy(), x.copy(order="K")):  # contiguous, and the transposed view
            rotate(inplace, cos, sin, inplace)
            np.testing.assert_array_equal(inplace, want)
        out = np.full(x.shape, np.nan, dt)
        build(x, False, cos, sin, out, False)  # a strided array as it is (Numba's any-layout build)
        np.testing.assert_array_equal(out, want)


@given(seeds, dtypes, st.integers(1, 70), st.integers(1, 70), st.integers(1, 4))
@settings(deadline=None)
def test_matvec_kernels_match_their_references(seed, dt, n_in, n_out, blocks):
    # the compiled decode step's products on Numba's threads: any number of row blocks (rows
    # not a multiple of the 8 summed at once, more blocks than rows), both builds
    rng = np.random.default_rng(seed)
    scale = rng.choice([1.0, 1e3])
    x = (rng.standard_normal(n_in) * scale).astype(dt)
    w, w_rows = (rng.standard_normal(shape).astype(dt) for shape in ((n_in, n_out), (n_out, n_in)))
    x[0] = 0.0
    tol = scale * np.sqrt(n_in)
    for build in ("serial", "parallel"):
        out, out_rows = np.full(n_out, np.nan, dt), np.full(n_out, np.nan, dt)
        getattr(matvec._x_times_w, build)(x, w, blocks, out)
        getattr(matvec._w_rows_times_x, build)(w_rows, x, out_rows)
        assert_close(out, matvec.matvec_numpy(x, w), dt, tol)
        assert_close(out_rows, matvec.rows_matvec_numpy(w_rows, x), dt, tol)
    out = np.empty(n_out, dt)
    matvec.matvec_into(x, w, out)  # blocks: one per Numba thread
    assert_close(out, matvec.matvec_numpy(x, w), dt, tol)
    with pytest.raises(ValueError, match=r"matvec: .* got x .*, w float32 .*, out"):
        matvec.matvec_into(x.astype(np.float64), w.astype(np.float32), out)
    with pytest.raises(ValueError, match=r"rows_matvec: .*w \(m, n\)"):
        matvec.rows_matvec_into(w, x, np.empty(n_out + 1, dt))


def test_every_kernel_is_in_the_one_table():
    """A kernel written in a topic module but not registered in kernels.KERNELS would be missed by
    the dispatch, the compile probe, the benchmarks and these tests: refuse it here."""
    import importlib

    for topic in {kernel.topic for kernel in kernels.KERNELS.values()}:
        module = importlib.import_module(f"autograd.kernels.{topic}")
        implemented = {n.removesuffix("_numba") for n in dir(module) if n.endswith("_numba")}
        registered = {n for n, kernel in kernels.KERNELS.items() if kernel.topic == topic}
        assert implemented == registered, topic
        for name in registered:
            assert callable(getattr(module, f"{name}_numpy")), f"{name} has no numpy reference"


@pytest.mark.parametrize("dt", [np.float32, np.float64])
@pytest.mark.parametrize("causal", [True, False])
def test_fused_attention_probs_backward_matches_the_softmax_backward(dt, causal):
    # attention._probs_backward (the compiled step's fused attention) is the softmax backward of
    # each row of the kept P, reading only the allowed keys and writing 0 in the masked future
    rng = np.random.default_rng(0)
    heads, t = 3, 37  # not a multiple of the 8 vector lanes
    p = softmax.softmax_forward_numpy(rng.standard_normal((heads * t, t)).astype(dt))
    if causal:
        p = np.where(np.tril(np.ones((t, t), bool))[None].repeat(heads, 0).reshape(-1, t), p, 0)
        p /= p.sum(axis=-1, keepdims=True)
    dp = rng.standard_normal(p.shape).astype(dt)
    want = softmax.softmax_backward_numpy(p, dp) * dt(0.25)
    got = dp.copy()
    attention._probs_backward.serial(p, got, causal, dt(0.25), t)
    assert_close(got, want, dt, 3)
    if causal:
        assert not np.triu(got.reshape(heads, t, t), 1).any()


@pytest.mark.parametrize("dt", [np.float32, np.float64])
@pytest.mark.parametrize("block", [1, 5, 16, 37])
def test_fused_attention_zeroes_the_future_up_to_its_row_block_only(dt, block):
    # the compiled fused attention's two softmax passes write 0 in the masked future of query i
    # up to the end of its row block, min(T, (i // block + 1) * block), where its products stop,
    # and nothing beyond it (arena memory there keeps whatever it held)
    rng = np.random.default_rng(1)
    heads, t = 2, 37
    scores = rng.standard_normal((heads, t, t)).astype(dt)
    stop = np.minimum(t, (np.arange(t) // block + 1) * block)[:, None]
    key = np.arange(t)[None, :]
    allowed, zeroed = key <= np.arange(t)[:, None], (key > np.arange(t)[:, None]) & (key < stop)
    want = softmax.softmax_forward_numpy(np.where(allowed, scores, -np.inf))
    probs, lse = np.where(allowed, scores, np.nan).astype(dt), np.empty((heads, t), dt)
    attention._probs_forward.serial(probs, dt(1.0), True, 0, lse, 0, block)
    assert_close(np.where(allowed, probs, 0), want, dt, 3)
    assert not probs[:, zeroed].any()
    assert np.isnan(probs[:, ~allowed & ~zeroed]).all()
    dp = rng.standard_normal((heads * t, t)).astype(dt)
    got = np.where(np.tile(allowed, (heads, 1)), dp, np.nan).astype(dt)
    p = np.where(np.tile(allowed, (heads, 1)), want.reshape(-1, t), np.nan).astype(dt)
    attention._probs_backward.serial(p, got, True, dt(0.5), block)
    full = np.tile(allowed, (heads, 1))
    ref = softmax.softmax_backward_numpy(want.reshape(-1, t), np.where(full, dp, 0)) * dt(0.5)
    assert_close(np.where(full, got, 0), ref, dt, 3)
    assert not got[np.tile(zeroed, (heads, 1))].any()
    assert np.isnan(got[np.tile(~allowed & ~zeroed, (heads, 1))]).all()


@given(cross_entropy_inputs(), st.sampled_from([1.0, 0.25, -3.0]))
@settings(deadline=None)
def test_cross_entropy_kept_row_stats_match_reference(inputs, grad_scale):
    # the compiled step's pair (fusion=True): the forward keeps each row's max and sum of exp,
    # the backward makes the gradient from them in one pass
    logits, targets, scale = inputs
    dt, n = logits.dtype.type, len(targets)
    loss_ref, d_ref = softmax.cross_entropy_forward_numpy(logits, targets, -100, True, grad_scale)
    row_loss, row_max, row_sum = np.empty(n), np.empty(n, logits.dtype), np.empty(n)
    kept = int(np.count_nonzero(targets != -100))
    inv_n = grad_scale / max(kept, 1)
    d = np.full_like(logits, np.nan)  # every entry must be written, ignored rows with zeros
    for build in ("serial", "parallel"):
        stats = getattr(softmax._cross_entropy_stats_rows, build)
        grad = getattr(softmax._cross_entropy_grad_rows, build)
        stats(logits, targets, -100, row_loss, row_max, row_sum)
        grad(logits, targets, -100, row_max, row_sum, inv_n, d)
        loss = float(np.sum(row_loss)) / kept if kept else 0.0
        tol = 1e-10 if dt == np.float64 else 1e-5
        assert loss == pytest.approx(loss_ref, rel=tol, abs=tol * scale)
        assert_close(d, d_ref, dt, abs(grad_scale) / n)
        assert not d[targets == -100].any()
