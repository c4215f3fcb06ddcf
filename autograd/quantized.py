"""Weights kept quantized in memory (llama.cpp's block formats) and the linear op that reads them.

A block is 32 consecutive values of one row along the input dimension, stored as small integers
and an f16 scale (llama.cpp's ggml-common.h, the `gguf` package's gguf/quants.py):

| format | per block of 32 values                    | a value                 | bytes / value |
| ------ | ----------------------------------------- | ----------------------- | ------------- |
| q8_0   | f16 d, 32 int8 q                          | x = d * q               | 34 / 32       |
| q4_0   | f16 d, 16 bytes of nibbles q in [0, 15]    | x = d * (q - 8)         | 18 / 32       |
| q4_1   | f16 d, f16 m, 16 bytes of nibbles          | x = d * q + m           | 20 / 32       |
| q5_0   | f16 d, 32 high bits, 16 bytes of nibbles   | x = d * (q - 16)        | 22 / 32       |
| q5_1   | f16 d, f16 m, 32 high bits, 16 bytes       | x = d * q + m           | 24 / 32       |

In a nibble byte j of a block, the low four bits are value j and the high four bits value j + 16;
q5_0's and q5_1's fifth bits are one little-endian 32-bit mask, bit j value j's.

Three of llama.cpp's K-quants, the types its Q4_K_M / Q5_K_M / Q6_K files hold, are kept too,
as a file stores them (FILE_FORMATS: read from a GGUF file only; their quantizer is llama.cpp's
iterative search, which is not reproduced here). A super-block is 256 values with f16 d (and
dmin) and a small integer scale per group of 32 (q4_k, q5_k) or 16 (q6_k) values:

| format | per super-block of 256 values                         | a value of group g   | bytes   |
| ------ | ------------------------------------------------------ | -------------------- | ------- |
| q4_k   | f16 d, f16 dmin, 8 6-bit s, m (12 bytes), 128 nibbles  | (d s_g) q - dmin m_g | 144/256 |
| q5_k   | as q4_k, and 32 bytes of fifth bits before the nibbles | (d s_g) q - dmin m_g | 176/256 |
| q6_k   | 128 bytes of nibbles, 64 of 2-bit highs, 16 int8 s, d  | (d s_g) (q - 32)     | 210/256 |

q4_k's nibble byte j of run c (32 bytes) holds value j of group 2c (low) and of group 2c + 1
(high); q5_k's fifth bits: bit g of byte j is value j of group g's. In q6_k each half of 128
values has 64 bytes of nibbles (byte j: value j low, value 64 + j high) and 32 bytes of 2-bit
fields (byte j: values j, 32 + j, 64 + j, 96 + j from its low bits up). In memory the 6-bit s
and m of q4_k and q5_k are unpacked into bytes (16, not 12).

Row-vector convention (notes 3.2): a Linear is y = x @ W with W (in, out). The blocks run along
`in`, so a QuantizedWeight stores the rows of W^T, `out` rows of `in` values each, exactly as a
GGUF file stores a weight (and as torch's (out, in) Linear weight lies). `shape` is W's (in, out);
`dequantize()` returns W, a transposed view of the float32 rows.

The op: quantized_linear(x, weight, bias) = x @ dequantize(weight) + bias, frozen weight. Its
forward and VJP are autograd/kernels/quantized.py's kernels (the blocks dequantized inside the
dot product for one row; tile by tile into a float buffer and BLAS for many), its VJP
dx = g @ W^T the same op transposed, so create_graph differentiates it again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from autograd import kernels
from autograd.functional import _rowwise_axis
from autograd.tensor import Function, Tensor

BLOCK = 32  # values per block of FORMATS
SUPER_BLOCK = 256  # values per super-block of FILE_FORMATS
FORMATS = ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1")  # quantize() makes these
FILE_FORMATS = ("q4_k", "q5_k", "q6_k")  # kept from a GGUF file's blocks (from_blocks) only
KEPT = FORMATS + FILE_FORMATS  # what a QuantizedWeight holds
WITH_MINS, WITH_HIGHS = ("q4_1", "q5_1"), ("q5_0", "q5_1")
# a QuantizedWeight's arrays, in its fields' order (None: not this format)
ARRAYS = ("scales", "quants", "mins", "highs", "group_scales", "group_mins")


def block_size(fmt: str) -> int:
    """Values per block (super-block) of a format: what in_features must be a multiple of."""
    return SUPER_BLOCK if fmt in FILE_FORMATS else BLOCK


def layout(fmt: str, n_in: int) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
    """A format's arrays for one row of `n_in` values: name -> (dtype, shape after the rows')."""
    blocks, supers = n_in // BLOCK, n_in // SUPER_BLOCK
    f16, u8 = np.dtype(np.float16), np.dtype(np.uint8)
    if fmt in ("q4_k", "q5_k"):  # d, dmin; the 8 groups' s and m; 128 nibble bytes; q5_k's bits
        arrays = {
            "scales": (f16, (supers,)),
            "quants": (u8, (supers, 128)),
            "mins": (f16, (supers,)),
            "group_scales": (u8, (supers, 8)),
            "group_mins": (u8, (supers, 8)),
        }
        if fmt == "q5_k":
            arrays["highs"] = (u8, (supers, 32))
        return arrays
    if fmt == "q6_k":  # d; 128 bytes of low nibbles, 64 of 2-bit highs; the 16 groups' s
        return {
            "scales": (f16, (supers,)),
            "quants": (u8, (supers, 128)),
            "highs": (u8, (supers, 64)),
            "group_scales": (np.dtype(np.int8), (supers, 16)),
        }
    arrays = {
        "scales": (f16, (blocks,)),
        "quants": (np.dtype(np.int8), (blocks, 32)) if fmt == "q8_0" else (u8, (blocks, 16)),
    }
    if fmt in WITH_MINS:
        arrays["mins"] = (f16, (blocks,))
    if fmt in WITH_HIGHS:
        arrays["highs"] = (np.dtype(np.uint32), (blocks,))
    return arrays


@dataclass(frozen=True, eq=False)
class QuantizedWeight:
    """A frozen (in, out) weight W as blocks of its transpose's rows (module docstring).

    Each array has a row per output (layout(format, in) gives the rest of its shape):
    scales: each block's (super-block's) f16 d; mins: q4_1's and q5_1's m, q4_k's and q5_k's dmin;
    quants: q8_0's int8 q, the others' nibble bytes; highs: q5_0's and q5_1's fifth bits (uint32
    masks), q5_k's fifth bits, q6_k's 2-bit highs; group_scales / group_mins: a K-quant's s, m.
    Build one with quantize(W, format), or from a GGUF tensor's raw blocks (from_blocks)."""

    format: str
    shape: tuple[int, int]  # W's (in, out)
    scales: np.ndarray
    quants: np.ndarray
    mins: np.ndarray | None = None
    highs: np.ndarray | None = None
    group_scales: np.ndarray | None = None
    group_mins: np.ndarray | None = None

    def __post_init__(self) -> None:
        n_in, n_out = self.shape
        if self.format not in KEPT or n_in <= 0 or n_in % block_size(self.format):
            raise ValueError(
                f"QuantizedWeight: format must be one of {', '.join(KEPT)} and in_features a "
                f"positive multiple of its block, got {self.format!r}, shape {self.shape}"
            )
        want = layout(self.format, n_in)
        for name in ARRAYS:
            array = getattr(self, name)
            if name not in want:
                if array is not None:
                    raise ValueError(f"QuantizedWeight: {self.format} has no {name}")
                continue
            dtype, per_row = want[name]
            shape = (n_out, *per_row)
            if (
                not isinstance(array, np.ndarray)
                or array.dtype != dtype
                or array.shape != shape
                or not array.flags.c_contiguous
            ):
                got = f"{getattr(array, 'dtype', type(array).__name__)} {np.shape(array)}"
                raise ValueError(
                    f"QuantizedWeight({self.format}, shape {self.shape}): {name} must be a "
                    f"C-contiguous {dtype} array of shape {shape}, got {got}"
                )

    @property
    def in_features(self) -> int:
        return self.shape[0]

    @property
    def out_features(self) -> int:
        return self.shape[1]

    @property
    def nbytes(self) -> int:
        """Bytes of the arrays: what a GGUF file of this format holds for the tensor (q4_k and
        q5_k: 4 more a super-block, their 6-bit s and m unpacked into bytes)."""
        return sum(a.nbytes for a in self.arrays().values())

    def arrays(self) -> dict[str, np.ndarray]:
        """The arrays this format has, by name (ARRAYS' order)."""
        return {name: getattr(self, name) for name in ARRAYS if getattr(self, name) is not None}

    def dequantize_rows(self, rows: Any = slice(None)) -> np.ndarray:
        """Rows of W^T (out-indices: a slice or integer ids) as float32 (len, in), with gguf's
        reader's arithmetic (gguf.quants.dequantize) in float32: d * q, d * (q - 8), d * q + m,
        d * (q - 16); q4_k and q5_k (d s_g) q - dmin m_g; q6_k (d s_g) (q - 32)."""
        if self.format in FILE_FORMATS:
            values = self._dequantize_super_blocks(rows)
            return values.reshape(*values.shape[:-2], self.shape[0])
        d = self.scales[rows].astype(np.float32)[..., None]
        q = self.quants[rows]
        if self.format == "q8_0":
            values = q.astype(np.float32) * d
        else:
            nibbles = np.concatenate([q & np.uint8(0x0F), q >> np.uint8(4)], axis=-1)
            if self.highs is not None:  # q5_0, q5_1: the fifth bits
                highs = self.highs[rows].view(np.uint8).reshape(*nibbles.shape[:-1], 4)
                fifth = np.unpackbits(highs, axis=-1, bitorder="little")  # bit j: value j
                nibbles = nibbles | (fifth << np.uint8(4))
            if self.format == "q4_0":
                values = d * (nibbles.astype(np.int8) - np.int8(8)).astype(np.float32)
            elif self.format == "q5_0":
                values = d * (nibbles.astype(np.int8) - np.int8(16)).astype(np.float32)
            else:  # q4_1, q5_1
                values = (
                    d * nibbles.astype(np.float32) + self.mins[rows].astype(np.float32)[..., None]
                )
        return values.reshape(*values.shape[:-2], self.shape[0])

    def _dequantize_super_blocks(self, rows: Any) -> np.ndarray:
        """q4_k / q5_k / q6_k rows -> float32 (..., super-blocks, 256)."""
        d = self.scales[rows].astype(np.float32)[..., None]  # (..., supers, 1)
        group_scale = d * self.group_scales[rows].astype(np.float32)  # d s_g, exact
        q = self.quants[rows]
        if self.format in ("q4_k", "q5_k"):  # run c of 32 bytes: group 2c low, 2c + 1 high
            runs = q.reshape(*q.shape[:-1], 4, 32)
            groups = bit_fields(runs, 4).reshape(*q.shape[:-1], 8, 32)
            if self.format == "q5_k":  # bit g of byte j: value j of group g
                groups = groups | (bit_fields(self.highs[rows], 1) << np.uint8(4))
            group_min = self.mins[rows].astype(np.float32)[..., None] * self.group_mins[
                rows
            ].astype(np.float32)
            values = group_scale[..., None] * groups.astype(np.float32) - group_min[..., None]
        else:  # q6_k, per half: 64 bytes of nibbles, 32 of 2-bit fields
            low = bit_fields(q.reshape(*q.shape[:-1], 2, 64), 4)  # (..., 2, 2, 64)
            high = bit_fields(self.highs[rows].reshape(*q.shape[:-1], 2, 32), 2)
            six = low.reshape(*q.shape[:-1], 2, 128) | (
                high.reshape(*q.shape[:-1], 2, 128) << np.uint8(4)
            )
            centred = (six.astype(np.int8) - np.int8(32)).astype(np.float32)
            values = group_scale[..., None] * centred.reshape(*q.shape[:-1], 16, 16)
        return values.reshape(*values.shape[:-2], SUPER_BLOCK)

    def dequantize(self) -> np.ndarray:
        """W (in, out) as float32: a transposed view of every row (dequantize_rows)."""
        return self.dequantize_rows().T

    def blocks(self) -> np.ndarray:
        """The raw blocks as a GGUF file stores them: (out, bytes per row) uint8."""

        def raw(array: np.ndarray) -> np.ndarray:
            return array.view(np.uint8).reshape(*array.shape[:2], -1)

        if self.format in ("q4_k", "q5_k"):  # d, dmin, the packed s and m, q5_k's bits, nibbles
            packed = _pack_k_scales(self.group_scales, self.group_mins)
            parts = [raw(self.scales[..., None]), raw(self.mins[..., None]), packed]
            parts += [self.highs, self.quants] if self.format == "q5_k" else [self.quants]
        elif self.format == "q6_k":  # the nibbles, the 2-bit highs, s, d
            parts = [self.quants, self.highs, raw(self.group_scales), raw(self.scales[..., None])]
        else:  # d, m, the fifth bits, q
            parts = [raw(self.scales[..., None])]
            for extra in (self.mins, self.highs):
                if extra is not None:
                    parts.append(raw(extra[..., None]))
            parts.append(raw(self.quants))
        return np.concatenate(parts, axis=-1).reshape(self.shape[1], -1)

    def take_rows(self, rows: np.ndarray) -> QuantizedWeight:
        """The same weight with its rows (out-indices) reordered: rows[i] becomes row i."""
        taken = {name: np.ascontiguousarray(a[rows]) for name, a in self.arrays().items()}
        return QuantizedWeight(self.format, (self.shape[0], len(rows)), **taken)

    def __repr__(self) -> str:
        return f"QuantizedWeight({self.format}, in={self.shape[0]}, out={self.shape[1]})"


