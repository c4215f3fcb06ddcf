"""autograd.testing, the public checker: its examples run, it imports without hypothesis, and it
catches a wrong backward of an op written outside glassgrad (CONTRIBUTING.md's Softplus)."""

import doctest
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given

import autograd.testing
import autograd.testing.strategies
from autograd import Function, GradcheckError
from autograd.testing import check_op


def test_module_doctests():
    assert doctest.testmod(autograd.testing).failed == 0
    assert doctest.testmod(autograd.testing.strategies).failed == 0


def test_imports_without_hypothesis():
    blocked = "import sys; sys.modules['hypothesis'] = None; import autograd.testing; print('ok')"
    out = subprocess.run([sys.executable, "-c", blocked], capture_output=True, text=True)
    assert out.stdout.strip() == "ok", out.stderr


class Softplus(Function):
    # y = ln(1 + e^x);  dx = g * sigmoid(x)
    def forward(self, x):
        self.save_for_backward(x)
        return np.logaddexp(0, x)

    def backward(self, g):
        (x,) = self.saved
        return (g / (1 + np.exp(-x)),)


class SoftplusWrongSign(Softplus):
    def backward(self, g):
        (x,) = self.saved
        return (-g / (1 + np.exp(-x)),)


class SoftplusInPlace(Softplus):
    def backward(self, g):
        g *= 1 / (1 + np.exp(-self.saved[0]))  # changes the caller's g
        return (g,)


@given(autograd.testing.strategies.one())
def test_a_user_op_passes(arrays):
    check_op(lambda t: Softplus.apply(t), lambda a: np.logaddexp(0, a), arrays)


def test_a_wrong_user_op_fails():
    x = [np.linspace(-2, 2, 6).reshape(2, 3)]
    with pytest.raises(GradcheckError, match="worst element"):
        check_op(lambda t: SoftplusWrongSign.apply(t), lambda a: np.logaddexp(0, a), x)
    with pytest.raises(AssertionError, match="changed g"):
        check_op(lambda t: SoftplusInPlace.apply(t), lambda a: np.logaddexp(0, a), x)


def test_non_differentiable_inputs_pass_as_arrays():
    seen = []

    def op(x, n):
        seen.append(type(n))
        return x**n

    check_op(op, np.power, [np.ones(3) * 2, np.array([0.0, 1.0, 2.0])], [True, False])
    assert set(seen) == {np.ndarray}  # n is never wrapped in a Tensor
