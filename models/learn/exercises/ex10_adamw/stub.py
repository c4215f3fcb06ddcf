"""The learner's starting file: `start` writes it with this docstring replaced by the
exercise's statement (en.md or zh.md)."""

import numpy as np


def adamw_step(p, g, m, v, t, lr, betas, eps, weight_decay):
    """p, g, m, v of one shape; t >= 1 -> (p, m, v)"""
    raise NotImplementedError("exercise 10: write adamw_step")
