"""The quantized linear's products (autograd/quantized.py): x @ W and g @ W^T, W frozen in blocks.

W (in, out) is stored as the blocks of W^T's rows (llama.cpp's q8_0, q4_0, q4_1, q5_0, q5_1: 32
values of one row, an f16 scale d, q4_1 and q5_1 an f16 minimum m; q4_k, q5_k and q6_k:
super-blocks of 256 values, f16 d (and dmin), an integer s (and m) per group of 32 or 16). Each
value is

    q8_0: d * q     q4_0: d * (q - 8)     q4_1, q5_1: d * q + m     q5_0: d * (q - 16)
    q4_k, q5_k: (d s_g) * q - dmin m_g    q6_k: (d s_g) * (q - 32)
    (in float32, as gguf reads; a q5's q is a nibble and one bit of the block's 32-bit mask or
    of q5_k's highs, q6_k's a nibble and a 2-bit field)

- quantized_matmul(x, weight):  x (N, in) @ W -> (N, out)
- quantized_matmul_t(g, weight): g (N, out) @ W^T -> (N, in)   (the VJP for x)
- quantize_rows(rows, fmt): W^T's float rows -> their blocks (llama.cpp's reference quantizers)

The numpy references dequantize W with gguf's arithmetic (QuantizedWeight.dequantize_rows) and
multiply. The Numba paths never hold the whole float W:
- one row of x (decoding a token): a matrix-vector kernel, one output per prange iteration, the
  block's values made inside the dot product (the weight's bytes are read once: decoding is
  bound by memory bandwidth);
- more rows (prefill, training): a tile of W^T's rows at a time is dequantized (in parallel) into
  a float buffer of x's dtype and multiplied by BLAS.
f16 scales become float32 through a 65536-entry table (Numba has no float16 on the CPU).
"""

from functools import partial

import numpy as np
from numba import njit, prange

from ._common import FASTMATH, Kernel
from ._prefetch import prefetch

# "contract" lets LLVM fuse a * b + c into one FMA. A value stays gguf's: d * q is exact in
# float32 (an 11-bit d times a 4- or 8-bit q), so fma(d, q, m) rounds once where gguf's
# d * q + m rounds once too. Only the sums' rounding changes, as "reassoc" already allows.
# (+18 % on the q4_1 matrix-vector product, one thread)
EXACT_VALUES = FASTMATH | {"contract"}


def _kernel(fn):
    return Kernel(fn, fastmath=EXACT_VALUES)


F16_TO_F32 = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)

# rows of W^T per dequantized tile: (TILE_ROWS, in) floats, 2.4-6.3 MB in float32 for
# in = 576..1536: in cache between being written and BLAS reading it, and wide enough for BLAS
# (x (1024, 576) @ W (576, 1536) in q8_0: 8.7 ms with 256 rows, 7.5 with 1024, float32 5.8).
# For x of fewer than FEW_ROWS rows (a prompt's prefill) the product is small beside the
# dequantization, and the tile takes FEW_ROWS rows: SmolLM2's 21-token prefill in the file's
# blocks 137.6 -> 140.8 ms, its peak RSS 254.6 -> 251.4 MB (the tiles are freed, not returned).
TILE_ROWS = 1024
FEW_ROWS = 256


def _check(x, weight, kernel, transposed):
    n = weight.shape[1] if transposed else weight.shape[0]
    x = np.asarray(x)
    if x.ndim != 2 or x.shape[1] != n or x.dtype not in (np.float32, np.float64):
        raise ValueError(
            f"{kernel}: x must be a float32/float64 (N, {n}) array for {weight!r}, "
            f"got {x.dtype} {x.shape}"
        )
    return np.ascontiguousarray(x)


# ---------------------------------------------------------------------------------------------
# numpy references: gguf's dequantization, then the product
# ---------------------------------------------------------------------------------------------


def quantized_matmul_numpy(x, weight):
    """x (N, in) @ W, W = weight.dequantize() (float32 values, in x's dtype) -> (N, out)."""
    x = _check(x, weight, "quantized_matmul", False)
    return x @ weight.dequantize().astype(x.dtype)


def quantized_matmul_t_numpy(g, weight):
    """g (N, out) @ W^T -> (N, in)."""
    g = _check(g, weight, "quantized_matmul_t", True)
    return g @ weight.dequantize_rows().astype(g.dtype)


# ---------------------------------------------------------------------------------------------
# Numba: the matrix-vector kernels (one row of x), one per format
# ---------------------------------------------------------------------------------------------


