"""Exercise 2: how its function takes the place of glassgrad's own (models/learn/plug.py)."""

from collections.abc import Callable

import numpy as np

import autograd.functional as F
import autograd.ops as ops


def _matmul(learner: Callable) -> list:
    own_matmul = ops.MatMul.backward

    def matmul(self, g):
        a, b = self.saved
        if a.ndim != 2 or b.ndim != 2:  # vectors and batches: glassgrad's own (not the exercise)
            return own_matmul(self, g)
        return tuple(learner(a, b, g))

    def linear(self, g):  # x @ W + b with x flattened to rows: the same product (notes 10.4)
        x, weight, has_bias = self.saved
        g2 = g.reshape(-1, g.shape[-1])
        dx, dw = learner(x.reshape(-1, x.shape[-1]), weight, g2)
        dx = np.asarray(dx).reshape(x.shape)
        return (dx, dw, ops.sum_to(g2, weight.shape[1:], copy=True)) if has_bias else (dx, dw)

    return [(ops.MatMul, "backward", matmul), (F.Linear, "backward", linear)]


# the learner's function -> its adapter
ADAPTERS = {"matmul_backward": _matmul}
