"""Exercise 5: how its function takes the place of glassgrad's own (models/learn/plug.py)."""

from collections.abc import Callable

import numpy as np

import autograd.functional as F


def _softmax(learner: Callable) -> list:
    def backward(self, g):
        a, axis = self.saved
        return (np.moveaxis(learner(np.moveaxis(a, axis, -1), np.moveaxis(g, axis, -1)), -1, axis),)

    return [(F.Softmax, "backward", backward)]


# the learner's function -> its adapter
ADAPTERS = {"softmax_backward": _softmax}
