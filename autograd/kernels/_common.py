"""Argument checks shared by the kernels (numpy only: importing this never imports Numba)."""

import numpy as np

FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def float_array(a, kernel, name, dtype=None):
    """`a` as a C-contiguous float32/float64 array; `dtype` casts a companion array to the first."""
    a = np.asarray(a, dtype=dtype, order="C")  # not ascontiguousarray: it makes 0-d arrays 1-d
    if a.dtype not in FLOAT_DTYPES:
        raise ValueError(f"{kernel}: {name} must be float32 or float64, got {a.dtype}")
    return a


def int_array(a, kernel, name):
    """`a` as a C-contiguous int64 array; any other dtype is an error, not a silent cast."""
    a = np.asarray(a)
    if not np.issubdtype(a.dtype, np.integer):
        raise ValueError(f"{kernel}: {name} must be an integer array, got {a.dtype}")
    return np.asarray(a, dtype=np.int64, order="C")


def last_axis(x, kernel, name="x"):
    """Check that `x` has a last axis to reduce over; return the (rows, C) view."""
    if x.ndim < 1:
        raise ValueError(f"{kernel}: {name} must have at least 1 dimension, got shape {x.shape}")
    return x.reshape(int(np.prod(x.shape[:-1])), x.shape[-1])  # not -1: C may be 0


def same_shape(a, b, kernel, names):
    if a.shape != b.shape:
        raise ValueError(
            f"{kernel}: {names[0]} {a.shape} and {names[1]} {b.shape} must have the same shape"
        )


# Numba fastmath flags for the kernels: only "reassoc", which lets LLVM split a long sum into
# vector lanes (2-5x faster reductions; the rounding differs from a left-to-right sum by a few
# ulp, and it is still the same on every run). No "nnan"/"ninf": -inf is how masks are written.
FASTMATH = {"reassoc"}
