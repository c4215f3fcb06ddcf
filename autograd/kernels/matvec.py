"""Matrix-vector products for decoding one token (batch 1), spread over Numba's threads:

- matvec_into(x, w, out):       out = x @ w,    w (in, out): a Linear's weight (notes' row vectors)
- rows_matvec_into(w, x, out):  out = w @ x,    w (out, in): a tied head, logits = h @ wte^T

The numpy references are those products themselves (matvec_numpy, rows_matvec_numpy).

Why not numpy's BLAS, as everywhere else: decoding a token is ~150 such products, each bound by
reading its weight once. OpenBLAS runs a gemv below 460 800 values on one thread (SmolLM2-135M's
o_proj, 576 x 576, read at half the speed of the others), and its threads spin between calls on
the cores that Numba's threads (the step's other kernels) need too. Here every product runs on
Numba's threads: SmolLM2's 30 layers' products on 2 threads read 26.6 GB/s, OpenBLAS's 22.9 (a
2-vCPU Xeon, float32, docs/decoding.md); on one thread OpenBLAS is ~3 % faster, so the compiled
decode step uses these only with two threads or more.

x @ w sums x[k] w[k, :] over the rows k of w: each thread takes its own contiguous block of rows
(one stream through memory, which the hardware prefetcher follows), adds 8 rows at a time into an
accumulator of its own, and the blocks' partial sums are added in order at the end. So the sum's
order depends on the number of threads, and within rounding of BLAS's (FASTMATH, plus "contract":
a * b + c as one FMA). w @ x takes 4 rows of w at a time, each one dot product with x.
"""

import numba
import numpy as np
from numba import prange

from ._common import FASTMATH, FLOAT_DTYPES, Kernel

# FMA contraction changes only the rounding of the sums, as "reassoc" already does
_SUMS = FASTMATH | {"contract"}


def _kernel(fn):
    return Kernel(fn, fastmath=_SUMS)


def _check(x, w, out, kernel, w_shape, w_names):
    """x (n,), w w_shape(n, m), out (m,): one float dtype, C-contiguous."""
    arrays = (x, w, out)
    if (
        any(not isinstance(a, np.ndarray) or not a.flags.c_contiguous for a in arrays)
        or len({a.dtype for a in arrays}) != 1
        or x.dtype not in FLOAT_DTYPES
        or x.ndim != 1
        or out.ndim != 1
        or w.shape != w_shape(x.size, out.size)
    ):
        raise ValueError(
            f"{kernel}: needs C-contiguous float32/float64 arrays of one dtype, x (n,), "
            f"w {w_names} and out (m,); got x {_describe(x)}, w {_describe(w)}, "
            f"out {_describe(out)}"
        )


def _describe(a):
    return f"{a.dtype} {a.shape}" if isinstance(a, np.ndarray) else type(a).__name__


# ---------------------------------------------------------------------------------------------
# numpy references
# ---------------------------------------------------------------------------------------------


def matvec_numpy(x, w):
    """x (in,) @ w (in, out) -> (out,)."""
    return x @ w


def rows_matvec_numpy(w, x):
    """w (out, in) @ x (in,) -> (out,)."""
    return w @ x


# ---------------------------------------------------------------------------------------------
# Numba
# ---------------------------------------------------------------------------------------------


@_kernel
def _x_times_w(x, w, blocks, out):
    n_in, n_out = w.shape
    partial = np.empty((blocks, n_out), w.dtype)
    for b in prange(blocks):
        k, end = b * n_in // blocks, (b + 1) * n_in // blocks
        acc = np.zeros(n_out, w.dtype)  # its own array: written through a view of partial,
        while k + 8 <= end:  # LLVM could not rule out aliasing w and ran 1.4x slower
            x0, x1, x2, x3 = x[k], x[k + 1], x[k + 2], x[k + 3]
            x4, x5, x6, x7 = x[k + 4], x[k + 5], x[k + 6], x[k + 7]
            for j in range(n_out):
                acc[j] += (
                    x0 * w[k, j] + x1 * w[k + 1, j] + x2 * w[k + 2, j] + x3 * w[k + 3, j]
                ) + (x4 * w[k + 4, j] + x5 * w[k + 5, j] + x6 * w[k + 6, j] + x7 * w[k + 7, j])
            k += 8
        while k < end:
            for j in range(n_out):
                acc[j] += x[k] * w[k, j]
            k += 1
        partial[b] = acc
    for j in range(n_out):
        total = partial[0, j]
        for b in range(1, blocks):
            total += partial[b, j]
        out[j] = total


@_kernel
def _w_rows_times_x(w, x, out):
    n_out, n_in = w.shape
    for q in prange((n_out + 3) // 4):
        r = 4 * q
        if r + 4 <= n_out:  # four dot products side by side: x is read once for the four
            s0 = s1 = s2 = s3 = w.dtype.type(0.0)
            for c in range(n_in):
                xc = x[c]
                s0 += w[r, c] * xc
                s1 += w[r + 1, c] * xc
                s2 += w[r + 2, c] * xc
                s3 += w[r + 3, c] * xc
            out[r], out[r + 1], out[r + 2], out[r + 3] = s0, s1, s2, s3
        else:
            for row in range(r, n_out):
                s = w.dtype.type(0.0)
                for c in range(n_in):
                    s += w[row, c] * x[c]
                out[row] = s


def numba_threads():
    """Numba's thread count (starting its threads, as start_threads does if it has not run)."""
    return numba.get_num_threads()


def matvec_into(x, w, out, blocks=None):
    """out = x @ w for x (in,), w (in, out), written into out (out,). blocks: how many blocks of
    w's rows are summed apart (default: one per Numba thread)."""
    _check(x, w, out, "matvec", lambda n, m: (n, m), "(n, m)")
    _x_times_w(w.size, x, w, blocks or numba.get_num_threads(), out)


def rows_matvec_into(w, x, out):
    """out = w @ x for w (out, in), x (in,), written into out (out,)."""
    _check(x, w, out, "rows_matvec", lambda n, m: (m, n), "(m, n)")
    _w_rows_times_x(w.size, w, x, out)
