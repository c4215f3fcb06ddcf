"""A GPT-2 style decoder-only Transformer: the model the notes describe, end to end.

Token ids -> token embedding + learned position embedding (notes 2.1, 8.6) -> n_layer Pre-LN blocks
(notes 8.5) -> final LayerNorm -> logits against the token embedding itself (weight tying, notes
9.4: logits = h @ wte^T, not an inverse of the lookup). Training minimises the mean next-token
cross-entropy over the positions whose target is not -100 (loss mask, notes 9.2).

Parameter names and layouts are Hugging Face GPT-2's (`transformer.h.0.attn.c_attn.weight` is
(C, 3C), row vectors x @ W), so `GPT.from_pretrained` loads a GPT-2 checkpoint as it is and the
checkpoints written by models.train are GPT-2 checkpoints.

Generation (notes 12) picks one token at a time from the last position's distribution. With the
KV cache (notes 12.4), each layer keeps the keys and values of the positions already seen, so a
new token costs one position's projections plus one attention row over the cached keys: O(T) work
per token instead of re-running the whole O(T^2) prefix.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

import autograd
import autograd.functional as F
import nn
from autograd import Tensor, get_default_dtype, no_grad

IGNORE_INDEX = -100  # a target that does not count in the loss (padding, prompt tokens, ...)


@dataclass
class GPTConfig:
    """Sizes of a GPT. block_size is the longest context (the number of learned positions)."""

    vocab_size: int
    block_size: int
    n_layer: int
    n_head: int
    n_embd: int
    dropout: float = 0.0
    bias: bool = True
    # keep only each block's input in training and recompute its activations in backward
    # (autograd.checkpoint): less memory for one more forward pass per block
    gradient_checkpointing: bool = False

    def __post_init__(self) -> None:
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"GPTConfig: {name} must be a positive integer, got {value!r}")
            setattr(self, name, int(value))
        if self.n_embd % self.n_head:
            raise ValueError(
                f"GPTConfig: n_embd {self.n_embd} must be divisible by n_head {self.n_head} "
                "(each head gets n_embd // n_head dimensions)"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"GPTConfig: dropout must be in [0, 1), got {self.dropout}")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    def to_hf_dict(self) -> dict[str, Any]:
        """config.json in Hugging Face GPT-2 keys, plus this project's own under "glassgrad"."""
        return {
            "model_type": "gpt2",
            "architectures": ["GPT2LMHeadModel"],
            "vocab_size": self.vocab_size,
            "n_positions": self.block_size,
            "n_ctx": self.block_size,
            "n_embd": self.n_embd,
            "n_layer": self.n_layer,
            "n_head": self.n_head,
            "activation_function": "gelu_new",  # HF's name for the tanh approximation
            "layer_norm_epsilon": 1e-5,
            "embd_pdrop": self.dropout,
            "resid_pdrop": self.dropout,
            "attn_pdrop": 0.0,  # this model has no dropout on the attention weights
            "tie_word_embeddings": True,
            "glassgrad": asdict(self),
        }

    @classmethod
    def from_hf_dict(cls, config: dict[str, Any]) -> GPTConfig:
        """Read a GPT-2 style config.json (ours or Hugging Face's)."""
        ours = config.get("glassgrad")
        if isinstance(ours, dict):
            return cls(**ours)
        try:
            block_size = config["n_positions"] if "n_positions" in config else config["n_ctx"]
            kwargs = {k: config[k] for k in ("vocab_size", "n_layer", "n_head", "n_embd")}
        except KeyError as exc:
            raise ValueError(
                f"GPTConfig.from_hf_dict: config.json lacks {exc.args[0]!r} (needs vocab_size, "
                "n_positions or n_ctx, n_layer, n_head, n_embd)"
            ) from None
        eps = config.get("layer_norm_epsilon", 1e-5)
        if abs(eps - 1e-5) > 1e-12:
            raise ValueError(
                f"GPTConfig.from_hf_dict: layer_norm_epsilon {eps} is not supported (the blocks "
                "use GPT-2's 1e-5)"
            )
        if config.get("activation_function", "gelu_new") not in ("gelu_new", "gelu_pytorch_tanh"):
            raise ValueError(
                f"GPTConfig.from_hf_dict: activation_function "
                f"{config['activation_function']!r} is not supported (GELU tanh only)"
            )
        return cls(block_size=block_size, **kwargs)


