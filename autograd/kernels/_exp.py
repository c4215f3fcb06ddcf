"""A vectorisable exp for the Numba kernels: `exp(x)` for float32 and float64 scalars.

Why: without Intel's SVML, Numba turns np.exp into one scalar libm call per value (~2.4 ns), which
also stops LLVM from vectorising the loop around it; softmax and attention spend most of their
time there. This version is plain arithmetic that LLVM inlines and vectorises (~0.45 ns per
float32 value, as fast as numpy's own SIMD exp), so a kernel keeps its one fused pass over a row.

Method (Cephes expf/exp, public domain): write x = n ln2 + r with integer n and |r| <= ln2 / 2
(ln2 split in two parts so n * ln2 is exact enough), approximate exp(r) by a polynomial (float32)
or a rational function (float64), and multiply by 2^n, built directly in the exponent bits.
Accuracy: <= 2 ulp against libm over the kernels' range (x <= ~0: exponents of max-subtracted
scores). Results below ~1e-38 (float32) or ~1e-308 (float64) are flushed to 0 instead of being
returned as subnormals; exp(-inf) = 0 and exp(NaN) = NaN as usual. It is not meant for large
positive x (no overflow to inf): the kernels only pass x <= 0 up to rounding.

Compiled as its own small functions, which LLVM then inlines into the caller's loop: without
fastmath flags, so the caller's "reassoc" cannot merge the two parts of ln2 back together, and
with error_model="numpy", so the float64 division carries no zero-division check (a branch that
would stop the loop from being vectorised; the divisor is >= ~1.6 anyway).
"""

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic, overload

LOG2E = 1.4426950408889634


@intrinsic
def _float_from_bits(typingctx, bits):
    """Reinterpret int32 / int64 bits as float32 / float64 (an LLVM bitcast: free, vectorisable)."""
    width = {types.int32: 32, types.int64: 64}.get(bits)
    if width is None:
        return None
    result = types.float32 if width == 32 else types.float64

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType() if width == 32 else ir.DoubleType())

    return result(bits), codegen


@numba.njit(error_model="numpy")
def _exp32(x):
    lowest = np.float32(-87.0)  # exp(-87) ~ 1.6e-38: 2^n below stays a normal float32
    xc = lowest if x < lowest else x  # keeps NaN (NaN < lowest is False)
    n = np.floor(xc * np.float32(LOG2E) + np.float32(0.5))
    r = xc - n * np.float32(0.693359375) + n * np.float32(2.12194440e-4)  # x - n ln2
    p = np.float32(1.9875691500e-4)
    p = p * r + np.float32(1.3981999507e-3)
    p = p * r + np.float32(8.3334519073e-3)
    p = p * r + np.float32(4.1665795894e-2)
    p = p * r + np.float32(1.6666665459e-1)
    p = p * r + np.float32(5.0000001201e-1)
    y = p * r * r + r + np.float32(1.0)  # exp(r)
    two_n = _float_from_bits(np.int32((np.int32(n) + np.int32(127)) << np.int32(23)))
    return np.float32(0.0) if x < lowest else y * two_n


@numba.njit(error_model="numpy")
def _exp64(x):
    lowest = -708.0  # exp(-708) ~ 3.3e-308: 2^n below stays a normal float64
    xc = lowest if x < lowest else x
    n = np.floor(xc * LOG2E + 0.5)
    r = xc - n * 6.93145751953125e-1 - n * 1.42860682030941723212e-6  # x - n ln2
    rr = r * r
    p = r * ((1.26177193074810590878e-4 * rr + 3.02994407707441961300e-2) * rr + 1.0)
    q = ((3.00198505138664455042e-6 * rr + 2.52448340349684104192e-3) * rr
         + 2.27265548208155028766e-1) * rr + 2.0  # fmt: skip
    y = 1.0 + 2.0 * p / (q - p)  # exp(r), Pade form
    two_n = _float_from_bits((np.int64(n) + np.int64(1023)) << np.int64(52))
    return 0.0 if x < lowest else y * two_n


def vectorisable(python_fn, for_float32, for_float64):
    """Make `python_fn` (numpy's version, used from Python) compile inside a Numba kernel to
    `for_float32` or `for_float64`, by the scalar's type; returns `python_fn`."""

    @overload(python_fn)
    def _by_type(x):
        if x == types.float32:
            return lambda x: for_float32(x)
        if x == types.float64:
            return lambda x: for_float64(x)
        return None

    return python_fn


def exp(x):
    """exp(x); in Python simply np.exp, inside a Numba kernel the vectorisable version."""
    return np.exp(x)


vectorisable(exp, _exp32, _exp64)
