"""The learner's starting file: `start` writes it with this docstring replaced by the
exercise's statement (en.md or zh.md)."""

import numpy as np


def embedding_backward(idx, g, vocab_size):
    """idx int (...), g (..., C), vocab_size: int -> dE (vocab_size, C)"""
    raise NotImplementedError("exercise 8: write embedding_backward")


def gather_backward(index, g, shape, axis):
    """index int and g of one shape, shape of x, axis >= 0 -> dx of shape"""
    raise NotImplementedError("exercise 8: write gather_backward")
