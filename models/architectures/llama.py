"""The Llama family (Llama 2/3, SmolLM2, TinyLlama, Qwen2, Mistral): models.architectures.decoder
with RMSNorm, rotary positions, the SwiGLU MLP and grouped-query attention, under Hugging Face's
names.

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

from models.architectures.decoder import Decoder, DecoderConfig
from models.formats.hf import Fields

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


class Llama(Decoder):
    """A Llama-family decoder under Hugging Face's names (the table above). Build one from a
    DecoderConfig (config_from_hf reads config.json), or load a directory: Llama.from_pretrained
    or models.from_pretrained."""

    names = NAMES
    layout = "llama"
    linear_weights_transposed = True  # torch's nn.Linear stores (out, in)
    hf_layer_field = "num_hidden_layers"

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
