"""Exercise 5's probes and engine cases: softmax along either axis, masked entries included."""

import numpy as np

import autograd.functional as F
from autograd.testing.references import np_softmax
from models.learn.checks import Case


def probes(p):
    return {"softmax_backward": [(np_softmax(p.logits, -1), p.r.standard_normal((3, 5)))]}


def cases(r):
    n = r.standard_normal
    x = n((3, 5)) * 3
    x[1, [0, 2]] = -np.inf
    return [
        Case("F.softmax(x, -1)", lambda t: F.softmax(t, -1), lambda a: np_softmax(a, -1), [x]),
        Case(
            "F.softmax(x, 0)",
            lambda t: F.softmax(t, 0),
            lambda a: np_softmax(a, 0),
            [n((4, 2))],
        ),
    ]
