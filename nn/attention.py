"""The Transformer pieces: causal self-attention (+ KV cache, rotary positions) and the Block.

Submodule names follow Hugging Face GPT-2 (`c_attn`, `c_proj`, `ln_1`, `attn`, `ln_2`, `mlp`), so
checkpoints map 1:1. Shapes: B batch, T positions, C = n_embd, H heads, D = C / H per head.
"""

from __future__ import annotations

import numpy as np

import autograd.functional as F
from autograd import Tensor, is_grad_enabled
from nn.layers import MLP, Dropout, LayerNorm, Linear, _rng, child_rng, residual_projection
from nn.module import Module


class LayerKVCache:
    """One layer's keys and values for generation (notes 12.4), preallocated to max_len.

    In a causal network a new token does not change what earlier positions may see, so their K/V
    never change: each step appends only the new positions' K/V (O(t * D) per append, the past is
    never copied again) and attends over all of them.
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

    def reset(self) -> None:
        """Forget the cached positions (the buffers are reused)."""
        self.length = 0


class CausalSelfAttention(Module):
    """Multi-head causal self-attention (notes 7.4, 8.1) with a fused q/k/v projection.

    `c_attn` (C, 3C) holds W_Q | W_K | W_V side by side (GPT-2's layout); its output columns are
    [q | k | v], each split into heads as (B, T, H, D) -> (B, H, T, D). The heads' outputs are
    concatenated back to (B, T, C) and projected by `c_proj` (W_O, notes 8.1).
    """

    def __init__(
        self,
        n_embd: int,
        n_head: int,
        dropout: float = 0.0,
        bias: bool = True,
        rotary: bool = False,
        max_len: int = 1024,
        rng: np.random.Generator | None = None,
        n_layer: int = 1,
    ) -> None:
        super().__init__()
        if n_embd % n_head:
            raise ValueError(
                f"CausalSelfAttention: n_embd {n_embd} must be divisible by n_head {n_head}"
            )
        rng = _rng(rng)
        self.n_embd = n_embd
        self.n_head = n_head
        self.head_dim = n_embd // n_head
        self.rotary = rotary
        self.max_len = max_len
        self.c_attn = Linear(n_embd, 3 * n_embd, bias=bias, rng=rng)
        self.c_proj = residual_projection(n_embd, n_embd, bias, rng, n_layer)
        self.resid_dropout = Dropout(dropout, rng=child_rng(rng))
        if rotary:
            self._cos, self._sin = F.rotary_tables(max_len, self.head_dim)

    def forward(self, x: Tensor, kv_cache: LayerKVCache | None = None) -> Tensor:
        if x.ndim != 3 or x.shape[-1] != self.n_embd:
            raise ValueError(f"CausalSelfAttention: x must be (B, T, {self.n_embd}), got {x.shape}")
        B, T, C = x.shape
        H, D = self.n_head, self.head_dim
        # One (C, 3C) product; its columns [q | k | v] split into heads: (B, T, 3, H, D) ->
        # (3, B, H, T, D). (Measured faster than three (C, C) products on column slices of W.)
        qkv = self.c_attn(x).reshape(B, T, 3, H, D).transpose(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        offset = 0 if kv_cache is None else kv_cache.length
        if self.rotary:
            q = F.apply_rotary(q, self._cos, self._sin, offset)
            k = F.apply_rotary(k, self._cos, self._sin, offset)
        if kv_cache is not None:
            if is_grad_enabled() and qkv.requires_grad:
                raise RuntimeError(
                    "CausalSelfAttention: the KV cache holds constants, so gradients cannot flow "
                    "through it; run generation under autograd.no_grad()"
                )
            k_all, v_all = kv_cache.append(k.data, v.data)
            k = Tensor(k_all, dtype=k_all.dtype)
            v = Tensor(v_all, dtype=v_all.dtype)
        # Causal, bottom-right aligned: new query i (at offset + i) reads keys j <= offset + i.
        y = F.scaled_dot_product_attention(q, k, v, causal=True)
        y = y.transpose(0, 2, 1, 3).reshape(B, T, C)  # concatenate the heads (notes 8.1)
        return self.resid_dropout(self.c_proj(y))

    def extra_repr(self) -> str:
        return f"n_embd={self.n_embd}, n_head={self.n_head}, rotary={self.rotary}"


class Block(Module):
    """One Transformer layer (notes 8.5): attention then MLP, each with a residual and a LayerNorm.

    pre_ln=True (default, GPT-2):  x = x + attn(ln_1(x));  x = x + mlp(ln_2(x)).
    pre_ln=False (Post-LN, the 2017 paper):  x = ln_1(x + attn(x));  x = ln_2(x + mlp(x)).
    """

    def __init__(
        self,
        n_embd: int,
        n_head: int,
        dropout: float = 0.0,
        bias: bool = True,
        rotary: bool = False,
        max_len: int = 1024,
        pre_ln: bool = True,
        rng: np.random.Generator | None = None,
        n_layer: int = 1,
    ) -> None:
        super().__init__()
        rng = _rng(rng)
        self.pre_ln = pre_ln
        self.ln_1 = LayerNorm(n_embd, bias=bias)
        self.attn = CausalSelfAttention(
            n_embd, n_head, dropout, bias, rotary, max_len, rng=rng, n_layer=n_layer
        )
        self.ln_2 = LayerNorm(n_embd, bias=bias)
        self.mlp = MLP(n_embd, dropout, bias, rng=rng, n_layer=n_layer)

    def forward(self, x: Tensor, kv_cache: LayerKVCache | None = None) -> Tensor:
        if self.pre_ln:
            x = x + self.attn(self.ln_1(x), kv_cache)
            return x + self.mlp(self.ln_2(x))
        x = self.ln_1(x + self.attn(x, kv_cache))
        return self.ln_2(x + self.mlp(x))

    def extra_repr(self) -> str:
        return "" if self.pre_ln else "post_ln"
