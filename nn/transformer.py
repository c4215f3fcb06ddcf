"""The encoder's and the encoder-decoder's layers (notes 8.7), beside the GPT's in nn.attention.

The three architectures differ in who may read whom (notes 8.7):
- encoder-only: `SelfAttention`, bidirectional: every position reads every position (optionally
  only the real tokens of a padded batch: `key_mask`);
- decoder-only: `nn.CausalSelfAttention`: position i reads j <= i;
- encoder-decoder: the decoder's causal self-attention, then `CrossAttention`: Q from the decoder
  stream, K/V from the encoder's output, so the weights are (target length x source length) and
  the two lengths may differ. It is not one X projected three times.

`EncoderBlock` and `DecoderBlock` stack these like nn.Block does (notes 8.5), Pre-LN by default or
the 2017 paper's Post-LN. `SinusoidalPositions` is the 2017 paper's fixed position table, beside
the learned one (an nn.Embedding of positions, notes 8.6).

key_mask is an allowed set like the causal mask (notes 7.4): a boolean (B, Tk) array, True where
the key is a real token; every row needs at least one. Shapes: B batch, T positions, C = n_embd,
H heads, D = C / H per head.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

import autograd.functional as F
from autograd import Tensor, get_default_dtype
from nn.attention import CausalSelfAttention, LayerKVCache
from nn.layers import (
    MLP,
    Dropout,
    Embedding,
    LayerNorm,
    Linear,
    _rng,
    child_rng,
    residual_projection,
)
from nn.module import Module


def _check_stream(layer: str, name: str, x: Tensor, n_embd: int) -> None:
    if x.ndim != 3 or x.shape[-1] != n_embd:
        raise ValueError(f"{layer}: {name} must be (B, T, n_embd={n_embd}), got {x.shape}")


def _split_heads(t: Tensor, n_head: int) -> Tensor:
    """(B, T, C) -> (B, H, T, D): column block h of C is head h (notes 8.1)."""
    B, T, C = t.shape
    return t.reshape(B, T, n_head, C // n_head).transpose(0, 2, 1, 3)


def _merge_heads(t: Tensor) -> Tensor:
    """(B, H, T, D) -> (B, T, H * D): the heads' outputs concatenated (notes 8.1)."""
    B, H, T, D = t.shape
    return t.transpose(0, 2, 1, 3).reshape(B, T, H * D)


def _attention_mask(layer: str, key_mask: Any, batch: int, n_keys: int) -> Any:
    """A (B, Tk) allowed set as the (B, 1, 1, Tk) mask F.scaled_dot_product_attention broadcasts
    over heads and queries; None when there is nothing to mask.

    An all-True mask becomes None too: attention then runs the fused kernel instead of the explicit
    (Tq, Tk) masked path (same result, cheaper).
    """
    if key_mask is None:
        return None
    mask = np.asarray(key_mask.data if isinstance(key_mask, Tensor) else key_mask)
    if mask.dtype != np.bool_ or mask.shape != (batch, n_keys):
        raise ValueError(
            f"{layer}: key_mask must be a boolean (B, Tk) = {(batch, n_keys)} allowed set "
            f"(True = a real token), got dtype {mask.dtype} shape {mask.shape}"
        )
    empty = ~mask.any(axis=1)
    if empty.any():
        raise ValueError(
            f"{layer}: key_mask row {int(np.argmax(empty))} allows no key; every sequence needs "
            "at least one real token (notes 7.4)"
        )
    return None if mask.all() else mask[:, None, None, :]


