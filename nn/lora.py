"""LoRA (Hu et al. 2021): fine-tune a frozen Linear through a low-rank update it learns.

A pretrained Linear y = x W + b (row vectors, W (in, out)) gets a trainable detour of rank r:

    y = x W + b + (alpha / r) (x A) B        A (in, r) random, B (r, out) zero

so at step 0 the model is exactly the pretrained one (B = 0), and training moves only A and B:
r (in + out) numbers instead of in * out. The gradient flows through the frozen W to reach the
layers below, but W itself gets none (autograd computes no x^T g for a frozen weight). After
training, the update can be merged into the weight, W' = W + (alpha / r) A B, and the layer is a
plain Linear again (no extra cost at inference); unmerging subtracts it.

`apply_lora(model, targets, rank, alpha)` freezes the whole model and wraps the Linears whose
names match `targets` (by default its self-attention projections, attention_projections);
`save_adapter` writes
only A and B (safetensors) and their settings (adapter_config.json), `load_adapter` puts them on a
fresh copy of the base model.
"""

from __future__ import annotations

import fnmatch
import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

import autograd.functional as F
from autograd import Tensor, get_default_dtype, no_grad
from autograd.quantized import quantized_linear
from nn.attention import Attention
from nn.checkpoint import load_safetensors, save_json_atomic, save_safetensors
from nn.layers import Linear
from nn.module import Module, Parameter, set_child
from nn.quantized import QuantizedLinear

BASES = (Linear, QuantizedLinear)  # the layers an adapter wraps
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
_FORMAT = "glassgrad-lora"


class LoRA(Module):
    """A frozen Linear plus its low-rank update: y = x W + b + (alpha / r) (x A) B.

    The base's weight and bias stay registered as `weight` and `bias` (the same Parameters,
    frozen), so the model's other names and its checkpoint keys do not change; the adapter adds
    `lora_A` (in, r), drawn uniform(-1/sqrt(in), 1/sqrt(in)) as PEFT's Kaiming init does, and
    `lora_B` (r, out), zero. The base may be a QuantizedLinear (QLoRA: W stays in its blocks, the
    adapter in the default float dtype); then merging is unload_lora's, into a float Linear.
    """

    def __init__(
        self,
        base: Linear | QuantizedLinear,
        rank: int,
        alpha: float,
        rng: np.random.Generator | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(base, (Linear, QuantizedLinear)):
            raise TypeError(
                f"LoRA: expected an nn.Linear or nn.QuantizedLinear to wrap, got "
                f"{type(base).__name__}"
            )
        if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or rank < 1:
            raise ValueError(f"LoRA: rank must be a positive integer, got {rank!r}")
        self.in_features, self.out_features = base.in_features, base.out_features
        self.rank, self.alpha = int(rank), float(alpha)
        self.scale = self.alpha / self.rank
        self.merged = False
        self.weight = base.weight
        self.bias = base.bias
        for p in (self.weight, self.bias):
            if isinstance(p, Parameter):
                p.requires_grad = False
        self.quantized = isinstance(base, QuantizedLinear)
        rng = np.random.default_rng(0) if rng is None else rng
        bound = 1.0 / math.sqrt(self.in_features)
        dtype = np.dtype(get_default_dtype()) if self.quantized else self.weight.dtype
        self.lora_A = Parameter(rng.uniform(-bound, bound, (self.in_features, rank)), dtype=dtype)
        self.lora_B = Parameter(np.zeros((rank, self.out_features)), dtype=dtype)

    def forward(self, x: Tensor) -> Tensor:
        if self.quantized:
            y = quantized_linear(x, self.weight, self.bias)
        else:
            y = F.linear(x, self.weight, self.bias)
        if self.merged:  # W already holds W + (alpha / r) A B
            return y
        # the scale on B (r, out): computed from parameters only, so a batch-sharded compiled
        # step computes it once per shard instead of scaling a batched array (autograd/compile/
        # shard.py knows no product with a constant on batched values)
        return y + F.linear(F.linear(x, self.lora_A), self.lora_B * self.scale)

    def delta(self) -> np.ndarray:
        """The update the adapter adds to the weight: (alpha / r) A B, shaped (in, out)."""
        return (self.lora_A.data @ self.lora_B.data) * self.lora_A.dtype.type(self.scale)

    def merge(self) -> None:
        """W <- W + (alpha / r) A B; forward is then the base Linear's (one product)."""
        if self.merged:
            raise RuntimeError("LoRA.merge: this adapter is already merged into its weight")
        if self.quantized:
            raise RuntimeError(
                f"LoRA.merge: the base weight is quantized ({self.weight.format}); merging would "
                "quantize the update away: unload_lora puts a float Linear holding W + (alpha / r) "
                "A B in its place"
            )
        with no_grad():
            self.weight.data = self.weight.data + self.delta()
        self.merged = True

    def unmerge(self) -> None:
        """W <- W - (alpha / r) A B (W back up to rounding: the float sum is not undone exactly)."""
        if not self.merged:
            raise RuntimeError("LoRA.unmerge: this adapter is not merged")
        with no_grad():
            self.weight.data = self.weight.data - self.delta()
        self.merged = False

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"rank={self.rank}, alpha={self.alpha:g}, merged={self.merged}"
        )


