"""glassgrad's layer library: Module, layers, Transformer pieces, optimizers, checkpoints.

>>> import numpy as np, nn
>>> layer = nn.Linear(4, 2)          # weight (4, 2): row vectors, x @ W + b
>>> [name for name, _ in layer.named_parameters()]
['weight', 'bias']
"""

from nn import optim
from nn.attention import Block, CausalSelfAttention, LayerKVCache, apply_rotary, rotary_tables
from nn.checkpoint import (
    CheckpointError,
    join_optimizer_state,
    load_checkpoint,
    load_safetensors,
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
    LayerNorm,
    Linear,
    ReLU,
    RMSNorm,
    linear,
)
from nn.module import Module, ModuleList, Parameter, Sequential
from nn.optim import clip_grad_norm_

__all__ = [
    "GELU",
    "MLP",
    "Block",
    "CausalSelfAttention",
    "CheckpointError",
    "Dropout",
    "Embedding",
    "LayerKVCache",
    "LayerNorm",
    "Linear",
    "Module",
    "ModuleList",
    "Parameter",
    "RMSNorm",
    "ReLU",
    "Sequential",
    "apply_rotary",
    "clip_grad_norm_",
    "join_optimizer_state",
    "linear",
    "load_checkpoint",
    "load_safetensors",
    "optim",
    "rotary_tables",
    "save_checkpoint",
    "save_json_atomic",
    "save_safetensors",
    "save_text_atomic",
    "split_optimizer_state",
]
