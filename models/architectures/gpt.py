"""GPT-2: the decoder of models.architectures.decoder with GPT-2's settings and Hugging Face GPT-2's
names.

Token ids -> token embedding + learned position embedding (notes 2.1, 8.6) -> n_layer Pre-LN blocks
(LayerNorm, GELU MLP; notes 8.5) -> final LayerNorm -> logits against the token embedding itself
(weight tying, notes 9.4). The forward pass, the loss and generation are
models.architectures.decoder's.

Parameter names and layouts are Hugging Face GPT-2's, one to one (HF_NAMES): glassgrad's own
names (models.architectures.decoder.Body, nn.Block) are GPT-2's, and GPT-2's Conv1D stores
row-vector (in, out) weights as glassgrad does, so `GPT.from_pretrained` loads a GPT-2 checkpoint as
it is and the checkpoints written by models.train are GPT-2 checkpoints. The file's other names: the
attention-mask buffers `attn.bias` / `attn.masked_bias` (not weights: skipped), `lm_head.weight`
(the tied wte: skipped), and keys without the `transformer.` prefix (the original GPT-2 upload).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

from models.architectures.decoder import (  # noqa: F401  (the sampling helpers' historical home)
    IGNORE_INDEX,
    Decoder,
    DecoderConfig,
    check_sampling_args,
    choose_next_token,
    next_token_probs,
)
from models.formats.errors import FileFormatError
from models.formats.hf import Fields


@dataclass
class GPTConfig(DecoderConfig):
    """Sizes of a GPT (GPT-2's settings: DecoderConfig's defaults). block_size is the longest
    context (the number of learned positions)."""

    def to_hf_dict(self) -> dict[str, Any]:
        """config.json in Hugging Face GPT-2 keys, plus this project's own under "glassgrad"."""
        hf = {
            "model_type": "gpt2",
            "architectures": ["GPT2LMHeadModel"],
            "vocab_size": self.vocab_size,
            "n_positions": self.block_size,
            "n_ctx": self.block_size,
            "n_embd": self.n_embd,
            "n_layer": self.n_layer,
            "n_head": self.n_head,
            "n_inner": self.ffn_hidden,
            "activation_function": "gelu_new",  # HF's name for the tanh approximation
            "layer_norm_epsilon": self.norm_eps,
            "embd_pdrop": self.dropout,
            "resid_pdrop": self.dropout,
            "attn_pdrop": 0.0,  # this model has no dropout on the attention weights
            "tie_word_embeddings": True,
            "torch_dtype": "float32",
            "glassgrad": asdict(self),
        }
        if self.eos_token_ids:
            hf["eos_token_id"] = self.eos_token_ids[0]
        return hf

    @classmethod
    def from_hf_dict(cls, config: dict[str, Any], source: str = "config.json") -> GPTConfig:
        """Read a GPT-2 style config.json (ours or Hugging Face's), every field checked."""
        f = Fields(config, source)
        f.choice("model_type", ("gpt2",), "gpt2")
        if config.get("glassgrad") is not None:  # glassgrad's own settings, written beside HF's
            ours = f.mapping("glassgrad")
            try:
                ours.token_ids("eos_token_ids", ours.integer("vocab_size"))
                return cls(**ours.config)
            except (TypeError, ValueError) as exc:
                if isinstance(exc, FileFormatError):
                    raise
                raise f.error("glassgrad", f"is not a GPTConfig ({exc})") from None
        if config.get("n_positions") is None and config.get("n_ctx") is None:
            raise FileFormatError(source, "n_positions or n_ctx", "is missing")
        block_size = f.integer("n_positions", None) or f.integer("n_ctx")
        f.choice("activation_function", ("gelu_new", "gelu_pytorch_tanh"), "gelu_new")
        if not f.boolean("tie_word_embeddings", True):
            raise f.error("tie_word_embeddings", "must be true: GPT-2's head is its embedding")
        n_embd, n_head = f.integer("n_embd"), f.integer("n_head")
        if n_embd % n_head:
            raise f.error("n_embd", f"must be divisible by n_head ({n_head})")
        vocab_size = f.integer("vocab_size")
        return cls(
            vocab_size=vocab_size,
            block_size=block_size,
            n_layer=f.integer("n_layer"),
            n_head=n_head,
            n_embd=n_embd,
            ffn_hidden=f.integer("n_inner", None),
            norm_eps=f.number("layer_norm_epsilon", 1e-5),
            eos_token_ids=f.token_ids("eos_token_id", vocab_size),
        )


