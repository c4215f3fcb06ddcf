"""Exercise 6: how its functions take the place of glassgrad's own (models/learn/plug.py)."""

from collections.abc import Callable

import numpy as np

import autograd.functional as F


def _log_softmax(learner: Callable) -> list:
    def backward(self, g):
        y, axis = self.saved
        return (np.moveaxis(learner(np.moveaxis(y, axis, -1), np.moveaxis(g, axis, -1)), -1, axis),)

    return [(F.LogSoftmax, "backward", backward)]


def _cross_entropy(learner: Callable) -> list:
    def backward(self, g):
        logits, targets, ignore_index = self.saved
        rows = logits.reshape(-1, logits.shape[-1])
        dlogits = learner(rows, targets.reshape(-1), ignore_index) * g
        return (np.asarray(dlogits).reshape(logits.shape),)

    return [(F.CrossEntropy, "backward", backward)]


# the learner's function -> its adapter
ADAPTERS = {
    "log_softmax_backward": _log_softmax,
    "cross_entropy_backward": _cross_entropy,
}