# Each output keeps 32 running sums, one per position in a block (lanes), added up at the end:
# the inner loop then has no reduction and no horizontal add per block, and LLVM turns it into
# vector instructions (4x faster than a sum per block on AVX-512). Every value is made as gguf's
# reader makes it, in float32, before it is multiplied, so a float64 x sees exactly W.
#
# Before a row, the row `ahead` rows later is prefetched (_prefetch.py): the arithmetic per byte
# keeps the hardware prefetcher behind, and the weight (a model's worth of rows, one layer after
# another) comes from memory, not the cache (q8_0, 400000 x 576: 5.4 -> 11.7 GB/s on one core).
PREFETCH_BYTES = 2048


@njit(cache=True, nogil=True)
def _prefetch_row(quants, r, ahead):
    """Prefetch the cache lines of row r + ahead of quants (out, bytes), if there is one."""
    if r + ahead < quants.shape[0]:
        start = (r + ahead) * quants.shape[1]
        for offset in range(0, quants.shape[1], 64):
            prefetch(quants, start + offset)


@njit(cache=True, nogil=True)
def _nibbles(byte):
    """(low, high) 4-bit values of a byte as int32: Numba's own integer arithmetic is int64,
    whose vectors convert to float at half the width (q4_1: 7.1 -> 11.2 G values/s, one core)."""
    byte = np.int32(byte)
    return np.int32(byte & 15), np.int32(byte >> 4)


@_kernel
def _matvec_q8_0(x, scales, quants, table, ahead, out):
    for r in prange(quants.shape[0]):
        _prefetch_row(quants, r, ahead)
        lanes = np.zeros(32, x.dtype)
        for b in range(scales.shape[1]):
            d = table[scales[r, b]]
            for j in range(32):
                lanes[j] += x[32 * b + j] * (d * np.float32(quants[r, 32 * b + j]))
        out[r] = lanes.sum()


@_kernel
def _matvec_q4_0(x, scales, quants, table, ahead, out):
    # byte j of a block: its low nibble is value j, its high nibble value j + 16
    for r in prange(quants.shape[0]):
        _prefetch_row(quants, r, ahead)
        lanes = np.zeros(32, x.dtype)
        for b in range(scales.shape[1]):
            d = table[scales[r, b]]
            for j in range(16):
                low, high = _nibbles(quants[r, 16 * b + j])
                # q - 8 in float32 (exact), not in integers: those would widen to int64
                lanes[j] += x[32 * b + j] * (d * (np.float32(low) - np.float32(8)))
                lanes[16 + j] += x[32 * b + 16 + j] * (d * (np.float32(high) - np.float32(8)))
        out[r] = lanes.sum()


@njit(cache=True, nogil=True)
def _five(nibble, mask, bit):
    """A q5_0 / q5_1 value: the nibble and, as its fifth bit, bit `bit` of the block's mask."""
    return np.int32(nibble | (((mask >> np.int32(bit)) & np.int32(1)) << np.int32(4)))


BIT = (np.int64(1) << np.arange(32)).astype(np.uint32).view(np.int32)  # bit j set in BIT[j]


@_kernel
def _matvec_q5_0(x, scales, highs, quants, table, bit, ahead, out):
    # d * (q - 16) with q = nibble + 16 * fifth bit, as d * nibble + (0 if the bit is set, else
    # -16 d): one FMA, and the exact value both ways (an 11-bit d times a 5-bit integer; only a
    # zero's sign can differ, which no sum sees). The bit picks a constant (a vector blend)
    # instead of being shifted into q per value (64-bit shifts: the kernel ran 1.9x slower)
    for r in prange(quants.shape[0]):
        _prefetch_row(quants, r, ahead)
        lanes = np.zeros(32, x.dtype)
        for b in range(scales.shape[1]):
            d, mask = table[scales[r, b]], highs[r, b]
            unset, zero = d * np.float32(-16), np.float32(0)
            for j in range(16):
                low, high = _nibbles(quants[r, 16 * b + j])
                low_offset = zero if mask & bit[j] else unset
                high_offset = zero if mask & bit[16 + j] else unset
                lanes[j] += x[32 * b + j] * (d * np.float32(low) + low_offset)
                lanes[16 + j] += x[32 * b + 16 + j] * (d * np.float32(high) + high_offset)
        out[r] = lanes.sum()


@_kernel
def _matvec_q5_1(x, scales, mins, highs, quants, table, bit, ahead, out):
    # d * q + m with q = nibble + (16 if the fifth bit is set, a blend) summed in float32 (exact,
    # an integer below 32): one FMA rounding once, as gguf's d * q (exact) + m does
    for r in prange(quants.shape[0]):
        _prefetch_row(quants, r, ahead)
        lanes = np.zeros(32, x.dtype)
        for b in range(scales.shape[1]):
            d, m, mask = table[scales[r, b]], table[mins[r, b]], highs[r, b]
            sixteen, zero = np.float32(16), np.float32(0)
            for j in range(16):
                low, high = _nibbles(quants[r, 16 * b + j])
                low_q = np.float32(low) + (sixteen if mask & bit[j] else zero)
                high_q = np.float32(high) + (sixteen if mask & bit[16 + j] else zero)
                lanes[j] += x[32 * b + j] * (d * low_q + m)
                lanes[16 + j] += x[32 * b + 16 + j] * (d * high_q + m)
        out[r] = lanes.sum()


