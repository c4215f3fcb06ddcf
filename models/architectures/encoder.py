"""An encoder-only Transformer (notes 8.7): every position reads every position.

Token embedding + positions -> n_layer nn.EncoderBlocks (no causal mask, so the tokens after a
position count as much as those before it) -> logits against the token embedding (tied head).
Trained by masked-character prediction: models/training/tasks/masked.py, `python -m models.encoder`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

import autograd.functional as F
import nn
from autograd import Tensor
from models.architectures import check_positive_integers


@dataclass
class EncoderConfig:
    """Sizes of an encoder; positions 'none' leaves it permutation-equivariant (notes 8.6)."""

    vocab_size: int
    block_size: int
    n_layer: int = 3
    n_head: int = 4
    n_embd: int = 96
    dropout: float = 0.0
    pre_ln: bool = True
    positions: str = "learned"

    def __post_init__(self) -> None:
        check_positive_integers(self, ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"))
        if self.n_embd % self.n_head:
            raise ValueError(
                f"EncoderConfig: n_embd {self.n_embd} must be divisible by n_head {self.n_head}"
            )
        if self.positions not in nn.transformer.POSITIONS:
            raise ValueError(
                f"EncoderConfig: positions must be one of {nn.transformer.POSITIONS}, got "
                f"{self.positions!r}"
            )


class Encoder(nn.Module):
    """`logits, loss = model(idx, targets)`: a distribution over the vocabulary at every position.

    Token embedding + positions -> n_layer EncoderBlocks -> (Pre-LN: final LayerNorm) -> logits
    against the token embedding (tied head, notes 9.4).
    """

    def __init__(self, config: EncoderConfig, rng: np.random.Generator | None = None) -> None:
        super().__init__()
        rng = np.random.default_rng(0) if rng is None else rng
        self.config = c = config
        self.wte = nn.Embedding(c.vocab_size, c.n_embd, rng=rng)
        self.wpe = nn.position_embedding(c.positions, c.block_size, c.n_embd, rng)
        self.drop = nn.Dropout(c.dropout, rng=rng.spawn(1)[0])
        self.h = nn.ModuleList(
            [
                nn.EncoderBlock(
                    c.n_embd,
                    c.n_head,
                    dropout=c.dropout,
                    pre_ln=c.pre_ln,
                    rng=rng,
                    n_layer=c.n_layer,
                )
                for _ in range(c.n_layer)
            ]
        )
        if c.pre_ln:  # Post-LN blocks already end in a LayerNorm (notes 8.5)
            self.ln_f = nn.LayerNorm(c.n_embd)

    def describe(self) -> str:
        c = self.config
        return (
            f"Encoder(vocab_size={c.vocab_size}, block_size={c.block_size}, n_layer={c.n_layer}, "
            f"n_head={c.n_head}, n_embd={c.n_embd}, {c.positions} positions)"
        )

    def forward(
        self, idx: Any, targets: Any = None, key_mask: Any = None
    ) -> tuple[Tensor, Tensor | None]:
        """Logits (B, T, V), and the mean cross-entropy over targets != IGNORE_INDEX if given.

        key_mask: optional boolean (B, T), True = a real token (padding is never attended to).
        """
        ids = np.asarray(idx)
        c = self.config
        if ids.dtype.kind not in "iu" or ids.ndim != 2 or not 1 <= ids.shape[1] <= c.block_size:
            raise ValueError(
                f"{self.describe()}: idx must be integer ids (batch, 1..{c.block_size}), got "
                f"dtype {ids.dtype} shape {ids.shape}"
            )
        x = self.wte(ids)
        if self.wpe is not None:
            x = x + self.wpe(np.arange(ids.shape[1]))  # e_i + p_i (notes 8.6)
        x = self.drop(x)
        for block in self.h:
            x = block(x, key_mask)
        if c.pre_ln:
            x = self.ln_f(x)
        logits = nn.linear(x, self.wte.weight.T)
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits, np.asarray(targets))