def bit_fields(packed: np.ndarray, bits: int) -> np.ndarray:
    """The `bits`-wide fields of each byte, lowest first, as a new axis before the bytes':
    (..., k) -> (..., 8 // bits, k); field i of byte b is (b >> (i * bits)) & mask."""
    shifts = np.arange(0, 8, bits, dtype=np.uint8)[:, None]
    return (packed[..., None, :] >> shifts) & np.uint8((1 << bits) - 1)


def _unpack_k_scales(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K's and Q5_K's 12 bytes (..., 12) -> 8 scales and 8 mins of 6 bits each, uint8 (..., 8).
    Bytes 0-3 hold scales 0-3 (low 6 bits) and the top bits of scales 4-7; bytes 4-7 the same
    for the mins; bytes 8-11 the low nibbles of scales 4-7 and, above them, of mins 4-7."""
    low_s, low_m, rest = packed[..., 0:4], packed[..., 4:8], packed[..., 8:12]
    top = np.uint8(0x30)
    scales = np.concatenate([low_s & 0x3F, (rest & 0x0F) | ((low_s >> 2) & top)], axis=-1)
    mins = np.concatenate([low_m & 0x3F, (rest >> 4) | ((low_m >> 2) & top)], axis=-1)
    return scales, mins


def _pack_k_scales(scales: np.ndarray, mins: np.ndarray) -> np.ndarray:
    """_unpack_k_scales' inverse: 8 scales and 8 mins below 64 (..., 8) -> (..., 12) bytes."""
    low = [(values[..., :4] & 0x3F) | ((values[..., 4:] >> 4) << 6) for values in (scales, mins)]
    rest = (scales[..., 4:] & 0x0F) | ((mins[..., 4:] & 0x0F) << 4)
    return np.concatenate([*low, rest], axis=-1).astype(np.uint8)


def _consecutive_views(weights: list[QuantizedWeight]) -> QuantizedWeight | None:
    """The weight whose arrays `weights` are consecutive row views of, covering all of it (what
    concatenate_outputs returned for them before), or None."""
    bases = {name: a.base for name, a in weights[0].arrays().items()}
    if any(base is None for base in bases.values()):
        return None
    rows = 0
    for w in weights:
        for name, base in bases.items():
            view = getattr(w, name)
            if (
                view.base is not base
                or view.ctypes.data != base.ctypes.data + rows * base.strides[0]
            ):
                return None
        rows += w.shape[1]
    if rows != bases["quants"].shape[0]:
        return None
    return QuantizedWeight(weights[0].format, (weights[0].shape[0], rows), **bases)


def concatenate_outputs(
    weights: list[QuantizedWeight],
) -> tuple[QuantizedWeight, list[QuantizedWeight]]:
    """W_1 | W_2 | ... (in, out_1 + out_2 + ...) as one weight, and each W_i again as a view of
    its rows in it: the same blocks in one array, so that one product computes all the outputs
    (the compiled decode step's q | k | v and gate | up) and the W_i cost no memory of their own.
    The weights must share format and in_features. Weights that are such views already (an
    earlier call's) give their weight back, nothing copied: a step built again adds no memory."""
    first = weights[0]
    if any(w.format != first.format or w.shape[0] != first.shape[0] for w in weights):
        raise ValueError(
            "concatenate_outputs: the weights must share format and in_features, got "
            + ", ".join(repr(w) for w in weights)
        )
    joined_before = _consecutive_views(weights)
    if joined_before is not None:  # an earlier call's views, in order: nothing to copy
        return joined_before, list(weights)

    def joined(name: str) -> np.ndarray | None:
        arrays = [getattr(w, name) for w in weights]
        return None if arrays[0] is None else np.concatenate(arrays)

    shape = (first.shape[0], sum(w.shape[1] for w in weights))
    fused = QuantizedWeight(first.format, shape, **{name: joined(name) for name in ARRAYS})
    views, start = [], 0
    for w in weights:
        rows = slice(start, start + w.shape[1])
        parts = {name: a[rows] for name, a in fused.arrays().items()}
        views.append(QuantizedWeight(w.format, w.shape, **parts))
        start = rows.stop
    return fused, views


def _check_format(fmt: Any, op: str, formats: tuple[str, ...]) -> str:
    if fmt in FILE_FORMATS and formats == FORMATS:
        raise ValueError(
            f"{op}: {fmt} blocks come from GGUF files only (from_blocks): llama.cpp's K-quant "
            f"quantizer is not reproduced here; quantize makes {', '.join(FORMATS)}"
        )
    if fmt not in formats:
        raise ValueError(f"{op}: format must be one of {', '.join(formats)}, got {fmt!r}")
    return fmt


def _check_blocks(n_in: int, op: str, shape: tuple[int, ...], fmt: str) -> None:
    size = block_size(fmt)
    if n_in % size or n_in == 0:
        raise ValueError(
            f"{op}: the input dimension must be a positive multiple of {size} (a block), "
            f"got weight shape {shape} (in = {n_in})"
        )


def quantize(weight: Any, fmt: str) -> QuantizedWeight:
    """W (in, out) -> its blocks in `fmt`, by llama.cpp's reference quantizers (ggml-quants.c's
    quantize_row_*_ref, as the gguf package's numpy port computes them, bit for bit), in float32:

    q8_0: d = max|x| / 127, q = roundf(x / d);
    q4_0: d = -(the value of largest magnitude) / 8, q = min(15, trunc(x / d + 8.5));
    q4_1: d = (max - min) / 15, m = min, q = min(15, trunc((x - min) / d + 0.5));
    q5_0: d = -(the value of largest magnitude) / 16, q = min(31, trunc(x / d + 16.5));
    q5_1: d = (max - min) / 31, m = min, q = min(31, trunc((x - min) / d + 0.5)).
    A block of zeros gets d = 0 and quants that dequantize to 0. The blocks are made by the
    kernel quantize_rows (Numba; the numpy reference beside it), a group of W^T's rows at a
    time, so float32 copies stay small. NaN or inf in W: a ValueError (no block holds them)."""
    _check_format(fmt, "quantize", FORMATS)
    w = np.asarray(weight.data if isinstance(weight, Tensor) else weight)
    if w.ndim != 2 or w.dtype.kind != "f":
        raise ValueError(f"quantize: weight must be a 2-d float (in, out), got {w.dtype} {w.shape}")
    _check_blocks(w.shape[0], f"quantize({fmt})", w.shape, fmt)
    n_in, n_out = w.shape
    shape = (n_out, n_in // BLOCK)
    scales = np.empty(shape, np.float16)
    mins = np.empty(shape, np.float16) if fmt in WITH_MINS else None
    highs = np.empty(shape, np.uint32) if fmt in WITH_HIGHS else None
    per_block = BLOCK if fmt == "q8_0" else BLOCK // 2
    quants = np.empty((*shape, per_block), np.int8 if fmt == "q8_0" else np.uint8)
    rows = max(1, (1 << 20) // n_in)  # a group of rows at a time: float32 copies stay small
    for start in range(0, n_out, rows):
        part = slice(start, start + rows)
        values = np.ascontiguousarray(w[:, part].T, dtype=np.float32)
        if not np.isfinite(values).all():
            row, col = np.argwhere(~np.isfinite(values))[0]
            raise ValueError(
                f"quantize({fmt}): weight {w.shape} holds {values[row, col]} at "
                f"[{col}, {start + row}]; only finite values can be quantized"
            )
        with kernels.serially():  # a load must not start Numba's workers (start_threads)
            d, quants[part], m, h = kernels.quantize_rows(values, fmt)
        scales[part] = d.astype(np.float16)
        if mins is not None:
            mins[part] = m.astype(np.float16)
        if highs is not None:
            highs[part] = h
    return QuantizedWeight(fmt, (n_in, n_out), scales, quants, mins, highs)


BYTES_PER_BLOCK = {
    "q8_0": 34, "q4_0": 18, "q4_1": 20, "q5_0": 22, "q5_1": 24,
    "q4_k": 144, "q5_k": 176, "q6_k": 210,
}  # fmt: skip


def from_blocks(raw: np.ndarray, fmt: str, n_in: int) -> QuantizedWeight:
    """A QuantizedWeight from a GGUF tensor's raw blocks: (rows, bytes per row) uint8, each row
    one output's `n_in` values (the file's ne0), nothing dequantized (q4_k's and q5_k's 6-bit s, m
    are unpacked into bytes). The arrays are copies, so the file can be closed."""
    _check_format(fmt, "from_blocks", KEPT)
    _check_blocks(n_in, f"from_blocks({fmt})", (n_in, raw.shape[0]), fmt)
    n_blocks, size = n_in // block_size(fmt), BYTES_PER_BLOCK[fmt]
    if raw.dtype != np.uint8 or raw.ndim != 2 or raw.shape[1] != n_blocks * size:
        raise ValueError(
            f"from_blocks({fmt}): raw must be uint8 (rows, {n_blocks * size}) for in = {n_in}, "
            f"got {raw.dtype} {raw.shape}"
        )
    blocks = raw.reshape(raw.shape[0], n_blocks, size)

    def part(start: int, stop: int, dtype: Any = np.uint8) -> np.ndarray:
        return np.ascontiguousarray(blocks[..., start:stop]).view(dtype)

    def f16(start: int) -> np.ndarray:
        return part(start, start + 2, np.float16)[..., 0]

    if fmt in ("q4_k", "q5_k"):  # d, dmin, 12 bytes of s and m, (q5_k: 32 of bits), 128 nibbles
        group_scales, group_mins = _unpack_k_scales(blocks[..., 4:16])
        nibbles = 16 if fmt == "q4_k" else 48
        return QuantizedWeight(
            fmt, (n_in, raw.shape[0]), f16(0), part(nibbles, size), f16(2),
            part(16, 48) if fmt == "q5_k" else None,
            np.ascontiguousarray(group_scales), np.ascontiguousarray(group_mins),
        )  # fmt: skip
    if fmt == "q6_k":  # 128 bytes of nibbles, 64 of 2-bit highs, 16 int8 s, d
        return QuantizedWeight(
            fmt, (n_in, raw.shape[0]), f16(208), part(0, 128), None, part(128, 192),
            part(192, 208, np.int8),
        )  # fmt: skip
    # d, then m (q4_1, q5_1), then 4 bytes of fifth bits (q5_0, q5_1), then the quants
    high = 4 if fmt in WITH_MINS else 2
    head = high + (4 if fmt in WITH_HIGHS else 0)
    quants = part(head, size)
    return QuantizedWeight(
        fmt,
        (n_in, raw.shape[0]),
        f16(0),
        quants.view(np.int8) if fmt == "q8_0" else quants,
        f16(2) if fmt in WITH_MINS else None,
        part(high, high + 4, np.uint32)[..., 0] if fmt in WITH_HIGHS else None,
    )


# --- the op (notes 3.2, 10.4) -------------------------------------------------------------------


class QuantizedLinear(Function):
    # out = x @ W (+ b), W = dequantize(weight) frozen;  transposed: out = x @ W^T
    # dx = g @ W^T (the op transposed);  db = sum of g over rows;  no dW  (notes 10.4)
    # The kernels read W's blocks, never a whole float W: one row of x is a matrix-vector
    # product dequantizing inside the dot product, more rows dequantize a tile at a time + BLAS.
    def forward(self, x, bias=None, weight=None, transposed=False):
        n_in = weight.shape[1] if transposed else weight.shape[0]
        if x.shape[-1] != n_in:
            raise ValueError(
                f"quantized_linear: x's last dimension {x.shape[-1]} must equal the weight's "
                f"{'out' if transposed else 'in'}_features {n_in} (x {x.shape}, {weight!r}"
                f"{', transposed' if transposed else ''})"
            )
        x2 = x.reshape(-1, n_in)
        product = kernels.quantized_matmul_t if transposed else kernels.quantized_matmul
        out = product(x2, weight)
        if bias is not None:
            np.add(out, bias, out=out)
        self.save_for_backward(weight, transposed, bias is not None, x.shape)
        return out.reshape(*x.shape[:-1], out.shape[-1])

    def backward(self, g):
        weight, transposed, has_bias, x_shape = self.saved
        g2 = g.reshape(-1, g.shape[-1])
        gx = None
        if self.needs_input_grad[0]:
            product = kernels.quantized_matmul if transposed else kernels.quantized_matmul_t
            gx = product(np.ascontiguousarray(g2), weight).reshape(x_shape)
        if not has_bias:
            return (gx,)
        return gx, (g2.sum(axis=0) if self.needs_input_grad[1] else None)

    def vjp(self, g, output):  # the same rule on Tensors: dx is the transposed op of g
        weight, transposed, has_bias, _ = self.saved
        gx = QuantizedLinear.apply(g, weight=weight, transposed=not transposed)
        if not has_bias:
            return (gx,)
        return gx, g.reshape(-1, g.shape[-1]).sum(axis=0)

    def jvp(self, out, x_dot, b_dot=None):  # out_dot = x_dot @ W (+ b_dot): linear in x and b
        weight, transposed, _, _ = self.saved
        n_in = x_dot.shape[-1]
        product = kernels.quantized_matmul_t if transposed else kernels.quantized_matmul
        out_dot = product(np.ascontiguousarray(x_dot.reshape(-1, n_in)), weight)
        out_dot = out_dot.reshape(out.shape)
        return out_dot if b_dot is None else out_dot + b_dot

    def backward_reads(self, c):  # the weight lives in the op's params; x is not read
        return ()

    def batch_axis(self, axes, c):  # x's rows, the bias replicated (as Linear's)
        return _rowwise_axis(axes, c)


def quantized_linear(x: Tensor, weight: QuantizedWeight, bias: Tensor | None = None) -> Tensor:
    """x @ W + bias, W = weight.dequantize() (in, out) frozen, for x of any shape (..., in)."""
    if not isinstance(weight, QuantizedWeight):
        raise TypeError(
            f"quantized_linear: weight must be a QuantizedWeight, got {type(weight).__name__}"
        )
    x = x if isinstance(x, Tensor) else Tensor(x)
    if x.dtype.kind != "f":
        raise TypeError(f"quantized_linear: x must be float32 or float64, got {x.dtype}")
    if bias is None:
        return QuantizedLinear.apply(x, weight=weight)
    if bias.shape != (weight.out_features,):
        raise ValueError(
            f"quantized_linear: bias must be (out,) = ({weight.out_features},), got {bias.shape}"
        )
    return QuantizedLinear.apply(x, bias, weight=weight)


class QuantizedRows(Function):
    # out[..., :] = row idx of W^T, dequantized: a lookup in a frozen quantized table (a tied
    # embedding, whose rows are the head's W^T rows); no input Tensor, so no gradient (10.9)
    def forward(self, idx=None, weight=None, dtype=None):
        rows = weight.dequantize_rows(idx.reshape(-1)).astype(dtype, copy=False)
        return rows.reshape(*idx.shape, weight.in_features)

    def backward(self, g):
        return ()

    def batch_axis(self, axes, c):  # rows of the table for batched ids (as Embedding's)
        return 0 if c.batched == ("idx",) else None


def quantized_rows(weight: QuantizedWeight, idx: Any, dtype: Any) -> Tensor:
    """Rows `idx` (integers, any shape) of W^T in `dtype`: idx.shape + (in,). An op, so that a
    compiled step replays the lookup for new ids."""
    ids = np.asarray(idx.data if isinstance(idx, Tensor) else idx)
    if ids.dtype.kind not in "iu":
        raise TypeError(
            f"quantized_rows: ids must be integers, got dtype {ids.dtype} ({ids.shape})"
        )
    if ids.size and (ids.min() < 0 or ids.max() >= weight.out_features):
        bad = ids[(ids < 0) | (ids >= weight.out_features)].flat[0]
        raise IndexError(
            f"quantized_rows: id {bad} is out of range [0, {weight.out_features}) "
            f"(ids shape {ids.shape})"
        )
    return QuantizedRows.apply(idx=ids, weight=weight, dtype=np.dtype(dtype))
