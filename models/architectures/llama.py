"""The Llama family (Llama 2/3, SmolLM2, TinyLlama, Qwen2, Mistral): models.architectures.decoder
with RMSNorm, rotary positions, the SwiGLU MLP and grouped-query attention, under Hugging Face's
names.

The module tree below is HF's own (model.layers.{i}.self_attn.q_proj, ...), so
`named_parameters()` lists exactly the file's tensor names, and HF_NAMES maps each of them, one
row per tensor, for loading and saving. The decoder's forward (and models.lab) read every family
by glassgrad's names (transformer, wte, h, ln_f; a block's attn; an attention's c_proj = W_O):
here they are read-only properties naming the HF module, so LoRA, which replaces a module under
its registered name, is seen under both.

config.json: hidden_size C, num_hidden_layers, num_attention_heads H, num_key_value_heads Hkv,
head_dim D (default C / H), intermediate_size F, rms_norm_eps, max_position_embeddings, vocab_size,
rope_theta and rope_scaling (or, as newer transformers write them, one rope_parameters dict),
tie_word_embeddings, eos_token_id; Qwen2 always has q/k/v biases, Llama when attention_bias is set;
Mistral's sliding_window, when set, caps the context (within the window it changes nothing).
"""

from __future__ import annotations

from typing import Any

import numpy as np

import nn
from autograd import Tensor
from models.architectures.decoder import Decoder, DecoderConfig
from models.formats.hf import Fields
from nn.attention import split_heads
from nn.layers import residual_projection

MODEL_TYPES = ("llama", "qwen2", "mistral")
DEFAULT_THETA = 10000.0
# What makes a decoder a Llama (DecoderConfig's defaults are GPT-2's).
SETTINGS = dict(
    bias=False,
    norm="rmsnorm",
    positions="rotary",
    mlp="swiglu",
    tie_word_embeddings=False,
    model_type="llama",
)


# Hugging Face's tensor name -> (this model's parameter, stored transposed?); {i}: layer i. The
# tree uses HF's names, so each name maps to itself; torch's nn.Linear stores (out, in), so every
# Linear weight is transposed on load and save. Shapes here (row vectors, (in, out)):
LAYER = "model.layers.{i}."
HF_NAMES = {
    "model.embed_tokens.weight": ("model.embed_tokens.weight", False),  # (V, C) wte
    LAYER + "input_layernorm.weight": (LAYER + "input_layernorm.weight", False),  # (C,) ln_1
    LAYER + "self_attn.q_proj.weight": (LAYER + "self_attn.q_proj.weight", True),  # (C, H*D) W_Q
    LAYER + "self_attn.k_proj.weight": (LAYER + "self_attn.k_proj.weight", True),  # (C, Hkv*D) W_K
    LAYER + "self_attn.v_proj.weight": (LAYER + "self_attn.v_proj.weight", True),  # (C, Hkv*D) W_V
    # q/k/v biases: Qwen2's, or Llama's with attention_bias
    LAYER + "self_attn.q_proj.bias": (LAYER + "self_attn.q_proj.bias", False),
    LAYER + "self_attn.k_proj.bias": (LAYER + "self_attn.k_proj.bias", False),
    LAYER + "self_attn.v_proj.bias": (LAYER + "self_attn.v_proj.bias", False),
    LAYER + "self_attn.o_proj.weight": (LAYER + "self_attn.o_proj.weight", True),  # (H*D, C) W_O
    LAYER + "self_attn.o_proj.bias": (LAYER + "self_attn.o_proj.bias", False),  # mlp_bias
    LAYER + "post_attention_layernorm.weight": (LAYER + "post_attention_layernorm.weight", False),
    LAYER + "mlp.gate_proj.weight": (LAYER + "mlp.gate_proj.weight", True),  # (C, F) SwiGLU gate
    LAYER + "mlp.up_proj.weight": (LAYER + "mlp.up_proj.weight", True),  # (C, F)
    LAYER + "mlp.down_proj.weight": (LAYER + "mlp.down_proj.weight", True),  # (F, C)
    LAYER + "mlp.gate_proj.bias": (LAYER + "mlp.gate_proj.bias", False),  # mlp_bias
    LAYER + "mlp.up_proj.bias": (LAYER + "mlp.up_proj.bias", False),
    LAYER + "mlp.down_proj.bias": (LAYER + "mlp.down_proj.bias", False),
    "model.norm.weight": ("model.norm.weight", False),  # (C,) ln_f
    "lm_head.weight": ("lm_head.weight", True),  # (C, V), when tie_word_embeddings is false
}


def llama_config(**sizes: Any) -> DecoderConfig:
    """A DecoderConfig with Llama's settings; `sizes` (vocab_size, n_layer, ...) and any change."""
    return DecoderConfig(**{**SETTINGS, **sizes})


