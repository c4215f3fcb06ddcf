"""Exercise 3's probes and engine cases: division, tanh, sum and max (ties included)."""

import numpy as np

from models.learn.checks import Case

PARTS = {"div_backward": ("da", "db")}


def probes(p):
    r, n = p.r, p.r.standard_normal
    ties = np.array([[1.0, 3.0, 3.0, 3.0], [2.0, 0.0, 2.0, -1.0]])
    return {
        "div_backward": [(r.uniform(-2, 2, (2, 3)), r.uniform(0.5, 2, (2, 3)), n((2, 3)))],
        "tanh_backward": [(np.tanh(n((2, 3))), n((2, 3)))],
        "sum_backward": [
            (n((2,)), (2, 3), (1,), False),
            (n((1, 3)), (2, 3), (0,), True),
            (np.array(1.5), (2, 3), (0, 1), False),
        ],
        "max_backward": [
            (ties, n(2), (1,), False),
            (ties, n((1, 4)), (0,), True),
        ],
    }


def cases(r):
    n = r.standard_normal
    # Two-way ties: there the even split is what central differences see (a three-way tie,
    # where they see 1/2 and not 1/3, is checked by the probes against the reference).
    ties = np.array([[1.0, 3.0, 3.0], [2.0, 0.5, 2.0]])
    return [
        Case("a / b", lambda a, b: a / b, np.divide, [n((2, 3)), r.uniform(0.5, 2, 3)]),
        Case("tanh(x)", lambda x: x.tanh(), np.tanh, [n((2, 3)) * 2]),
        Case("x.sum(axis=1)", lambda x: x.sum(axis=1), lambda a: a.sum(axis=1), [n((2, 3))]),
        Case(
            "x.sum(axis=-1, keepdims=True)",
            lambda x: x.sum(axis=-1, keepdims=True),
            lambda a: a.sum(axis=-1, keepdims=True),
            [n((2, 3, 2))],
        ),
        Case("x.max(axis=1)", lambda x: x.max(axis=1), lambda a: a.max(axis=1), [ties]),
        Case("x.max()", lambda x: x.max(), np.max, [n((2, 3))]),
    ]
