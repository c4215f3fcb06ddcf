"""Exercise 7: the reference solution."""

import numpy as np


def layer_norm_backward(x, w, g, eps):
    # y = xhat w + b, xhat = (x - mean) / sqrt(var + eps), population variance  (notes 8.4, 10.8)
    # dx = (u - mean(u) - xhat mean(u xhat)) / sqrt(var + eps), u = g w
    # dw = sum over rows of g xhat;  db = sum over rows of g
    mean = x.mean(axis=-1, keepdims=True)
    rstd = 1 / np.sqrt(((x - mean) ** 2).mean(axis=-1, keepdims=True) + eps)
    xhat = (x - mean) * rstd
    u = g * w
    mean_u, mean_uxhat = u.mean(axis=-1, keepdims=True), (u * xhat).mean(axis=-1, keepdims=True)
    dx = rstd * (u - mean_u - xhat * mean_uxhat)
    rows = g.reshape(-1, g.shape[-1]), xhat.reshape(-1, x.shape[-1])
    return dx, (rows[0] * rows[1]).sum(axis=0), rows[0].sum(axis=0)
