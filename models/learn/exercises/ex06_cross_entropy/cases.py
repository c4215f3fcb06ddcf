"""Exercise 6's probes and engine cases: log-softmax (a masked entry too) and cross-entropy with
an ignored target."""

import numpy as np

import autograd.functional as F
from autograd.testing.references import np_cross_entropy, np_log_softmax
from models.learn.checks import Case


def probes(p):
    targets = np.array([1, -100, 4, 0])
    return {
        "log_softmax_backward": [(np_log_softmax(p.logits, -1), p.r.standard_normal((3, 5)))],
        "cross_entropy_backward": [(p.cross_entropy_logits, targets, -100)],
    }


def cases(r):
    n = r.standard_normal
    targets = np.array([[1, -100, 3], [0, 2, 2]])
    x = n((2, 4)) * 3
    x[0, 1] = -np.inf
    return [
        Case(
            "F.log_softmax(x, -1)",
            lambda t: F.log_softmax(t, -1),
            lambda a: np_log_softmax(a, -1),
            [x],
        ),
        Case(
            "F.cross_entropy(logits, targets)",
            lambda t: F.cross_entropy(t, targets),
            lambda a: np_cross_entropy(a, targets),
            [n((2, 3, 4))],
        ),
    ]
