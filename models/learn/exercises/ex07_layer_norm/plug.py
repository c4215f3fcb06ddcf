"""Exercise 7: how its function takes the place of glassgrad's own (models/learn/plug.py)."""

from collections.abc import Callable

import autograd.functional as F


def _layer_norm(learner: Callable) -> list:
    def backward(self, g):
        x, weight, _, _, eps = self.saved
        return tuple(learner(x, weight, g, eps))

    return [(F.LayerNorm, "backward", backward)]


# the learner's function -> its adapter
ADAPTERS = {"layer_norm_backward": _layer_norm}
