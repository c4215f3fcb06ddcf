"""Exercise 2's probes and engine cases: every 2-D product, nn.Linear's too."""

import numpy as np

import autograd.functional as F
from models.learn.checks import Case

PARTS = {"matmul_backward": ("da", "db")}


def probes(p):
    n = p.r.standard_normal
    return {
        "matmul_backward": [
            (n((3, 3)), n((3, 3)), n((3, 3))),
            (n((2, 4)), n((4, 3)), n((2, 3))),
        ],
    }


def cases(r):
    n = r.standard_normal
    return [
        Case("a @ b", lambda a, b: a @ b, np.matmul, [n((3, 4)), n((4, 2))]),
        Case("a @ b", lambda a, b: a @ b, np.matmul, [n((3, 3)), n((3, 3))]),
        Case(
            "F.linear(x, w, b)",
            F.linear,
            lambda x, w, b: x @ w + b,
            [n((2, 3, 4)), n((4, 5)), n(5)],
        ),
    ]
