"""autograd.functional's edge cases beyond the property suite (tests/op_cases.py holds the
property cases of every op on both kernel paths: shapes, axes, logits up to +-1e4, -inf masks)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import autograd
import autograd.functional as F
from autograd import Tensor, kernels
from autograd.testing.references import np_layer_norm, np_softmax
from autograd.testing.strategies import norm_inputs

BACKENDS = pytest.mark.parametrize("path", ["numba", "numpy"])


def test_fully_masked_softmax_slice_is_zero_not_nan(backend):
    x = Tensor([[-np.inf, -np.inf], [0.0, -np.inf]], requires_grad=True)
    y = F.softmax(x)
    np.testing.assert_array_equal(y.data, [[0.0, 0.0], [1.0, 0.0]])
    (y * Tensor([[1.0, 2.0], [3.0, 4.0]])).sum().backward()
    assert np.isfinite(x.grad).all()
    np.testing.assert_array_equal(F.logsumexp(x).data, [-np.inf, 0.0])
    np.testing.assert_array_equal(F.log_softmax(x).data[0], [-np.inf, -np.inf])


@BACKENDS
@given(case=norm_inputs(), offset=st.sampled_from([1e3, 1e4]))
def test_layer_norm_float32_with_a_large_offset(path, case, offset):
    # A small spread on a large offset: E[x^2] - E[x]^2 would cancel catastrophically in float32.
    x, w, b = case
    x = x / np.abs(x).max() + offset
    autograd.set_default_dtype(np.float32)
    with kernels.use_backend(path):
        y = F.layer_norm(Tensor(x), Tensor(w), Tensor(b)).data
    expected = np_layer_norm(x.astype(np.float32).astype(np.float64), w, b)
    np.testing.assert_allclose(y, expected, atol=2e-2 if offset == 1e4 else 2e-3)


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


def test_dropout_is_identity_in_eval_and_inverted_in_training():
    x = Tensor(np.ones(20000))
    assert F.dropout(x, 0.3, training=False) is x
    y = F.dropout(x, 0.3, training=True, rng=np.random.default_rng(1)).data
    assert set(np.unique(y)) <= {0.0, np.float32(1 / 0.7)}
    assert abs(y.mean() - 1.0) < 0.03  # the expectation is kept (inverted scaling)
    assert not F.dropout(x, 1.0, True).data.any()
    with pytest.raises(ValueError, match="dropout: p must be in"):
        F.dropout(x, 1.5, True)


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
