"""Forward mode's API (autograd/forward_ad.py): dual tensors, jvp by the rules, jacfwd/jacrev and
hvp forward-over-reverse, each checked against an independent answer (the transpose trick, reverse
over reverse, central differences). The rules themselves: test_forward_mode_property.py."""

from __future__ import annotations

import numpy as np
import pytest

import autograd
import autograd.functional as F
from autograd import Function, Tensor, forward_ad
from autograd.higher_order import hvp_by_double_backward, jvp_by_transpose
from models.architectures.gpt import GPT, GPTConfig


def rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


def mlp(x, w1, w2):
    return F.layer_norm(F.gelu(x @ w1), None, None) @ w2


def test_dual_tensors_carry_the_tangent_through_ordinary_code(float64):
    x0, v = rand(3), rand(3, seed=1)
    with forward_ad.dual_level():
        x = forward_ad.make_dual(x0, v)
        y = (x * x).sum() + x.exp().sum()
        value, tangent = forward_ad.unpack_dual(y)
        assert y.op is None  # nothing required grad: nothing was recorded
        assert forward_ad.unpack_dual(Tensor(1.0))[1] is None  # a constant carries no tangent
    assert value.item() == pytest.approx((x0 * x0).sum() + np.exp(x0).sum())
    np.testing.assert_allclose(tangent, 2 * x0 @ v + np.exp(x0) @ v, rtol=1e-12)
    with forward_ad.dual_level():  # the tangent of a closed level is gone
        assert forward_ad.unpack_dual(x)[1] is None


def test_dual_level_errors_name_the_problem():
    with pytest.raises(RuntimeError, match="no dual level is open"):
        forward_ad.make_dual(np.ones(2), np.ones(2))
    with forward_ad.dual_level():
        with pytest.raises(RuntimeError, match="already open"), forward_ad.dual_level():
            pass
        with pytest.raises(ValueError, match=r"tangent has shape \(3,\) but the primal \(2,\)"):
            forward_ad.make_dual(np.ones(2), np.ones(3))

        x = forward_ad.make_dual(np.ones(2), np.ones(2))
        with pytest.raises(RuntimeError, match="in-place change of a dual tensor"):
            x[0] = 3.0

    class NoRule(Function):
        def forward(self, a):
            return a * 2

    with forward_ad.dual_level(), pytest.raises(NotImplementedError, match="NoRule has no JVP"):
        NoRule.apply(forward_ad.make_dual(np.ones(2), np.ones(2)))

    class WrongShape(NoRule):
        def jvp(self, out, a_dot):
            return a_dot.sum()

    with forward_ad.dual_level(), pytest.raises(RuntimeError, match=r"jvp of WrongShape: .* \(\)"):
        WrongShape.apply(forward_ad.make_dual(np.ones(2), np.ones(2)))


def test_jvp_by_the_rules_equals_the_transpose_trick(float64):
    primals = (rand(4, 3), rand(3, 5, seed=1), rand(5, 2, seed=2))
    tangents = tuple(rand(*p.shape, seed=10 + i) for i, p in enumerate(primals))

    def fn(x, w1, w2):  # several outputs, one of them constant
        y = mlp(x, w1, w2)
        return F.softmax(y), Tensor(np.ones(2)), F.cross_entropy(y, np.array([0, 1, 1, 0]))

    outs, dots = autograd.jvp(fn, primals, tangents)
    ref_outs, ref_dots = jvp_by_transpose(fn, primals, tangents)
    for o, r in zip(outs, ref_outs, strict=True):
        np.testing.assert_array_equal(o.data, r.data)
    for d, r in zip(dots, ref_dots, strict=True):
        np.testing.assert_allclose(d.data, r.data, rtol=1e-10, atol=1e-14)
    np.testing.assert_array_equal(dots[1].data, [0.0, 0.0])


def test_jacfwd_and_jacrev_agree_with_central_differences(float64):
    x = rand(2, 3)

    def fn(t):  # (2, 3) -> (3, 4)
        return F.softmax(t.T @ Tensor(rand(2, 4, seed=1)) * t.sum(), axis=0)

    forward, reverse = autograd.jacfwd(fn, x), autograd.jacrev(fn, x)
    assert forward.shape == reverse.shape == (3, 4, 2, 3)
    np.testing.assert_allclose(forward.data, reverse.data, rtol=1e-12, atol=1e-15)
    eps, numeric = 1e-6, np.zeros((3, 4, 2, 3))
    for index in np.ndindex(x.shape):
        e = np.zeros_like(x)
        e[index] = eps
        numeric[(..., *index)] = (fn(Tensor(x + e)).data - fn(Tensor(x - e)).data) / (2 * eps)
    np.testing.assert_allclose(forward.data, numeric, rtol=1e-7, atol=1e-9)


def test_hvp_forward_over_reverse_equals_reverse_over_reverse_on_a_gpt(float64):
    model = GPT(GPTConfig(vocab_size=7, block_size=5, n_layer=2, n_head=2, n_embd=8))
    rng = np.random.default_rng(3)
    with autograd.no_grad():
        for p in model.parameters():
            p.data = p.data + rng.normal(0, 0.3, p.shape)
    idx, targets = rng.integers(0, 7, (2, 5)), rng.integers(0, 7, (2, 5))
    params = list(model.parameters())
    v = [rng.standard_normal(p.shape) for p in params]

    def loss(*_):
        return model(idx, targets)[1]

    value, hv = autograd.hvp(loss, params, v)
    ref_value, ref_hv = hvp_by_double_backward(loss, params, v)
    assert value.item() == ref_value.item()
    scale = max(np.abs(r.data).max() for r in ref_hv)
    for h, r in zip(hv, ref_hv, strict=True):
        np.testing.assert_allclose(h.data, r.data, rtol=1e-9, atol=1e-12 * scale)
    assert all(p.grad is None and p._tangent is None for p in params)  # nothing left behind
