"""The learner's starting file: `start` writes it with this docstring replaced by the
exercise's statement (en.md or zh.md)."""

import numpy as np


def layer_norm_backward(x, w, g, eps):
    """x (..., C), w (C,), g (..., C), eps: float -> (dx, dw, db)"""
    raise NotImplementedError("exercise 7: write layer_norm_backward")
