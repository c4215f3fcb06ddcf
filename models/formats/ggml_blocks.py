"""ggml's K-quants Q2_K and Q3_K, read as floats.

The formats are llama.cpp's (ggml-common.h); the arithmetic is the gguf package's reader's
(gguf/quants.py, which transformers' GGUF loader uses), step for step in float32, so the values
are the same bits (tests/test_gguf.py holds them equal on random blocks and on every fixture).
The formats glassgrad can also keep as blocks and multiply by (the 32-value Q8_0, Q4_0, Q4_1,
Q5_0, Q5_1 and the K-quants Q4_K, Q5_K and Q6_K) live in autograd/quantized.py, as do the bit
fields this file shares with them.

| type | values / block | bytes | a value (q: the stored integer of the value)             |
| ---- | -------------: | ----: | -------------------------------------------------------- |
| q2_k | 256            | 84    | d * s_j * q - dmin * m_j; 2-bit q, 16 groups, 4-bit s, m |
| q3_k | 256            | 110   | d * (s_j - 32) * (q - 4 h); 2-bit q, h its inverted top   |
|      |                |       | bit; 16 groups, 6-bit s                                  |

Each dequantizer takes (n, bytes a block) uint8 and returns (n, values a block) float32.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from autograd.quantized import bit_fields


def _f16(blocks: np.ndarray, start: int) -> np.ndarray:
    """The f16 at bytes start:start+2 of each block, as float32 (n, 1)."""
    return np.ascontiguousarray(blocks[:, start : start + 2]).view(np.float16).astype(np.float32)


def _nibbles(packed: np.ndarray, width: int) -> np.ndarray:
    """Runs of `width` bytes -> 2 * width values: the low nibbles, then the high ones (n, -1)."""
    n = packed.shape[0]
    return bit_fields(packed.reshape(n, -1, width), 4).reshape(n, -1)


def q2_k(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    packed_scales, qs = blocks[:, 0:16], blocks[:, 16:80]
    d, dmin = _f16(blocks, 80), _f16(blocks, 82)
    scale = (d * (packed_scales & 0x0F).astype(np.float32)).reshape(n, 16, 1)
    minimum = (dmin * (packed_scales >> 4).astype(np.float32)).reshape(n, 16, 1)
    # two halves of 32 bytes; in each, the four 2-bit fields of byte l are values l, 32 + l, ...
    q = bit_fields(qs.reshape(n, 2, 32), 2).reshape(n, 16, 16).astype(np.float32)
    return (scale * q - minimum).reshape(n, 256)


def q3_k(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    hmask, qs, packed_scales, d = (
        blocks[:, 0:32],
        blocks[:, 32:96],
        blocks[:, 96:108],
        _f16(blocks, 108),
    )
    low = bit_fields(packed_scales[:, 0:8], 4).reshape(n, 16)  # the low 4 bits of the 16 scales
    high = bit_fields(packed_scales[:, 8:12], 2).reshape(n, 16)  # and their top 2 bits
    scales = ((low | (high << np.uint8(4))).astype(np.int8) - np.int8(32)).astype(np.float32)
    scale = (d * scales).reshape(n, 16, 1)
    q_low = bit_fields(qs.reshape(n, 2, 32), 2).reshape(n, 16, 16)
    q_high = bit_fields(hmask.reshape(n, 1, 32), 1).reshape(n, 16, 16) ^ np.uint8(1)  # 1: no offset
    q = (q_low.astype(np.int8) - (q_high << np.uint8(2)).astype(np.int8)).astype(np.float32)
    return (scale * q).reshape(n, 256)


# ggml's type name -> its dequantizer
DEQUANTIZERS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "Q2_K": q2_k, "Q3_K": q3_k,
}  # fmt: skip
