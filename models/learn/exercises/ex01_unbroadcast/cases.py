"""Exercise 1's probes and engine cases: every binary op broadcasts through unbroadcast."""

import numpy as np

from models.learn.checks import Case


def probes(p):
    n = p.r.standard_normal
    return {
        "unbroadcast": [
            (n((2, 3)), (3,)),
            (n((4, 2, 3)), (2, 1)),
            (n((2, 3)), (2, 3)),
            (n((3, 2)), ()),
        ],
    }


def cases(r):
    n = r.standard_normal
    return [
        Case("a + b", lambda a, b: a + b, np.add, [n((2, 3)), n(3)]),
        Case("a * b", lambda a, b: a * b, np.multiply, [n((2, 1)), n((1, 3))]),
        Case("a - b", lambda a, b: a - b, np.subtract, [n((4, 1, 3)), n((2, 3))]),
        Case("a + b", lambda a, b: a + b, np.add, [n(()), n((2, 2))]),
    ]