@_kernel
def _matvec_q4_1(x, scales, mins, quants, table, ahead, out):
    for r in prange(quants.shape[0]):
        _prefetch_row(quants, r, ahead)
        lanes = np.zeros(32, x.dtype)
        for b in range(scales.shape[1]):
            d, m = table[scales[r, b]], table[mins[r, b]]
            for j in range(16):
                low, high = _nibbles(quants[r, 16 * b + j])
                lanes[j] += x[32 * b + j] * (d * np.float32(low) + m)
                lanes[16 + j] += x[32 * b + 16 + j] * (d * np.float32(high) + m)
        out[r] = lanes.sum()


@njit(cache=True, nogil=True)
def _group_pair(d, dmin, group_scales, group_mins, r, g):
    """q4_k's and q5_k's d s and dmin m of groups g and g + 1 of row r: exact in float32 (an
    11-bit d times a 6-bit integer)."""
    return (
        d * np.float32(group_scales[r, g]),
        d * np.float32(group_scales[r, g + 1]),
        dmin * np.float32(group_mins[r, g]),
        dmin * np.float32(group_mins[r, g + 1]),
    )


@njit(cache=True, nogil=True)
def _k_pair(quants, highs, five, r, k, c, j):
    """q4_k's (five False) or q5_k's two q of byte j of run c of super-block k in row r, values j
    of groups 2c and 2c + 1: the nibbles and, for q5_k, bits 2c and 2c + 1 of highs byte j above
    them (bit g of byte j is value j of group g's), as int32 (each step cast back, as _six)."""
    low, high = _nibbles(quants[r, 128 * k + 32 * c + j])
    if not five:
        return low, high
    fifth = np.int32(highs[r, 32 * k + j])
    low_bit = np.int32(np.int32(fifth >> np.int32(2 * c)) & np.int32(1))
    high_bit = np.int32(np.int32(fifth >> np.int32(2 * c + 1)) & np.int32(1))
    return np.int32(low | np.int32(low_bit << 4)), np.int32(high | np.int32(high_bit << 4))


NO_HIGHS = np.zeros((1, 1), np.uint8)  # q4_k's highs for the kernels it shares with q5_k


@_kernel
def _matvec_q4_k_q5_k(
    x, scales, mins, group_scales, group_mins, highs, five, quants, table, ahead, out
):
    # (d s_g) q is exact in float32 (at most 22 bits): one FMA rounds once, as gguf's
    # (d s_g) q - dmin m_g does. Byte j of run c holds value j of group 2c (low nibble) and of
    # group 2c + 1 (high); q5_k (five) adds a fifth bit from highs
    for r in prange(quants.shape[0]):
        _prefetch_row(quants, r, ahead)
        lanes = np.zeros(64, x.dtype)
        for k in range(scales.shape[1]):
            d, dmin = table[scales[r, k]], table[mins[r, k]]
            for c in range(4):
                s_low, s_high, m_low, m_high = _group_pair(
                    d, dmin, group_scales, group_mins, r, 8 * k + 2 * c
                )
                at = 256 * k + 64 * c
                for j in range(32):
                    low, high = _k_pair(quants, highs, five, r, k, c, j)
                    lanes[j] += x[at + j] * (s_low * np.float32(low) - m_low)
                    lanes[32 + j] += x[at + 32 + j] * (s_high * np.float32(high) - m_high)
        out[r] = lanes.sum()


@njit(cache=True, nogil=True)
def _six(quants, highs, r, k, half, j):
    """q6_k's four q of byte j (< 32) of half `half` of super-block k in row r, values j, 32 + j,
    64 + j and 96 + j of the half, as float32 q - 32: the low nibbles of bytes j and 32 + j of the
    half's 64, then their high nibbles, each with a 2-bit field of highs byte j above it."""
    first = np.int32(quants[r, 128 * k + 64 * half + j])
    second = np.int32(quants[r, 128 * k + 64 * half + 32 + j])
    two = np.int32(highs[r, 64 * k + 32 * half + j])
    # every step cast back to int32: Numba's integer arithmetic is int64, whose vectors hold
    # half as many values (and convert to float at half the width), as in _nibbles
    q0 = np.int32(first & 15) | np.int32(np.int32(two & 3) << 4)
    q1 = np.int32(second & 15) | np.int32(np.int32(two & 12) << 2)
    q2 = np.int32(first >> 4) | np.int32(two & 48)
    q3 = np.int32(second >> 4) | np.int32(np.int32(two & 192) >> 2)
    centre = np.float32(32)
    return (
        np.float32(np.int32(q0)) - centre, np.float32(np.int32(q1)) - centre,
        np.float32(np.int32(q2)) - centre, np.float32(np.int32(q3)) - centre,
    )  # fmt: skip