def _matches(name: str, pattern: str) -> bool:
    """A target names a module by its full dotted name or its last part, globs allowed."""
    return fnmatch.fnmatchcase(name, pattern) or fnmatch.fnmatchcase(
        name.rsplit(".", 1)[-1], pattern
    )


def apply_lora(
    model: Module,
    targets: str | list[str] | tuple[str, ...],
    rank: int = 8,
    alpha: float = 16.0,
    rng: np.random.Generator | None = None,
) -> list[str]:
    """Freeze every parameter of `model` and wrap each Linear whose name matches a target
    (comma-separated or a list; full dotted names or last parts, globs allowed) in a LoRA.
    Returns the wrapped modules' names. A target that matches no Linear is an error."""
    patterns = [t.strip() for t in targets.split(",")] if isinstance(targets, str) else targets
    patterns = [p for p in patterns if p]
    if not patterns:
        raise ValueError("apply_lora: no targets given")
    linears = [(name, m) for name, m in model.named_modules() if type(m) in BASES]
    unmatched = [p for p in patterns if not any(_matches(name, p) for name, _ in linears)]
    if unmatched:
        raise KeyError(
            f"apply_lora: no Linear matches {unmatched}; the model's Linears are "
            f"{sorted({name.rsplit('.', 1)[-1] for name, _ in linears})}"
        )
    model.requires_grad_(False)
    rng = np.random.default_rng(0) if rng is None else rng
    wrapped = []
    for name, linear in linears:
        if any(_matches(name, p) for p in patterns):
            set_child(model, name, LoRA(linear, rank, alpha, rng=rng))
            wrapped.append(name)
    return wrapped


def attention_projections(model: Module) -> list[str]:
    """LoRA's usual targets: the Linears of the model's self-attention layers (W_Q, W_K, W_V,
    W_O however a layer stores them), as patterns apply_lora takes: a Linear's own name where no
    other Linear has it, else with its layer's name: "c_attn,*.attn.c_proj" for nn.Block's, whose
    MLP has a c_proj too."""
    modules = dict(model.named_modules())
    linears = [name for name, m in modules.items() if type(m) in BASES]

    def in_self_attention(name: str) -> bool:
        layer = modules.get(name.rpartition(".")[0])
        return isinstance(layer, Attention) and not layer.cross

    others = {name.rsplit(".", 1)[-1] for name in linears if not in_self_attention(name)}
    patterns: list[str] = []
    for name in filter(in_self_attention, linears):
        layer, _, own = name.rpartition(".")
        pattern = f"*.{layer.rsplit('.', 1)[-1]}.{own}" if own in others else own
        if pattern not in patterns:
            patterns.append(pattern)
    return patterns


def lora_modules(model: Module) -> list[tuple[str, LoRA]]:
    """(name, LoRA) for every adapter in the model, in registration order."""
    return [(name, m) for name, m in model.named_modules() if isinstance(m, LoRA)]


def merge_lora(model: Module) -> None:
    """Merge every adapter into its weight (W + (alpha / r) A B), in place."""
    for _, m in lora_modules(model):
        m.merge()


def unmerge_lora(model: Module) -> None:
    """Take every merged adapter out of its weight again."""
    for _, m in lora_modules(model):
        m.unmerge()


