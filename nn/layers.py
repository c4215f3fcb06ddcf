"""The basic layers: Linear, Embedding, LayerNorm, RMSNorm, Dropout, GELU, ReLU and the MLPs.

Row-vector convention (notes 3.2): a layer computes `x @ W + b` with `W` shaped (in, out).
Every layer creates its parameters in `autograd.get_default_dtype()` and draws its initial values
from an optional `rng` (a numpy Generator; default `np.random.default_rng(0)`), GPT-2 style:
normal(0, 0.02) weights, zero biases.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

import autograd.functional as F
from autograd import Tensor
from nn.module import Module, Parameter


def _rng(rng: np.random.Generator | None) -> np.random.Generator:
    return np.random.default_rng(0) if rng is None else rng


def child_rng(rng: np.random.Generator) -> np.random.Generator:
    """An independent Generator derived from `rng` (each Dropout gets its own mask stream)."""
    return rng.spawn(1)[0]


class Linear(Module):
    """y = x @ weight + bias; weight (in_features, out_features) ~ N(0, std^2), bias zeros."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        rng: np.random.Generator | None = None,
        std: float = 0.02,
    ) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = Parameter(_rng(rng).normal(0.0, std, size=(in_features, out_features)))
        self.bias = Parameter(np.zeros(out_features)) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}"
        )


def residual_projection(
    n_in: int, n_out: int, bias: bool, rng: np.random.Generator, n_layer: int
) -> Linear:
    """A Linear that writes into the residual stream (attention's and the MLP's c_proj): GPT-2
    scales its init std to 0.02 / sqrt(2 * n_layer), so the residual sum's variance does not grow
    with depth."""
    return Linear(n_in, n_out, bias=bias, rng=rng, std=0.02 / math.sqrt(2 * n_layer))


class Embedding(Module):
    """A lookup table: row `i` of weight (num_embeddings, embedding_dim) is token i's vector."""

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        rng: np.random.Generator | None = None,
        std: float = 0.02,
    ) -> None:
        super().__init__()
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.weight = Parameter(_rng(rng).normal(0.0, std, size=(num_embeddings, embedding_dim)))

    def forward(self, idx: Any) -> Tensor:
        return F.embedding(self.weight, idx)

    def attend(self, x: Tensor) -> Tensor:
        """x @ weight^T: scores of x against every row (a tied output head, notes 9.4)."""
        return F.linear(x, self.weight.T)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}"


class LayerNorm(Module):
    """LayerNorm over the last axis (notes 8.4: population variance, eps inside the sqrt)."""

    def __init__(self, n: int, eps: float = 1e-5, bias: bool = True) -> None:
        super().__init__()
        self.n = n
        self.eps = eps
        self.weight = Parameter(np.ones(n))
        self.bias = Parameter(np.zeros(n)) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.n}, eps={self.eps}, bias={self.bias is not None}"


class RMSNorm(Module):
    """x / sqrt(mean(x^2) + eps) * weight over the last axis (no centring, no bias)."""

    def __init__(self, n: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.n = n
        self.eps = eps
        self.weight = Parameter(np.ones(n))

    def forward(self, x: Tensor) -> Tensor:
        return F.rms_norm(x, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.n}, eps={self.eps}"


class Dropout(Module):
    """Zero elements with probability p in training mode (scaling the rest by 1/(1-p)).

    rng: the Generator for the masks; None uses F.dropout's shared, seeded Generator.
    """

    def __init__(self, p: float = 0.5, rng: np.random.Generator | None = None) -> None:
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"Dropout: p must be in [0, 1], got {p}")
        self.p = p
        self.rng = rng

    def forward(self, x: Tensor) -> Tensor:
        return F.dropout(x, self.p, self.training, self.rng)

    def extra_repr(self) -> str:
        return f"p={self.p}"


class GELU(Module):
    """GELU activation; approximate='tanh' is GPT-2's, 'none' the exact x * Phi(x)."""

    def __init__(self, approximate: str = "tanh") -> None:
        super().__init__()
        if approximate not in ("tanh", "none"):
            raise ValueError(f"GELU: approximate must be 'tanh' or 'none', got {approximate!r}")
        self.approximate = approximate

    def forward(self, x: Tensor) -> Tensor:
        return F.gelu(x, self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


class ReLU(Module):
    """max(x, 0) (notes 8.2)."""

    def forward(self, x: Tensor) -> Tensor:
        return x.relu()


class MLP(Module):
    """The position-wise feed-forward network (notes 8.2): GELU(x W1 + b1) W2 + b2, then dropout.

    Hidden size `hidden` (default 4 * n_embd); `c_fc`/`c_proj` are GPT-2's names. c_proj writes
    into the residual stream, so its init std is 0.02 / sqrt(2 * n_layer) (GPT-2: keeps the
    residual sum's variance from growing with depth).
    """

    def __init__(
        self,
        n_embd: int,
        dropout: float = 0.0,
        bias: bool = True,
        rng: np.random.Generator | None = None,
        n_layer: int = 1,
        hidden: int | None = None,
    ) -> None:
        super().__init__()
        rng = _rng(rng)
        hidden = 4 * n_embd if hidden is None else hidden
        self.c_fc = Linear(n_embd, hidden, bias=bias, rng=rng)
        self.gelu = GELU("tanh")
        self.c_proj = residual_projection(hidden, n_embd, bias, rng, n_layer)
        self.dropout = Dropout(dropout, rng=child_rng(rng))

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class GatedMLP(Module):
    """SwiGLU, the gated feed-forward network (notes 8.2), as the Llama family uses it:
    c_proj(silu(x W_gate) * (x W_up)). The gate decides, per hidden unit, how much of the up
    projection c_fc passes; three matrices instead of two, so `hidden` is usually ~8/3 n_embd.
    A family that names the three otherwise overrides make_projections and the three names."""

    def __init__(
        self,
        n_embd: int,
        hidden: int,
        bias: bool = False,
        rng: np.random.Generator | None = None,
        n_layer: int = 1,
    ) -> None:
        super().__init__()
        self.make_projections(n_embd, hidden, bias, _rng(rng), n_layer)

    def make_projections(
        self, n_embd: int, hidden: int, bias: bool, rng: np.random.Generator, n_layer: int
    ) -> None:
        self.c_gate = Linear(n_embd, hidden, bias=bias, rng=rng)
        self.c_fc = Linear(n_embd, hidden, bias=bias, rng=rng)
        self.c_proj = residual_projection(hidden, n_embd, bias, rng, n_layer)

    def forward(self, x: Tensor) -> Tensor:
        return self.c_proj(F.swiglu(self.c_gate(x), self.c_fc(x)))
