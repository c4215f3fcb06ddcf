"""One row of x times a quantized W with x quantized to int8 too (llama.cpp's decode arithmetic).

autograd/kernels/quantized.py multiplies float x by W's values, each made in float32 from its
block (~36 vector instructions per 32 values on 8-lane AVX2: there a q4_1 product runs at
6.5 G values/s on one core, while llama.cpp's whole Q4_1 token runs ~10). llama.cpp instead
quantizes x itself, per 32 values, to int8 (its q8_0 / q8_1 "vec_dot_type"), and multiplies the
two blocks' small integers exactly, in 16- and 32-bit integer lanes:

    x's block:  dx = max|x| / 127,  xq = rint(x / dx) (int8),  sx = dx * sum(xq)
    y[r] = sum over blocks b of  d[r,b] dx[b] * sum_j q[r,b,j] xq[b,j]   (+ m[r,b] sx[b])

with W's block d * q + m (q4_1), d * (q - 8) (q4_0: m = -8 d) or d * q (q8_0: no m). That is
y = x~ @ W exactly up to float rounding, x~ = dx * xq: x rounded to 8 bits per block (an error
of up to half a step, 1/254 of its block's largest magnitude); on SmolLM2 in Q8_0 the mean KL of
the next-token distribution against the float64 model goes 0.0015 -> 0.0042, llama.cpp's own
Q8_0 file's is 0.0046-0.0050 (docs/quantization.md). It is a decode option, off by default
(DecodeStep(int8_activations=True), generate(..., compiled="int8")): the quantized linear op
itself (quantized.py) keeps x as it is, and its VJP is that of x @ W.

On a CPU with AVX2 the block's integer dot product is two instructions, as in llama.cpp:
vpmaddubsw (32 unsigned 8-bit q times 32 signed 8-bit xq, adjacent pairs summed to 16 bits; a
q8_0 q goes in as |q| with its sign moved onto xq) and vpmaddwd (pairs of those summed to 32
bits), then one convert and one FMA into 8 float lanes. Numba's LLVM does not find these from a
loop (a Numba int8 probe ran 3x slower than the float kernel), so _row_dot emits them as LLVM IR:
q4_1 2.1x faster than the float kernel on an AMD Zen 3 core (11.3 against 5.3 G values/s, the
tied head's shape; benchmarks.quant_quality --bandwidth).
Elsewhere (no AVX2, or float64 x) the same sums run as a plain Numba loop (_matvec_portable).

- quantize_activations(x): x (in,) -> (xq, dx, sx), float32 arithmetic, halves to even (rint, as
  llama.cpp's AVX2 quantizer rounds)
- quantized_matvec_int8(x, weight): x (N, in) -> (N, out), each row quantized, then the sums
"""

from functools import partial

import numpy as np
from llvmlite import binding, ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from ._common import Kernel
from .quantized import F16_TO_F32, PREFETCH_BYTES, _check, _one_row, _prefetch_row

FORMATS = ("q8_0", "q4_0", "q4_1")  # W's formats with an int8 product
_FEATURES = binding.get_host_cpu_features()
AVX2 = all(_FEATURES.get(name, False) for name in ("avx2", "fma", "f16c"))


def _check_format(weight, kernel):
    if weight.format not in FORMATS:
        raise ValueError(
            f"{kernel}: int8 activations need a weight in {', '.join(FORMATS)}, got "
            f"{weight.format} {weight.shape}"
        )


# ---------------------------------------------------------------------------------------------
# x's blocks to int8: the numpy reference and its Numba twin (the same bits)
# ---------------------------------------------------------------------------------------------


def quantize_activations(x):
    """x (in,) float32/float64, in a multiple of 32 -> xq int8 (in,), dx and sx float32 (in / 32,):
    dx = max|x| / 127 and xq = rint(x * (1 / dx)) (0 for a block of zeros) in float32,
    sx = dx * sum(xq) (the q4 formats' m and -8 d multiply it)."""
    blocks = np.asarray(x, np.float32).reshape(-1, 32)
    dx = np.abs(blocks).max(axis=1) / np.float32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(dx == 0, np.float32(0), np.float32(1) / dx)
    xq = np.rint(blocks * inv[:, None]).astype(np.int8)
    sx = dx * xq.sum(axis=1, dtype=np.int32).astype(np.float32)
    return xq.reshape(-1), dx, sx