def unload_lora(model: Module) -> list[str]:
    """Merge every adapter and put a plain Linear (the merged weight, the bias) in its place:
    the model is then the base architecture again, its state_dict the base's keys (for a merged
    checkpoint that any loader of the base model reads). Returns the names replaced."""
    names = []
    for name, m in lora_modules(model):
        linear = Linear(m.in_features, m.out_features, bias=m.bias is not None)
        if m.quantized:  # W dequantized, in the adapter's dtype, plus the update
            w = m.weight.dequantize().astype(m.lora_A.dtype) + m.delta()
            linear.weight = Parameter(w, dtype=m.lora_A.dtype)
            linear.weight.requires_grad = False  # frozen, as the base was
        else:
            if not m.merged:
                m.merge()
            linear.weight = m.weight
        linear.bias = m.bias
        set_child(model, name, linear)
        names.append(name)
    return names


def adapter_state_dict(model: Module) -> dict[str, np.ndarray]:
    """Only the adapters' arrays: {"<module>.lora_A": (in, r), "<module>.lora_B": (r, out)}."""
    state = {}
    for name, m in lora_modules(model):
        state[f"{name}.lora_A"] = m.lora_A.data.copy()
        state[f"{name}.lora_B"] = m.lora_B.data.copy()
    return state


def save_adapter(
    directory: str | os.PathLike,
    model: Module,
    metadata: dict[str, str] | None = None,
    base_model: str | None = None,
) -> None:
    """Write the adapters only: adapter_model.safetensors (A and B of each wrapped Linear, with
    `metadata`) and adapter_config.json (rank, alpha, the wrapped modules' names, and the base
    model's directory when given)."""
    adapters = lora_modules(model)
    if not adapters:
        raise ValueError("save_adapter: the model has no LoRA adapters (see apply_lora)")
    settings = {(m.rank, m.alpha) for _, m in adapters}
    if len(settings) != 1:
        raise ValueError(f"save_adapter: the adapters mix rank/alpha settings {sorted(settings)}")
    if any(m.merged for _, m in adapters):
        raise ValueError("save_adapter: unmerge the adapters first (a merged W already holds AB)")
    (rank, alpha) = settings.pop()
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    save_safetensors(directory / ADAPTER_WEIGHTS, adapter_state_dict(model), metadata)
    config = {
        "format": _FORMAT,
        "r": rank,
        "lora_alpha": alpha,
        "target_modules": [name for name, _ in adapters],
        "layout": "row vectors: y = x W + b + (lora_alpha / r) (x A) B, A (in, r), B (r, out)",
    }
    if base_model is not None:
        config["base_model"] = str(base_model)
    save_json_atomic(directory / ADAPTER_CONFIG, config)


def read_adapter_config(directory: str | os.PathLike) -> dict[str, Any]:
    path = Path(directory) / ADAPTER_CONFIG
    if not path.is_file():
        raise FileNotFoundError(f"{directory} holds no LoRA adapter: no {ADAPTER_CONFIG}")
    try:
        config = json.loads(path.read_text("utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON ({exc})") from None
    if not isinstance(config, dict) or config.get("format") != _FORMAT:
        raise ValueError(f"{path}: not a {_FORMAT} adapter config")
    return config


def load_adapter(directory: str | os.PathLike, model: Module) -> list[str]:
    """Load the A and B of `directory`'s adapter into the model: a model without adapters gets
    them first (the modules adapter_config.json names are wrapped and the model frozen, as
    apply_lora does); a model with adapters must have exactly those. Returns the names."""
    config = read_adapter_config(directory)
    arrays, _ = load_safetensors(Path(directory) / ADAPTER_WEIGHTS)
    names = config["target_modules"]
    present = dict(model.named_modules())
    missing = [n for n in names if n not in present]
    if missing:
        raise KeyError(f"load_adapter: the model has no module {missing} that the adapter names")
    if not lora_modules(model):
        apply_lora(model, [_exact(n) for n in names], rank=config["r"], alpha=config["lora_alpha"])
    wrapped = [name for name, _ in lora_modules(model)]
    if wrapped != names:
        raise KeyError(f"load_adapter: the model's adapters {wrapped} are not the file's {names}")
    for name, m in lora_modules(model):
        for part in ("lora_A", "lora_B"):
            value, param = arrays[f"{name}.{part}"], getattr(m, part)
            if value.shape != param.shape:
                raise ValueError(
                    f"load_adapter: {name}.{part} has shape {value.shape} in the file, "
                    f"{param.shape} in the model"
                )
            with no_grad():
                param.data = np.array(value, dtype=param.dtype)
    return wrapped


def _exact(name: str) -> str:
    """A glob pattern that matches `name` literally."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)
