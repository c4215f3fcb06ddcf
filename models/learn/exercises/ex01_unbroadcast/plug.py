"""Exercise 1: how its function takes the place of glassgrad's own (models/learn/plug.py)."""

from collections.abc import Callable

import numpy as np

import autograd.ops as ops
import autograd.tensor as tensor


def _unbroadcast(learner: Callable) -> list:
    def unbroadcast(grad, shape, copy=False):
        if not isinstance(grad, np.ndarray):  # a Tensor (create_graph): not the learner's case
            return tensor.unbroadcast(grad, shape, copy)
        out = np.asarray(learner(grad, tuple(shape)))
        return out.copy() if copy and np.shares_memory(out, grad) else out

    return [(ops, "unbroadcast", unbroadcast)]


# the learner's function -> its adapter
ADAPTERS = {"unbroadcast": _unbroadcast}