@njit(cache=True, nogil=True)
def _quantize_activations(x, xq, dx, sx):
    for b in range(dx.shape[0]):
        largest = np.float32(0)
        for j in range(32):
            largest = max(largest, abs(np.float32(x[32 * b + j])))
        scale = largest / np.float32(127)
        inv = np.float32(1) / scale if scale != 0 else np.float32(0)
        total = np.int32(0)
        for j in range(32):
            q = np.int32(np.rint(np.float32(x[32 * b + j]) * inv))
            xq[32 * b + j] = q
            total += q
        dx[b], sx[b] = scale, scale * np.float32(total)


# ---------------------------------------------------------------------------------------------
# numpy reference: the block sums, in float64
# ---------------------------------------------------------------------------------------------


def _block_values(weight):
    """W^T's (out, blocks, 32) integer q, d and m (out, blocks) in float64, every format's value
    d * q + m: q4_0's d (q - 8) has m = -8 d, q8_0's m is 0."""
    d = weight.scales.astype(np.float64)
    if weight.format == "q8_0":
        return weight.quants.astype(np.int64), d, np.zeros_like(d)
    low, high = weight.quants & np.uint8(15), weight.quants >> np.uint8(4)
    q = np.concatenate([low, high], axis=-1).astype(np.int64)
    if weight.format == "q4_0":
        return q, d, -8 * d
    return q, d, weight.mins.astype(np.float64)


def quantized_matvec_int8_numpy(x, weight):
    """x (N, in) @ W with each row of x as quantize_activations makes it: per block,
    d dx sum(q xq) + m sx, summed over the blocks (float64, then x's dtype)."""
    x = _check(x, weight, "quantized_matvec_int8", False)
    _check_format(weight, "quantized_matvec_int8")
    q, d, m = _block_values(weight)
    out = np.empty((x.shape[0], weight.shape[1]), x.dtype)
    for i, row in enumerate(x):
        xq, dx, sx = quantize_activations(row)
        sums = np.einsum("obj,bj->ob", q, xq.reshape(-1, 32).astype(np.int64))
        out[i] = (d * dx * sums + m * sx).sum(axis=1)
    return out


# ---------------------------------------------------------------------------------------------
# AVX2: one row's dot product as LLVM IR (vpmaddubsw, vpmaddwd, an FMA per block)
# ---------------------------------------------------------------------------------------------

_I8, _I16, _I32, _F32, _HALF = (
    ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.FloatType(), ir.HalfType()
)  # fmt: skip


def _vector(kind, n):
    return ir.VectorType(kind, n)


def _splat(kind, n, value):
    return ir.Constant(_vector(kind, n), [value] * n)


