"""Exercise 8's classic mistakes, each as the wrong function it amounts to."""

import numpy as np

from models.learn.exercises.ex08_embedding.solution import gather_backward


def _embedding_assigned(idx, g, vocab_size):
    dE = np.zeros((vocab_size, g.shape[-1]))
    dE[idx.reshape(-1)] += g.reshape(-1, g.shape[-1])
    return dE


def _gather_put(index, g, shape, axis):
    dx = np.zeros(shape)
    np.put_along_axis(dx, index, g, axis=axis)
    return dx


def _gather_last_axis(index, g, shape, axis):
    return gather_backward(index, g, shape, len(shape) - 1)


MISTAKES = {
    "embedding_backward": [("d_not_accumulated", _embedding_assigned)],
    "gather_backward": [
        ("d_not_accumulated", _gather_put),
        ("d_gather_axis", _gather_last_axis),
    ],
}
