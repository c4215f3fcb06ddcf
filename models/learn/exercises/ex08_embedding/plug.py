"""Exercise 8: how its functions take the place of glassgrad's own (models/learn/plug.py)."""

from collections.abc import Callable

import numpy as np

import autograd.functional as F


def _embedding(learner: Callable) -> list:
    def backward(self, g):
        idx, vocab_size = self.saved
        return (np.asarray(learner(idx, g, vocab_size), dtype=g.dtype),)

    return [(F.Embedding, "backward", backward)]


def _gather(learner: Callable) -> list:
    own_gather = F.Gather.backward

    def backward(self, g):
        shape, index, axis = self.saved
        axis %= len(shape)
        others = [d for d in range(len(shape)) if d != axis]
        if index.shape != g.shape or any(g.shape[d] != shape[d] for d in others):
            return own_gather(self, g)  # broadcast size-1 dims: glassgrad's own (not the exercise)
        return (np.asarray(learner(index, g, shape, axis), dtype=g.dtype),)

    return [(F.Gather, "backward", backward)]


# the learner's function -> its adapter
ADAPTERS = {
    "embedding_backward": _embedding,
    "gather_backward": _gather,
}
