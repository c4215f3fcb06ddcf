"""Exercise 7's classic mistakes, each as the wrong function it amounts to."""

import numpy as np

from models.learn.exercises.ex07_layer_norm.solution import layer_norm_backward


def _ln(x, w, g, eps, xhat_term=True, mean_term=True, eps_inside=True):
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    rstd = 1 / np.sqrt(var + eps) if eps_inside else 1 / (np.sqrt(var) + eps)
    xhat = (x - mean) * rstd
    u = g * w
    dx = u - u.mean(axis=-1, keepdims=True) if mean_term else u
    if xhat_term:
        dx = dx - xhat * (u * xhat).mean(axis=-1, keepdims=True)
    rows = g.reshape(-1, g.shape[-1]), xhat.reshape(-1, x.shape[-1])
    return rstd * dx, (rows[0] * rows[1]).sum(axis=0), rows[0].sum(axis=0)


def _constant_statistics(x, w, g, eps):
    rstd = 1 / np.sqrt(x.var(axis=-1, keepdims=True) + eps)
    _, dw, db = layer_norm_backward(x, w, g, eps)
    return g * w * rstd, dw, db


MISTAKES = {
    "layer_norm_backward": [
        ("d_constant_statistics", _constant_statistics),
        ("d_ln_no_xhat_term", lambda *a: _ln(*a, xhat_term=False)),
        ("d_ln_no_mean_term", lambda *a: _ln(*a, mean_term=False)),
        ("d_ln_eps_outside_sqrt", lambda *a: _ln(*a, eps_inside=False)),
    ],
}