class Transformer(nn.Module):
    """The parameter container Hugging Face calls `transformer`; GPT.forward runs it."""

    def __init__(self, config: GPTConfig, rng: np.random.Generator) -> None:
        super().__init__()
        self.wte = nn.Embedding(config.vocab_size, config.n_embd, rng=rng)
        self.wpe = nn.Embedding(config.block_size, config.n_embd, rng=rng)
        self.drop = nn.Dropout(config.dropout, rng=rng.spawn(1)[0])  # its own mask stream
        self.h = nn.ModuleList(
            [
                nn.Block(
                    config.n_embd,
                    config.n_head,
                    dropout=config.dropout,
                    bias=config.bias,
                    max_len=config.block_size,
                    rng=rng,
                    n_layer=config.n_layer,
                )
                for _ in range(config.n_layer)
            ]
        )
        self.ln_f = nn.LayerNorm(config.n_embd, bias=config.bias)


class GPT(nn.Module):
    """GPT-2: `logits, loss = model(idx, targets)`; `model.generate(idx, n)` continues text.

    rng initialises the weights (default np.random.default_rng(0)), so the same rng seed gives the
    same model.
    """

    def __init__(self, config: GPTConfig, rng: np.random.Generator | None = None) -> None:
        super().__init__()
        if not isinstance(config, GPTConfig):
            raise TypeError(f"GPT: config must be a GPTConfig, got {type(config).__name__}")
        rng = np.random.default_rng(0) if rng is None else rng
        self.config = config
        self.transformer = Transformer(config, rng)

    def describe(self) -> str:
        """One line naming the model and its sizes (used in error messages and logs)."""
        c = self.config
        return (
            f"GPT(vocab_size={c.vocab_size}, block_size={c.block_size}, n_layer={c.n_layer}, "
            f"n_head={c.n_head}, n_embd={c.n_embd})"
        )

    def _token_ids(self, idx: Any, what: str) -> np.ndarray:
        """idx as a (B, T) int64 array, or a clear error naming the problem."""
        ids = np.asarray(idx.data if isinstance(idx, Tensor) else idx)
        if ids.dtype.kind not in "iu":
            raise TypeError(
                f"{self.describe()}.{what}: idx must hold integer token ids, got dtype "
                f"{ids.dtype} with shape {ids.shape}"
            )
        if ids.ndim != 2 or ids.shape[1] == 0:
            raise ValueError(
                f"{self.describe()}.{what}: idx must have shape (batch, time) with time >= 1, "
                f"got shape {ids.shape}"
            )
        return ids.astype(np.int64, copy=False)  # their range: F.embedding checks it, once

    def _embed(self, ids: np.ndarray, what: str) -> Tensor:
        """Token embeddings; an id outside the vocabulary is reported as the model's error."""
        try:
            return self.transformer.wte(ids)
        except IndexError:
            raise ValueError(
                f"{self.describe()}.{what}: token ids must lie in [0, vocab_size = "
                f"{self.config.vocab_size}), got ids from {ids.min()} to {ids.max()}"
            ) from None

    def forward(
        self,
        idx: Any,
        targets: Any = None,
        kv_caches: list[nn.LayerKVCache] | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Logits (B, T, V) and the mean cross-entropy against targets (B, T), or None.

        targets: next-token ids; IGNORE_INDEX (-100) marks positions left out of the loss. Without
        targets only the last position's logits are computed: (B, 1, V), all that generation needs.
        kv_caches: one nn.LayerKVCache per layer (generation); idx then holds only the new
        positions, which continue after the cached ones.
        """
        ids = self._token_ids(idx, "forward")
        batch, length = ids.shape
        past = 0
        if kv_caches is not None:
            if len(kv_caches) != self.config.n_layer:
                raise ValueError(
                    f"{self.describe()}.forward: got {len(kv_caches)} KV caches for "
                    f"{self.config.n_layer} layers"
                )
            past = kv_caches[0].length
        if past + length > self.config.block_size:
            raise ValueError(
                f"{self.describe()}.forward: sequence length {past + length}"
                + (f" ({past} cached + {length} new)" if past else "")
                + f" exceeds block_size {self.config.block_size}; crop the context to the last "
                f"{self.config.block_size} tokens"
            )
        t = self.transformer
        positions = np.arange(past, past + length)
        x = t.drop(
            self._embed(ids, "forward") + t.wpe(positions)
        )  # (B, T, C) + (T, C): notes 8.6, e_i + p_i
        for i, block in enumerate(t.h):
            if self.config.gradient_checkpointing and self.training and kv_caches is None:
                x = autograd.checkpoint(block, x)
            else:
                x = block(x, kv_cache=None if kv_caches is None else kv_caches[i])
        if targets is None:
            x = x[:, -1:, :]  # LayerNorm and the head act per position: skip the others
        # Tied head (notes 9.4): logits = h @ wte^T, as one 2-D product (nn.linear flattens B, T).
        logits = nn.linear(t.ln_f(x), t.wte.weight.T)
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits, self._targets(targets, ids.shape))

    def _targets(self, targets: Any, shape: tuple[int, ...]) -> np.ndarray:
        y = np.asarray(targets.data if isinstance(targets, Tensor) else targets)
        if y.dtype.kind not in "iu" or y.shape != shape:
            raise ValueError(
                f"{self.describe()}.forward: targets must be integer ids shaped like idx "
                f"{shape}, got shape {y.shape} dtype {y.dtype}"
            )
        return y.astype(np.int64, copy=False)  # their range: F.cross_entropy checks it, once

    # --- generation (notes 12) --------------------------------------------------------------------
    def new_kv_caches(self, batch: int) -> list[nn.LayerKVCache]:
        """Empty per-layer key/value caches for `batch` sequences of up to block_size positions."""
        c = self.config
        dtype = self.transformer.wte.weight.dtype
        return [
            nn.LayerKVCache(batch, c.n_head, c.block_size, c.head_dim, dtype)
            for _ in range(c.n_layer)
        ]

    def generate(
        self,
        idx: Any,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        eos_id: int | None = None,
        use_cache: bool = True,
        rng: np.random.Generator | None = None,
    ) -> np.ndarray:
        """Continue each row of idx (B, T) by up to max_new_tokens tokens; returns (B, T + n).

        temperature 0 is greedy (argmax); otherwise tokens are sampled from softmax(logits / T)
        after optional top-k / top-p truncation (notes 12.2). Stops early once every row has
        produced eos_id (rows that finished first are padded with eos_id). The model sees at most
        the last block_size tokens. rng: the Generator to sample with (default: a fresh,
        unseeded one).

        With use_cache, the prompt is run once and each new token costs one position. Positions
        are absolute (learned), so once the context is longer than block_size the window slides,
        every position shifts and the cache is rebuilt from the cropped window (notes 12.4).
        """
        ids = self._token_ids(idx, "generate")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)):
            raise TypeError(f"generate: max_new_tokens must be an int, got {max_new_tokens!r}")
        if max_new_tokens < 0:
            raise ValueError(f"generate: max_new_tokens must be >= 0, got {max_new_tokens}")
        check_sampling_args(temperature, top_k, top_p, self.config.vocab_size)
        if eos_id is not None and not 0 <= eos_id < self.config.vocab_size:
            raise ValueError(
                f"generate: eos_id {eos_id} is not a token id of vocab_size "
                f"{self.config.vocab_size}"
            )
        rng = np.random.default_rng() if rng is None else rng
        batch, start = ids.shape
        block = self.config.block_size
        out = np.empty((batch, start + max_new_tokens), dtype=np.int64)
        out[:, :start] = ids
        length = start
        done = np.zeros(batch, dtype=bool)
        caches = self.new_kv_caches(batch) if use_cache else None
        was_training = self.training
        self.eval()
        try:
            with no_grad():
                for _ in range(max_new_tokens):
                    if caches is None:
                        logits, _ = self(out[:, max(0, length - block) : length])
                    elif 0 < caches[0].length < block:
                        logits, _ = self(out[:, length - 1 : length], kv_caches=caches)
                    else:  # first step, or the window slid: (re)fill the cache
                        for cache in caches:
                            cache.reset()
                        logits, _ = self(out[:, max(0, length - block) : length], kv_caches=caches)
                    scores = logits.data[:, -1, :].astype(np.float64)
                    token = choose_next_token(scores, temperature, top_k, top_p, rng)
                    if eos_id is not None:
                        token = np.where(done, eos_id, token)
                        done |= token == eos_id
                    out[:, length] = token
                    length += 1
                    if eos_id is not None and done.all():
                        break
        finally:
            self.train(was_training)
        return out[:, :length]

    # --- checkpoints ----------------------------------------------------------------------------
    def save_pretrained(
        self, directory: str | Path, metadata: dict[str, str] | None = None
    ) -> None:
        """Write config.json and model.safetensors (HF GPT-2 names), each atomically."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        nn.save_safetensors(
            directory / "model.safetensors",
            self.state_dict(),
            metadata={"format": "pt", **(metadata or {})},
        )
        nn.save_json_atomic(directory / "config.json", self.config.to_hf_dict())

    @classmethod
    def from_pretrained(cls, path: str | Path, dtype: Any = None) -> GPT:
        """Load a GPT-2 style checkpoint: a directory with config.json + model.safetensors, or the
        .safetensors file inside one (config.json beside it).

        Accepts keys with or without the `transformer.` prefix (the original GPT-2 upload has
        none), skips the attention-mask buffers `attn.bias` / `attn.masked_bias` and a stored
        `lm_head.weight` (the head is tied to wte). Weights are cast to dtype (default: the
        default float dtype).
        """
        path = Path(path)
        weights_path = path / "model.safetensors" if path.is_dir() else path
        config_path = weights_path.parent / "config.json"
        for needed in (weights_path, config_path):
            if not needed.is_file():
                raise FileNotFoundError(f"GPT.from_pretrained: {needed} does not exist")
        with open(config_path, encoding="utf-8") as f:
            config = GPTConfig.from_hf_dict(json.load(f))
        arrays, _ = nn.load_safetensors(weights_path)
        state = _hf_state_dict(arrays)
        if "transformer.h.0.attn.c_attn.bias" not in state:
            config.bias = False  # a bias-free checkpoint (ours with bias=False)
        dtype = np.dtype(get_default_dtype() if dtype is None else dtype)
        model = cls(config).to(dtype)
        model.load_state_dict({k: v.astype(dtype, copy=False) for k, v in state.items()})
        return model