@njit(cache=True, nogil=True)
def _quarter_scales(d, group_scales, r, g):
    """q6_k's d s of groups g, g + 2, g + 4, g + 6 of row r (one in each quarter of a half, for
    its bytes 0-15 or 16-31): exact in float32 (an 11-bit d times an int8)."""
    return (
        d * np.float32(group_scales[r, g]),
        d * np.float32(group_scales[r, g + 2]),
        d * np.float32(group_scales[r, g + 4]),
        d * np.float32(group_scales[r, g + 6]),
    )


@_kernel
def _matvec_q6_k(x, scales, group_scales, quants, highs, table, ahead, out):
    # (d s_g) (q - 32): d s_g is exact (an 11-bit d times an int8), q - 32 too; their product
    # rounds once, as gguf's does. Value v of a super-block is in group v // 16
    for r in prange(quants.shape[0]):
        _prefetch_row(quants, r, ahead)
        lanes = np.zeros(128, x.dtype)
        for k in range(scales.shape[1]):
            d = table[scales[r, k]]
            for half in range(2):
                at = 256 * k + 128 * half
                for part in range(2):  # bytes 0-15, then 16-31: one group in each quarter
                    g = 16 * k + 8 * half + part
                    s0, s1, s2, s3 = _quarter_scales(d, group_scales, r, g)
                    for j in range(16 * part, 16 * part + 16):
                        q0, q1, q2, q3 = _six(quants, highs, r, k, half, j)
                        lanes[j] += x[at + j] * (s0 * q0)
                        lanes[32 + j] += x[at + 32 + j] * (s1 * q1)
                        lanes[64 + j] += x[at + 64 + j] * (s2 * q2)
                        lanes[96 + j] += x[at + 96 + j] * (s3 * q3)
        out[r] = lanes.sum()


def _flat_k(weight):
    """The K-quant kernels' view: f16 bits (out, super-blocks) of d (and dmin), the groups' s
    (and m) (out, groups), the quants and q5_k's and q6_k's highs as (out, bytes)."""
    n_out = weight.shape[1]
    flat = {name: a.reshape(n_out, -1) for name, a in weight.arrays().items()}
    flat["scales"] = weight.scales.view(np.uint16)
    if weight.mins is not None:  # q4_k's and q5_k's dmin
        flat["mins"] = weight.mins.view(np.uint16)
    return flat


def _flat(weight):
    """The kernels' view of the blocks: f16 bits (out, blocks); the mins as f16 bits and the
    fifth bits as int32 (out, blocks), each None where the format has none; quants (out, bytes)."""
    quants = weight.quants.reshape(weight.quants.shape[0], -1)
    mins = None if weight.mins is None else weight.mins.view(np.uint16)
    highs = None if weight.highs is None else weight.highs.view(np.int32)
    return weight.scales.view(np.uint16), mins, highs, quants


