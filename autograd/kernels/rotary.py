"""Rotary position embedding (notes 8.6): heads (B, H, T, D) turned by each position's angles,
into an output array (or in place): F.apply_rotary's forward and backward in a compiled training
step, and the compiled decode step's rotation of a new token's query and key heads.

    y1 = x1 cos - x2 sin,   y2 = x1 sin + x2 cos      (x1, x2: the two halves of a head)

Each product is rounded, then the difference or sum, as functional._rotate's numpy operations do
(no fused multiply-add: FASTMATH has no "contract"), so both give the same values. One Numba pass
instead of four half-width ufunc calls and their temporaries (a training step's (4, 9, 256, 64)
queries: six passes over half-width arrays; a decoded token of SmolLM2-135M rotates 60 times,
where each numpy call cost more than its arithmetic).
"""

import numpy as np
from numba import prange

from ._common import Kernel


def rotate_numpy(x, cos, sin):
    """x (..., T, D) rotated by the angles whose cos and sin (T, D / 2) are given; a new array."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)


@Kernel
def _rotate(x, cos, sin, out):
    """x (B, H, T, D) rotated into out (B, H, T, D), which may be x itself (rotate_numpy's
    values); cos and sin (T, D / 2). A head's pair is read before either is written."""
    batch, heads, positions, width = x.shape
    half = width // 2
    for bh in prange(batch * heads):
        b, h = bh // heads, bh % heads
        for t in range(positions):
            for i in range(half):
                x1, x2 = x[b, h, t, i], x[b, h, t, half + i]
                out[b, h, t, i] = x1 * cos[t, i] - x2 * sin[t, i]
                out[b, h, t, half + i] = x1 * sin[t, i] + x2 * cos[t, i]
