"""The learner's starting file: `start` writes it with this docstring replaced by the
exercise's statement (en.md or zh.md)."""

import math

import numpy as np

from ex05_softmax import softmax_backward  # yours, from exercise 5


def attention_backward(q, k, v, g, allowed):
    """q (B,H,Tq,D), k (B,H,Tk,D), v (B,H,Tk,Dv), g (B,H,Tq,Dv), allowed bool (Tq,Tk) -> (dq, dk, dv)"""
    raise NotImplementedError("exercise 9: write attention_backward")
