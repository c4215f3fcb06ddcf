"""One decoder-only Transformer; GPT-2 and the Llama family are two settings of it (notes 8, 9, 12).

Token ids -> token embedding (+ learned positions) -> n_layer Pre-LN blocks (notes 8.5) -> final
norm -> logits against the token embedding itself (tied head, notes 9.4) or a separate lm_head.
Training minimises the mean next-token cross-entropy over the positions whose target is not -100
(loss mask, notes 9.2). Where the families differ, the notes name the choice:

| setting              | GPT-2 (2019)            | Llama, Qwen2, Mistral, SmolLM2                 |
| -------------------- | ----------------------- | ---------------------------------------------- |
| norm (8.4)           | LayerNorm               | RMSNorm (eps from the config)                  |
| positions (8.6)      | learned table `wpe`     | rotary on q, k (rope_theta, llama3 scaling)    |
| mlp (8.2)            | GELU, 4C hidden         | SwiGLU: gate_proj, up_proj, down_proj          |
| K/V heads (8.1)      | one per query head      | n_kv_head <= n_head (grouped-query)            |
| biases               | everywhere              | none; Qwen2: on q, k, v                        |
| head (9.4)           | tied to wte             | tied or its own lm_head                        |

Parameter names are Hugging Face's for each family, and each family's HF_NAMES
(models.architectures.gpt, models.architectures.llama) maps one tensor to one parameter. Layouts are
glassgrad's row vectors: every Linear weight is (in, out) (GPT-2 stores them so too; Llama's files
hold (out, in), transposed on load and save).

Generation (notes 12) picks one token at a time from the last position's distribution. With the
KV cache (notes 12.4), each layer keeps the keys and values of the positions already seen, so a
new token costs one position's projections plus one attention row over the cached keys: O(T) work
per token instead of re-running the whole O(T^2) prefix.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import autograd
import autograd.functional as F
import nn
from autograd import Tensor, get_default_dtype, no_grad
from models.architectures import check_positive_integers
from models.architectures.decoding import DecodeStep
from models.formats import hf
from models.formats.errors import FileFormatError
from models.formats.quantized import QuantizedLoading

COMPILED = (False, True, "exact", "int8")  # generate's choices of compiled decoding
IGNORE_INDEX = -100  # a target that does not count in the loss (padding, prompt tokens, ...)


@dataclass
class DecoderConfig:
    """Sizes and settings of a decoder (defaults: GPT-2's). block_size is the longest context.

    None resolves on creation: n_kv_head -> n_head, head_dim -> n_embd // n_head, ffn_hidden ->
    4 * n_embd, qkv_bias -> bias.
    """

    vocab_size: int
    block_size: int
    n_layer: int
    n_head: int
    n_embd: int
    dropout: float = 0.0
    bias: bool = True
    n_kv_head: int | None = None
    head_dim: int | None = None
    ffn_hidden: int | None = None
    qkv_bias: bool | None = None
    norm: str = "layernorm"
    norm_eps: float = 1e-5
    positions: str = "learned"
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    mlp: str = "gelu"
    tie_word_embeddings: bool = True
    eos_token_ids: list[int] = field(default_factory=list)
    model_type: str = "gpt2"
    # keep only each block's input in training and recompute its activations in backward
    # (autograd.checkpoint): less memory for one more forward pass per block
    gradient_checkpointing: bool = False

    def __post_init__(self) -> None:
        name = type(self).__name__
        sizes = ("vocab_size", "block_size", "n_layer", "n_head", "n_embd")
        check_positive_integers(self, sizes)
        for key in sizes:
            setattr(self, key, int(getattr(self, key)))
        if self.head_dim is None:
            if self.n_embd % self.n_head:
                raise ValueError(
                    f"{name}: n_embd {self.n_embd} must be divisible by n_head {self.n_head} "
                    "(each head gets n_embd // n_head dimensions)"
                )
            self.head_dim = self.n_embd // self.n_head
        for key in ("n_kv_head", "head_dim", "ffn_hidden"):
            value = getattr(self, key)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name}: {key} must be None or a positive integer, got {value!r}")
            setattr(self, key, int(value))
        self.n_kv_head = self.n_head if self.n_kv_head is None else self.n_kv_head
        if self.n_head % self.n_kv_head:
            raise ValueError(f"{name}: n_kv_head {self.n_kv_head} must divide n_head {self.n_head}")
        self.ffn_hidden = 4 * self.n_embd if self.ffn_hidden is None else self.ffn_hidden
        self.qkv_bias = self.bias if self.qkv_bias is None else self.qkv_bias
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"{name}: dropout must be in [0, 1), got {self.dropout}")
        for key, allowed in (
            ("norm", ("layernorm", "rmsnorm")),
            ("positions", ("learned", "rotary")),
            ("mlp", ("gelu", "swiglu")),
        ):
            if getattr(self, key) not in allowed:
                raise ValueError(
                    f"{name}: {key} must be one of {allowed}, got {getattr(self, key)!r}"
                )

    def parameter_count(self) -> int:
        """The number of parameters a Decoder of these settings holds, computed without
        building it (a loader refuses a config too large for memory before allocating)."""
        c, hd = self, self.head_dim
        norm = c.n_embd * (2 if c.norm == "layernorm" and c.bias else 1)
        attention = c.n_embd * hd * (2 * c.n_head + 2 * c.n_kv_head)  # q, k, v, o
        attention += hd * (c.n_head + 2 * c.n_kv_head) * c.qkv_bias + c.n_embd * c.bias
        matrices = 3 if c.mlp == "swiglu" else 2
        mlp = matrices * c.n_embd * c.ffn_hidden + (matrices - 1) * c.ffn_hidden * c.bias
        mlp += c.n_embd * c.bias
        total = c.vocab_size * c.n_embd * (1 if c.tie_word_embeddings else 2)
        total += c.block_size * c.n_embd if c.positions == "learned" else 0
        return total + c.n_layer * (2 * norm + attention + mlp) + norm


class Body(nn.Module):
    """What GPT-2 calls `transformer`: embeddings (wte, and wpe for learned positions), blocks
    (h), final norm (ln_f)."""

    def __init__(self, c: DecoderConfig, rng: np.random.Generator) -> None:
        super().__init__()
        self.wte = nn.Embedding(c.vocab_size, c.n_embd, rng=rng)
        self.wpe = (
            nn.Embedding(c.block_size, c.n_embd, rng=rng) if c.positions == "learned" else None
        )
        self.drop = nn.Dropout(c.dropout, rng=rng.spawn(1)[0])  # its own mask stream
        rotary = (
            nn.RotaryPositions(c.head_dim, c.block_size, c.rope_theta, c.rope_scaling)
            if c.positions == "rotary"
            else False
        )
        shared = ("n_kv_head", "head_dim", "qkv_bias", "norm", "norm_eps", "mlp", "ffn_hidden")
        block = {key: getattr(c, key) for key in (*shared, "bias", "dropout", "n_layer")}
        block.update(rotary=rotary, max_len=c.block_size, rng=rng)
        self.h = nn.ModuleList([nn.Block(c.n_embd, c.n_head, **block) for _ in range(c.n_layer)])
        self.ln_f = nn.make_norm(c.norm, c.n_embd, c.norm_eps, c.bias)


class Decoder(nn.Module):
    """`logits, loss = model(idx, targets)`; `model.generate(idx, n)` continues text.

    A family (models.architectures.gpt.GPT, models.architectures.llama.Llama) sets HF_NAMES, its
    files' tensor names -> (parameter, stored transposed?), which loading and saving both read; a
    family whose parts are named otherwise than Body's makes its own (make_body) and keeps
    `transformer`, `wte`, `h`, `ln_f` readable. rng initialises the weights (default
    np.random.default_rng(0)).
    """

    HF_NAMES: dict[str, tuple[str, bool]] = {}  # {i} stands for a layer's number
    hf_layers = "h"  # the files' name of the list of blocks
    hf_layer_field = "n_layer"  # config.json's name for the number of blocks

    def __init__(self, config: DecoderConfig, rng: np.random.Generator | None = None) -> None:
        super().__init__()
        rng = np.random.default_rng(0) if rng is None else rng
        self.config = config
        self.make_body(config, rng)
        if not config.tie_word_embeddings:
            self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False, rng=rng)

    def make_body(self, config: DecoderConfig, rng: np.random.Generator) -> None:
        """Register the embeddings, blocks and final norm (GPT-2's `transformer`)."""
        self.transformer = Body(config, rng)

    def describe(self) -> str:
        """One line naming the model and its sizes (used in error messages and logs)."""
        c = self.config
        kv = "" if c.n_kv_head == c.n_head else f", n_kv_head={c.n_kv_head}"
        return (
            f"{type(self).__name__}(vocab_size={c.vocab_size}, block_size={c.block_size}, "
            f"n_layer={c.n_layer}, n_head={c.n_head}{kv}, n_embd={c.n_embd})"
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
        all_logits: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Logits (B, T, V) and the mean cross-entropy against targets (B, T), or None.

        targets: next-token ids; IGNORE_INDEX (-100) marks positions left out of the loss. Without
        targets (and without all_logits) only the last position's logits are computed: (B, 1, V),
        all that generation needs. kv_caches: one nn.LayerKVCache per layer (generation); idx then
        holds only the new positions, which continue after the cached ones.
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
        x = self._embed(ids, "forward")
        if (
            t.wpe is not None
        ):  # learned positions: e_i + p_i (notes 8.6); rotary ones act in attention
            x = x + t.wpe(np.arange(past, past + length))
        x = t.drop(x)
        for i, block in enumerate(t.h):
            if self.config.gradient_checkpointing and self.training and kv_caches is None:
                x = autograd.checkpoint(block, x)
            else:
                x = block(x, kv_cache=None if kv_caches is None else kv_caches[i])
        if targets is None and not all_logits:
            x = x[:, -1:, :]  # the norm and the head act per position: skip the others
        x = t.ln_f(x)
        if self.config.tie_word_embeddings:  # logits = h @ wte^T (notes 9.4), one 2-D product
            logits = t.wte.attend(x)  # (a QuantizedEmbedding's: the quantized linear)
        else:
            logits = self.lm_head(x)
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
    def new_kv_caches(self, batch: int, max_len: int | None = None) -> list[nn.LayerKVCache]:
        """Empty per-layer caches of the K/V heads for `batch` sequences of up to max_len
        positions (default block_size; a long-context model wants less preallocated)."""
        c = self.config
        max_len = c.block_size if max_len is None else min(max_len, c.block_size)
        dtype = self.transformer.ln_f.weight.dtype  # (wte's may be quantized blocks)
        return [
            nn.LayerKVCache(batch, c.n_kv_head, max_len, c.head_dim, dtype)
            for _ in range(c.n_layer)
        ]

    def _eos_ids(self, eos_id: Any) -> np.ndarray:
        """The ids that end a sequence: eos_id (an int or a list), else the config's."""
        ids = self.config.eos_token_ids if eos_id is None else np.atleast_1d(eos_id).tolist()
        for i in ids:
            if not 0 <= i < self.config.vocab_size:
                raise ValueError(
                    f"generate: eos_id {i} is not a token id of vocab_size {self.config.vocab_size}"
                )
        return np.asarray(ids, dtype=np.int64)

    def generate(
        self,
        idx: Any,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        eos_id: int | list[int] | None = None,
        use_cache: bool = True,
        rng: np.random.Generator | None = None,
        compiled: bool | str = False,
    ) -> np.ndarray:
        """Continue each row of idx (B, T) by up to max_new_tokens tokens; returns (B, T + n).

        temperature 0 is greedy (argmax); otherwise tokens are sampled from softmax(logits / T)
        after optional top-k / top-p truncation (notes 12.2). A row ends at any end-of-sequence
        id (eos_id: an id or a list; default the config's eos_token_ids); rows that finished first
        are padded with the id they ended on, and generation stops once every row has ended. The
        model sees at most the last block_size tokens. rng: the Generator to sample with (default
        a fresh, unseeded one).

        With use_cache, the prompt is run once and each new token costs one position. Once the
        context is longer than block_size the window slides, every position shifts and the cache
        is rebuilt from the cropped window (notes 12.4).

        compiled (with use_cache): each token after the prompt runs as a compiled decode step
        (compile_decoder; docs/decoding.md) without the per-op Python of eager; the prompt (and a
        refill after the window slid) runs eagerly. "exact": eager's very calls, its logits bit
        for bit; True: Llama's q, k, v projections as one product (the same sums, rounded
        apart by the BLAS at block edges, ~1e-15 relative in float64); "int8": as True, and
        quantized layers (q8_0, q4_0, q4_1) multiply their inputs rounded to int8 per 32 values,
        as llama.cpp decodes (DecodeStep's int8_activations: faster, not eager's logits).
        """
        ids = self._token_ids(idx, "generate")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)):
            raise TypeError(f"generate: max_new_tokens must be an int, got {max_new_tokens!r}")
        if max_new_tokens < 0:
            raise ValueError(f"generate: max_new_tokens must be >= 0, got {max_new_tokens}")
        check_sampling_args(temperature, top_k, top_p, self.config.vocab_size)
        if compiled not in COMPILED:
            raise ValueError(
                f"generate: compiled must be False, True, 'exact' or 'int8', got {compiled!r}"
            )
        if compiled and not use_cache:
            raise ValueError("generate: compiled decoding needs the KV cache (use_cache=True)")
        eos = self._eos_ids(eos_id)
        rng = np.random.default_rng() if rng is None else rng
        batch, start = ids.shape
        block = self.config.block_size
        out = np.empty((batch, start + max_new_tokens), dtype=np.int64)
        out[:, :start] = ids
        length = start
        ended = np.full(batch, -1, dtype=np.int64)  # the eos id a row ended on, -1 while running
        caches = self.new_kv_caches(batch, start + max_new_tokens) if use_cache else None
        step = None
        if compiled:
            step = self.compile_decoder(caches, compiled == "exact", compiled == "int8")
        was_training = self.training
        self.eval()
        try:
            with no_grad():
                for _ in range(max_new_tokens):
                    if caches is None:
                        logits, _ = self(out[:, max(0, length - block) : length])
                    elif 0 < caches[0].length < block and step is not None:
                        new = step(out[:, length - 1])[:, None, :]
                        logits = Tensor(new, dtype=new.dtype)
                    elif 0 < caches[0].length < block:
                        logits, _ = self(out[:, length - 1 : length], kv_caches=caches)
                    else:  # first step, or the window slid: (re)fill the cache
                        for cache in caches:
                            cache.reset()
                        logits, _ = self(out[:, max(0, length - block) : length], kv_caches=caches)
                    scores = logits.data[:, -1, :].astype(np.float64)
                    token = choose_next_token(scores, temperature, top_k, top_p, rng)
                    token = np.where(ended >= 0, ended, token)
                    ended = np.where((ended < 0) & np.isin(token, eos), token, ended)
                    out[:, length] = token
                    length += 1
                    if eos.size and (ended >= 0).all():
                        break
        finally:
            self.train(was_training)
        return out[:, :length]

    def compile_decoder(
        self, caches: list[nn.LayerKVCache], exact: bool = False, int8_activations: bool = False
    ) -> DecodeStep:
        """A compiled decode step over `caches` (models.architectures.decoding.DecodeStep):
        step(tokens (B,)) -> the logits (B, V) of the next position, appending to the caches.
        Prefill them first (self(prompt, kv_caches=caches)); build a new step after the weights
        change. exact: eager's logits bit for bit; int8_activations: quantized layers multiply
        x rounded to int8, as llama.cpp (see DecodeStep)."""
        return DecodeStep(self, caches, exact, int8_activations)

    def stream(
        self,
        ids: Any,
        caches: list[nn.LayerKVCache],
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        rng: np.random.Generator | None = None,
        compiled: bool | str = False,
    ) -> Iterator[int]:
        """Continue one sequence whose first caches[0].length tokens are in `caches`: run `ids`
        (1-D, the tokens after them) and yield each new token as soon as it is chosen, until an
        end-of-sequence id (yielded too) or max_new_tokens. A chat keeps `caches` between turns.
        compiled: each token after `ids` runs as a compiled decode step (True, or "int8": as
        generate's).
        Raises ValueError before computing anything when the context cannot hold them all."""
        ids = np.asarray(ids, dtype=np.int64).reshape(1, -1)
        check_sampling_args(temperature, top_k, top_p, self.config.vocab_size)
        room = caches[0].max_len - caches[0].length
        if ids.shape[1] + max_new_tokens > room:
            raise ValueError(
                f"the context is full: {caches[0].length} tokens so far + {ids.shape[1]} new + "
                f"{max_new_tokens} to generate exceed the {caches[0].max_len} the cache holds"
            )
        eos = self._eos_ids(None)
        rng = np.random.default_rng() if rng is None else rng
        was_training = self.training
        self.eval()
        if compiled not in (False, True, "int8"):
            raise ValueError(f"stream: compiled must be False, True or 'int8', got {compiled!r}")
        step = None
        if compiled and max_new_tokens > 1:
            step = self.compile_decoder(caches, int8_activations=compiled == "int8")
        try:
            for i in range(max_new_tokens):
                if step is not None and i > 0:
                    scores = step(ids[0]).astype(np.float64)
                else:
                    with no_grad():
                        logits, _ = self(ids, kv_caches=caches)
                    scores = logits.data[:, -1, :].astype(np.float64)
                token = int(choose_next_token(scores, temperature, top_k, top_p, rng)[0])
                yield token
                if token in eos:
                    return
                ids = np.array([[token]])
        finally:
            self.train(was_training)

    # --- Hugging Face directories (models.formats.hf reads and writes the files) ------------------
    @classmethod
    def config_from_hf(cls, config: dict[str, Any], source: str) -> DecoderConfig:
        raise NotImplementedError(f"{cls.__name__} does not read Hugging Face configs")

    def hf_config(self) -> dict[str, Any]:
        raise NotImplementedError(f"{type(self).__name__} does not write Hugging Face configs")

    def hf_file_name(self, name: str) -> str | None:
        """A tensor name of the family's files as HF_NAMES spells it (None: not a weight, skip)."""
        return name

    def hf_names(self) -> dict[str, tuple[str, bool]]:
        """HF_NAMES for this model, in parameter order: {i} filled in for every layer, and only
        the parameters the config gives (a bias it leaves out is not expected). A parameter
        without a row is an error: the family's files would have no name for it."""
        params = dict(self.named_parameters())
        by_parameter = {}
        for hf_pattern, (pattern, transposed) in self.HF_NAMES.items():
            for i in range(self.config.n_layer) if "{i}" in hf_pattern else [""]:
                hf_name, name = (p.replace("{i}", str(i)) for p in (hf_pattern, pattern))
                by_parameter[name] = (hf_name, transposed)
        unnamed = [name for name in params if name not in by_parameter]
        if unnamed:
            raise ValueError(
                f"{self.describe()}: {type(self).__name__}.HF_NAMES has no Hugging Face name for "
                f"{', '.join(unnamed)}"
            )
        return {by_parameter[name][0]: (name, by_parameter[name][1]) for name in params}

    def transposed_in_files(self) -> set[str]:
        """The parameters the family's files store transposed (torch's (out, in) Linear weights)."""
        return {name for name, transposed in self.hf_names().values() if transposed}

    def load_hf_files(
        self, headers: list[nn.SafetensorsHeader], dtype: Any, whole: Path, take: Any = None
    ) -> None:
        """Load the weights of the family's safetensors files (their headers, hf.read_header):
        every header is checked against the model first (each tensor a parameter, once,
        floating-point, in the config's shape; no parameter missing from `whole`, the file or
        index that lists them) and only then are the tensors read, one at a time, converted to
        dtype and transposed where HF_NAMES says. take: what the tensors pass through first
        (models.formats.quantized.QuantizedLoading.take keeps Linear weights quantized)."""
        params = dict(self.named_parameters())
        hf_names = self.hf_names()
        where: dict[str, Path] = {}  # parameter -> the file holding it
        plan = []
        for header in headers:
            file, names = header.path, []
            for stored, (kind, shape, _) in header.tensors.items():
                hf_name = self.hf_file_name(stored)
                if hf_name is None:
                    continue
                if hf_name not in hf_names:
                    raise FileFormatError(
                        file, None, f"tensor {stored!r} is not a parameter of {self.describe()}"
                    )
                name, transposed = hf_names[hf_name]
                if name in where:
                    raise FileFormatError(
                        file, None, f"tensor {stored!r} is stored twice (also in {where[name]})"
                    )
                if kind not in nn.FLOAT_DTYPES:
                    raise FileFormatError(
                        file,
                        None,
                        f"tensor {stored!r} has dtype {kind}, a floating-point parameter needs "
                        f"one of {', '.join(nn.FLOAT_DTYPES)}",
                    )
                expected = params[name].shape[::-1] if transposed else params[name].shape
                if shape != expected:
                    raise FileFormatError(
                        file,
                        None,
                        f"tensor {stored!r} has shape {shape}, the config gives {expected}",
                    )
                where[name] = file
                names.append(stored)
            plan.append((header, names))
        missing = [name for name in params if name not in where]
        if missing:
            raise FileFormatError(
                whole, None, f"the checkpoint lacks {', '.join(missing)} ({self.describe()})"
            )
        tensors = (
            (str(h.path), name, array)
            for h, names in plan
            for name, array in hf.read_tensors(h, names)
        )
        self.load_hf_tensors(tensors if take is None else take(tensors), dtype)

    def load_hf_tensors(self, tensors: Iterator[tuple[str, str, np.ndarray]], dtype: Any) -> None:
        """Copy (file, name, array) one at a time into the parameters HF_NAMES maps them to,
        converting to dtype and transposing where it says; every parameter must be found once
        (load_hf_files checks safetensors headers first; models.formats.gguf its own tensors)."""
        params = dict(self.named_parameters())
        hf_names = self.hf_names()
        loaded = set()
        for source, stored, array in tensors:
            hf_name = self.hf_file_name(stored)
            if hf_name is None:
                continue
            if hf_name not in hf_names:
                problem = f"tensor {stored!r} is not a parameter of {self.describe()}"
                raise FileFormatError(source, None, problem)
            name, transposed = hf_names[hf_name]
            expected = params[name].shape[::-1] if transposed else params[name].shape
            if array.shape != expected:
                problem = f"tensor {stored!r} has shape {array.shape}, the config gives {expected}"
                raise FileFormatError(source, None, problem)
            array = array.T if transposed else array
            params[name].data = np.ascontiguousarray(array, dtype=dtype)
            loaded.add(name)
        missing = [name for name in params if name not in loaded]
        if missing:
            raise ValueError(f"{self.describe()}: the checkpoint lacks {', '.join(missing)}")

    def hf_tensors(self) -> dict[str, np.ndarray]:
        """HF name -> array as the family's files store it (HF_NAMES), in parameter order."""
        params = dict(self.named_parameters())
        return {
            hf_name: np.ascontiguousarray(params[name].data.T) if transposed else params[name].data
            for hf_name, (name, transposed) in self.hf_names().items()
        }

    def save_pretrained(
        self, directory: str | Path, metadata: dict[str, str] | None = None
    ) -> None:
        """Write config.json and model.safetensors as Hugging Face does, each atomically."""
        hf.write_directory(directory, self.hf_config(), self.hf_tensors(), metadata)

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        dtype: Any = None,
        max_bytes: int | None = None,
        quantize: str | None = None,
    ) -> Decoder:
        """Load a Hugging Face directory of this family (config.json + model.safetensors or its
        shards); weights converted to dtype (default: the default float dtype, float32).

        A model whose parameters need more bytes than are available (MemAvailable, or
        max_bytes, or $GLASSGRAD_MAX_LOAD_BYTES) is refused before anything is allocated. Every
        file is checked as it is read; a malformed one is a models.FileFormatError naming it.
        quantize: a format of autograd.quantized.FORMATS keeps every Linear weight (and a tied
        embedding) in that block format, quantized as it is read (models.formats.quantized)."""
        path = Path(path)
        directory, config = hf.read_config(path)
        dtype = np.dtype(get_default_dtype() if dtype is None else dtype)
        source = directory / "config.json"
        settings = cls.config_from_hf(config, str(source))
        need = settings.parameter_count()
        hf.check_memory(source, need, dtype, max_bytes)
        files = hf.weight_files(directory, path)
        whole = files[0] if len(files) == 1 else directory / hf.INDEX
        headers = [hf.read_header(file) for file in files]
        layer = re.compile(rf"(?:^|\.){cls.hf_layers}\.(\d+)\.")  # a block's tensors
        layers = {int(m[1]) for h in headers for name in h.tensors if (m := layer.search(name))}
        if settings.n_layer > len(layers):  # refused before building layers the files lack
            raise FileFormatError(
                whole,
                None,
                f"holds {len(layers)} layers, config.json's {cls.hf_layer_field} is "
                f"{settings.n_layer}",
            )
        model = cls(settings, _NoInit())
        quantized = None if quantize is None else QuantizedLoading(model, quantize, dtype)
        model.load_hf_files(headers, dtype, whole, None if quantized is None else quantized.take)
        if quantized is not None:
            quantized.check(whole)
        return model


class _NoInit:
    """Stands in for the rng when every weight is about to be loaded: normal() returns zeros
    instead of drawing (SmolLM2-135M: the draws were 3.1 of the 3.8 s a load took). Zeros come
    from pages the OS hands out only when written, and loading replaces each before it is: the
    peak stays one model plus one tensor in flight. load_hf_files refuses a checkpoint that
    lacks a parameter, so none stays zero. Dropout's mask streams are real Generators (spawn)."""

    def normal(self, loc: float, scale: float, size: tuple[int, ...]) -> np.ndarray:
        return np.zeros(size, dtype=get_default_dtype())  # Parameter's dtype: no copy

    def spawn(self, n: int) -> list[np.random.Generator]:
        return np.random.default_rng(0).spawn(n)


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
