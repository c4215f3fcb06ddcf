"""GELU, the tanh approximation GPT-2 uses (notes 8.2), forward and backward, elementwise.

    y = x/2 (1 + t),   t = tanh(u),   u = s (x + 0.044715 x^3),   s = sqrt(2 / pi)
    dy/dx = (1 + t)/2 + x/2 (1 - t^2) s (1 + 3 * 0.044715 x^2)

The forward returns (y, t): t is what the backward needs. The numpy reference works in place
(out= and *=) to avoid a temporary per step of the formula; it still walks memory a dozen times.
The Numba kernel does each direction in one pass, with tanh written through the vectorisable exp
of a non-positive number: tanh(u) = sign(u) (1 - z) / (1 + z), z = exp(-2 |u|).
"""

import math

import numba
import numpy as np
from numba import prange

from ._common import FASTMATH, Kernel, float_array, same_shape
from ._exp import exp

S = math.sqrt(2.0 / math.pi)
A = 0.044715


def _check_backward(gy, x, t):
    """The three arrays as C-contiguous floats of x's dtype, all of x's shape."""
    x = float_array(x, "gelu_backward", "x")
    gy = float_array(gy, "gelu_backward", "gy", dtype=x.dtype)
    t = float_array(t, "gelu_backward", "t", dtype=x.dtype)
    same_shape(gy, x, "gelu_backward", ("gy", "x"))
    same_shape(t, x, "gelu_backward", ("t", "x"))
    return gy, x, t


# ---------------------------------------------------------------------------------------------
# numpy reference
# ---------------------------------------------------------------------------------------------


def gelu_forward_numpy(x):
    """(y, t) with y = x/2 (1 + t), t = tanh(s (x + 0.044715 x^3)) (notes 8.2)."""
    x = float_array(x, "gelu_forward", "x")
    t = x * x
    t *= A * S
    t += S
    t *= x  # u
    np.tanh(t, out=t)
    y = t + 1
    y *= x
    y *= 0.5
    return y, t


def gelu_backward_numpy(gy, x, t):
    """gx = gy ((1 + t)/2 + x/2 (1 - t^2) s (1 + 3 * 0.044715 x^2))."""
    gy, x, t = _check_backward(gy, x, t)
    gx = t * t
    np.subtract(1, gx, out=gx)  # 1 - t^2
    du = x * x
    du *= 3 * A * S
    du += S  # du/dx
    gx *= du
    gx *= x
    gx *= 0.5  # x/2 (1 - t^2) du/dx
    np.multiply(t, 0.5, out=du)
    du += 0.5  # (1 + t)/2
    gx += du
    gx *= gy
    return gx


# ---------------------------------------------------------------------------------------------
# Numba kernels: one pass over the flattened arrays
# ---------------------------------------------------------------------------------------------


@numba.njit(error_model="numpy", fastmath=FASTMATH)
def _tanh_u(xi, s, a_s, one, two):
    """t = tanh(s (x + 0.044715 x^3)) through exp(-2|u|) <= 1 (one home for every loop below)."""
    u = xi * (s + a_s * xi * xi)
    z = exp(-two * abs(u))
    th = (one - z) / (one + z)
    return -th if u < 0 else th


@Kernel
def _gelu_values(x, y, t, s, a_s):
    # s = sqrt(2/pi) and a_s = 0.044715 s come in x's dtype: float32 input is computed in float32
    one, two, half = x.dtype.type(1.0), x.dtype.type(2.0), x.dtype.type(0.5)
    for i in prange(x.size):
        xi = x[i]
        th = _tanh_u(xi, s, a_s, one, two)
        t[i] = th
        y[i] = half * xi * (one + th)


@Kernel
def _gelu_output(x, y, s, a_s):
    # y only (a compiled step's forward: its backward recomputes t from x, see _gelu_grads_of_x)
    one, two, half = x.dtype.type(1.0), x.dtype.type(2.0), x.dtype.type(0.5)
    for i in prange(x.size):
        xi = x[i]
        y[i] = half * xi * (one + _tanh_u(xi, s, a_s, one, two))


@Kernel
def _gelu_grads(gy, x, t, gx, s, a3_s):
    one, half = x.dtype.type(1.0), x.dtype.type(0.5)
    for i in prange(x.size):
        xi, ti = x[i], t[i]
        du = s + a3_s * xi * xi
        gx[i] = gy[i] * (half * (one + ti) + half * xi * (one - ti * ti) * du)


@Kernel
def _gelu_grads_of_x(gy, x, gx, s, a_s, a3_s):
    # _gelu_grads with t recomputed from x in the same pass (one read of x, no t array)
    one, two, half = x.dtype.type(1.0), x.dtype.type(2.0), x.dtype.type(0.5)
    for i in prange(x.size):
        xi = x[i]
        ti = _tanh_u(xi, s, a_s, one, two)
        du = s + a3_s * xi * xi
        gx[i] = gy[i] * (half * (one + ti) + half * xi * (one - ti * ti) * du)


def constants(dtype):
    """(s, 0.044715 s, 3 * 0.044715 s) in `dtype`, the kernels' arguments."""
    return dtype.type(S), dtype.type(A * S), dtype.type(3.0 * A * S)


def gelu_forward_numba(x):
    """Numba GELU forward; same contract as gelu_forward_numpy."""
    x = float_array(x, "gelu_forward", "x")
    y, t = np.empty_like(x), np.empty_like(x)
    s, a_s, _ = constants(x.dtype)
    _gelu_values(x.size, x.reshape(-1), y.reshape(-1), t.reshape(-1), s, a_s)
    return y, t


def gelu_backward_numba(gy, x, t):
    """Numba GELU backward; same contract as gelu_backward_numpy."""
    gy, x, t = _check_backward(gy, x, t)
    gx = np.empty_like(x)
    s, _, a3_s = constants(x.dtype)
    _gelu_grads(x.size, gy.reshape(-1), x.reshape(-1), t.reshape(-1), gx.reshape(-1), s, a3_s)
    return gx