def _row_dot(fmt):
    """An intrinsic row_dot(quants, q_at, scales, s_at, mins, xq, dx, sx, blocks) -> float32: the
    int8 product of one row of W^T (its quants from element q_at, its f16 bits from s_at of
    scales and mins) with xq over `blocks` blocks. mins is read for q4_1 only."""

    def codegen(context, builder, signature, args):
        arrays = [context.make_array(signature.args[i])(context, builder, args[i]) for i in
                  (0, 2, 4, 5, 6, 7)]  # fmt: skip
        quants, scales, mins, xq, dx, sx = (a.data for a in arrays)
        q_at, s_at, blocks = args[1], args[3], args[8]

        def load(pointer, index, kind, align):
            address = builder.gep(pointer, [index])
            return builder.load(builder.bitcast(address, kind.as_pointer()), align=align)

        def function(name, result, operands):
            kind = ir.FunctionType(result, operands)
            return cgutils.get_or_insert_function(builder.module, kind, name)

        madd_bytes = function(
            "llvm.x86.avx2.pmadd.ub.sw", _vector(_I16, 16), [_vector(_I8, 32)] * 2
        )
        madd_words = function("llvm.x86.avx2.pmadd.wd", _vector(_I32, 8), [_vector(_I16, 16)] * 2)
        fma = function("llvm.fma.v8f32", _vector(_F32, 8), [_vector(_F32, 8)] * 3)
        lanes = cgutils.alloca_once_value(builder, _splat(_F32, 8, 0.0))
        offsets = cgutils.alloca_once_value(builder, ir.Constant(_F32, 0.0))  # the m sx terms
        at = q_at.type
        bytes_per_block = 32 if fmt == "q8_0" else 16
        with cgutils.for_range(builder, blocks) as loop:
            b = loop.index
            byte_at = builder.add(q_at, builder.mul(b, at(bytes_per_block)))
            x = load(xq, builder.mul(b, at(32)), _vector(_I8, 32), 1)
            if fmt == "q8_0":  # |q| (128 for -128, read unsigned) times xq with q's sign
                w = load(quants, byte_at, _vector(_I8, 32), 1)
                negative = builder.icmp_signed("<", w, _splat(_I8, 32, 0))
                magnitude = builder.select(negative, builder.neg(w), w)
                pairs = builder.call(
                    madd_bytes, [magnitude, builder.select(negative, builder.neg(x), x)]
                )
            else:  # byte j: value j in the low nibble, j + 16 in the high one
                w = load(quants, byte_at, _vector(_I8, 16), 1)
                low = builder.and_(w, _splat(_I8, 16, 15))
                high = builder.lshr(w, _splat(_I8, 16, 4))
                nibbles = builder.shuffle_vector(
                    low, high, ir.Constant(_vector(_I32, 32), list(range(32)))
                )
                pairs = builder.call(madd_bytes, [nibbles, x])
            # 8 int32 lanes, each the sum of 4 products q xq; then lanes += float(sums) * d dx
            sums = builder.call(madd_words, [pairs, _splat(_I16, 16, 1)])
            s_index = builder.add(s_at, b)
            d = builder.fpext(load(scales, s_index, _HALF, 2), _F32)
            x_scale = load(dx, b, _F32, 4)
            scale = builder.fmul(d, x_scale)
            splat = builder.insert_element(
                ir.Constant(_vector(_F32, 8), ir.Undefined), scale, _I32(0)
            )
            splat = builder.shuffle_vector(splat, splat, ir.Constant(_vector(_I32, 8), [0] * 8))
            as_float = builder.sitofp(sums, _vector(_F32, 8))
            builder.store(builder.call(fma, [as_float, splat, builder.load(lanes)]), lanes)
            if fmt != "q8_0":  # q4_1: m sx; q4_0: (-8 d) sx
                if fmt == "q4_1":
                    m = builder.fpext(load(mins, s_index, _HALF, 2), _F32)
                else:
                    m = builder.fmul(d, ir.Constant(_F32, -8.0))
                term = builder.fmul(m, load(sx, b, _F32, 4))
                builder.store(builder.fadd(builder.load(offsets), term), offsets)
        total, vector = builder.load(offsets), builder.load(lanes)
        for i in range(8):
            total = builder.fadd(total, builder.extract_element(vector, _I32(i)))
        return total

    def typer(typingctx, quants, q_at, scales, s_at, mins, xq, dx, sx, blocks):
        return types.float32(quants, q_at, scales, s_at, mins, xq, dx, sx, blocks), codegen

    typer.__name__ = f"row_dot_{fmt}"
    return intrinsic(typer)


_row_dot_q8_0, _row_dot_q4_0, _row_dot_q4_1 = (_row_dot(fmt) for fmt in FORMATS)


@Kernel
def _matvec_avx2(kind, quants, scales, mins, xq, dx, sx, ahead, out):
    # kind: FORMATS.index(format); the branch is taken once per row
    blocks = scales.shape[1]
    for r in prange(quants.shape[0]):
        _prefetch_row(quants, r, ahead)
        q_at, s_at = r * quants.shape[1], r * blocks
        if kind == 0:
            out[r] = _row_dot_q8_0(quants, q_at, scales, s_at, mins, xq, dx, sx, blocks)
        elif kind == 1:
            out[r] = _row_dot_q4_0(quants, q_at, scales, s_at, mins, xq, dx, sx, blocks)
        else:
            out[r] = _row_dot_q4_1(quants, q_at, scales, s_at, mins, xq, dx, sx, blocks)


