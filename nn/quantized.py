"""Layers whose weight stays quantized in memory (autograd/quantized.py: llama.cpp's q8_0, q4_0,
q4_1, q5_0, q5_1 blocks): QuantizedLinear, QuantizedEmbedding, and quantize_linears, which puts
them in a model in place of its Linear layers (and of a tied embedding/head pair).

The weight is frozen: it is not a Parameter, so parameters(), optimizers and gradients never see
it; a bias stays a float Parameter. Row vectors as everywhere (notes 3.2): y = x @ W + b with W
(in, out), the blocks holding W^T's rows as a GGUF file does.

>>> import numpy as np, nn
>>> layer = nn.QuantizedLinear.from_linear(nn.Linear(64, 8), "q8_0")
>>> [name for name, _ in layer.named_parameters()], layer
(['bias'], QuantizedLinear(in_features=64, out_features=8, format=q8_0, bias=True))
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from autograd import Tensor, get_default_dtype, kernels
from autograd.quantized import (
    FORMATS,
    QuantizedWeight,
    concatenate_outputs,
    quantize,
    quantized_linear,
    quantized_rows,
)
from nn.layers import Embedding, Linear
from nn.module import Module, Parameter, set_child


class QuantizedLinear(Module):
    """y = x @ W + bias, W a frozen QuantizedWeight (in, out), bias an optional float Parameter."""

    def __init__(self, weight: QuantizedWeight, bias: Any = None) -> None:
        super().__init__()
        if not isinstance(weight, QuantizedWeight):
            raise TypeError(
                f"QuantizedLinear: weight must be a QuantizedWeight, got {type(weight).__name__}"
            )
        self.weight = weight
        self.in_features, self.out_features = weight.shape
        self.bias = None if bias is None else Parameter(np.asarray(getattr(bias, "data", bias)))

    @classmethod
    def from_linear(cls, linear: Linear, fmt: str) -> QuantizedLinear:
        """A Linear's weight quantized to fmt (its bias kept, the same Parameter)."""
        layer = cls(quantize(linear.weight.data, fmt))
        layer.bias = linear.bias
        return layer

    def forward(self, x: Tensor) -> Tensor:
        return quantized_linear(x, self.weight, self.bias)

    def forward_into(self, x: np.ndarray, out: np.ndarray, int8_activations: bool = False) -> None:
        """out = x @ W (+ bias) for x (rows, in): the compiled decode step's call
        (models.architectures.decoding), the same kernels as forward; int8_activations: x's
        rows quantized to int8 first, as llama.cpp decodes (kernels.quantized_matvec_int8)."""
        kernels.quantized_matmul_into(x, self.weight, out, int8_activations)
        if self.bias is not None:
            np.add(out, self.bias.data, out=out)

    def product_into(
        self, x: np.ndarray, out: np.ndarray, int8_activations: bool = False
    ) -> Callable[[], None]:
        """A call () -> None doing forward_into(x, out, int8_activations) on these very arrays,
        its checks made once (the compiled decode step binds each product as it is built)."""
        product = kernels.bind_quantized_matmul_into(x, self.weight, out, int8_activations)
        if self.bias is None:
            return product
        bias = self.bias.data

        def with_bias() -> None:
            product()
            np.add(out, bias, out=out)

        return with_bias

    @classmethod
    def side_by_side(cls, layers: list[QuantizedLinear]) -> QuantizedLinear:
        """One layer computing every layer's outputs, side by side (q | k | v, gate | up). The
        blocks move into one array: each layer's weight becomes a view of its rows there (the
        same values; no memory is added). The layers must share format and in_features, and all
        or none have a bias."""
        if len({layer.bias is None for layer in layers}) > 1:
            raise ValueError("QuantizedLinear.side_by_side: all layers or none must have a bias")
        fused, views = concatenate_outputs([layer.weight for layer in layers])
        for layer, view in zip(layers, views, strict=True):
            layer.weight = view
        bias = None
        if layers[0].bias is not None:
            bias = np.concatenate([layer.bias.data for layer in layers])
        return cls(fused, bias)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"format={self.weight.format}, bias={self.bias is not None}"
        )


class QuantizedEmbedding(Module):
    """A lookup table kept quantized: row i of the (V, C) table is out-row i of a QuantizedWeight
    of shape (C, V), so the same blocks are the tied output head (attend). A lookup dequantizes
    only the rows it reads, into `dtype` (default: the default float dtype); frozen."""

    def __init__(self, weight: QuantizedWeight, dtype: Any = None) -> None:
        super().__init__()
        if not isinstance(weight, QuantizedWeight):
            raise TypeError(
                f"QuantizedEmbedding: weight must be a QuantizedWeight, got {type(weight).__name__}"
            )
        self.weight = weight
        self.embedding_dim, self.num_embeddings = weight.shape
        self.dtype = np.dtype(get_default_dtype() if dtype is None else dtype)

    def forward(self, idx: Any) -> Tensor:
        return quantized_rows(self.weight, idx, self.dtype)

    def attend(self, x: Tensor) -> Tensor:
        """x @ table^T (the tied output head, notes 9.4), by the quantized linear."""
        return quantized_linear(x, self.weight)

    def lookup_into(self, idx: np.ndarray, out: np.ndarray) -> None:
        """out = the rows idx of the table (forward's values) for the compiled decode step."""
        np.copyto(out, self.weight.dequantize_rows(idx), casting="same_kind")

    def attend_into(self, x: np.ndarray, out: np.ndarray, int8_activations: bool = False) -> None:
        """out = x @ table^T (attend's values) for the compiled decode step; int8_activations as
        QuantizedLinear.forward_into's."""
        kernels.quantized_matmul_into(x, self.weight, out, int8_activations)

    def attend_product(
        self, x: np.ndarray, out: np.ndarray, int8_activations: bool = False
    ) -> Callable[[], None]:
        """attend_into(x, out, int8_activations) bound to these arrays (product_into's)."""
        return kernels.bind_quantized_matmul_into(x, self.weight, out, int8_activations)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, format={self.weight.format}"


def quantize_linears(model: Module, fmt: str, tied_embedding: Embedding | None = None) -> Module:
    """Replace, in place, every Linear of `model` by a QuantizedLinear of its weight in fmt
    (autograd.quantized.FORMATS); `tied_embedding`, the Embedding a tied output head reads (a
    decoder's wte), by a QuantizedEmbedding of its rows. Linears whose in_features is not a
    multiple of 32 are an error (naming the layer). Returns the model."""
    if fmt not in FORMATS:
        raise ValueError(
            f"quantize_linears: format must be one of {', '.join(FORMATS)}, got {fmt!r}"
        )
    for name, module in list(model.named_modules()):
        if not (isinstance(module, Linear) or module is tied_embedding):
            continue
        try:
            if isinstance(module, Linear):
                quantized = QuantizedLinear.from_linear(module, fmt)
            else:  # rows of the table = rows of W^T
                table = quantize(module.weight.data.T, fmt)
                quantized = QuantizedEmbedding(table, module.weight.dtype)
        except ValueError as exc:
            raise ValueError(f"quantize_linears: layer {name!r}: {exc}") from None
        set_child(model, name, quantized)
    return model
