"""Exercise 10: the reference solution."""

import numpy as np


def adamw_step(p, g, m, v, t, lr, betas, eps, weight_decay):
    # decoupled decay, then Adam with bias-corrected moments (t counts from 1)
    b1, b2 = betas
    p = p * (1 - lr * weight_decay)
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    m_hat, v_hat = m / (1 - b1**t), v / (1 - b2**t)
    return p - lr * m_hat / (np.sqrt(v_hat) + eps), m, v
