"""The Llama family (Llama 2/3, SmolLM2, TinyLlama, Qwen2, Mistral): models.decoder with
RMSNorm, rotary positions, the SwiGLU MLP and grouped-query attention, under Hugging Face's names.

What a Hugging Face Llama file calls each parameter, and where it lives here (every name is HF's
own, so `named_parameters()` lists exactly the file's tensor names):

    model.embed_tokens.weight                      (V, C)  token embedding (wte)
    model.layers.{i}.input_layernorm.weight        (C,)    RMSNorm before attention (ln_1)
    model.layers.{i}.self_attn.q_proj.weight       (C, H*D)      W_Q  } (in, out) here;
    model.layers.{i}.self_attn.k_proj.weight       (C, Hkv*D)    W_K  } the file stores
    model.layers.{i}.self_attn.v_proj.weight       (C, Hkv*D)    W_V  } torch's (out, in):
    model.layers.{i}.self_attn.o_proj.weight       (H*D, C)      W_O  } transposed on load/save
    model.layers.{i}.self_attn.{q,k,v}_proj.bias   Qwen2 only (and Llama's attention_bias)
    model.layers.{i}.post_attention_layernorm.weight (C,)  RMSNorm before the MLP (ln_2)
    model.layers.{i}.mlp.gate_proj.weight          (C, F)  SwiGLU: down(silu(x gate) * (x up))
    model.layers.{i}.mlp.up_proj.weight            (C, F)
    model.layers.{i}.mlp.down_proj.weight          (F, C)
    model.norm.weight                              (C,)    final RMSNorm (ln_f)
    lm_head.weight                                 (C, V)  only when tie_word_embeddings is false

config.json: hidden_size C, num_hidden_layers, num_attention_heads H, num_key_value_heads Hkv,
head_dim D (default C / H), intermediate_size F, rms_norm_eps, max_position_embeddings, vocab_size,
rope_theta and rope_scaling (or, as newer transformers write them, one rope_parameters dict),
tie_word_embeddings, eos_token_id; Qwen2 always has q/k/v biases, Llama when attention_bias is set;
Mistral's sliding_window, when set, caps the context (within the window it changes nothing).
"""

from __future__ import annotations

from typing import Any

from models.decoder import Decoder, DecoderConfig
from models.hf import field, ids

# glassgrad's role names (GPT-2's, which the decoder's forward reads) -> Llama's names.
NAMES = {"transformer": "model", "wte": "embed_tokens", "h": "layers", "ln_f": "norm"}
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


def llama_config(**sizes: Any) -> DecoderConfig:
    """A DecoderConfig with Llama's settings; `sizes` (vocab_size, n_layer, ...) and any change."""
    return DecoderConfig(**{**SETTINGS, **sizes})


def _rope_settings(config: dict[str, Any], source: str) -> tuple[float, dict | None]:
    """(rope_theta, rope_scaling) from either spelling: top-level rope_theta / rope_scaling, or
    rope_parameters {"rope_type": ..., "rope_theta": ..., scaling fields}."""
    params = config.get("rope_parameters") or {}
    theta = params.get("rope_theta", config.get("rope_theta", DEFAULT_THETA))
    scaling = config.get("rope_scaling") or params
    kind = scaling.get("rope_type", scaling.get("type", "default")) if scaling else "default"
    if kind == "default":
        return float(theta), None
    if kind != "llama3":
        raise ValueError(f"{source}: rope type {kind!r} is not supported (default or llama3)")
    keys = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    for key in keys:
        if key not in scaling:
            raise ValueError(f"{source}: the llama3 rope scaling lacks the field {key!r}")
    return float(theta), {"rope_type": "llama3", **{k: scaling[k] for k in keys}}


def config_from_hf(config: dict[str, Any], source: str) -> DecoderConfig:
    """A Llama / Qwen2 / Mistral config.json -> the decoder's settings."""
    model_type = field(config, "model_type", source)
    if model_type not in MODEL_TYPES:
        raise ValueError(f"{source}: model_type {model_type!r} is not a Llama-family type")
    activation = config.get("hidden_act", "silu")
    if activation != "silu":
        raise ValueError(f"{source}: hidden_act {activation!r} is not supported (silu only)")
    theta, scaling = _rope_settings(config, source)
    mlp_bias = bool(config.get("mlp_bias", False))
    if model_type == "llama" and bool(config.get("attention_bias", False)) != mlp_bias:
        # o_proj's bias follows attention_bias, the MLP's mlp_bias; the blocks share one setting
        raise ValueError(f"{source}: attention_bias and mlp_bias must agree")
    block_size = field(config, "max_position_embeddings", source)
    window = config.get("sliding_window")
    if model_type == "mistral" and window is not None:
        block_size = min(block_size, window)  # within the window, sliding changes nothing
    return llama_config(
        vocab_size=field(config, "vocab_size", source),
        block_size=block_size,
        n_layer=field(config, "num_hidden_layers", source),
        n_head=field(config, "num_attention_heads", source),
        n_embd=field(config, "hidden_size", source),
        n_kv_head=config.get("num_key_value_heads"),
        head_dim=config.get("head_dim"),
        ffn_hidden=field(config, "intermediate_size", source),
        bias=mlp_bias,
        qkv_bias=model_type == "qwen2" or bool(config.get("attention_bias", False)),
        norm_eps=float(field(config, "rms_norm_eps", source, 1e-6)),
        rope_theta=theta,
        rope_scaling=scaling,
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        eos_token_ids=ids(config.get("eos_token_id")),
        model_type=model_type,
    )


class Llama(Decoder):
    """A Llama-family decoder under Hugging Face's names (the table above). Build one from a
    DecoderConfig (config_from_hf reads config.json), or load a directory: Llama.from_pretrained
    or models.from_pretrained."""

    names = NAMES
    layout = "llama"
    linear_weights_transposed = True  # torch's nn.Linear stores (out, in)

    @classmethod
    def config_from_hf(cls, config: dict[str, Any], source: str) -> DecoderConfig:
        return config_from_hf(config, source)

    def hf_name(self, name: str) -> str | None:
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