class SelfAttention(Module):
    """Bidirectional multi-head self-attention (notes 8.7, the encoder's): no causal mask.

    The same fused `c_attn` (C, 3C) = W_Q | W_K | W_V and `c_proj` (W_O) as CausalSelfAttention;
    only the allowed set differs: every real token, before or after.
    """

    def __init__(
        self,
        n_embd: int,
        n_head: int,
        dropout: float = 0.0,
        bias: bool = True,
        rng: np.random.Generator | None = None,
        n_layer: int = 1,
    ) -> None:
        super().__init__()
        if n_embd % n_head:
            raise ValueError(f"SelfAttention: n_embd {n_embd} must be divisible by n_head {n_head}")
        rng = _rng(rng)
        self.n_embd = n_embd
        self.n_head = n_head
        self.c_attn = Linear(n_embd, 3 * n_embd, bias=bias, rng=rng)
        self.c_proj = residual_projection(n_embd, n_embd, bias, rng, n_layer)
        self.resid_dropout = Dropout(dropout, rng=child_rng(rng))

    def forward(self, x: Tensor, key_mask: Any = None) -> Tensor:
        _check_stream("SelfAttention", "x", x, self.n_embd)
        B, T, C = x.shape
        H = self.n_head
        qkv = self.c_attn(x).reshape(B, T, 3, H, C // H).transpose(2, 0, 3, 1, 4)
        mask = _attention_mask("SelfAttention", key_mask, B, T)
        y = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], causal=False, mask=mask)
        return self.resid_dropout(self.c_proj(_merge_heads(y)))

    def extra_repr(self) -> str:
        return f"n_embd={self.n_embd}, n_head={self.n_head}"


class CrossAttention(Module):
    """Multi-head cross-attention (notes 8.7): queries from x (B, Tq, C), the decoder stream;
    keys and values from memory (B, Tk, C), the encoder's output. Tq and Tk may differ.

    `c_q` (C, C) is W_Q, `c_kv` (C, 2C) is W_K | W_V, `c_proj` is W_O. During generation the
    memory does not change, so its K/V are projected once (`memory_kv`) and passed to every step.
    """

    def __init__(
        self,
        n_embd: int,
        n_head: int,
        dropout: float = 0.0,
        bias: bool = True,
        rng: np.random.Generator | None = None,
        n_layer: int = 1,
    ) -> None:
        super().__init__()
        if n_embd % n_head:
            raise ValueError(
                f"CrossAttention: n_embd {n_embd} must be divisible by n_head {n_head}"
            )
        rng = _rng(rng)
        self.n_embd = n_embd
        self.n_head = n_head
        self.c_q = Linear(n_embd, n_embd, bias=bias, rng=rng)
        self.c_kv = Linear(n_embd, 2 * n_embd, bias=bias, rng=rng)
        self.c_proj = residual_projection(n_embd, n_embd, bias, rng, n_layer)
        self.resid_dropout = Dropout(dropout, rng=child_rng(rng))

    def memory_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """The encoder output's keys and values, each (B, H, Tk, D)."""
        _check_stream("CrossAttention", "memory", memory, self.n_embd)
        B, Tk, C = memory.shape
        H = self.n_head
        kv = self.c_kv(memory).reshape(B, Tk, 2, H, C // H).transpose(2, 0, 3, 1, 4)
        return kv[0], kv[1]

    def _queries(self, x: Tensor, k: Tensor) -> Tensor:
        _check_stream("CrossAttention", "x", x, self.n_embd)
        if x.shape[0] != k.shape[0]:
            raise ValueError(
                f"CrossAttention: x {x.shape} and the memory's keys {k.shape} must have the "
                "same batch size"
            )
        return _split_heads(self.c_q(x), self.n_head)

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        key_mask: Any = None,
        memory_kv: tuple[Tensor, Tensor] | None = None,
    ) -> Tensor:
        """Attend from x to memory; pass memory_kv = self.memory_kv(memory) instead of memory to
        reuse keys and values already projected (generation)."""
        if (memory is None) == (memory_kv is None):
            raise ValueError("CrossAttention: pass exactly one of memory and memory_kv")
        k, v = self.memory_kv(memory) if memory_kv is None else memory_kv
        q = self._queries(x, k)
        mask = _attention_mask("CrossAttention", key_mask, k.shape[0], k.shape[2])
        # No causal mask: every target position may read the whole source (notes 8.7).
        y = F.scaled_dot_product_attention(q, k, v, causal=False, mask=mask)
        return self.resid_dropout(self.c_proj(_merge_heads(y)))

    def attention_weights(self, x: Tensor, memory: Tensor, key_mask: Any = None) -> np.ndarray:
        """The weights A = softmax(q k^T / sqrt(D)) forward uses, (B, H, Tq, Tk): one row per
        target position, one column per source position; masked keys get exactly 0."""
        k, _ = self.memory_kv(memory)
        q = self._queries(x, k)
        scores = q.data @ k.data.swapaxes(-1, -2) / math.sqrt(q.shape[-1])
        mask = _attention_mask("CrossAttention", key_mask, k.shape[0], k.shape[2])
        if mask is not None:
            scores = np.where(mask, scores, -np.inf)
        weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
        return weights / weights.sum(axis=-1, keepdims=True)

    def extra_repr(self) -> str:
        return f"n_embd={self.n_embd}, n_head={self.n_head}"


