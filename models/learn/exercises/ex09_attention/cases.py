"""Exercise 9's probes and engine cases: causal attention (Tq < Tk and Dv != D too) and
attention under another mask."""

import numpy as np

import autograd.functional as F
from autograd.testing.references import np_attention
from models.learn.checks import Case

PARTS = {"attention_backward": ("dq", "dk", "dv")}


def probes(p):
    causal = np.tril(np.ones((4, 4), bool))
    return {"attention_backward": [(*p.attention, p.r.standard_normal((1, 2, 4, 2)), causal)]}


def cases(r):
    n = r.standard_normal
    allowed = r.random((3, 5)) < 0.6
    allowed[:, 0] = True
    return [
        Case(
            "F.scaled_dot_product_attention(q, k, v, causal=True)",
            lambda q, k, v: F.scaled_dot_product_attention(q, k, v, causal=True),
            lambda q, k, v: np_attention(q, k, v, True),
            [n((1, 2, 4, 3)), n((1, 2, 4, 3)), n((1, 2, 4, 3))],
        ),
        Case(
            "F.scaled_dot_product_attention(q, k, v, causal=True), Tq < Tk, Dv != D",
            lambda q, k, v: F.scaled_dot_product_attention(q, k, v, causal=True),
            lambda q, k, v: np_attention(q, k, v, True),
            [n((2, 1, 3, 2)), n((2, 1, 5, 2)), n((2, 1, 5, 3))],
        ),
        Case(
            "F.scaled_dot_product_attention(q, k, v, causal=False, mask=allowed)",
            lambda q, k, v: F.scaled_dot_product_attention(q, k, v, causal=False, mask=allowed),
            lambda q, k, v: np_attention(q, k, v, False, allowed),
            [n((1, 1, 3, 2)), n((1, 1, 5, 2)), n((1, 1, 5, 2))],
        ),
    ]
