"""The encoder-decoder Transformer (the 2017 paper's architecture, notes 8.7) and its vocabulary.

The encoder reads the source both ways (nn.EncoderBlock: no causal mask, padding masked out); the
decoder writes the target one token at a time with causal self-attention and reads the encoder's
output through cross-attention (nn.DecoderBlock: Q from the decoder, K/V from the encoder). One
token embedding serves source, target and the tied output head (notes 9.4).

Generation encodes the source once and projects each layer's cross-attention K/V from it once;
every step then costs one target position: its causal self-attention appends to a KV cache (notes
12.4) and its cross-attention reads the fixed source K/V. `generate(..., use_cache=False)`
recomputes everything from scratch each step and gives the same tokens.

The vocabulary lives with the model: the model masks PAD out of attention, starts generation at
BOS and stops a row at EOS, and its vocab_size is VOCAB's. Trained on digit tasks by
models/training/tasks/digits.py, `python -m models.seq2seq`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

import autograd.functional as F
import nn
from autograd import Tensor, no_grad
from models.architectures import check_positive_integers

# --- the vocabulary -------------------------------------------------------------------------------

PAD, BOS, EOS = 0, 1, 2  # padding (masked out / ignored), start of the target, end of the target
VOCAB = ("<pad>", "<bos>", "<eos>", *"0123456789+")
_ID = {ch: i for i, ch in enumerate(VOCAB) if len(ch) == 1}


def encode(text: str) -> list[int]:
    return [_ID[ch] for ch in text]


def decode(ids: Any) -> str:
    """The characters up to the first EOS (PAD and BOS are dropped)."""
    out = []
    for i in ids:
        if i == EOS:
            break
        if i > EOS:
            out.append(VOCAB[i])
    return "".join(out)


def source_keys(src: np.ndarray) -> np.ndarray:
    """The source's padding mask as the (B, 1, 1, S) allowed set attention reads (True = a real
    token). A batch carries it as an array of its own, so that a compiled step takes it as an
    argument and each replay masks its own batch's padding (a mask computed inside the step from
    src would be a constant of the trace: docs/compile.md)."""
    return np.ascontiguousarray((src != PAD)[:, None, None, :])


# --- the model ------------------------------------------------------------------------------------


@dataclass
class Seq2SeqConfig:
    """Sizes of an encoder-decoder; n_layer blocks on each side. max_tgt_len counts the EOS."""

    max_src_len: int
    max_tgt_len: int
    vocab_size: int = len(VOCAB)
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 64
    dropout: float = 0.0
    pre_ln: bool = True
    positions: str = "learned"

    def __post_init__(self) -> None:
        check_positive_integers(
            self, ("max_src_len", "max_tgt_len", "vocab_size", "n_layer", "n_head", "n_embd")
        )
        if self.n_embd % self.n_head:
            raise ValueError(
                f"Seq2SeqConfig: n_embd {self.n_embd} must be divisible by n_head {self.n_head}"
            )
        if self.positions not in ("learned", "sinusoidal"):
            raise ValueError(
                f"Seq2SeqConfig: positions must be 'learned' or 'sinusoidal', got "
                f"{self.positions!r} (the decoder needs positions to know where it is)"
            )


class Seq2Seq(nn.Module):
    """`logits, loss = model(src, tgt_in, tgt_out)`; `model.generate(src, n)` decodes greedily."""

    def __init__(self, config: Seq2SeqConfig, rng: np.random.Generator | None = None) -> None:
        super().__init__()
        rng = np.random.default_rng(0) if rng is None else rng
        self.config = c = config
        blocks = dict(dropout=c.dropout, pre_ln=c.pre_ln, rng=rng, n_layer=c.n_layer)
        self.wte = nn.Embedding(c.vocab_size, c.n_embd, rng=rng)
        self.enc_pos = nn.position_embedding(c.positions, c.max_src_len, c.n_embd, rng)
        self.dec_pos = nn.position_embedding(c.positions, c.max_tgt_len, c.n_embd, rng)
        self.drop = nn.Dropout(c.dropout, rng=rng.spawn(1)[0])
        self.encoder = nn.ModuleList(
            [nn.EncoderBlock(c.n_embd, c.n_head, **blocks) for _ in range(c.n_layer)]
        )
        self.decoder = nn.ModuleList(
            [
                nn.DecoderBlock(c.n_embd, c.n_head, max_len=c.max_tgt_len, **blocks)
                for _ in range(c.n_layer)
            ]
        )
        # Pre-LN leaves the residual stream unnormalised: one final LayerNorm on each side (notes
        # 8.5). Post-LN blocks already end in one.
        if c.pre_ln:
            self.enc_ln_f = nn.LayerNorm(c.n_embd)
            self.dec_ln_f = nn.LayerNorm(c.n_embd)

    def describe(self) -> str:
        c = self.config
        return (
            f"Seq2Seq(n_layer={c.n_layer}+{c.n_layer}, n_head={c.n_head}, n_embd={c.n_embd}, "
            f"{'pre' if c.pre_ln else 'post'}-LN, {c.positions} positions)"
        )

    def _ids(self, ids: Any, what: str, max_len: int) -> np.ndarray:
        ids = np.asarray(ids)
        if ids.dtype.kind not in "iu" or ids.ndim != 2 or ids.shape[1] == 0:
            raise ValueError(
                f"{self.describe()}: {what} must be integer ids (batch, time >= 1), got dtype "
                f"{ids.dtype} shape {ids.shape}"
            )
        if ids.shape[1] > max_len:
            raise ValueError(
                f"{self.describe()}: {what} has {ids.shape[1]} positions, more than the "
                f"{max_len} this model was built for"
            )
        return ids.astype(np.int64, copy=False)

    def encode(self, src: Any, key_mask: np.ndarray | None = None) -> tuple[Tensor, np.ndarray]:
        """The encoder's output (B, S, C) and the source's key mask (B, S), True = real token.
        key_mask: `source_keys(src)`, when a compiled step passes it as an argument."""
        src = self._ids(src, "src", self.config.max_src_len)
        key_mask = src != PAD if key_mask is None else key_mask
        x = self.drop(self.wte(src) + self.enc_pos(np.arange(src.shape[1])))
        for block in self.encoder:
            x = block(x, key_mask)
        return (self.enc_ln_f(x) if self.config.pre_ln else x), key_mask

    def decode(
        self,
        tgt: Any,
        memory: Tensor | None,
        key_mask: np.ndarray,
        kv_caches: list[nn.LayerKVCache] | None = None,
        memory_kvs: list[tuple[Tensor, Tensor]] | None = None,
    ) -> Tensor:
        """Logits (B, T, V) for the target positions tgt (after the cached ones, if any)."""
        tgt = self._ids(tgt, "tgt", self.config.max_tgt_len)
        past = 0 if kv_caches is None else kv_caches[0].length
        x = self.drop(self.wte(tgt) + self.dec_pos(np.arange(past, past + tgt.shape[1])))
        for i, block in enumerate(self.decoder):
            x = block(
                x,
                memory,
                key_mask,
                kv_cache=None if kv_caches is None else kv_caches[i],
                memory_kv=None if memory_kvs is None else memory_kvs[i],
            )
        if self.config.pre_ln:
            x = self.dec_ln_f(x)
        return nn.linear(x, self.wte.weight.T)  # tied head (notes 9.4)

    def forward(
        self, src: Any, tgt_in: Any, tgt_out: Any = None, key_mask: np.ndarray | None = None
    ) -> tuple[Tensor, Tensor | None]:
        """Logits (B, T, V) for every target position, and the mean cross-entropy against
        tgt_out (IGNORE_INDEX = padding) when given (teacher forcing: the whole target at once).
        key_mask: the source's padding mask as `source_keys(src)` (else computed here)."""
        memory, key_mask = self.encode(src, key_mask)
        logits = self.decode(tgt_in, memory, key_mask)
        if tgt_out is None:
            return logits, None
        return logits, F.cross_entropy(logits, np.asarray(tgt_out))

    def new_kv_caches(self, batch: int) -> list[nn.LayerKVCache]:
        """Empty self-attention caches, one per decoder layer, for up to max_tgt_len positions."""
        c = self.config
        dtype = self.wte.weight.dtype
        return [
            nn.LayerKVCache(batch, c.n_head, c.max_tgt_len, c.n_embd // c.n_head, dtype)
            for _ in range(c.n_layer)
        ]

    def generate(self, src: Any, max_new_tokens: int, use_cache: bool = True) -> np.ndarray:
        """Greedy targets (B, n <= max_new_tokens) after BOS; a row that has produced EOS is
        padded with EOS. use_cache=False reruns encoder and decoder on everything each step."""
        c = self.config
        src = self._ids(src, "src", c.max_src_len)
        if not 0 <= max_new_tokens <= c.max_tgt_len:
            raise ValueError(
                f"{self.describe()}.generate: max_new_tokens must be in [0, {c.max_tgt_len}], "
                f"got {max_new_tokens}"
            )
        batch = src.shape[0]
        out = np.full((batch, max_new_tokens + 1), BOS, dtype=np.int64)
        done = np.zeros(batch, dtype=bool)
        length = 1
        was_training = self.training
        self.eval()
        try:
            with no_grad():
                if use_cache:
                    memory, key_mask = self.encode(src)  # once per source
                    memory_kvs = [block.cross_attn.memory_kv(memory) for block in self.decoder]
                    caches = self.new_kv_caches(batch)
                while length <= max_new_tokens and not done.all():
                    if use_cache:  # only the newest position; the past lives in the caches
                        step = out[:, length - 1 : length]
                        logits = self.decode(step, None, key_mask, caches, memory_kvs)
                    else:
                        logits, _ = self(src, out[:, :length])
                    token = np.argmax(logits.data[:, -1], axis=-1)
                    token = np.where(done, EOS, token)
                    done |= token == EOS
                    out[:, length] = token
                    length += 1
        finally:
            self.train(was_training)
        return out[:, 1:length]