def _matvec_call(x, weight, out):
    """(kernel, args) of the matrix-vector product out (out,) = x (in,) @ W: kernel(*args)."""
    work = weight.shape[0] * weight.shape[1]
    ahead = max(1, PREFETCH_BYTES // (weight.quants.nbytes // weight.shape[1]))
    if weight.format in ("q4_k", "q5_k", "q6_k"):
        a = _flat_k(weight)
        if weight.format in ("q4_k", "q5_k"):
            return _matvec_q4_k_q5_k, (
                work, x, a["scales"], a["mins"], a["group_scales"], a["group_mins"],
                a.get("highs", NO_HIGHS), weight.format == "q5_k", a["quants"], F16_TO_F32,
                ahead, out,
            )  # fmt: skip
        return _matvec_q6_k, (
            work, x, a["scales"], a["group_scales"], a["quants"], a["highs"], F16_TO_F32, ahead,
            out,
        )  # fmt: skip
    bits, mins, highs, quants = _flat(weight)
    if weight.format == "q8_0":
        return _matvec_q8_0, (work, x, bits, quants, F16_TO_F32, ahead, out)
    if weight.format == "q4_0":
        return _matvec_q4_0, (work, x, bits, quants, F16_TO_F32, ahead, out)
    if weight.format == "q4_1":
        return _matvec_q4_1, (work, x, bits, mins, quants, F16_TO_F32, ahead, out)
    if weight.format == "q5_0":
        return _matvec_q5_0, (work, x, bits, highs, quants, F16_TO_F32, BIT, ahead, out)
    return _matvec_q5_1, (work, x, bits, mins, highs, quants, F16_TO_F32, BIT, ahead, out)


def _matvec(x, weight, out):
    kernel, args = _matvec_call(x, weight, out)
    kernel(*args)


def _one_row(x, weight, out):
    """Whether x (1, in) and out (1, out) are one C-contiguous row each, of one float dtype:
    what the matrix-vector kernels write into out directly."""
    return (
        x.ndim == 2
        and x.shape == (1, weight.shape[0])
        and out.shape == (1, weight.shape[1])
        and x.dtype == out.dtype
        and x.dtype in (np.float32, np.float64)
        and x.flags.c_contiguous
        and out.flags.c_contiguous
    )


# ---------------------------------------------------------------------------------------------
# Numba: dequantize a tile of W^T's rows into a float buffer (gguf's arithmetic, float32)
# ---------------------------------------------------------------------------------------------


@Kernel
def _dequantize_q8_0(scales, quants, table, start, tile):
    for i in prange(tile.shape[0]):
        for b in range(scales.shape[1]):
            d = table[scales[start + i, b]]
            for j in range(32):
                tile[i, 32 * b + j] = np.float32(quants[start + i, 32 * b + j]) * d


@Kernel
def _dequantize_q4_0(scales, quants, table, start, tile):
    for i in prange(tile.shape[0]):
        for b in range(scales.shape[1]):
            d = table[scales[start + i, b]]
            for j in range(16):
                byte = quants[start + i, 16 * b + j]
                tile[i, 32 * b + j] = d * np.float32(np.int32(byte & 15) - 8)
                tile[i, 32 * b + 16 + j] = d * np.float32(np.int32(byte >> 4) - 8)


@Kernel
def _dequantize_q4_1(scales, mins, quants, table, start, tile):
    for i in prange(tile.shape[0]):
        for b in range(scales.shape[1]):
            d, m = table[scales[start + i, b]], table[mins[start + i, b]]
            for j in range(16):
                byte = quants[start + i, 16 * b + j]
                tile[i, 32 * b + j] = d * np.float32(byte & 15) + m
                tile[i, 32 * b + 16 + j] = d * np.float32(byte >> 4) + m


@Kernel
def _dequantize_q5_0(scales, highs, quants, table, start, tile):
    for i in prange(tile.shape[0]):
        for b in range(scales.shape[1]):
            d, mask = table[scales[start + i, b]], highs[start + i, b]
            for j in range(16):
                low, high = _nibbles(quants[start + i, 16 * b + j])
                low, high = _five(low, mask, j), _five(high, mask, j + 16)
                tile[i, 32 * b + j] = d * (np.float32(low) - np.float32(16))
                tile[i, 32 * b + 16 + j] = d * (np.float32(high) - np.float32(16))


@Kernel
def _dequantize_q5_1(scales, mins, highs, quants, table, start, tile):
    for i in prange(tile.shape[0]):
        for b in range(scales.shape[1]):
            d, m = table[scales[start + i, b]], table[mins[start + i, b]]
            mask = highs[start + i, b]
            for j in range(16):
                low, high = _nibbles(quants[start + i, 16 * b + j])
                low, high = _five(low, mask, j), _five(high, mask, j + 16)
                tile[i, 32 * b + j] = d * np.float32(low) + m
                tile[i, 32 * b + 16 + j] = d * np.float32(high) + m


@Kernel
def _dequantize_q4_k_q5_k(
    scales, mins, group_scales, group_mins, highs, five, quants, table, start, tile
):
    for i in prange(tile.shape[0]):
        r = start + i
        for k in range(scales.shape[1]):
            d, dmin = table[scales[r, k]], table[mins[r, k]]
            for c in range(4):
                s_low, s_high, m_low, m_high = _group_pair(
                    d, dmin, group_scales, group_mins, r, 8 * k + 2 * c
                )
                for j in range(32):
                    low, high = _k_pair(quants, highs, five, r, k, c, j)
                    tile[i, 256 * k + 64 * c + j] = s_low * np.float32(low) - m_low
                    tile[i, 256 * k + 64 * c + 32 + j] = s_high * np.float32(high) - m_high


@Kernel
def _dequantize_q6_k(scales, group_scales, quants, highs, table, start, tile):
    for i in prange(tile.shape[0]):
        r = start + i
        for k in range(scales.shape[1]):
            d = table[scales[r, k]]
            for half in range(2):
                at = 256 * k + 128 * half
                for part in range(2):
                    g = 16 * k + 8 * half + part
                    s0, s1, s2, s3 = _quarter_scales(d, group_scales, r, g)
                    for j in range(16 * part, 16 * part + 16):
                        q0, q1, q2, q3 = _six(quants, highs, r, k, half, j)
                        tile[i, at + j], tile[i, at + 32 + j] = s0 * q0, s1 * q1
                        tile[i, at + 64 + j], tile[i, at + 96 + j] = s2 * q2, s3 * q3


def _dequantize_tile(weight, start, tile, work):
    """tile[i] = row start + i of W^T, in the tile's dtype (a float32 value, then converted);
    work: the Kernel's measure of it (0 runs it on this thread)."""
    if weight.format in ("q4_k", "q5_k", "q6_k"):
        a = _flat_k(weight)
        if weight.format in ("q4_k", "q5_k"):
            _dequantize_q4_k_q5_k(
                work, a["scales"], a["mins"], a["group_scales"], a["group_mins"],
                a.get("highs", NO_HIGHS), weight.format == "q5_k", a["quants"], F16_TO_F32,
                start, tile,
            )  # fmt: skip
        else:
            _dequantize_q6_k(
                work, a["scales"], a["group_scales"], a["quants"], a["highs"], F16_TO_F32,
                start, tile,
            )  # fmt: skip
        return
    bits, mins, highs, quants = _flat(weight)
    if weight.format == "q8_0":
        _dequantize_q8_0(work, bits, quants, F16_TO_F32, start, tile)
    elif weight.format == "q4_0":
        _dequantize_q4_0(work, bits, quants, F16_TO_F32, start, tile)
    elif weight.format == "q4_1":
        _dequantize_q4_1(work, bits, mins, quants, F16_TO_F32, start, tile)
    elif weight.format == "q5_0":
        _dequantize_q5_0(work, bits, highs, quants, F16_TO_F32, start, tile)
    else:
        _dequantize_q5_1(work, bits, mins, highs, quants, F16_TO_F32, start, tile)


def _tiles(weight, dtype, rows):
    """(start, stop, tile) over W^T's rows, each tile dequantized into one reused buffer; rows:
    x's (or g's) rows, which set the tile's height (TILE_ROWS, or FEW_ROWS for few rows)."""
    n_out, n_in = weight.shape[1], weight.shape[0]
    height = TILE_ROWS if rows >= FEW_ROWS else FEW_ROWS
    buffer = np.empty((min(height, n_out), n_in), dtype)
    for start in range(0, n_out, height):
        stop = min(start + height, n_out)
        tile = buffer[: stop - start]
        # few rows (a prompt's prefill): the tile is dequantized on this thread. Numba's workers
        # found the cores still taken by BLAS's threads, spinning after the tile before
        # (SmolLM2 Q4_K_M's 21-token prefill on 2 threads: 267 -> 114 ms; on 1 thread 167 ms)
        _dequantize_tile(weight, start, tile, tile.size if rows >= FEW_ROWS else 0)
        yield start, stop, tile


def quantized_matmul_numba(x, weight):
    """Numba x @ W; same contract as quantized_matmul_numpy."""
    x = _check(x, weight, "quantized_matmul", False)
    out = np.empty((x.shape[0], weight.shape[1]), x.dtype)
    if x.shape[0] == 1:
        _matvec(x[0], weight, out[0])
        return out
    for start, stop, tile in _tiles(weight, x.dtype, x.shape[0]):
        # not matmul(out=out[:, start:stop]): numpy leaves BLAS for its own loop when the output
        # is a strided slice (8 rows x 576 x 256 took 14 ms instead of 0.1 ms)
        out[:, start:stop] = x @ tile.T
    return out


def matmul_into(x, weight, out):
    """out[...] = quantized_matmul_numba(x, weight); one row of x, of out's dtype, both
    C-contiguous, runs the matrix-vector kernel into out directly. (Not a registered kernel of
    its own: the same kernels as quantized_matmul, writing into a buffer.)"""
    if _one_row(x, weight, out):
        _matvec(x[0], weight, out[0])
    else:
        out[...] = quantized_matmul_numba(x, weight)


def bind_matmul_into(x, weight, out):
    """A call () -> None doing matmul_into(x, weight, out) on these very arrays, its checks and
    the kernel's arguments made once (the compiled decode step's ~120 products a token each
    saved ~7 us of Python)."""
    if not _one_row(x, weight, out):
        return partial(matmul_into, x, weight, out)
    kernel, args = _matvec_call(x[0], weight, out[0])
    return partial(kernel, *args)


def quantized_matmul_t_numba(g, weight):
    """Numba g @ W^T; same contract as quantized_matmul_t_numpy."""
    g = _check(g, weight, "quantized_matmul_t", True)
    out = np.zeros((g.shape[0], weight.shape[0]), g.dtype)
    for start, stop, tile in _tiles(weight, g.dtype, g.shape[0]):
        out += g[:, start:stop] @ tile
    return out


# ---------------------------------------------------------------------------------------------
# quantizing W^T's rows: llama.cpp's reference quantizers (ggml-quants.c's quantize_row_*_ref,
# as the gguf package's numpy port computes them), in float32 step for step
# ---------------------------------------------------------------------------------------------


# the values q takes in the 4- and 5-bit formats; q4_0 and q5_0 are symmetric (d from the value of
# largest magnitude), q4_1 and q5_1 affine (d and a minimum m from the min and max)
LEVELS = {"q4_0": 16, "q4_1": 16, "q5_0": 32, "q5_1": 32}
SYMMETRIC = ("q4_0", "q5_0")


def _check_rows(rows, fmt, kernel):
    rows = np.ascontiguousarray(rows, dtype=np.float32)
    if rows.ndim != 2 or rows.shape[1] % 32 or (fmt != "q8_0" and fmt not in LEVELS):
        raise ValueError(
            f"{kernel}: rows must be (n, a multiple of 32) and fmt q8_0, q4_0, q4_1, q5_0 or "
            f"q5_1, got {rows.shape} and {fmt!r}"
        )
    return rows


def _round_half_away(v):
    """C's roundf (halves away from zero), as ggml's reference quantizer rounds; floor(a + 0.5)
    would round 0.49999997 up (a + 0.5 is 1.0 in float32)."""
    a = np.abs(v)
    whole = np.floor(a)
    return np.sign(v) * (whole + np.floor(2 * (a - whole)))


def _nibble_pairs(q):
    """(..., 32) values in [0, 15] -> (..., 16) bytes: value j low, value j + 16 high."""
    return q[..., :16] | (q[..., 16:] << np.uint8(4))


def quantize_rows_numpy(rows, fmt):
    """rows (n, in) of finite floats -> (d, quants, m, h) of their 32-value blocks, d and m float32
    (n, in / 32) (m: q4_1's and q5_1's minimum, zeros for the others), h uint32 (n, in / 32) (the
    q5s' fifth bits, zeros for the others), quants as QuantizedWeight keeps them:

    q8_0: d = max|x| / 127, q = roundf(x / d)                       (int8, (n, blocks, 32));
    q4_0: d = -(the value of largest magnitude, the first) / 8, q = min(15, trunc(x / d + 8.5));
    q4_1: d = (max - min) / 15, m = min, q = min(15, trunc((x - min) / d + 0.5))  (nibble pairs);
    q5_0: as q4_0 with 16 for 8 and 31 for 15; q's low four bits in nibble pairs, bit 4 in h;
    q5_1: as q4_1 with 31 for 15, q stored as q5_0's.
    "/ d" is "* (1 / d)", and 1 / d is 0 for d = 0 (a block of zeros). A zero min or max counts
    as +0 (numpy's min of 0 and -0 depends on their places), so m and d carry no -0."""
    rows = _check_rows(rows, fmt, "quantize_rows")
    blocks = rows.reshape(rows.shape[0], -1, 32)
    levels, symmetric = LEVELS.get(fmt, 0), fmt in SYMMETRIC
    half = np.float32(levels // 2)
    with np.errstate(divide="ignore", invalid="ignore"):
        if fmt == "q8_0":
            d = np.abs(blocks).max(axis=-1, keepdims=True) / np.float32(127)
            m = np.zeros_like(d)
        elif symmetric:
            where = np.abs(blocks).argmax(axis=-1)[..., None]
            d = np.take_along_axis(blocks, where, axis=-1) / -half
            m = np.zeros_like(d)
        else:
            m = blocks.min(axis=-1, keepdims=True) + np.float32(0)
            top = blocks.max(axis=-1, keepdims=True) + np.float32(0)
            d = (top - m) / np.float32(levels - 1)
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d)
    if fmt == "q8_0":
        quants = _round_half_away(blocks * inv).astype(np.int8)
        return d[..., 0], quants, m[..., 0], np.zeros(d.shape[:-1], np.uint32)
    if symmetric:
        t = blocks * inv + (half + np.float32(0.5))
    else:
        t = (blocks - m) * inv + np.float32(0.5)
    q = np.trunc(t).astype(np.uint8).clip(0, levels - 1)
    h = np.packbits(q >> np.uint8(4), axis=-1, bitorder="little").view(np.uint32)[..., 0]
    return d[..., 0], _nibble_pairs(q & np.uint8(15)), m[..., 0], h


def _exact(fn):
    """A Kernel with no fast-math flags: each value is rounded where numpy rounds it."""
    return Kernel(fn, fastmath=False)


@njit(cache=True, nogil=True)
def _roundf(v):
    """_round_half_away of one float32."""
    a = abs(v)
    whole = np.floor(a)
    r = whole + np.floor(np.float32(2) * (a - whole))
    return r if v >= 0 else -r


@_exact
def _quantize_q8_0(rows, d, quants):
    for r in prange(rows.shape[0]):
        for b in range(d.shape[1]):
            block = rows[r, 32 * b : 32 * b + 32]
            amax = np.float32(0)
            for j in range(32):
                amax = max(amax, abs(block[j]))
            scale = amax / np.float32(127)
            inv = np.float32(1) / scale if scale != 0 else np.float32(0)
            d[r, b] = scale
            for j in range(32):
                quants[r, b, j] = np.int8(_roundf(block[j] * inv))


@njit(cache=True, nogil=True)
def _level(t, levels):
    """min(levels - 1, trunc(t)) of a non-negative float32 t: astype(uint8).clip(0, top) does."""
    return min(np.int64(np.trunc(t)), levels - 1)


@_exact
def _quantize_symmetric(rows, levels, d, quants, highs):
    """q4_0 (levels 16) and q5_0 (32): d = -(the first value of largest magnitude) / (levels / 2),
    q = min(levels - 1, trunc(x / d + levels / 2 + 1/2)); low nibbles in quants, fifth bits in
    highs (none for q4_0: its q stays below 16)."""
    half = np.float32(levels // 2)
    for r in prange(rows.shape[0]):
        for b in range(d.shape[1]):
            block = rows[r, 32 * b : 32 * b + 32]
            extreme = block[0]  # the first of the largest magnitude, sign and all (argmax)
            for j in range(1, 32):
                if abs(block[j]) > abs(extreme):
                    extreme = block[j]
            scale = extreme / -half
            inv = np.float32(1) / scale if scale != 0 else np.float32(0)
            d[r, b] = scale
            mask = np.int64(0)
            for j in range(16):
                low = _level(block[j] * inv + (half + np.float32(0.5)), levels)
                high = _level(block[16 + j] * inv + (half + np.float32(0.5)), levels)
                quants[r, b, j] = np.uint8((low & 15) | ((high & 15) << 4))
                mask |= ((low >> 4) << j) | ((high >> 4) << (j + 16))
            highs[r, b] = np.uint32(mask)


@_exact
def _quantize_affine(rows, levels, d, m, quants, highs):
    """q4_1 (levels 16) and q5_1 (32): d = (max - min) / (levels - 1), m = min (a zero min or max
    counts as +0), q = min(levels - 1, trunc((x - min) / d + 1/2)); stored as the symmetric ones."""
    for r in prange(rows.shape[0]):
        for b in range(d.shape[1]):
            block = rows[r, 32 * b : 32 * b + 32]
            low, top = block[0], block[0]
            for j in range(1, 32):
                low, top = min(low, block[j]), max(top, block[j])
            low, top = low + np.float32(0), top + np.float32(0)  # -0 -> +0
            scale = (top - low) / np.float32(levels - 1)
            inv = np.float32(1) / scale if scale != 0 else np.float32(0)
            d[r, b], m[r, b] = scale, low
            mask = np.int64(0)
            for j in range(16):
                q_low = _level((block[j] - low) * inv + np.float32(0.5), levels)
                q_high = _level((block[16 + j] - low) * inv + np.float32(0.5), levels)
                quants[r, b, j] = np.uint8((q_low & 15) | ((q_high & 15) << 4))
                mask |= ((q_low >> 4) << j) | ((q_high >> 4) << (j + 16))
            highs[r, b] = np.uint32(mask)


def quantize_rows_numba(rows, fmt):
    """Numba quantize_rows; the same contract and the same bits as quantize_rows_numpy."""
    rows = _check_rows(rows, fmt, "quantize_rows")
    n, blocks = rows.shape[0], rows.shape[1] // 32
    d, m = np.empty((n, blocks), np.float32), np.zeros((n, blocks), np.float32)
    h = np.zeros((n, blocks), np.uint32)
    if fmt == "q8_0":
        quants = np.empty((n, blocks, 32), np.int8)
        _quantize_q8_0(rows.size, rows, d, quants)
    else:
        quants = np.empty((n, blocks, 16), np.uint8)
        if fmt in SYMMETRIC:
            _quantize_symmetric(rows.size, rows, LEVELS[fmt], d, quants, h)
        else:
            _quantize_affine(rows.size, rows, LEVELS[fmt], d, m, quants, h)
    return d, quants, m, h
