"""SiLU, the gate of Llama's SwiGLU MLP (notes 8.2), forward and backward, elementwise; and
SwiGLU's gated product silu(x) u as one op.

    y = x s,   s = sigmoid(x) = 1 / (1 + e^-x)
    dy/dx = s (1 + x (1 - s))          (the product rule, with s' = s (1 - s))
    SwiGLU: y = silu(x) u,   dx = g u s (1 + x (1 - s)),   du = g silu(x)

The backward takes x, not s: s is recomputed there (one exp), so x alone waits for the backward.
sigmoid goes through the exp of a non-positive number, e = exp(-|x|), which never overflows:
s = 1 / (1 + e) for x >= 0 and e / (1 + e) below. The numpy reference walks memory several
times; the Numba kernel does each direction in one pass, with the vectorisable exp (_exp.py).
"""

import numba
import numpy as np
from numba import prange

from ._common import FASTMATH, Kernel, float_array, same_shape
from ._exp import exp

# ---------------------------------------------------------------------------------------------
# numpy reference
# ---------------------------------------------------------------------------------------------


def _sigmoid_numpy(x):
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1, e) / (1 + e)


def silu_forward_numpy(x):
    """y = x sigmoid(x)."""
    x = float_array(x, "silu_forward", "x")
    return (x * _sigmoid_numpy(x)).astype(x.dtype, copy=False)


def silu_backward_numpy(gy, x):
    """gx = gy s (1 + x (1 - s)), s = sigmoid(x) recomputed from x."""
    x = float_array(x, "silu_backward", "x")
    gy = float_array(gy, "silu_backward", "gy", dtype=x.dtype)
    same_shape(gy, x, "silu_backward", ("gy", "x"))
    s = _sigmoid_numpy(x)
    return (gy * s * (1 + x * (1 - s))).astype(x.dtype, copy=False)


def swiglu_forward_numpy(x, u):
    """y = silu(x) u (silu's values, then the product)."""
    x, u, _ = _swiglu_inputs("swiglu_forward", x, u)
    return (silu_forward_numpy(x) * u).astype(x.dtype, copy=False)


def swiglu_backward_numpy(gy, x, u):
    """(gx, gu) = (gy u s (1 + x (1 - s)), gy silu(x)), s = sigmoid(x) recomputed from x."""
    x, u, gy = _swiglu_inputs("swiglu_backward", x, u, gy)
    s = _sigmoid_numpy(x)
    gx = (gy * u * (s * (1 + x * (1 - s)))).astype(x.dtype, copy=False)
    return gx, (gy * (x * s)).astype(x.dtype, copy=False)


def _swiglu_inputs(kernel, x, u, gy=None):
    """x, u (and gy, for the backward) checked: float arrays of x's dtype, one shape."""
    x = float_array(x, kernel, "x")
    u = float_array(u, kernel, "u", dtype=x.dtype)
    same_shape(x, u, kernel, ("x", "u"))
    if gy is not None:
        gy = float_array(gy, kernel, "gy", dtype=x.dtype)
        same_shape(gy, x, kernel, ("gy", "x"))
    return x, u, gy


# ---------------------------------------------------------------------------------------------
# Numba kernels: one pass over the flattened arrays
# ---------------------------------------------------------------------------------------------


@numba.njit(error_model="numpy", fastmath=FASTMATH)
def _sigmoid(xi, one):
    e = exp(-abs(xi))  # <= 1: no overflow
    return (one if xi >= 0 else e) / (one + e)


@Kernel
def _silu_values(x, y):
    one = x.dtype.type(1.0)
    for i in prange(x.size):
        xi = x[i]
        y[i] = xi * _sigmoid(xi, one)


@Kernel
def _silu_times(x, u, y):
    """y = silu(x) * u (SwiGLU's silu(h W_gate) * (h W_up)) in one call, for the compiled decode
    step: _silu_values's loop, then the product in a loop of its own, so that "reassoc" cannot
    regroup x s u: the values of _silu_values then np.multiply, bit for bit. y must be an array
    of its own: written over x or u, LLVM's alias check sends the loop to its scalar version
    (13 us instead of 1.2 for SmolLM2's 1536 values)."""
    one = x.dtype.type(1.0)
    for i in prange(x.size):
        xi = x[i]
        y[i] = xi * _sigmoid(xi, one)
    for i in prange(x.size):
        y[i] = y[i] * u[i]


@Kernel
def _swiglu_grads(gy, x, u, gx, gu):
    """SwiGLU's backward in one pass: gx = gy u s (1 + x (1 - s)), gu = gy silu(x); gx and gu
    arrays of their own (see _silu_times)."""
    one = x.dtype.type(1.0)
    for i in prange(x.size):
        xi = x[i]
        s = _sigmoid(xi, one)
        gu[i] = gy[i] * (xi * s)
        gx[i] = gy[i] * u[i] * (s * (one + xi * (one - s)))


@Kernel
def _silu_grads(gy, x, gx):
    one = x.dtype.type(1.0)
    for i in prange(x.size):
        xi = x[i]
        s = _sigmoid(xi, one)
        gx[i] = gy[i] * (s * (one + xi * (one - s)))


def silu_forward_numba(x):
    """Numba SiLU forward; same contract as silu_forward_numpy."""
    x = float_array(x, "silu_forward", "x")
    y = np.empty_like(x)
    _silu_values(x.size, x.reshape(-1), y.reshape(-1))
    return y


def silu_backward_numba(gy, x):
    """Numba SiLU backward; same contract as silu_backward_numpy."""
    x = float_array(x, "silu_backward", "x")
    gy = float_array(gy, "silu_backward", "gy", dtype=x.dtype)
    same_shape(gy, x, "silu_backward", ("gy", "x"))
    gx = np.empty_like(x)
    _silu_grads(x.size, gy.reshape(-1), x.reshape(-1), gx.reshape(-1))
    return gx


def swiglu_forward_numba(x, u):
    """Numba SwiGLU forward (_silu_times: silu's values, then the product, bit for bit);
    same contract as swiglu_forward_numpy."""
    x, u, _ = _swiglu_inputs("swiglu_forward", x, u)
    y = np.empty_like(x)
    _silu_times(x.size, x.reshape(-1), u.reshape(-1), y.reshape(-1))
    return y


def swiglu_backward_numba(gy, x, u):
    """Numba SwiGLU backward in one pass; same contract as swiglu_backward_numpy."""
    x, u, gy = _swiglu_inputs("swiglu_backward", x, u, gy)
    gx, gu = np.empty_like(x), np.empty_like(x)
    flat = (a.reshape(-1) for a in (gy, x, u, gx, gu))
    _swiglu_grads(x.size, *flat)
    return gx, gu