class EncoderBlock(Module):
    """One encoder layer: bidirectional self-attention then MLP (notes 8.5, 8.7).

    pre_ln=True:  x = x + attn(ln_1(x), key_mask);  x = x + mlp(ln_2(x)).
    pre_ln=False (Post-LN, the 2017 paper):  x = ln_1(x + attn(x, key_mask));  x = ln_2(x + mlp(x)).
    """

    def __init__(
        self,
        n_embd: int,
        n_head: int,
        dropout: float = 0.0,
        bias: bool = True,
        pre_ln: bool = True,
        rng: np.random.Generator | None = None,
        n_layer: int = 1,
    ) -> None:
        super().__init__()
        rng = _rng(rng)
        self.pre_ln = pre_ln
        self.ln_1 = LayerNorm(n_embd, bias=bias)
        self.attn = SelfAttention(n_embd, n_head, dropout, bias, rng=rng, n_layer=n_layer)
        self.ln_2 = LayerNorm(n_embd, bias=bias)
        self.mlp = MLP(n_embd, dropout, bias, rng=rng, n_layer=n_layer)

    def forward(self, x: Tensor, key_mask: Any = None) -> Tensor:
        if self.pre_ln:
            x = x + self.attn(self.ln_1(x), key_mask)
            return x + self.mlp(self.ln_2(x))
        x = self.ln_1(x + self.attn(x, key_mask))
        return self.ln_2(x + self.mlp(x))

    def extra_repr(self) -> str:
        return "" if self.pre_ln else "post_ln"


class DecoderBlock(Module):
    """One decoder layer of the 2017 Transformer (notes 8.7): causal self-attention over the
    target so far, cross-attention to the encoder's output, then MLP; each with a residual.

    pre_ln=True:   x = x + attn(ln_1(x));  x = x + cross_attn(ln_2(x), memory);
                   x = x + mlp(ln_3(x)).
    pre_ln=False:  x = ln_1(x + attn(x));  x = ln_2(x + cross_attn(x, memory));
                   x = ln_3(x + mlp(x)).
    Generation passes kv_cache (the self-attention's past K/V, grows by one position a step) and
    memory_kv (the cross-attention's K/V, projected once from the encoder output) instead of memory.
    """

    def __init__(
        self,
        n_embd: int,
        n_head: int,
        dropout: float = 0.0,
        bias: bool = True,
        pre_ln: bool = True,
        max_len: int = 1024,
        rng: np.random.Generator | None = None,
        n_layer: int = 1,
    ) -> None:
        super().__init__()
        rng = _rng(rng)
        self.pre_ln = pre_ln
        self.ln_1 = LayerNorm(n_embd, bias=bias)
        self.attn = CausalSelfAttention(
            n_embd, n_head, dropout, bias, max_len=max_len, rng=rng, n_layer=n_layer
        )
        self.ln_2 = LayerNorm(n_embd, bias=bias)
        self.cross_attn = CrossAttention(n_embd, n_head, dropout, bias, rng=rng, n_layer=n_layer)
        self.ln_3 = LayerNorm(n_embd, bias=bias)
        self.mlp = MLP(n_embd, dropout, bias, rng=rng, n_layer=n_layer)

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        key_mask: Any = None,
        kv_cache: LayerKVCache | None = None,
        memory_kv: tuple[Tensor, Tensor] | None = None,
    ) -> Tensor:
        if self.pre_ln:
            x = x + self.attn(self.ln_1(x), kv_cache)
            x = x + self.cross_attn(self.ln_2(x), memory, key_mask, memory_kv)
            return x + self.mlp(self.ln_3(x))
        x = self.ln_1(x + self.attn(x, kv_cache))
        x = self.ln_2(x + self.cross_attn(x, memory, key_mask, memory_kv))
        return self.ln_3(x + self.mlp(x))

    def extra_repr(self) -> str:
        return "" if self.pre_ln else "post_ln"


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
