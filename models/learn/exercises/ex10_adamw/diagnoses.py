"""Exercise 10's classic mistakes, each as the wrong step it amounts to, and the rule its
message gives when the step changes an argument in place (it is no VJP)."""

import numpy as np


def _adam(
    p,
    g,
    m,
    v,
    t,
    lr,
    betas,
    eps,
    wd,
    correct=True,
    l2=False,
    decay_lr=True,
    inside=False,
    after=False,
):
    b1, b2 = betas
    if l2:
        g = g + wd * p
    elif not after:
        p = p * (1 - (lr * wd if decay_lr else wd))
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    m_hat, v_hat = (m / (1 - b1**t), v / (1 - b2**t)) if correct else (m, v)
    denom = np.sqrt(v_hat + eps) if inside else np.sqrt(v_hat) + eps
    p = p - lr * m_hat / denom
    return (p * (1 - lr * wd) if after else p), m, v


MISTAKES = {
    "adamw_step": [
        ("d_no_bias_correction", lambda *a: _adam(*a, correct=False)),
        ("d_l2_decay", lambda *a: _adam(*a, l2=True)),
        ("d_decay_without_lr", lambda *a: _adam(*a, decay_lr=False)),
        ("d_eps_inside_sqrt", lambda *a: _adam(*a, inside=True)),
        ("d_decay_after_step", lambda *a: _adam(*a, after=True)),
    ],
}

IN_PLACE_RULE = {"adamw_step": "rule_step"}  # every other piece is a VJP: "rule_vjp"
