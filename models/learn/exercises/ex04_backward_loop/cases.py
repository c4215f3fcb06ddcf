"""Exercise 4's engine cases (graphs where a tensor is used more than once) and its own check:
the loop probes of diagnoses.py, whose answers tell the classic mistakes apart."""

import numpy as np

import autograd.functional as F
from autograd.testing.references import np_layer_norm
from models.learn.checks import Case
from models.learn.exercises.ex04_backward_loop.diagnoses import loop_probes
from models.learn.plug import plugged


def probes(p):
    return {}  # run_backward is probed through the engine: see check


def check(functions, lang):
    with plugged(functions):
        loop_probes(lang)


def cases(r):
    n = r.standard_normal

    def diamond(x, w):
        h = (x @ w).tanh()
        return h * h + h.sum(axis=-1, keepdims=True) * x.sum()

    def np_diamond(x, w):
        h = np.tanh(x @ w)
        return h * h + h.sum(axis=-1, keepdims=True) * x.sum()

    def chain(x):
        a = x * 2.0
        b = a * a
        return (a + b) * b

    def np_chain(x):
        a = x * 2.0
        return (a + a * a) * (a * a)

    return [
        Case(
            "h * h + h.sum() * x.sum(), h = tanh(x @ w)",
            diamond,
            np_diamond,
            [n((2, 3)), n((3, 3))],
        ),
        Case("(a + a²) a², a = 2x", chain, np_chain, [n((3,))]),
        Case(
            "F.layer_norm(x, w, b).sum() twice",
            lambda x, w, b: F.layer_norm(x, w, b) + F.layer_norm(x, w, b),
            lambda x, w, b: 2 * np_layer_norm(x, w, b),
            [n((2, 4)), n(4), n(4)],
        ),
    ]