def _rope_settings(f: Fields) -> tuple[float, dict | None]:
    """(rope_theta, rope_scaling) from either spelling: top-level rope_theta / rope_scaling, or
    rope_parameters {"rope_type": ..., "rope_theta": ..., scaling fields}."""
    params = f.mapping("rope_parameters")
    theta = params.number("rope_theta", None) if params else None
    theta = f.number("rope_theta", DEFAULT_THETA) if theta is None else theta
    scaling = f.mapping("rope_scaling")
    scaling = params if scaling is None or not scaling.config else scaling
    if scaling is None:
        return theta, None
    kind = scaling.choice(
        "rope_type" if "rope_type" in scaling.config else "type", ("default", "llama3"), "default"
    )
    if kind == "default":
        return theta, None
    settings = {
        "rope_type": "llama3",
        "factor": scaling.number("factor"),
        "low_freq_factor": scaling.number("low_freq_factor"),
        "high_freq_factor": scaling.number("high_freq_factor"),
        "original_max_position_embeddings": scaling.integer("original_max_position_embeddings"),
    }
    if settings["high_freq_factor"] <= settings["low_freq_factor"]:  # the two bound a ramp
        raise scaling.error("high_freq_factor", "must be above low_freq_factor")
    return theta, settings


def config_from_hf(config: dict[str, Any], source: str) -> DecoderConfig:
    """A Llama / Qwen2 / Mistral config.json -> the decoder's settings, every field checked."""
    f = Fields(config, source)
    model_type = f.choice("model_type", MODEL_TYPES)
    f.choice("hidden_act", ("silu",), "silu")
    theta, scaling = _rope_settings(f)
    mlp_bias, attention_bias = f.boolean("mlp_bias", False), f.boolean("attention_bias", False)
    if model_type == "llama" and attention_bias != mlp_bias:
        # o_proj's bias follows attention_bias, the MLP's mlp_bias; the blocks share one setting
        raise f.error("attention_bias", f"must equal mlp_bias ({mlp_bias}) here")
    n_embd, n_head = f.integer("hidden_size"), f.integer("num_attention_heads")
    n_kv_head = f.integer("num_key_value_heads", n_head)
    if n_head % n_kv_head:
        raise f.error("num_key_value_heads", f"must divide num_attention_heads ({n_head})")
    head_dim = f.integer("head_dim", None)
    if head_dim is None and n_embd % n_head:
        raise f.error("hidden_size", f"must be divisible by num_attention_heads ({n_head})")
    block_size = f.integer("max_position_embeddings")
    window = f.integer("sliding_window", None) if model_type == "mistral" else None
    if window is not None:
        block_size = min(block_size, window)  # within the window, sliding changes nothing
    vocab_size = f.integer("vocab_size")
    return llama_config(
        vocab_size=vocab_size,
        block_size=block_size,
        n_layer=f.integer("num_hidden_layers"),
        n_head=n_head,
        n_embd=n_embd,
        n_kv_head=n_kv_head,
        head_dim=head_dim,
        ffn_hidden=f.integer("intermediate_size"),
        bias=mlp_bias,
        qkv_bias=model_type == "qwen2" or attention_bias,
        norm_eps=f.number("rms_norm_eps", 1e-6),
        rope_theta=theta,
        rope_scaling=scaling,
        tie_word_embeddings=f.boolean("tie_word_embeddings", False),
        eos_token_ids=f.token_ids("eos_token_id", vocab_size),
        model_type=model_type,
    )


class LlamaAttention(nn.CausalSelfAttention):
    """Llama's causal self-attention: W_Q, W_K, W_V, W_O as four Linears, q_proj (C, H*D) and
    k_proj, v_proj (C, Hkv*D) for grouped-query heads, o_proj (H*D, C); the rest is nn.Attention.
    """

    def make_projections(
        self, qkv_bias: bool, bias: bool, rng: np.random.Generator, n_layer: int
    ) -> None:
        q_width, kv_width = self.n_head * self.head_dim, self.n_kv_head * self.head_dim
        self.q_proj = nn.Linear(self.n_embd, q_width, bias=qkv_bias, rng=rng)
        self.k_proj = nn.Linear(self.n_embd, kv_width, bias=qkv_bias, rng=rng)
        self.v_proj = nn.Linear(self.n_embd, kv_width, bias=qkv_bias, rng=rng)
        self.o_proj = residual_projection(q_width, self.n_embd, bias, rng, n_layer)

    def self_qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        return (
            split_heads(self.q_proj(x), self.n_head),
            split_heads(self.k_proj(x), self.n_kv_head),
            split_heads(self.v_proj(x), self.n_kv_head),
        )

    c_proj = property(lambda self: self.o_proj)  # W_O, which nn.Attention's forward applies


class LlamaMLP(nn.GatedMLP):
    """Llama's SwiGLU under its own names: down_proj(silu(x gate_proj) * (x up_proj))."""

    def make_projections(
        self, n_embd: int, hidden: int, bias: bool, rng: np.random.Generator, n_layer: int
    ) -> None:
        self.gate_proj = nn.Linear(n_embd, hidden, bias=bias, rng=rng)
        self.up_proj = nn.Linear(n_embd, hidden, bias=bias, rng=rng)
        self.down_proj = residual_projection(hidden, n_embd, bias, rng, n_layer)

    # the names nn.GatedMLP's forward reads
    c_gate = property(lambda self: self.gate_proj)
    c_fc = property(lambda self: self.up_proj)
    c_proj = property(lambda self: self.down_proj)


