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

BLOCK = 32  # values per block, every format here
FORMATS = ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1")
WITH_MINS, WITH_HIGHS = ("q4_1", "q5_1"), ("q5_0", "q5_1")
ARRAYS = ("scales", "quants", "mins", "highs")  # a QuantizedWeight's arrays (None: not this format)


@dataclass(frozen=True, eq=False)
class QuantizedWeight:
    """A frozen (in, out) weight W as blocks of its transpose's rows (module docstring).

    scales: (out, in / 32) float16, each block's d; mins: the same for q4_1's and q5_1's m;
    quants: q8_0 (out, in / 32, 32) int8; the others (out, in / 32, 16) uint8 nibble pairs;
    highs: q5_0's and q5_1's fifth bits, (out, in / 32) uint32; None in the other formats.
    Build one with quantize(W, format), or from a GGUF tensor's raw blocks (from_blocks)."""

    format: str
    shape: tuple[int, int]  # W's (in, out)
    scales: np.ndarray
    quants: np.ndarray
    mins: np.ndarray | None = None
    highs: np.ndarray | None = None

    def __post_init__(self) -> None:
        n_in, n_out = self.shape
        per_block = BLOCK if self.format == "q8_0" else BLOCK // 2
        want = {
            "scales": (self.scales, np.float16, (n_out, n_in // BLOCK)),
            "quants": (
                self.quants,
                np.int8 if self.format == "q8_0" else np.uint8,
                (n_out, n_in // BLOCK, per_block),
            ),
        }
        if self.format in WITH_MINS:
            want["mins"] = (self.mins, np.float16, (n_out, n_in // BLOCK))
        elif self.mins is not None:
            raise ValueError(f"QuantizedWeight: {self.format} has no mins (q4_1 and q5_1 do)")
        if self.format in WITH_HIGHS:
            want["highs"] = (self.highs, np.uint32, (n_out, n_in // BLOCK))
        elif self.highs is not None:
            raise ValueError(f"QuantizedWeight: {self.format} has no highs (q5_0 and q5_1 do)")
        for name, (array, dtype, shape) in want.items():
            if (
                not isinstance(array, np.ndarray)
                or array.dtype != dtype
                or array.shape != shape
                or not array.flags.c_contiguous
            ):
                got = f"{getattr(array, 'dtype', type(array).__name__)} {np.shape(array)}"
                raise ValueError(
                    f"QuantizedWeight({self.format}, shape {self.shape}): {name} must be a "
                    f"C-contiguous {np.dtype(dtype)} array of shape {shape}, got {got}"
                )

    @property
    def in_features(self) -> int:
        return self.shape[0]

    @property
    def out_features(self) -> int:
        return self.shape[1]

    @property
    def nbytes(self) -> int:
        """Bytes of the blocks: what a GGUF file of this format holds for the tensor."""
        return sum(a.nbytes for a in self.arrays().values())

    def arrays(self) -> dict[str, np.ndarray]:
        """The arrays this format has, by name (ARRAYS' order)."""
        return {name: getattr(self, name) for name in ARRAYS if getattr(self, name) is not None}

    def dequantize_rows(self, rows: Any = slice(None)) -> np.ndarray:
        """Rows of W^T (out-indices: a slice or integer ids) as float32 (len, in), with gguf's
        reader's arithmetic (gguf.quants.dequantize): d * q, d * (q - 8), d * q + m, d * (q - 16)
        in float32."""
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

    def dequantize(self) -> np.ndarray:
        """W (in, out) as float32: a transposed view of every row (dequantize_rows)."""
        return self.dequantize_rows().T

    def blocks(self) -> np.ndarray:
        """The raw blocks as a GGUF file stores them: (out, in / 32 * bytes per block) uint8."""
        parts = [self.scales.view(np.uint8).reshape(*self.scales.shape, 2)]
        for extra in (self.mins, self.highs):  # the file's order: d, m, the fifth bits, q
            if extra is not None:
                parts.append(extra.view(np.uint8).reshape(*extra.shape, extra.itemsize))
        parts.append(self.quants.view(np.uint8))
        return np.concatenate(parts, axis=-1).reshape(self.shape[1], -1)

    def take_rows(self, rows: np.ndarray) -> QuantizedWeight:
        """The same weight with its rows (out-indices) reordered: rows[i] becomes row i."""
        taken = {name: np.ascontiguousarray(a[rows]) for name, a in self.arrays().items()}
        return QuantizedWeight(self.format, (self.shape[0], len(rows)), **taken)

    def __repr__(self) -> str:
        return f"QuantizedWeight({self.format}, in={self.shape[0]}, out={self.shape[1]})"


def _consecutive_views(weights: list[QuantizedWeight]) -> QuantizedWeight | None:
    """The weight whose arrays `weights` are consecutive row views of, covering all of it (what
    concatenate_outputs returned for them before), or None."""
    bases = [getattr(weights[0], name) for name in ARRAYS]
    bases = [None if a is None else a.base for a in bases]
    if bases[1] is None or bases[0] is None:
        return None
    rows = 0
    for w in weights:
        for name, base in zip(ARRAYS, bases, strict=True):
            view = getattr(w, name)
            if view is None:
                continue
            if (
                view.base is not base
                or view.ctypes.data != base.ctypes.data + rows * base.strides[0]
            ):
                return None
        rows += w.shape[1]
    if rows != bases[1].shape[0]:
        return None
    return QuantizedWeight(weights[0].format, (weights[0].shape[0], rows), *bases)


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


def _check_format(fmt: Any, op: str) -> str:
    if fmt not in FORMATS:
        raise ValueError(f"{op}: format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    return fmt


def _check_blocks(n_in: int, op: str, shape: tuple[int, ...]) -> None:
    if n_in % BLOCK or n_in == 0:
        raise ValueError(
            f"{op}: the input dimension must be a positive multiple of {BLOCK} (a block), "
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
    _check_format(fmt, "quantize")
    w = np.asarray(weight.data if isinstance(weight, Tensor) else weight)
    if w.ndim != 2 or w.dtype.kind != "f":
        raise ValueError(f"quantize: weight must be a 2-d float (in, out), got {w.dtype} {w.shape}")
    _check_blocks(w.shape[0], f"quantize({fmt})", w.shape)
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
        d, quants[part], m, h = kernels.quantize_rows(values, fmt)
        scales[part] = d.astype(np.float16)
        if mins is not None:
            mins[part] = m.astype(np.float16)
        if highs is not None:
            highs[part] = h
    return QuantizedWeight(fmt, (n_in, n_out), scales, quants, mins, highs)


BYTES_PER_BLOCK = {"q8_0": 34, "q4_0": 18, "q4_1": 20, "q5_0": 22, "q5_1": 24}


def from_blocks(raw: np.ndarray, fmt: str, n_in: int) -> QuantizedWeight:
    """A QuantizedWeight from a GGUF tensor's raw blocks: (rows, bytes per row) uint8, each row
    one output's `n_in` values (the file's ne0), nothing dequantized. The arrays are copies, so
    the file can be closed."""
    _check_format(fmt, "from_blocks")
    _check_blocks(n_in, f"from_blocks({fmt})", (n_in, raw.shape[0]))
    n_blocks, size = n_in // BLOCK, BYTES_PER_BLOCK[fmt]
    if raw.dtype != np.uint8 or raw.ndim != 2 or raw.shape[1] != n_blocks * size:
        raise ValueError(
            f"from_blocks({fmt}): raw must be uint8 (rows, {n_blocks * size}) for in = {n_in}, "
            f"got {raw.dtype} {raw.shape}"
        )
    blocks = raw.reshape(raw.shape[0], n_blocks, size)

    def f16(start: int) -> np.ndarray:
        return np.ascontiguousarray(blocks[..., start : start + 2]).view(np.float16)[..., 0]

    # d, then m (q4_1, q5_1), then 4 bytes of fifth bits (q5_0, q5_1), then the quants
    high = 4 if fmt in WITH_MINS else 2
    head = high + (4 if fmt in WITH_HIGHS else 0)
    quants = np.ascontiguousarray(blocks[..., head:])
    highs = np.ascontiguousarray(blocks[..., high : high + 4]).view(np.uint32)[..., 0]
    return QuantizedWeight(
        fmt,
        (n_in, raw.shape[0]),
        f16(0),
        quants.view(np.int8) if fmt == "q8_0" else quants,
        f16(2) if fmt in WITH_MINS else None,
        highs if fmt in WITH_HIGHS else None,
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