# ---------------------------------------------------------------------------------------------
# everywhere else: the same block sums as a Numba loop (float64 sums, as the reference's)
# ---------------------------------------------------------------------------------------------


@Kernel
def _matvec_portable(kind, quants, scales, mins, table, xq, dx, sx, ahead, out):
    blocks = scales.shape[1]
    for r in prange(quants.shape[0]):
        _prefetch_row(quants, r, ahead)
        total = 0.0
        for b in range(blocks):
            dot = np.int32(0)
            if kind == 0:
                for j in range(32):
                    dot += np.int32(quants[r, 32 * b + j]) * np.int32(xq[32 * b + j])
            else:
                for j in range(16):
                    byte = np.int32(quants[r, 16 * b + j])
                    dot += np.int32(byte & 15) * np.int32(xq[32 * b + j])
                    dot += np.int32(byte >> 4) * np.int32(xq[32 * b + 16 + j])
            d = np.float64(table[scales[r, b]])
            # q4_0's d (q - 8) x~ summed: d dx sum(q xq) - 8 d sx
            m = 0.0 if kind == 0 else (-8 * d if kind == 1 else np.float64(table[mins[r, b]]))
            total += d * np.float64(dx[b]) * dot + m * np.float64(sx[b])
        out[r] = total


def _bound_matvec(x, weight, out):
    """A call () -> None: out (out,) = the int8 product of one row x (in,) (C-contiguous,
    float32 or float64), x quantized into buffers of its own at each call."""
    xq = np.empty(x.shape[0], np.int8)
    dx, sx = np.empty((2, x.shape[0] // 32), np.float32)
    quants = weight.quants.reshape(weight.quants.shape[0], -1)
    scales = weight.scales.view(np.uint16)
    mins = scales if weight.mins is None else weight.mins.view(np.uint16)
    kind, work = FORMATS.index(weight.format), weight.shape[0] * weight.shape[1]
    ahead = max(1, PREFETCH_BYTES // (weight.quants.nbytes // weight.shape[1]))
    if AVX2 and out.dtype == np.float32:
        product = partial(_matvec_avx2, work, kind, quants, scales, mins, xq, dx, sx, ahead, out)
    else:
        product = partial(
            _matvec_portable, work, kind, quants, scales, mins, F16_TO_F32, xq, dx, sx, ahead, out
        )

    def call():
        _quantize_activations(x, xq, dx, sx)
        product()

    return call


def _matvec_into(x, weight, out):
    _bound_matvec(x, weight, out)()


def quantized_matvec_int8_numba(x, weight):
    """Numba quantized_matvec_int8; the same contract as quantized_matvec_int8_numpy."""
    x = _check(x, weight, "quantized_matvec_int8", False)
    _check_format(weight, "quantized_matvec_int8")
    out = np.empty((x.shape[0], weight.shape[1]), x.dtype)
    for row, row_out in zip(x, out, strict=True):
        _matvec_into(row, weight, row_out)
    return out


def matvec_int8_into(x, weight, out):
    """out[...] = quantized_matvec_int8_numba(x, weight); one C-contiguous row of x, of out's
    dtype, goes to the kernel with out written in place."""
    if _one_row(x, weight, out):
        _check_format(weight, "quantized_matvec_int8")
        _matvec_into(x[0], weight, out[0])
    else:
        out[...] = quantized_matvec_int8_numba(x, weight)


def bind_matvec_int8_into(x, weight, out):
    """A call () -> None doing matvec_int8_into(x, weight, out) on these very arrays, its checks,
    buffers and the kernel's arguments made once (the compiled decode step's call)."""
    _check_format(weight, "quantized_matvec_int8")
    if not _one_row(x, weight, out):
        return partial(matvec_int8_into, x, weight, out)
    return _bound_matvec(x[0], weight, out[0])
