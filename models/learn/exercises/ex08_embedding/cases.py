"""Exercise 8's probes and engine cases: embedding and gather with repeated ids."""

import numpy as np

import autograd.functional as F
from models.learn.checks import Case


def probes(p):
    n = p.r.standard_normal
    ids = np.array([[0, 2, 0], [3, 0, 2]])  # 0 and 2 repeat
    return {
        "embedding_backward": [(ids, n((2, 3, 2)), 5)],
        "gather_backward": [
            (np.array([[0, 2, 0, 0], [1, 1, 2, 0]]), n((2, 4)), (2, 3), 1),
            (np.array([[1, 1, 0]]), n((1, 3)), (2, 3), 0),
        ],
    }


def cases(r):
    n = r.standard_normal
    ids = np.array([[1, 1, 3], [0, 1, 3]])
    index = np.array([[2, 0, 2, 2], [1, 1, 0, 1], [0, 0, 0, 2]])  # repeats along each row
    return [
        Case("F.embedding(E, ids)", lambda w: F.embedding(w, ids), lambda w: w[ids], [n((4, 3))]),
        Case(
            "F.gather(x, index, axis=1)",
            lambda x: F.gather(x, index, 1),
            lambda a: np.take_along_axis(a, index, 1),
            [n((3, 3))],
        ),
        Case(
            "F.gather(x, index, axis=-2)",
            lambda x: F.gather(x, index[:2], -2),
            lambda a: np.take_along_axis(a, index[:2], -2),
            [n((3, 4))],
        ),
    ]
