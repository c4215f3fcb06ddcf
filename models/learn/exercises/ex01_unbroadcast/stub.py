"""The learner's starting file: `start` writes it with this docstring replaced by the
exercise's statement (en.md or zh.md)."""

import numpy as np


def unbroadcast(grad, shape):
    """grad (...broadcast shape) -> array of shape"""
    raise NotImplementedError("exercise 1: write unbroadcast")
