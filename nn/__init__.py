"""glassgrad's layer library: Module, layers, Transformer pieces, optimizers, checkpoints.

>>> import numpy as np, nn
>>> layer = nn.Linear(4, 2)          # weight (4, 2): row vectors, x @ W + b
>>> [name for name, _ in layer.named_parameters()]
['weight', 'bias']
"""

try:  # HIPS autograd (or a folder named autograd) has no check_packages
    from autograd import check_packages
except ImportError as exc:
    raise ImportError(
        "glassgrad: 'import autograd' did not find glassgrad's engine (HIPS autograd has the same "
        "name): pip uninstall autograd, or rename the folder; see the README, Install"
    ) from exc
from autograd.functional import apply_rotary, linear, rotary_tables  # the primitives layers use
from nn import optim
from nn.accumulate import (
    accumulate_gradients,
    accumulation_weights,
    counted_targets,
    split_batch,
)
from nn.attention import (
    Attention,
    Block,
    CausalSelfAttention,
    CrossAttention,
    DecoderBlock,
    EncoderBlock,
    LayerKVCache,
    RotaryPositions,
    SelfAttention,
    grouped_attention,
    make_mlp,
    make_norm,
)
from nn.checkpoint import (
    FLOAT_DTYPES,
    CheckpointError,
    SafetensorsHeader,
    iter_safetensors,
    join_optimizer_state,
    load_checkpoint,
    load_safetensors,
    read_safetensors_header,
    read_safetensors_tensors,
    save_checkpoint,
    save_json_atomic,
    save_safetensors,
    save_text_atomic,
    split_optimizer_state,
)
from nn.layers import (
    GELU,
    MLP,
    Dropout,
    Embedding,
    GatedMLP,
    LayerNorm,
    Linear,
    ReLU,
    RMSNorm,
)
from nn.lora import (
    LoRA,
    apply_lora,
    load_adapter,
    merge_lora,
    save_adapter,
    unload_lora,
    unmerge_lora,
)
from nn.module import Module, ModuleList, Parameter, Sequential
from nn.optim import clip_grad_norm_
from nn.quantized import QuantizedEmbedding, QuantizedLinear, quantize_linears
from nn.transformer import (
    SinusoidalPositions,
    position_embedding,
    sinusoidal_table,
)

__all__ = [
    "GELU",
    "MLP",
    "Attention",
    "Block",
    "CausalSelfAttention",
    "CheckpointError",
    "FLOAT_DTYPES",
    "SafetensorsHeader",
    "CrossAttention",
    "DecoderBlock",
    "Dropout",
    "Embedding",
    "GatedMLP",
    "EncoderBlock",
    "LayerKVCache",
    "LayerNorm",
    "Linear",
    "LoRA",
    "Module",
    "ModuleList",
    "Parameter",
    "QuantizedEmbedding",
    "QuantizedLinear",
    "RMSNorm",
    "RotaryPositions",
    "ReLU",
    "SelfAttention",
    "Sequential",
    "SinusoidalPositions",
    "accumulate_gradients",
    "accumulation_weights",
    "apply_lora",
    "apply_rotary",
    "clip_grad_norm_",
    "counted_targets",
    "iter_safetensors",
    "join_optimizer_state",
    "grouped_attention",
    "linear",
    "load_adapter",
    "make_mlp",
    "make_norm",
    "load_checkpoint",
    "load_safetensors",
    "read_safetensors_header",
    "read_safetensors_tensors",
    "merge_lora",
    "optim",
    "position_embedding",
    "quantize_linears",
    "rotary_tables",
    "save_adapter",
    "save_checkpoint",
    "save_json_atomic",
    "save_safetensors",
    "save_text_atomic",
    "sinusoidal_table",
    "split_batch",
    "split_optimizer_state",
    "unload_lora",
    "unmerge_lora",
]

check_packages("autograd", "nn")  # no folder of the same name may shadow glassgrad's
