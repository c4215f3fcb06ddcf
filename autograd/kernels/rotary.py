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
def _rotate(x, x_by_position, cos, sin, out, out_by_position):
    """x (B, H, T, D) rotated into out (B, H, T, D), which may be x itself (rotate_numpy's
    values); cos and sin (T, D / 2). A head's pair is read before either is written. Either
    array may be given as its (B, T, H, D) view instead (x_by_position, out_by_position): see
    rotate_into."""
    batch, width = x.shape[0], x.shape[3]
    heads, positions = (x.shape[2], x.shape[1]) if x_by_position else (x.shape[1], x.shape[2])
    half = width // 2
    for bh in prange(batch * heads):
        b, h = bh // heads, bh % heads
        for t in range(positions):
            xr = x[b, t, h] if x_by_position else x[b, h, t]
            o = out[b, t, h] if out_by_position else out[b, h, t]
            for i in range(half):
                x1, x2 = xr[i], xr[half + i]
                o[i] = x1 * cos[t, i] - x2 * sin[t, i]
                o[half + i] = x1 * sin[t, i] + x2 * cos[t, i]


def rotate_into(x, cos, sin, out):
    """out = x rotated by the angles of cos and sin (T, D / 2): x and out (B, H, T, D), out may be
    x. Attention's heads are usually a transposed view of a projection's (B, T, H, D) output (or
    gradient): such an array is handed to the kernel as that C-contiguous view, whose rows Numba
    vectorises (as a strided 4-d array it ran ~2.4x slower: (2, 9, 256, 64) 0.17 vs 0.07 ms)."""
    (xv, x_by_position), (ov, out_by_position) = _position_major(x), _position_major(out)
    _rotate(out.size, xv, x_by_position, cos, sin, ov, out_by_position)


def _position_major(a):
    """(a, False); or (a's (B, T, H, D) view, True) when that view is C-contiguous and a is not."""
    if not a.flags.c_contiguous:
        swapped = a.transpose(0, 2, 1, 3)
        if swapped.flags.c_contiguous:
            return swapped, True
    return a, False
