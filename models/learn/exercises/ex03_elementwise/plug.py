"""Exercise 3: how its functions take the place of glassgrad's own (models/learn/plug.py)."""

from collections.abc import Callable

import numpy as np

import autograd.ops as ops


def _div(learner: Callable) -> list:
    def backward(self, g):
        a, b = self.saved
        da, db = learner(a, b, g)
        return ops.sum_to(np.asarray(da), a.shape), ops.sum_to(np.asarray(db), b.shape)

    return [(ops.Div, "backward", backward)]


def _tanh(learner: Callable) -> list:
    return [(ops.Tanh, "backward", lambda self, g: (learner(self.saved[0], g),))]


def _sum(learner: Callable) -> list:
    def backward(self, g):
        shape, axes, keepdims = self.saved
        return (learner(g, shape, axes, keepdims),)

    return [(ops.Sum, "backward", backward)]


def _max(learner: Callable) -> list:
    def backward(self, g):
        a, _, axes, keepdims = self.saved
        return (learner(a, g, axes, keepdims),)

    return [(ops.Max, "backward", backward)]


# the learner's function -> its adapter
ADAPTERS = {
    "div_backward": _div,
    "tanh_backward": _tanh,
    "sum_backward": _sum,
    "max_backward": _max,
}
