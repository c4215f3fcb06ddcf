"""Attention and the Transformer block, one family for the decoder, the encoder and both together.

The three architectures differ in who may read whom (notes 8.7):
- decoder-only (GPT-2, Llama): causal self-attention, position i reads j <= i;
- encoder-only: bidirectional self-attention, every (real) token reads every real token;
- encoder-decoder: the decoder's causal self-attention, then cross-attention: Q from the decoder
  stream, K/V from the encoder's output (the memory), so the weights are target x source.
All of them are `Attention`; `CausalSelfAttention`, `SelfAttention` and `CrossAttention` only fix
its settings and the call signature. The same class covers the pieces the open models use:
rotary positions (notes 8.6), fewer K/V heads than query heads (notes 8.1: grouped-query, or
multi-query with one K/V head), biases on q/k/v only, and a KV cache for generation.

Parameter names are glassgrad's own (the names of every checkpoint it writes): the fused
`c_attn` (C, 3C) = W_Q | W_K | W_V and `c_proj` = W_O (cross-attention: `c_q` and `c_kv`).
A model family that stores its projections otherwise subclasses Attention and makes its own
(models.architectures.llama). Weights are row-vector (in, out). Shapes: B batch, T positions, C =
n_embd, H query heads, Hkv K/V heads, D per head.

key_mask is an allowed set like the causal mask (notes 7.4): a boolean (B, Tk) array, True where
the key is a real token; every row needs at least one.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

import autograd.functional as F
from autograd import Tensor, is_grad_enabled
from nn.layers import (
    MLP,
    Dropout,
    GatedMLP,
    LayerNorm,
    Linear,
    RMSNorm,
    _rng,
    child_rng,
    residual_projection,
)
from nn.module import Module


class LayerKVCache:
    """One layer's keys and values for generation (notes 12.4), preallocated to max_len.

    In a causal network a new token does not change what earlier positions may see, so their K/V
    never change: each step appends only the new positions' K/V (O(t * D) per append, the past is
    never copied again) and attends over all of them. It holds the Hkv K/V heads, never the copies
    grouped-query attention shares among query heads.
    """

    def __init__(
        self, batch: int, n_head: int, max_len: int, head_dim: int, dtype: object = np.float32
    ) -> None:
        self.k = np.empty((batch, n_head, max_len, head_dim), dtype=dtype)
        self.v = np.empty((batch, n_head, max_len, head_dim), dtype=dtype)
        self.max_len = max_len
        self.length = 0

    def append(self, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Store k, v (B, H, t, D) after the cached positions; return views of all of them."""
        expected = self.k.shape[:2] + (k.shape[2],) + self.k.shape[3:]
        if k.shape != expected or v.shape != expected:
            raise ValueError(
                f"LayerKVCache.append: k {k.shape} and v {v.shape} must be (B, H, t, D) = "
                f"{expected} to match the cache {self.k.shape}"
            )
        end = self.length + k.shape[2]
        if end > self.max_len:
            raise ValueError(
                f"LayerKVCache.append: {self.length} cached + {k.shape[2]} new positions exceed "
                f"max_len {self.max_len}"
            )
        self.k[:, :, self.length : end] = k
        self.v[:, :, self.length : end] = v
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]

    def reset(self, length: int = 0) -> None:
        """Keep only the first `length` cached positions (default none; the buffers are reused)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"LayerKVCache.reset: length {length} not in [0, {self.length}]")
        self.length = length


class RotaryPositions:
    """The cos/sin tables of rotary positions (notes 8.6) that all layers of a model share.

    theta is HF's rope_theta, scaling its rope_scaling (None or "llama3"). The tables are made for
    the positions used so far and grow on demand up to max_len (Llama 3.2 allows 131072).
    """

    def __init__(
        self, head_dim: int, max_len: int, theta: float = 10000.0, scaling: dict | None = None
    ) -> None:
        self.head_dim, self.max_len, self.theta, self.scaling = head_dim, max_len, theta, scaling
        self.cos, self.sin = F.rotary_tables(min(max_len, 256), head_dim, theta, scaling)

    def tables(self, end: int) -> tuple[np.ndarray, np.ndarray]:
        """cos, sin (float64) for at least the positions < end (up to max_len), grown if needed."""
        if end > self.cos.shape[0] and self.cos.shape[0] < self.max_len:
            size = min(self.max_len, max(end, 2 * self.cos.shape[0]))
            self.cos, self.sin = F.rotary_tables(size, self.head_dim, self.theta, self.scaling)
        return self.cos, self.sin

    def __call__(self, x: Tensor, offset: int) -> Tensor:
        """x (B, H, T, D) rotated for the positions offset .. offset + T - 1."""
        cos, sin = self.tables(offset + x.shape[-2])
        return F.apply_rotary(x, cos, sin, offset)


def _attention_mask(layer: str, key_mask: Any, batch: int, n_keys: int) -> Any:
    """A (B, Tk) allowed set as the (B, 1, 1, Tk) mask F.scaled_dot_product_attention broadcasts
    over heads and queries; None when there is nothing to mask.

    An all-True (B, Tk) mask becomes None too: attention then runs the fused kernel instead of the
    explicit (Tq, Tk) masked path (same result, cheaper). A mask given already as (B, 1, 1, Tk) is
    passed on as it is, never collapsed: a compiled step takes it as an argument (new values each
    replay), and the attention op must read that very array (docs/compile.md).
    """
    if key_mask is None:
        return None
    mask = np.asarray(key_mask.data if isinstance(key_mask, Tensor) else key_mask)
    if mask.dtype != np.bool_ or mask.shape not in ((batch, n_keys), (batch, 1, 1, n_keys)):
        raise ValueError(
            f"{layer}: key_mask must be a boolean (B, Tk) = {(batch, n_keys)} allowed set "
            f"(True = a real token) or the same as (B, 1, 1, Tk), got dtype {mask.dtype} shape "
            f"{mask.shape}"
        )
    empty = ~mask.reshape(batch, n_keys).any(axis=1)
    if empty.any():
        raise ValueError(
            f"{layer}: key_mask row {int(np.argmax(empty))} allows no key; every sequence needs "
            "at least one real token (notes 7.4)"
        )
    if mask.ndim == 4:
        return mask
    return None if mask.all() else mask[:, None, None, :]


def split_heads(t: Tensor, n_head: int) -> Tensor:
    """(B, T, H * D) -> (B, H, T, D): column block h is head h (notes 8.1)."""
    B, T, C = t.shape
    return t.reshape(B, T, n_head, C // n_head).transpose(0, 2, 1, 3)


def _merge_heads(t: Tensor) -> Tensor:
    """(B, H, T, D) -> (B, T, H * D): the heads' outputs concatenated (notes 8.1)."""
    B, H, T, D = t.shape
    return t.transpose(0, 2, 1, 3).reshape(B, T, H * D)


