"""Exercise 9: the reference solution."""

import math

import numpy as np


def attention_backward(q, k, v, g, allowed):
    # S = q k^T / sqrt(D) on the allowed set, A = softmax(S), O = A v    (notes 7.4, 10.5-10.7)
    scale = 1 / math.sqrt(q.shape[-1])
    s = np.where(allowed, q @ k.swapaxes(-1, -2) * scale, -np.inf)
    a = np.exp(s - s.max(axis=-1, keepdims=True))
    a /= a.sum(axis=-1, keepdims=True)
    dv = a.swapaxes(-1, -2) @ g  # O = A V:  dV = A^T dO, dA = dO V^T  (10.5)
    da = g @ v.swapaxes(-1, -2)
    # softmax's VJP (10.6), then the scale; 0 off the allowed set, where a is 0 (7.4)
    ds = a * (da - (a * da).sum(axis=-1, keepdims=True)) * scale
    return ds @ k, ds.swapaxes(-1, -2) @ q, dv  # dQ = dS K / sqrt(D), dK = dS^T Q / sqrt(D)
