"""Position vectors added to the token embeddings (notes 8.6): learned, sinusoidal or none.

The attention layers and blocks of the encoder, the decoder and the encoder-decoder are in
nn.attention. `SinusoidalPositions` is the 2017 paper's fixed position table, beside the learned
one (an nn.Embedding of positions); rotary positions rotate q and k inside attention instead
(nn.attention.RotaryPositions).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from autograd import Tensor, get_default_dtype
from nn.layers import Embedding, _rng
from nn.module import Module


def sinusoidal_table(max_len: int, n_embd: int, base: float = 10000.0) -> np.ndarray:
    """The 2017 paper's positions (max_len, n_embd), float64, for an even n_embd:
    PE[p, 2i] = sin(p / base^(2i / C)),  PE[p, 2i + 1] = cos(p / base^(2i / C)).

    Each coordinate pair turns at its own frequency, so PE[p + k] is a fixed rotation of PE[p]
    for every p (the same idea as rotary positions, notes 8.6, applied to the input instead).
    """
    if n_embd % 2:
        raise ValueError(f"sinusoidal_table: n_embd must be even (sin/cos pairs), got {n_embd}")
    inv_freq = base ** (-np.arange(0, n_embd, 2, dtype=np.float64) / n_embd)
    angles = np.arange(max_len, dtype=np.float64)[:, None] * inv_freq[None, :]
    table = np.empty((max_len, n_embd))
    table[:, 0::2] = np.sin(angles)
    table[:, 1::2] = np.cos(angles)
    return table


class SinusoidalPositions(Module):
    """Fixed position vectors (no parameters): `pos(positions)` -> (T, C) rows of the table,
    added to the token embeddings like learned ones (notes 8.6: e_i + p_i)."""

    def __init__(self, max_len: int, n_embd: int) -> None:
        super().__init__()
        self.max_len = max_len
        self.n_embd = n_embd
        # In the dtype the parameters are created in; not persistent: a function of the sizes.
        table = sinusoidal_table(max_len, n_embd).astype(get_default_dtype())
        self.register_buffer("table", table, persistent=False)

    def forward(self, positions: Any) -> Tensor:
        positions = np.asarray(positions)
        if positions.size and (positions.min() < 0 or positions.max() >= self.max_len):
            raise ValueError(
                f"SinusoidalPositions: positions up to {positions.max()} exceed max_len "
                f"{self.max_len}"
            )
        return Tensor(self.table[positions], dtype=self.table.dtype)

    def extra_repr(self) -> str:
        return f"{self.max_len}, {self.n_embd}"


POSITIONS = ("learned", "sinusoidal", "none")


def position_embedding(
    kind: str, max_len: int, n_embd: int, rng: np.random.Generator | None = None
) -> Module | None:
    """The position vectors p_i added to the token embeddings (notes 8.6), called with an array
    of positions: learned (an Embedding, GPT-2), sinusoidal (fixed, the 2017 paper), or none
    (None: the model then sees a set, not a sequence, notes 8.6)."""
    if kind == "learned":
        return Embedding(max_len, n_embd, rng=_rng(rng))
    if kind == "sinusoidal":
        return SinusoidalPositions(max_len, n_embd)
    if kind == "none":
        return None
    raise ValueError(f"position_embedding: kind must be one of {POSITIONS}, got {kind!r}")