def grouped_attention(q: Tensor, k: Tensor, v: Tensor, causal: bool, mask: Any = None) -> Tensor:
    """softmax(q k^T / sqrt(D)) v with q (B, H, Tq, D) and k, v (B, Hkv, Tk, D), Hkv dividing H:
    query head h reads K/V head h // (H / Hkv) (notes 8.1; HF's repeat_kv order)."""
    B, H, Tq, D = q.shape
    n_kv = k.shape[1]
    if n_kv != H and Tq == 1:  # one position reads every key: a group's heads become query rows
        y = F.scaled_dot_product_attention(q.reshape(B, n_kv, H // n_kv, D), k, v, False, mask)
        return y.reshape(B, H, 1, D)  # of its K/V head, one product per K/V head
    return F.scaled_dot_product_attention(q, k, v, causal=causal, mask=mask)


class Attention(Module):
    """Multi-head attention (notes 7.4, 8.1): project, split into heads, optionally rotate (8.6)
    and cache, attend, concatenate the heads and project back (W_O).

    causal: position i reads j <= i. cross: K/V come from a memory (the encoder's output) instead
    of x. n_kv_head (default n_head) K/V heads shared by groups of query heads. rotary: a
    RotaryPositions shared by the model's layers, True for tables of max_len of this layer's own,
    or False. qkv_bias (default bias): biases on the q/k/v projections; bias: on W_O.

    The projections are made by make_projections and read by queries, memory_kv and self_qkv
    (q, k, v of x itself) and c_proj (W_O); a subclass that stores W_Q, W_K, W_V apart overrides
    them (models.architectures.llama.LlamaAttention).

    Two settings for measuring attention (models/lab), off by default:
    - score_scale: the factor of q.k in the scores instead of 1/sqrt(D) (notes 7.1, 7.3), applied
      to q before the fused kernel, so that a compiled training step runs it too;
    - probe: an object with weights(attn, q, k, a) -> a and heads(attn, o) -> o. When set, the
      layer takes the explicit path: A = F.attention_weights(...) as Tensor ops (q, k after rotary),
      which the probe may record, differentiate or edit, then the heads' outputs O = A v, (B, H,
      Tq, Dv), which it may edit too, before W_O. The fused path is the same computation.
    """

    score_scale: float | None = None
    probe: Any = None

    def __init__(
        self,
        n_embd: int,
        n_head: int,
        *,
        n_kv_head: int | None = None,
        head_dim: int | None = None,
        causal: bool = True,
        cross: bool = False,
        rotary: bool | RotaryPositions = False,
        max_len: int = 1024,
        bias: bool = True,
        qkv_bias: bool | None = None,
        dropout: float = 0.0,
        rng: np.random.Generator | None = None,
        n_layer: int = 1,
    ) -> None:
        super().__init__()
        name = type(self).__name__
        n_kv_head = n_head if n_kv_head is None else n_kv_head
        if head_dim is None and n_embd % n_head:
            raise ValueError(f"{name}: n_embd {n_embd} must be divisible by n_head {n_head}")
        if n_kv_head < 1 or n_head % n_kv_head:
            raise ValueError(f"{name}: n_kv_head {n_kv_head} must divide n_head {n_head}")
        rng = _rng(rng)
        self.n_embd, self.n_head, self.n_kv_head = n_embd, n_head, n_kv_head
        self.head_dim = n_embd // n_head if head_dim is None else head_dim
        self.causal, self.cross = causal, cross
        self.make_projections(bias if qkv_bias is None else qkv_bias, bias, rng, n_layer)
        self.resid_dropout = Dropout(dropout, rng=child_rng(rng))
        if rotary is True:
            rotary = RotaryPositions(self.head_dim, max_len)
        self.rotary = rotary or None

    # --- the projections: W_Q | W_K | W_V in one matrix (a subclass may store them apart) ------
    def make_projections(
        self, qkv_bias: bool, bias: bool, rng: np.random.Generator, n_layer: int
    ) -> None:
        """W_Q | W_K | W_V as one Linear c_attn (C, 3 H D): one product, measured faster than
        three on column slices. Cross-attention: W_Q as c_q, W_K | W_V as c_kv. W_O: c_proj."""
        q_width, kv_width = self.n_head * self.head_dim, self.n_kv_head * self.head_dim
        if self.cross:
            self.c_q = Linear(self.n_embd, q_width, bias=qkv_bias, rng=rng)
            self.c_kv = Linear(self.n_embd, 2 * kv_width, bias=qkv_bias, rng=rng)
        elif self.n_kv_head != self.n_head:
            raise ValueError(f"{type(self).__name__}: the fused c_attn needs n_kv_head == n_head")
        else:
            self.c_attn = Linear(self.n_embd, 3 * q_width, bias=qkv_bias, rng=rng)
        self.c_proj = residual_projection(q_width, self.n_embd, bias, rng, n_layer)

    def _check(self, what: str, x: Tensor) -> None:
        if x.ndim != 3 or x.shape[-1] != self.n_embd:
            raise ValueError(
                f"{type(self).__name__}: {what} must be (B, T, n_embd={self.n_embd}), got {x.shape}"
            )

    def queries(self, x: Tensor) -> Tensor:
        """Cross-attention's queries (B, H, Tq, D) of the decoder stream x."""
        return split_heads(self.c_q(x), self.n_head)

    def memory_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values (B, Hkv, Tk, D) of what is attended to: a cross-attention's memory (the
        encoder output; during generation projected once and passed as memory_kv)."""
        self._check("memory", memory)
        B, Tk, _ = memory.shape
        kv = self.c_kv(memory).reshape(B, Tk, 2, self.n_kv_head, self.head_dim)
        kv = kv.transpose(2, 0, 3, 1, 4)
        return kv[0], kv[1]

    def self_qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Self-attention's q, k, v (B, H, T, D) of x: one (C, 3C) product, whose columns
        [q | k | v] split into heads: (B, T, 3, H, D) -> (3, B, H, T, D)."""
        B, T, _ = x.shape
        qkv = self.c_attn(x).reshape(B, T, 3, self.n_head, self.head_dim).transpose(2, 0, 3, 1, 4)
        return qkv[0], qkv[1], qkv[2]

    def _project(
        self, x: Tensor, memory: Tensor | None, memory_kv: tuple[Tensor, Tensor] | None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """q (B, H, Tq, D) from x; k, v (B, Hkv, Tk, D) from x, or from the memory."""
        if not self.cross:
            return self.self_qkv(x)
        if (memory is None) == (memory_kv is None):
            raise ValueError(f"{type(self).__name__}: pass exactly one of memory and memory_kv")
        k, v = self.memory_kv(memory) if memory_kv is None else memory_kv
        if x.shape[0] != k.shape[0]:
            raise ValueError(
                f"{type(self).__name__}: x {x.shape} and the memory's keys {k.shape} must "
                "have the same batch size"
            )
        return self.queries(x), k, v

    # --- attention ----------------------------------------------------------------------------
    def attend(
        self,
        x: Tensor,
        key_mask: Any = None,
        kv_cache: LayerKVCache | None = None,
        memory: Tensor | None = None,
        memory_kv: tuple[Tensor, Tensor] | None = None,
    ) -> Tensor:
        """x (B, Tq, C) -> (B, Tq, C). key_mask (B, Tk) masks the keys (padding); kv_cache: x holds
        the positions after the cached ones (generation); memory / memory_kv: cross-attention's
        source, as the encoder's output or its keys and values projected already."""
        self._check("x", x)
        q, k, v = self._project(x, memory, memory_kv)
        offset = 0 if kv_cache is None else kv_cache.length
        if self.rotary is not None:
            q, k = self.rotary(q, offset), self.rotary(k, offset)
        if kv_cache is not None:
            if is_grad_enabled() and (k.requires_grad or v.requires_grad):
                raise RuntimeError(
                    f"{type(self).__name__}: the KV cache holds constants, so gradients cannot "
                    "flow through it; run generation under autograd.no_grad()"
                )
            k_all, v_all = kv_cache.append(k.data, v.data)
            k, v = Tensor(k_all, dtype=k_all.dtype), Tensor(v_all, dtype=v_all.dtype)
        mask = _attention_mask(type(self).__name__, key_mask, k.shape[0], k.shape[2])
        # Causal, bottom-right aligned: new query i (at offset + i) reads keys j <= offset + i.
        if self.probe is not None:  # the explicit path (see the class's docstring)
            a = F.attention_weights(q, k, self.causal, mask, self.scale)
            a = self.probe.weights(self, q, k, a)
            y = self.probe.heads(self, a @ F.per_query_head(v, self.n_head))
        else:
            if self.score_scale is not None:  # (c q).k / sqrt(D) = score_scale * q.k
                q = q * (self.score_scale * math.sqrt(self.head_dim))
            y = grouped_attention(q, k, v, self.causal, mask)
        return self.resid_dropout(self.c_proj(_merge_heads(y)))

    @property
    def scale(self) -> float:
        """The factor of q.k in the scores: 1/sqrt(D) (notes 7.1) unless score_scale says."""
        return 1.0 / math.sqrt(self.head_dim) if self.score_scale is None else self.score_scale

    def extra_repr(self) -> str:
        kv = "" if self.n_kv_head == self.n_head else f", n_kv_head={self.n_kv_head}"
        return (
            f"n_embd={self.n_embd}, n_head={self.n_head}{kv}, causal={self.causal}, "
            f"rotary={self.rotary is not None}"
        )


class CausalSelfAttention(Attention):
    """The decoder's self-attention (GPT-2's, Llama's): position i reads j <= i."""

    def __init__(self, n_embd: int, n_head: int, **settings: Any) -> None:
        super().__init__(n_embd, n_head, causal=True, **settings)

    def forward(self, x: Tensor, kv_cache: LayerKVCache | None = None) -> Tensor:
        return self.attend(x, kv_cache=kv_cache)


class SelfAttention(Attention):
    """The encoder's self-attention (notes 8.7): every real token reads every real token."""

    def __init__(self, n_embd: int, n_head: int, **settings: Any) -> None:
        super().__init__(n_embd, n_head, causal=False, **settings)

    def forward(self, x: Tensor, key_mask: Any = None) -> Tensor:
        return self.attend(x, key_mask=key_mask)


class CrossAttention(Attention):
    """Cross-attention (notes 8.7): queries from x (B, Tq, C), the decoder stream; keys and
    values from memory (B, Tk, C), the encoder's output. Tq and Tk may differ; no causal mask:
    every target position may read the whole source."""

    def __init__(self, n_embd: int, n_head: int, **settings: Any) -> None:
        super().__init__(n_embd, n_head, causal=False, cross=True, **settings)

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        key_mask: Any = None,
        memory_kv: tuple[Tensor, Tensor] | None = None,
    ) -> Tensor:
        return self.attend(x, key_mask, memory=memory, memory_kv=memory_kv)

    def attention_weights(self, x: Tensor, memory: Tensor, key_mask: Any = None) -> np.ndarray:
        """The weights A = softmax(q k^T / sqrt(D)) forward uses, (B, H, Tq, Tk): one row per
        target position, one column per source position; masked keys get exactly 0."""
        self._check("x", x)
        q, k, _ = self._project(x, memory, None)
        scores = q.data @ k.data.swapaxes(-1, -2) / math.sqrt(q.shape[-1])
        mask = _attention_mask(type(self).__name__, key_mask, k.shape[0], k.shape[2])
        if mask is not None:
            scores = np.where(mask, scores, -np.inf)
        weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
        return weights / weights.sum(axis=-1, keepdims=True)


# --- the block (notes 8.5) ----------------------------------------------------------------------


def make_norm(kind: str, n: int, eps: float = 1e-5, bias: bool = True) -> Module:
    """LayerNorm (notes 8.4) or RMSNorm (no centring, no bias)."""
    if kind == "layernorm":
        return LayerNorm(n, eps=eps, bias=bias)
    if kind == "rmsnorm":
        return RMSNorm(n, eps=eps)
    raise ValueError(f"norm must be 'layernorm' or 'rmsnorm', got {kind!r}")


def make_mlp(
    kind: str,
    n_embd: int,
    hidden: int | None,
    bias: bool,
    dropout: float,
    rng: np.random.Generator,
    n_layer: int,
) -> Module:
    """The feed-forward network of a block (notes 8.2): "gelu", MLP (c_fc, c_proj), or "swiglu",
    GatedMLP, of `hidden` units (default 4 * n_embd)."""
    if kind == "gelu":
        return MLP(n_embd, dropout, bias, rng=rng, n_layer=n_layer, hidden=hidden)
    if kind == "swiglu":
        return GatedMLP(n_embd, hidden or 4 * n_embd, bias, rng, n_layer)
    raise ValueError(f"Block: mlp must be 'gelu' or 'swiglu', got {kind!r}")


class Block(Module):
    """One Transformer layer (notes 8.5): self-attention, optionally cross-attention to a memory
    (the 2017 decoder's), then the MLP; each a residual branch with its norm.

    pre_ln=True (GPT-2, Llama):  x = x + attn(ln_1(x));  [x = x + cross_attn(ln_2(x), memory)];
                                 x = x + mlp(ln_mlp(x)).
    pre_ln=False (Post-LN, the 2017 paper):  x = ln_1(x + attn(x));  ...;  x = ln_mlp(x + mlp(x)).
    ln_mlp is ln_2, or ln_3 after a cross-attention. Settings: causal (decoder) or not (encoder);
    norm "layernorm" | "rmsnorm" (eps); mlp "gelu" | "swiglu" of ffn_hidden units (make_mlp);
    attention settings (n_kv_head, rotary, qkv_bias, ...) go to Attention.
    """

    def __init__(
        self,
        n_embd: int,
        n_head: int,
        *,
        causal: bool = True,
        cross: bool = False,
        pre_ln: bool = True,
        norm: str = "layernorm",
        norm_eps: float = 1e-5,
        mlp: str = "gelu",
        ffn_hidden: int | None = None,
        mlp_bias: bool | None = None,
        bias: bool = True,
        dropout: float = 0.0,
        rng: np.random.Generator | None = None,
        n_layer: int = 1,
        **attention: Any,
    ) -> None:
        super().__init__()
        rng = _rng(rng)
        self.pre_ln = pre_ln
        shared = dict(bias=bias, dropout=dropout, rng=rng, n_layer=n_layer)
        self.ln_1 = make_norm(norm, n_embd, norm_eps, bias)
        self.attn = (CausalSelfAttention if causal else SelfAttention)(
            n_embd, n_head, **shared, **attention
        )
        self.cross_attn = None
        if cross:
            self.ln_2 = make_norm(norm, n_embd, norm_eps, bias)
            # The memory's positions are the source's, not the target's: no rotary here.
            cross = {**attention, "rotary": False}
            self.cross_attn = CrossAttention(n_embd, n_head, **shared, **cross)
            self.ln_3 = make_norm(norm, n_embd, norm_eps, bias)
        else:
            self.ln_2 = make_norm(norm, n_embd, norm_eps, bias)
        mlp_bias = bias if mlp_bias is None else mlp_bias
        self.mlp = make_mlp(mlp, n_embd, ffn_hidden, mlp_bias, dropout, rng, n_layer)

    @property
    def ln_mlp(self) -> Module:
        """The norm of the MLP's branch: ln_3 after a cross-attention, else ln_2."""
        return self.ln_2 if self.cross_attn is None else self.ln_3

    def _residual(self, x: Tensor, norm: Module, branch: Any) -> Tensor:
        if self.pre_ln:
            return x + branch(norm(x))
        return norm(x + branch(x))

    def forward(
        self,
        x: Tensor,
        kv_cache: LayerKVCache | None = None,
        key_mask: Any = None,
        memory: Tensor | None = None,
        memory_kv: tuple[Tensor, Tensor] | None = None,
    ) -> Tensor:
        """key_mask masks the padding of what the block reads besides x itself: the memory when
        it has cross-attention, else x's own positions (the encoder)."""
        self_mask = None if self.cross_attn is not None else key_mask
        x = self._residual(x, self.ln_1, lambda h: self.attn.attend(h, self_mask, kv_cache))
        if self.cross_attn is not None:
            x = self._residual(
                x, self.ln_2, lambda h: self.cross_attn.attend(h, key_mask, None, memory, memory_kv)
            )
        return self._residual(x, self.ln_mlp, self.mlp)

    def extra_repr(self) -> str:
        return "" if self.pre_ln else "post_ln"


class EncoderBlock(Block):
    """An encoder layer (notes 8.7): bidirectional self-attention over the real tokens, then MLP."""

    def __init__(self, n_embd: int, n_head: int, **settings: Any) -> None:
        super().__init__(n_embd, n_head, causal=False, **settings)

    def forward(self, x: Tensor, key_mask: Any = None) -> Tensor:
        return super().forward(x, key_mask=key_mask)


class DecoderBlock(Block):
    """A decoder layer of the 2017 Transformer (notes 8.7): causal self-attention (ln_1, attn),
    cross-attention to the encoder's output (ln_2, cross_attn), MLP (ln_3, mlp). Generation
    passes kv_cache (the self-attention's past K/V) and memory_kv (the cross-attention's K/V,
    projected once from the encoder output) instead of memory."""

    def __init__(self, n_embd: int, n_head: int, **settings: Any) -> None:
        super().__init__(n_embd, n_head, cross=True, **settings)

    def forward(self, x: Tensor, memory: Tensor | None = None, key_mask: Any = None, **cached: Any):
        """cached: kv_cache and memory_kv during generation."""
        return super().forward(x, key_mask=key_mask, memory=memory, **cached)