_MASK_BUFFER = re.compile(r"(^|\.)attn\.(masked_)?bias$")


def _hf_state_dict(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Checkpoint keys -> this model's names: add the `transformer.` prefix, drop mask buffers."""
    state = {}
    for key, value in arrays.items():
        if _MASK_BUFFER.search(key) or key == "lm_head.weight":
            continue
        state[key if key.startswith("transformer.") else "transformer." + key] = value
    return state


# --- choosing the next token (notes 12.2) ---------------------------------------------------------


def check_sampling_args(
    temperature: float, top_k: int | None, top_p: float | None, vocab_size: int
) -> None:
    if not temperature >= 0.0:  # also rejects NaN
        raise ValueError(f"generate: temperature must be >= 0 (0 = greedy), got {temperature}")
    if top_k is not None and (
        isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or top_k < 1
    ):
        raise ValueError(f"generate: top_k must be a positive int or None, got {top_k!r}")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise ValueError(f"generate: top_p must be in (0, 1] or None, got {top_p}")
    if vocab_size < 1:
        raise ValueError(f"generate: vocab_size must be positive, got {vocab_size}")


def next_token_probs(
    logits: np.ndarray,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
) -> np.ndarray:
    """The distribution sampling draws from, rows of logits (B, V) -> probabilities (B, V).

    softmax(logits / temperature), then top-k (keep the k highest logits; ties with the k-th are
    kept too) and top-p (keep the most probable tokens until their mass reaches top_p; the most
    probable token is always kept), each followed by renormalisation. temperature must be > 0.
    """
    logits = np.asarray(logits, dtype=np.float64) / temperature
    vocab = logits.shape[-1]
    if top_k is not None and top_k < vocab:
        kth = np.partition(logits, vocab - top_k, axis=-1)[:, vocab - top_k, None]
        logits = np.where(logits >= kth, logits, -np.inf)
    probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    if top_p is not None and top_p < 1.0:
        order = np.argsort(-probs, axis=-1, kind="stable")
        sorted_probs = np.take_along_axis(probs, order, axis=-1)
        # Keep a token while the mass of the tokens before it is still short of top_p.
        keep_sorted = np.cumsum(sorted_probs, axis=-1) - sorted_probs < top_p
        keep = np.zeros_like(keep_sorted)
        np.put_along_axis(keep, order, keep_sorted, axis=-1)
        probs = np.where(keep, probs, 0.0)
        probs /= probs.sum(axis=-1, keepdims=True)
    return probs


def choose_next_token(
    logits: np.ndarray,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    rng: np.random.Generator,
) -> np.ndarray:
    """One token id per row: argmax when temperature is 0, else a draw from next_token_probs."""
    if temperature == 0.0:
        return np.argmax(logits, axis=-1)
    probs = next_token_probs(logits, temperature, top_k, top_p)
    cdf = np.cumsum(probs, axis=-1)
    cdf /= cdf[:, -1:]  # exactly 1 at the end, so every u in [0, 1) lands on a token
    u = rng.random((probs.shape[0], 1))
    # The first token whose cdf exceeds u; a zero-probability token never does (cdf unchanged).
    return (cdf <= u).sum(axis=-1)
