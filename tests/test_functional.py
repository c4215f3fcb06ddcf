"""The Transformer ops of autograd.functional in the central-difference property suite.

Each op runs on both kernel paths (Numba and the numpy reference); hypothesis draws shapes, axes,
large magnitudes (logits up to +-1e4) and -inf masks; forwards are compared with plain numpy.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from opcheck import check_op

import autograd
import autograd.functional as F
from autograd import Tensor, kernels

BACKENDS = pytest.mark.parametrize("path", ["numba", "numpy"])
SHAPE = hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=5)


def seeded(draw):
    return np.random.default_rng(draw(st.integers(0, 2**32 - 1)))


# --- plain numpy formulas the forwards must equal ---------------------------------------------


def np_softmax(x, axis):
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    e = np.exp(x - m)
    s = e.sum(axis=axis, keepdims=True)
    return np.divide(e, s, out=np.zeros_like(e), where=s > 0)


def np_logsumexp(x, axis, keepdims=False):
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    with np.errstate(divide="ignore"):
        out = np.log(np.exp(x - m).sum(axis=axis, keepdims=True)) + m
    return out if keepdims else np.squeeze(out, axis=axis)


def np_layer_norm(x, w, b, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def np_attention(q, k, v, causal):
    tq, tk = q.shape[2], k.shape[2]
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    if causal:
        s = np.where(np.tril(np.ones((tq, tk), bool), tk - tq), s, -np.inf)
    return np_softmax(s, -1) @ v


# --- strategies -------------------------------------------------------------------------------


@st.composite
def logits_case(draw, allow_inf=True):
    """An array, an axis, and values that may be huge (+-1e4) or contain -inf (whole slices too)."""
    shape = draw(SHAPE)
    rng = seeded(draw)
    x = rng.standard_normal(shape) * draw(st.sampled_from([1.0, 3.0, 1e4]))
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    if allow_inf and draw(st.booleans()):
        x[rng.random(shape) < 0.3] = -np.inf
        if draw(st.booleans()):  # an entirely -inf slice along the axis
            index = [slice(None)] * len(shape)
            index[axis] = slice(None)
            for d in range(len(shape)):
                if d != axis % len(shape):
                    index[d] = 0
            x[tuple(index)] = -np.inf
    return x, axis


@BACKENDS
@given(case=logits_case())
def test_softmax(path, case):
    x, axis = case
    with kernels.use_backend(path):
        check_op(lambda t: F.softmax(t, axis), lambda a: np_softmax(a, axis), [x])


@BACKENDS
@given(case=logits_case())
def test_log_softmax(path, case):
    x, axis = case

    def reference(a):
        with np.errstate(invalid="ignore"):
            out = a - np_logsumexp(a, axis, keepdims=True)
        return np.where(np.isneginf(a), -np.inf, out)

    with kernels.use_backend(path):
        check_op(lambda t: F.log_softmax(t, axis), reference, [x])


@BACKENDS
@given(case=logits_case(), keepdims=st.booleans())
def test_logsumexp(path, case, keepdims):
    x, axis = case
    with kernels.use_backend(path):
        check_op(
            lambda t: F.logsumexp(t, axis, keepdims), lambda a: np_logsumexp(a, axis, keepdims), [x]
        )


def test_fully_masked_softmax_slice_is_zero_not_nan(backend):
    x = Tensor([[-np.inf, -np.inf], [0.0, -np.inf]], requires_grad=True)
    y = F.softmax(x)
    np.testing.assert_array_equal(y.data, [[0.0, 0.0], [1.0, 0.0]])
    (y * Tensor([[1.0, 2.0], [3.0, 4.0]])).sum().backward()
    assert np.isfinite(x.grad).all()
    np.testing.assert_array_equal(F.logsumexp(x).data, [-np.inf, 0.0])
    np.testing.assert_array_equal(F.log_softmax(x).data[0], [-np.inf, -np.inf])


@st.composite
def norm_case(draw):
    shape = draw(SHAPE)
    rng = seeded(draw)
    # (not 100: with C = 2 the output is +-1 whatever x is, and the only x-dependence left is
    # through eps at 1e-9 of the variance, below what central differences resolve)
    x = rng.standard_normal(shape) * draw(st.sampled_from([0.1, 1.0, 10.0]))
    # Rows whose values nearly coincide make LayerNorm ill-conditioned (its derivatives grow like
    # 1/spread): central differences cannot resolve them; test_reliability covers them instead.
    assume(shape[-1] == 1 or np.ptp(x, axis=-1).min() > 0.2 * np.abs(x).max())
    return x, rng.standard_normal(shape[-1:]), rng.standard_normal(shape[-1:])


@BACKENDS
@given(case=norm_case())
def test_layer_norm(path, case):
    x, w, b = case
    with kernels.use_backend(path):
        check_op(F.layer_norm, np_layer_norm, [x, w, b], forward_rtol=1e-9)


@BACKENDS
@given(case=norm_case(), offset=st.sampled_from([1e3, 1e4]))
def test_layer_norm_float32_with_a_large_offset(path, case, offset):
    # A small spread on a large offset: E[x^2] - E[x]^2 would cancel catastrophically in float32.
    x, w, b = case
    x = x / np.abs(x).max() + offset
    autograd.set_default_dtype(np.float32)
    with kernels.use_backend(path):
        y = F.layer_norm(Tensor(x), Tensor(w), Tensor(b)).data
    expected = np_layer_norm(x.astype(np.float32).astype(np.float64), w, b)
    np.testing.assert_allclose(y, expected, atol=2e-2 if offset == 1e4 else 2e-3)


@given(case=norm_case())
def test_rms_norm(case):
    x, w, _ = case

    def reference(a, weight):
        return a / np.sqrt((a * a).mean(-1, keepdims=True) + 1e-5) * weight

    check_op(F.rms_norm, reference, [x, w])


@st.composite
def gather_case(draw):
    shape = draw(SHAPE)
    rng = seeded(draw)
    axis = draw(st.integers(0, len(shape) - 1))
    index_shape = list(shape)
    index_shape[axis] = draw(st.integers(1, 6))  # repeats are likely: they must accumulate
    return rng.standard_normal(shape), rng.integers(0, shape[axis], index_shape), axis


@given(case=gather_case())
def test_gather(case):
    x, index, axis = case
    check_op(lambda t: F.gather(t, index, axis), lambda a: np.take_along_axis(a, index, axis), [x])


@st.composite
def embedding_case(draw):
    rng = seeded(draw)
    vocab, dim = draw(st.integers(1, 6)), draw(st.integers(1, 5))
    idx_shape = draw(hnp.array_shapes(min_dims=0, max_dims=2, min_side=1, max_side=6))
    return rng.standard_normal((vocab, dim)), rng.integers(0, vocab, idx_shape)


@BACKENDS
@given(case=embedding_case())
def test_embedding(path, case):
    weight, idx = case
    with kernels.use_backend(path):
        check_op(lambda w: F.embedding(w, idx), lambda w: w[idx], [weight])


@st.composite
def cross_entropy_case(draw):
    rng = seeded(draw)
    lead = draw(hnp.array_shapes(min_dims=1, max_dims=2, min_side=1, max_side=5))
    vocab = draw(st.integers(1, 7))
    logits = rng.standard_normal((*lead, vocab)) * draw(st.sampled_from([1.0, 10.0, 1e4]))
    targets = rng.integers(0, vocab, lead)
    targets[rng.random(lead) < draw(st.sampled_from([0.0, 0.3, 1.0]))] = -100
    return logits, targets


@BACKENDS
@given(case=cross_entropy_case())
def test_cross_entropy(path, case):
    logits, targets = case

    def reference(z):
        keep = targets != -100
        if not keep.any():
            return np.float64(0.0)
        logp = z - np_logsumexp(z, -1, keepdims=True)
        picked = np.take_along_axis(logp, np.where(keep, targets, 0)[..., None], -1)[..., 0]
        return -picked[keep].mean()

    with kernels.use_backend(path):
        check_op(lambda z: F.cross_entropy(z, targets), reference, [logits], forward_rtol=1e-9)


def test_cross_entropy_all_ignored_is_zero_with_zero_gradient(backend):
    logits = Tensor(np.ones((2, 3)), requires_grad=True)
    loss = F.cross_entropy(logits, np.array([-100, -100]))
    assert loss.item() == 0.0
    loss.backward()
    np.testing.assert_array_equal(logits.grad, 0.0)


def test_cross_entropy_gradient_is_p_minus_onehot_over_n(backend):
    # notes 10.3: d loss / d logits = (p - onehot(y)) / n
    z = np.array([[1.0, 2.0, 0.5], [0.0, 0.0, 0.0]])
    logits = Tensor(z, requires_grad=True, dtype=np.float64)
    F.cross_entropy(logits, np.array([2, 0])).backward()
    expected = (np_softmax(z, -1) - np.eye(3)[[2, 0]]) / 2
    np.testing.assert_allclose(logits.grad, expected, rtol=1e-12)


@pytest.mark.parametrize(
    ("approximate", "path"), [("tanh", "numba"), ("tanh", "numpy"), ("none", "")]
)
@given(shape=SHAPE, data=st.data())
def test_gelu(approximate, path, shape, data):
    scale = data.draw(st.sampled_from([1.0, 3.0, 30.0]))
    x = np.random.default_rng(data.draw(st.integers(0, 99))).standard_normal(shape) * scale

    def reference(a):
        if approximate == "tanh":
            return 0.5 * a * (1 + np.tanh(math.sqrt(2 / math.pi) * (a + 0.044715 * a**3)))
        return a * 0.5 * (1 + np.vectorize(math.erf)(a / math.sqrt(2)))

    with kernels.use_backend(path or "numba"):
        check_op(lambda t: F.gelu(t, approximate), reference, [x])


@given(shape=SHAPE, p=st.sampled_from([0.1, 0.5, 0.9]), seed=st.integers(0, 99))
def test_dropout(shape, p, seed):
    x = np.random.default_rng(seed).standard_normal(shape)
    keep = np.random.default_rng(seed).random(shape) >= p

    check_op(
        lambda t: F.dropout(t, p, True, rng=np.random.default_rng(seed)),
        lambda a: a * keep / (1 - p),
        [x],
    )


def test_dropout_is_identity_in_eval_and_inverted_in_training():
    x = Tensor(np.ones(20000))
    assert F.dropout(x, 0.3, training=False) is x
    y = F.dropout(x, 0.3, training=True, rng=np.random.default_rng(1)).data
    assert set(np.unique(y)) <= {0.0, np.float32(1 / 0.7)}
    assert abs(y.mean() - 1.0) < 0.03  # the expectation is kept (inverted scaling)
    assert not F.dropout(x, 1.0, True).data.any()
    with pytest.raises(ValueError, match="dropout: p must be in"):
        F.dropout(x, 1.5, True)


@st.composite
def attention_case(draw):
    rng = seeded(draw)
    b, h = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    tk = draw(st.sampled_from([1, 2, 3, 5, 8]))
    tq = draw(st.integers(1, tk))  # Tq < Tk: a KV-cache step (bottom-right aligned causal)
    d = draw(st.sampled_from([1, 2, 3, 5]))
    scale = draw(st.sampled_from([1.0, 3.0]))
    q = rng.standard_normal((b, h, tq, d)) * scale
    k = rng.standard_normal((b, h, tk, d)) * scale
    return q, k, rng.standard_normal((b, h, tk, d)), draw(st.booleans())


@BACKENDS
@given(case=attention_case())
def test_scaled_dot_product_attention(path, case):
    q, k, v, causal = case
    with kernels.use_backend(path):
        check_op(
            lambda a, b, c: F.scaled_dot_product_attention(a, b, c, causal=causal),
            lambda a, b, c: np_attention(a, b, c, causal),
            [q, k, v],
            forward_rtol=1e-9,
        )


@given(case=attention_case(), seed=st.integers(0, 99))
def test_attention_with_explicit_mask(case, seed):
    q, k, v, causal = case
    allowed = np.random.default_rng(seed).random((q.shape[2], k.shape[2])) < 0.6
    allowed[:, 0] = True  # every row keeps at least one key

    def reference(a, b, c):
        s = a @ np.swapaxes(b, -1, -2) / math.sqrt(a.shape[-1])
        rule = allowed & np.tril(np.ones(allowed.shape, bool), b.shape[2] - a.shape[2])
        return np_softmax(np.where(rule, s, -np.inf), -1) @ c

    check_op(
        lambda a, b, c: F.scaled_dot_product_attention(a, b, c, mask=allowed),
        reference,
        [q, k, v],
    )


def test_attention_rows_with_no_allowed_key_are_an_error():
    q = Tensor(np.ones((1, 1, 2, 4)))
    with pytest.raises(ValueError, match=r"query row \(0, 0, 1\) has no allowed key"):
        F.scaled_dot_product_attention(q, q, q, mask=np.array([[True, False], [False, False]]))
    with pytest.raises(ValueError, match="must be 4-d"):
        F.scaled_dot_product_attention(q[0], q[0], q[0])


def test_index_errors_are_clear():
    w = Tensor(np.ones((4, 3)), requires_grad=True)
    with pytest.raises(IndexError, match=r"embedding: id 4 is out of range \[0, 4\)"):
        F.embedding(w, np.array([0, 4]))
    with pytest.raises(IndexError, match="embedding: id -1"):
        F.embedding(w, np.array([-1]))
    with pytest.raises(TypeError, match="embedding: token ids must be integers.*float"):
        F.embedding(w, np.array([1.0]))
    with pytest.raises(IndexError, match="gather: index 3 is out of range"):
        F.gather(w, np.array([[3]]), axis=1)
    with pytest.raises(
        ValueError, match=r"cross_entropy: target 5 at \(2,\) is out of range \[0, 3\)"
    ):
        F.cross_entropy(w, np.array([0, 1, 5, 2]))
    with pytest.raises(ValueError, match=r"cross_entropy: targets \(3,\) must have"):
        F.cross_entropy(w, np.array([0, 1, 2]))


def test_ops_keep_float32():
    autograd.set_default_dtype(np.float32)
    x = Tensor(np.random.default_rng(0).standard_normal((2, 3, 4)), requires_grad=True)
    for y in (F.softmax(x), F.log_softmax(x), F.gelu(x), F.layer_norm(x)):
        assert y.dtype == np.float32


@given(case=attention_case(), dv=st.integers(1, 4))
def test_attention_value_width_may_differ(case, dv):
    # notes ch. 11 has d_k = 1 and d_v = 2: V's width is independent of Q/K's
    q, k, v, causal = case
    v = np.resize(v, v.shape[:3] + (dv,))
    check_op(
        lambda a, b, c: F.scaled_dot_product_attention(a, b, c, causal=causal),
        lambda a, b, c: np_attention(a, b, c, causal),
        [q, k, v],
    )
