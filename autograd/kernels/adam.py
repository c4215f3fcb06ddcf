"""Adam / AdamW's update (notes 9.4), the one home of its arithmetic, in place, elementwise.

    g += l2 p              (Adam's L2 weight decay; l2 = 0 for AdamW)
    p *= decay             (AdamW's decoupled weight decay, decay = 1 - lr wd; 1 for Adam)
    m = b1 m + (1 - b1) g;   v = b2 v + (1 - b2) g^2
    p -= (m / (sqrt(v) / sqrt(1 - b2^t) + eps)) * lr / (1 - b1^t)

nn.optim.Adam(W)'s eager step() runs the numpy reference on each parameter; a compiled step runs
the Numba loop once per parameter group over flat buffers (nn.optim.FlatAdam); both take the
step's numbers from `coefficients`. Unlike the other kernels it changes its arrays (p, m, v) in
place and returns nothing, and it is not in kernels.KERNELS (no autograd.functional op calls it).
The two do the same operations in the same order and dtype, so they agree bit for bit: eager
stays on the reference so that tests/test_compile.py, comparing compiled and eager steps, holds
the loop to it. The loop is built without fastmath (no reassociation, no fused multiply-add).
"""

import math
from typing import NamedTuple

import numpy as np
from numba import prange

from ._common import Kernel


class Coefficients(NamedTuple):
    """The numbers of step t of one parameter group, in the order the loop takes them."""

    decay: float
    l2: float
    b1: float
    one_b1: float
    b2: float
    one_b2: float
    root_c2: float  # sqrt(1 - b2^t): v's bias correction, under the square root
    eps: float
    step_size: float  # lr / (1 - b1^t): m's bias correction, with the learning rate


def coefficients(lr, betas, eps, weight_decay, decoupled, t):
    """Step t's Coefficients (Python floats) for the group's settings."""
    b1, b2 = betas
    return Coefficients(
        decay=1.0 - lr * weight_decay if decoupled else 1.0,
        l2=0.0 if decoupled else weight_decay,
        b1=b1,
        one_b1=1.0 - b1,
        b2=b2,
        one_b2=1.0 - b2,
        root_c2=math.sqrt(1.0 - b2**t),
        eps=eps,
        step_size=lr / (1.0 - b1**t),
    )


# ---------------------------------------------------------------------------------------------
# numpy reference
# ---------------------------------------------------------------------------------------------


def adam_update_numpy(p, g, m, v, c):
    """One step in place: p, m, v (one shape) change; g is read. c: Coefficients.

    Python floats meet the arrays as numpy rounds them, to the arrays' dtype (NEP 50)."""
    if c.l2:  # (not 0 * p: an infinite p would give NaN)
        g = g + c.l2 * p
    p *= c.decay
    m *= c.b1
    m += c.one_b1 * g
    v *= c.b2
    v += c.one_b2 * (g * g)
    denom = np.sqrt(v)  # the formula above, arranged to reuse one temporary array
    denom /= c.root_c2
    denom += c.eps
    update = np.divide(m, denom, out=denom)
    update *= c.step_size
    p -= update


# ---------------------------------------------------------------------------------------------
# Numba kernel: one pass over flat arrays
# ---------------------------------------------------------------------------------------------


def _adam_update(p, g, m, v, decay, l2, b1, one_b1, b2, one_b2, root_c2, eps, step_size):
    # the module docstring's four lines, one element at a time
    for i in prange(p.size):
        gi = g[i] + l2 * p[i] if l2 != 0 else g[i]
        pi = p[i] * decay
        mi = m[i] * b1 + one_b1 * gi
        vi = v[i] * b2 + one_b2 * (gi * gi)
        denom = np.sqrt(vi) / root_c2 + eps
        m[i] = mi
        v[i] = vi
        p[i] = pi - (mi / denom) * step_size


_adam_loop = Kernel(_adam_update, fastmath=set())


def adam_update_numba(p, g, m, v, c):
    """The Numba loop; the contract of adam_update_numpy, on 1-d C-contiguous arrays of one dtype
    (a compiled step's flat buffers). The numbers are rounded to that dtype first, as numpy
    rounds a Python float that meets a float32 array."""
    s = p.dtype.type
    _adam_loop(p.size, p, g, m, v, *(s(x) for x in c))
