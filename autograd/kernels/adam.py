"""The Adam / AdamW update of autograd.compile's fused optimizer, one element at a time.

The arithmetic of nn.optim.Adam(W).step (notes 9.4), operation for operation in the parameter
dtype, over the flat parameter / gradient / moment buffers (autograd/compile/lowering.py,
flat_optimizer): nn.optim is the reference, and tests/test_compile.py checks that a replay with
it equals eager bit for bit. Built without fastmath (no reassociation), unlike the other kernels.
"""

import numpy as np
from numba import prange

from ._common import Kernel


def _adam_update(p, g, m, v, decay, l2, b1, one_b1, b2, one_b2, root_c2, eps, step_size):
    # g += l2 p (Adam's L2);  p *= decay (AdamW's);  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
    # p -= (m / (sqrt(v) / sqrt(1 - b2^t) + eps)) * lr / (1 - b1^t)
    for i in prange(p.size):
        gi = g[i] + l2 * p[i] if l2 != 0 else g[i]
        pi = p[i] * decay
        mi = m[i] * b1 + one_b1 * gi
        vi = v[i] * b2 + one_b2 * (gi * gi)
        denom = np.sqrt(vi) / root_c2 + eps
        m[i] = mi
        v[i] = vi
        p[i] = pi - (mi / denom) * step_size


adam_update = Kernel(_adam_update, fastmath=set())
