"""ggml's K-quants (Q2_K to Q6_K), read as floats.

The formats are llama.cpp's (ggml-common.h); the arithmetic is the gguf package's reader's
(gguf/quants.py, which transformers' GGUF loader uses), step for step in float32, so the values
are the same bits (tests/test_gguf.py holds them equal on random blocks and on every fixture).
The 32-value formats (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1), which glassgrad can also keep as blocks and
multiply by, live in autograd/quantized.py.

| type | values / block | bytes | a value (q: the stored integer of the value)             |
| ---- | -------------: | ----: | -------------------------------------------------------- |
| q2_k | 256            | 84    | d * s_j * q - dmin * m_j; 2-bit q, 16 groups, 4-bit s, m |
| q3_k | 256            | 110   | d * (s_j - 32) * (q - 4 h); 2-bit q, h its inverted top   |
|      |                |       | bit; 16 groups, 6-bit s                                  |
| q4_k | 256            | 144   | d * s_j * q - dmin * m_j; 4-bit q, 8 groups, 6-bit s, m  |
| q5_k | 256            | 176   | the same, 5-bit q (a nibble and a bit)                   |
| q6_k | 256            | 210   | d * s_j * (q - 32); 6-bit q, 16 groups, int8 s           |

Each dequantizer takes (n, bytes a block) uint8 and returns (n, values a block) float32.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def _f16(blocks: np.ndarray, start: int) -> np.ndarray:
    """The f16 at bytes start:start+2 of each block, as float32 (n, 1)."""
    return np.ascontiguousarray(blocks[:, start : start + 2]).view(np.float16).astype(np.float32)


def _fields(packed: np.ndarray, bits: int) -> np.ndarray:
    """The `bits`-wide fields of each byte, lowest first, as a new axis before the bytes':
    (..., k) -> (..., 8 // bits, k); field i of byte b is (b >> (i * bits)) & mask."""
    shifts = np.arange(0, 8, bits, dtype=np.uint8)[:, None]
    return (packed[..., None, :] >> shifts) & np.uint8((1 << bits) - 1)


def _nibbles(packed: np.ndarray, width: int) -> np.ndarray:
    """Runs of `width` bytes -> 2 * width values: the low nibbles, then the high ones (n, -1)."""
    n = packed.shape[0]
    return _fields(packed.reshape(n, -1, width), 4).reshape(n, -1)


def _k_scales(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K / Q5_K: 12 bytes -> 8 scales and 8 mins of 6 bits each, as float32 (n, 8, 1).
    Bytes 0-3 hold scales 0-3 (low 6 bits) and the top bits of scales 4-7; bytes 4-7 the same
    for the mins; bytes 8-11 the low nibbles of scales 4-7 and, above them, of mins 4-7."""
    n = packed.shape[0]
    low_s, low_m, rest = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    top = np.uint8(0x30)
    scales = np.concatenate([low_s & 0x3F, (rest & 0x0F) | ((low_s >> 2) & top)], axis=-1)
    mins = np.concatenate([low_m & 0x3F, (rest >> 4) | ((low_m >> 2) & top)], axis=-1)
    return (scales.reshape(n, 8, 1).astype(np.float32), mins.reshape(n, 8, 1).astype(np.float32))


def q2_k(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    packed_scales, qs = blocks[:, 0:16], blocks[:, 16:80]
    d, dmin = _f16(blocks, 80), _f16(blocks, 82)
    scale = (d * (packed_scales & 0x0F).astype(np.float32)).reshape(n, 16, 1)
    minimum = (dmin * (packed_scales >> 4).astype(np.float32)).reshape(n, 16, 1)
    # two halves of 32 bytes; in each, the four 2-bit fields of byte l are values l, 32 + l, ...
    q = _fields(qs.reshape(n, 2, 32), 2).reshape(n, 16, 16).astype(np.float32)
    return (scale * q - minimum).reshape(n, 256)


def q3_k(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    hmask, qs, packed_scales, d = (
        blocks[:, 0:32],
        blocks[:, 32:96],
        blocks[:, 96:108],
        _f16(blocks, 108),
    )
    low = _fields(packed_scales[:, 0:8], 4).reshape(n, 16)  # the low 4 bits of the 16 scales
    high = _fields(packed_scales[:, 8:12], 2).reshape(n, 16)  # and their top 2 bits
    scales = ((low | (high << np.uint8(4))).astype(np.int8) - np.int8(32)).astype(np.float32)
    scale = (d * scales).reshape(n, 16, 1)
    q_low = _fields(qs.reshape(n, 2, 32), 2).reshape(n, 16, 16)
    q_high = _fields(hmask.reshape(n, 1, 32), 1).reshape(n, 16, 16) ^ np.uint8(1)  # 1: no offset
    q = (q_low.astype(np.int8) - (q_high << np.uint8(2)).astype(np.int8)).astype(np.float32)
    return (scale * q).reshape(n, 256)


def q4_k(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    d, dmin = _f16(blocks, 0), _f16(blocks, 2)
    scales, mins = _k_scales(blocks[:, 4:16])
    scale, minimum = (d[:, :, None] * scales), (dmin[:, :, None] * mins)
    q = _nibbles(blocks[:, 16:144], 32).reshape(n, 8, 32).astype(np.float32)
    return (scale * q - minimum).reshape(n, 256)


def q5_k(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    d, dmin = _f16(blocks, 0), _f16(blocks, 2)
    scales, mins = _k_scales(blocks[:, 4:16])
    scale, minimum = (d[:, :, None] * scales), (dmin[:, :, None] * mins)
    low = _nibbles(blocks[:, 48:176], 32).reshape(n, 8, 32)
    high = _fields(blocks[:, 16:48].reshape(n, 1, 32), 1).reshape(n, 8, 32)  # bit j: group j
    q = (low | (high << np.uint8(4))).astype(np.float32)
    return (scale * q - minimum).reshape(n, 256)


def q6_k(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    ql, qh, scales, d = blocks[:, 0:128], blocks[:, 128:192], blocks[:, 192:208], _f16(blocks, 208)
    scale = (d * scales.view(np.int8).astype(np.float32)).reshape(n, 16, 1)
    low = _nibbles(ql, 64).reshape(n, 8, 32)  # halves of 64 bytes: low nibbles, then high
    high = _fields(qh.reshape(n, 2, 32), 2).reshape(n, 8, 32)
    q = (low | (high << np.uint8(4))).astype(np.int8) - np.int8(32)
    return (scale * q.reshape(n, 16, 16).astype(np.float32)).reshape(n, 256)


# ggml's type name -> its dequantizer
DEQUANTIZERS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "Q2_K": q2_k, "Q3_K": q3_k, "Q4_K": q4_k, "Q5_K": q5_k, "Q6_K": q6_k,
}  # fmt: skip