class LlamaBlock(nn.Module):
    """One Llama layer (notes 8.5), Pre-LN: x + self_attn(input_layernorm(x)), then
    x + mlp(post_attention_layernorm(x)); the norm and MLP are the config's (RMSNorm, SwiGLU)."""

    def __init__(self, c: DecoderConfig, rotary: nn.RotaryPositions, rng: np.random.Generator):
        super().__init__()
        self.input_layernorm = nn.make_norm(c.norm, c.n_embd, c.norm_eps, c.bias)
        self.self_attn = LlamaAttention(
            c.n_embd,
            c.n_head,
            n_kv_head=c.n_kv_head,
            head_dim=c.head_dim,
            rotary=rotary,
            max_len=c.block_size,
            bias=c.bias,
            qkv_bias=c.qkv_bias,
            dropout=c.dropout,
            rng=rng,
            n_layer=c.n_layer,
        )
        self.post_attention_layernorm = nn.make_norm(c.norm, c.n_embd, c.norm_eps, c.bias)
        if c.mlp != "swiglu":
            raise ValueError(f"Llama: mlp must be 'swiglu', got {c.mlp!r}")
        self.mlp = LlamaMLP(c.n_embd, c.ffn_hidden, c.bias, rng, c.n_layer)

    attn = property(lambda self: self.self_attn)  # the name models.lab reads a block's attention by

    def forward(self, x: Tensor, kv_cache: nn.LayerKVCache | None = None) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), kv_cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    """What HF calls `model`: the token embedding, the layers, the final norm. No position table:
    the rotary positions (notes 8.6), one set of tables, are shared by every layer's attention."""

    def __init__(self, c: DecoderConfig, rng: np.random.Generator) -> None:
        super().__init__()
        if c.positions != "rotary":
            raise ValueError(f"Llama: positions must be 'rotary', got {c.positions!r}")
        self.embed_tokens = nn.Embedding(c.vocab_size, c.n_embd, rng=rng)
        self.drop = nn.Dropout(c.dropout, rng=rng.spawn(1)[0])  # its own mask stream
        rotary = nn.RotaryPositions(c.head_dim, c.block_size, c.rope_theta, c.rope_scaling)
        self.layers = nn.ModuleList([LlamaBlock(c, rotary, rng) for _ in range(c.n_layer)])
        self.norm = nn.make_norm(c.norm, c.n_embd, c.norm_eps, c.bias)

    # the names the decoder's forward reads every family's body by
    # (models.architectures.decoder.Body's)
    wte = property(lambda self: self.embed_tokens)
    wpe = None  # positions are rotary, inside attention
    h = property(lambda self: self.layers)
    ln_f = property(lambda self: self.norm)


class Llama(Decoder):
    """A Llama-family decoder under Hugging Face's names (HF_NAMES). Build one from a
    DecoderConfig (config_from_hf reads config.json), or load a directory: Llama.from_pretrained
    or models.from_pretrained."""

    HF_NAMES = HF_NAMES
    hf_layers = "layers"
    hf_layer_field = "num_hidden_layers"

    def make_body(self, config: DecoderConfig, rng: np.random.Generator) -> None:
        self.model = LlamaModel(config, rng)

    transformer = property(lambda self: self.model)  # the name the decoder's forward reads

    @classmethod
    def config_from_hf(cls, config: dict[str, Any], source: str) -> DecoderConfig:
        return config_from_hf(config, source)

    def hf_file_name(self, name: str) -> str | None:
        """Skip what is not a weight: older files store the rotary frequencies, and tied models
        may store lm_head.weight (the same array as embed_tokens)."""
        if name.endswith("rotary_emb.inv_freq"):
            return None
        if name == "lm_head.weight" and self.config.tie_word_embeddings:
            return None
        return name

    def hf_config(self) -> dict[str, Any]:
        c = self.config
        architecture = {"llama": "Llama", "qwen2": "Qwen2", "mistral": "Mistral"}[c.model_type]
        config = {
            "model_type": c.model_type,
            "architectures": [f"{architecture}ForCausalLM"],
            "vocab_size": c.vocab_size,
            "hidden_size": c.n_embd,
            "intermediate_size": c.ffn_hidden,
            "num_hidden_layers": c.n_layer,
            "num_attention_heads": c.n_head,
            "num_key_value_heads": c.n_kv_head,
            "head_dim": c.head_dim,
            "max_position_embeddings": c.block_size,
            "rms_norm_eps": c.norm_eps,
            "rope_theta": c.rope_theta,
            "rope_scaling": c.rope_scaling,
            "hidden_act": "silu",
            "tie_word_embeddings": c.tie_word_embeddings,
            "mlp_bias": c.bias,
            "torch_dtype": "float32",
        }
        if c.model_type == "llama":
            config["attention_bias"] = c.qkv_bias
        if c.model_type == "mistral":
            config["sliding_window"] = None
        if c.eos_token_ids:
            eos = c.eos_token_ids
            config["eos_token_id"] = eos[0] if len(eos) == 1 else eos
        return config