# Hugging Face's tensor name -> (this model's parameter, stored transposed?); {i}: layer i. Every
# name maps to itself and nothing is transposed. Shapes (row vectors, (in, out)):
LAYER = "transformer.h.{i}."
HF_NAMES = {
    "transformer.wte.weight": ("transformer.wte.weight", False),  # (V, C), also the output head
    "transformer.wpe.weight": ("transformer.wpe.weight", False),  # (block_size, C)
    LAYER + "ln_1.weight": (LAYER + "ln_1.weight", False),  # (C,)
    LAYER + "ln_1.bias": (LAYER + "ln_1.bias", False),
    LAYER + "attn.c_attn.weight": (LAYER + "attn.c_attn.weight", False),  # (C, 3C) W_Q|W_K|W_V
    LAYER + "attn.c_attn.bias": (LAYER + "attn.c_attn.bias", False),
    LAYER + "attn.c_proj.weight": (LAYER + "attn.c_proj.weight", False),  # (C, C) W_O
    LAYER + "attn.c_proj.bias": (LAYER + "attn.c_proj.bias", False),
    LAYER + "ln_2.weight": (LAYER + "ln_2.weight", False),
    LAYER + "ln_2.bias": (LAYER + "ln_2.bias", False),
    LAYER + "mlp.c_fc.weight": (LAYER + "mlp.c_fc.weight", False),  # (C, 4C)
    LAYER + "mlp.c_fc.bias": (LAYER + "mlp.c_fc.bias", False),
    LAYER + "mlp.c_proj.weight": (LAYER + "mlp.c_proj.weight", False),  # (4C, C)
    LAYER + "mlp.c_proj.bias": (LAYER + "mlp.c_proj.bias", False),
    "transformer.ln_f.weight": ("transformer.ln_f.weight", False),
    "transformer.ln_f.bias": ("transformer.ln_f.bias", False),
}
_MASK_BUFFER = re.compile(r"(^|\.)attn\.(masked_)?bias$")


class GPT(Decoder):
    """GPT-2: `logits, loss = model(idx, targets)`; `model.generate(idx, n)` continues text.

    rng initialises the weights (default np.random.default_rng(0)), so the same rng seed gives the
    same model.
    """

    HF_NAMES = HF_NAMES

    def __init__(self, config: GPTConfig, rng: Any = None) -> None:
        if not isinstance(config, GPTConfig):
            raise TypeError(f"GPT: config must be a GPTConfig, got {type(config).__name__}")
        super().__init__(config, rng)

    def describe(self) -> str:
        c = self.config
        return (
            f"GPT(vocab_size={c.vocab_size}, block_size={c.block_size}, n_layer={c.n_layer}, "
            f"n_head={c.n_head}, n_embd={c.n_embd})"
        )

    @classmethod
    def config_from_hf(cls, config: dict[str, Any], source: str) -> GPTConfig:
        return GPTConfig.from_hf_dict(config, source)

    def hf_config(self) -> dict[str, Any]:
        return self.config.to_hf_dict()

    def hf_file_name(self, name: str) -> str | None:
        """Skip the mask buffers and the tied head; add the `transformer.` prefix if missing."""
        if _MASK_BUFFER.search(name) or name == "lm_head.weight":
            return None
        return name if name.startswith("transformer.") else "transformer." + name
