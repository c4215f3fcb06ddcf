"""GELU, the tanh approximation GPT-2 uses (notes 8.2), forward and backward, elementwise.

    y = x/2 (1 + t),   t = tanh(u),   u = s (x + 0.044715 x^3),   s = sqrt(2 / pi)
    dy/dx = (1 + t)/2 + x/2 (1 - t^2) s (1 + 3 * 0.044715 x^2)

The forward returns (y, t): t is what the backward needs. The numpy reference works in place
(out= and *=) to avoid a temporary per step of the formula; it still walks memory a dozen times.
The Numba kernel does each direction in one pass, with a tanh LLVM can vectorise (numba's np.tanh
is one scalar libm call per value): in float64 through the vectorisable exp of a non-positive
number, tanh(u) = sign(u) (1 - z) / (1 + z), z = exp(-2 |u|); in float32 as a [13/6] minimax
rational function of u on |u| <= 7.9 (the coefficients of Eigen's fast float tanh; <= 3e-7 from
tanh, float32's own rounding), 1.6x faster than through exp (no floor, no exponent bits).
"""

import math

import numba
import numpy as np
from numba import prange

from ._common import FASTMATH, Kernel, float_array, same_shape
from ._exp import exp, vectorisable

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
def _tanh32(u):
    c = np.float32(7.90531110763549805)  # tanh(c) rounds to 1 in float32
    u = c if u > c else (-c if u < -c else u)  # NaN falls through
    u2 = u * u
    p = np.float32(-2.76076847742355e-16)
    p = p * u2 + np.float32(2.00018790482477e-13)
    p = p * u2 + np.float32(-8.60467152213735e-11)
    p = p * u2 + np.float32(5.12229709037114e-08)
    p = p * u2 + np.float32(1.48572235717979e-05)
    p = p * u2 + np.float32(6.37261928875436e-04)
    p = p * u2 + np.float32(4.89352455891786e-03)
    q = np.float32(1.19825839466702e-06)
    q = q * u2 + np.float32(1.18534705686654e-04)
    q = q * u2 + np.float32(2.26843463243900e-03)
    q = q * u2 + np.float32(4.89352518554385e-03)
    return u * p / q


@numba.njit(error_model="numpy", fastmath=FASTMATH)
def _tanh64(u):
    z = exp(-2.0 * abs(u))  # <= 1: no overflow
    th = (1.0 - z) / (1.0 + z)
    return -th if u < 0 else th


def _tanh(u):
    """tanh(u); in Python simply np.tanh, inside a Numba kernel the vectorisable version."""
    return np.tanh(u)


vectorisable(_tanh, _tanh32, _tanh64)


@numba.njit(error_model="numpy", fastmath=FASTMATH)
def _tanh_u(xi, s, a_s):
    """t = tanh(s (x + 0.044715 x^3)) (one home for every loop below)."""
    return _tanh(xi * (s + a_s * xi * xi))


@Kernel
def _gelu_values(x, y, t, s, a_s):
    # s = sqrt(2/pi) and a_s = 0.044715 s come in x's dtype: float32 input is computed in float32
    one, half = x.dtype.type(1.0), x.dtype.type(0.5)
    for i in prange(x.size):
        xi = x[i]
        th = _tanh_u(xi, s, a_s)
        t[i] = th
        y[i] = half * xi * (one + th)


@Kernel
def _gelu_output(x, y, s, a_s):
    # y only (a compiled step's forward: its backward recomputes t from x, see _gelu_grads_of_x)
    one, half = x.dtype.type(1.0), x.dtype.type(0.5)
    for i in prange(x.size):
        xi = x[i]
        y[i] = half * xi * (one + _tanh_u(xi, s, a_s))


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
    one, half = x.dtype.type(1.0), x.dtype.type(0.5)
    for i in prange(x.size):
        xi = x[i]
        ti = _tanh_u(xi, s, a_s)
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
