"""Rotary position embedding (notes 8.6) of one position's heads, in place: the compiled decode
step's rotation of a new token's query and key heads.

    y1 = x1 cos - x2 sin,   y2 = x1 sin + x2 cos      (x1, x2: the two halves of a head)

Each product is rounded, then the difference or sum, as functional._rotate's numpy operations do
(no fused multiply-add: FASTMATH has no "contract"), so both give the same values. One Numba pass
instead of four half-width ufunc calls and their temporaries: a token of SmolLM2-135M rotates 60
times, where each numpy call cost more than its arithmetic.
"""

import numpy as np
from numba import prange

from ._common import Kernel


def rotate_numpy(x, cos, sin):
    """x (rows, D) rotated by the angles whose cos and sin (D / 2,) are given; a new array."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)


@Kernel
def _rotate_rows(x, cos, sin):
    """x (rows, D) rotated in place (rotate_numpy's values)."""
    half = x.shape[1] // 2
    for r in prange(x.shape[0]):
        for i in range(half):
            x1, x2 = x[r, i], x[r, half + i]
            x[r, i] = x1 * cos[i] - x2 * sin[i]
            x[r, half + i] = x1 * sin[i] + x2 * cos[i]
