"""The learner's starting file: `start` writes it with this docstring replaced by the
exercise's statement (en.md or zh.md)."""

import numpy as np


def div_backward(a, b, g):
    """a, b, g of one shape -> (da, db)"""
    raise NotImplementedError("exercise 3: write div_backward")


def tanh_backward(y, g):
    """y = tanh(x), g of one shape -> dx"""
    raise NotImplementedError("exercise 3: write tanh_backward")


def sum_backward(g, shape, axes, keepdims):
    """g (reduced), shape of a, axes: tuple of non-negative ints -> da of shape"""
    raise NotImplementedError("exercise 3: write sum_backward")


def max_backward(a, g, axes, keepdims):
    """a, g (reduced), axes: tuple of non-negative ints -> da of a.shape"""
    raise NotImplementedError("exercise 3: write max_backward")
