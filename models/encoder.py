"""An encoder-only Transformer (notes 8.7) trained by masked-character prediction.

    python -m models.encoder

The demo corpus (models.data: the Python stdlib's source) is cut into windows; in each, 15 % of
the characters are replaced by a MASK token and the model predicts them from the rest, read both
ways (nn.EncoderBlock: no causal mask, so the characters after a gap count as much as those
before it). A decoder-only GPT could only use the left side. The score is the fraction of masked
characters of the validation text predicted exactly, beside the unigram baseline: always
guessing the training text's most frequent character.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

import autograd.functional as F
import nn
from autograd import Tensor, get_default_dtype, no_grad
from models.data import eval_batches, get_batch, prepare_corpus
from models.gpt import IGNORE_INDEX


@dataclass
class EncoderConfig:
    """Sizes of an encoder; positions 'none' leaves it permutation-equivariant (notes 8.6)."""

    vocab_size: int
    block_size: int
    n_layer: int = 3
    n_head: int = 4
    n_embd: int = 96
    dropout: float = 0.0
    pre_ln: bool = True
    positions: str = "learned"

    def __post_init__(self) -> None:
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"EncoderConfig: {name} must be a positive integer, got {value!r}")
        if self.n_embd % self.n_head:
            raise ValueError(
                f"EncoderConfig: n_embd {self.n_embd} must be divisible by n_head {self.n_head}"
            )
        if self.positions not in nn.transformer.POSITIONS:
            raise ValueError(
                f"EncoderConfig: positions must be one of {nn.transformer.POSITIONS}, got "
                f"{self.positions!r}"
            )


class Encoder(nn.Module):
    """`logits, loss = model(idx, targets)`: a distribution over the vocabulary at every position.

    Token embedding + positions -> n_layer EncoderBlocks -> (Pre-LN: final LayerNorm) -> logits
    against the token embedding (tied head, notes 9.4).
    """

    def __init__(self, config: EncoderConfig, rng: np.random.Generator | None = None) -> None:
        super().__init__()
        rng = np.random.default_rng(0) if rng is None else rng
        self.config = c = config
        self.wte = nn.Embedding(c.vocab_size, c.n_embd, rng=rng)
        self.wpe = nn.position_embedding(c.positions, c.block_size, c.n_embd, rng)
        self.drop = nn.Dropout(c.dropout, rng=rng.spawn(1)[0])
        self.h = nn.ModuleList(
            [
                nn.EncoderBlock(
                    c.n_embd,
                    c.n_head,
                    dropout=c.dropout,
                    pre_ln=c.pre_ln,
                    rng=rng,
                    n_layer=c.n_layer,
                )
                for _ in range(c.n_layer)
            ]
        )
        if c.pre_ln:  # Post-LN blocks already end in a LayerNorm (notes 8.5)
            self.ln_f = nn.LayerNorm(c.n_embd)

    def describe(self) -> str:
        c = self.config
        return (
            f"Encoder(vocab_size={c.vocab_size}, block_size={c.block_size}, n_layer={c.n_layer}, "
            f"n_head={c.n_head}, n_embd={c.n_embd}, {c.positions} positions)"
        )

    def forward(
        self, idx: Any, targets: Any = None, key_mask: Any = None
    ) -> tuple[Tensor, Tensor | None]:
        """Logits (B, T, V), and the mean cross-entropy over targets != IGNORE_INDEX if given.

        key_mask: optional boolean (B, T), True = a real token (padding is never attended to).
        """
        ids = np.asarray(idx)
        c = self.config
        if ids.dtype.kind not in "iu" or ids.ndim != 2 or not 1 <= ids.shape[1] <= c.block_size:
            raise ValueError(
                f"{self.describe()}: idx must be integer ids (batch, 1..{c.block_size}), got "
                f"dtype {ids.dtype} shape {ids.shape}"
            )
        x = self.wte(ids)
        if self.wpe is not None:
            x = x + self.wpe(np.arange(ids.shape[1]))  # e_i + p_i (notes 8.6)
        x = self.drop(x)
        for block in self.h:
            x = block(x, key_mask)
        if c.pre_ln:
            x = self.ln_f(x)
        logits = nn.linear(x, self.wte.weight.T)
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits, np.asarray(targets))


def mask_characters(
    x: np.ndarray, mask_id: int, rng: np.random.Generator, rate: float = 0.15
) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, targets): `rate` of the positions (at least one per row) become mask_id in the
    inputs and keep their character as the target; every other target is IGNORE_INDEX.

    Always the MASK token (BERT also leaves 20 % of its picks unchanged or random, so that its
    features stay useful on unmasked text; here only the prediction matters).
    """
    hidden = rng.random(x.shape) < rate
    hidden[np.arange(len(x)), rng.integers(0, x.shape[1], len(x))] = True
    return np.where(hidden, mask_id, x), np.where(hidden, x, IGNORE_INDEX)


# About 3 minutes on the 2-core machine (docs/seq2seq.md); at 3x that time, width 128 and 4
# blocks reached 0.470 instead of 0.444.
DEFAULTS: dict[str, Any] = {
    "steps": 1000,
    "batch_size": 32,
    "block_size": 64,
    "n_layer": 3,
    "n_head": 4,
    "n_embd": 96,
    "lr": 3e-3,
    "warmup": 100,
    "eval_batches": 16,
    "seed": 0,
}


def masked_accuracy(
    model: Encoder, batches: list[tuple[np.ndarray, np.ndarray]]
) -> tuple[float, int]:
    """(fraction of masked characters predicted exactly, how many), in eval mode, no graph."""
    was_training = model.training
    model.eval()
    correct = total = 0
    try:
        with no_grad():
            for inputs, targets in batches:
                logits, _ = model(inputs)
                hidden = targets != IGNORE_INDEX
                correct += int((logits.data.argmax(-1) == targets)[hidden].sum())
                total += int(hidden.sum())
    finally:
        model.train(was_training)
    return correct / total, total


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m models.encoder",
        description="Train an encoder-only Transformer by masked-character prediction (8.7).",
    )
    d = DEFAULTS
    add = p.add_argument
    add("--data", help="UTF-8 text file (default: the Python standard library sources)")
    add("--steps", type=int, default=d["steps"], help="optimizer steps (default %(default)s)")
    add("--batch-size", type=int, default=d["batch_size"], help="default %(default)s")
    add("--block-size", type=int, default=d["block_size"], help="default %(default)s")
    add("--n-layer", type=int, default=d["n_layer"], help="default %(default)s")
    add("--n-head", type=int, default=d["n_head"], help="default %(default)s")
    add("--n-embd", type=int, default=d["n_embd"], help="default %(default)s")
    add("--lr", type=float, default=d["lr"], help="peak learning rate (default %(default)s)")
    add("--warmup", type=int, default=d["warmup"], help="warmup steps (default %(default)s)")
    add("--eval-batches", type=int, default=d["eval_batches"], help="validation batches")
    add("--post-ln", action="store_true", help="the 2017 paper's Post-LN blocks")
    add("--positions", choices=["learned", "sinusoidal"], default="learned")
    add("--seed", type=int, default=d["seed"], help="default %(default)s")
    add("--quiet", action="store_true", help="no progress bar")
    return p


def main(argv: list[str] | None = None) -> int:
    from threadpoolctl import threadpool_limits

    # One BLAS thread for small products (measured in docs/seq2seq.md); callers keep theirs.
    with threadpool_limits(limits=1, user_api="blas"):
        return _main(build_parser().parse_args(argv))


def _main(a: argparse.Namespace) -> int:
    from tqdm import tqdm

    corpus = prepare_corpus(a.data)
    mask_id = corpus.tokenizer.vocab_size  # one id past the characters
    config = EncoderConfig(
        vocab_size=mask_id + 1,
        block_size=a.block_size,
        n_layer=a.n_layer,
        n_head=a.n_head,
        n_embd=a.n_embd,
        pre_ln=not a.post_ln,
        positions=a.positions,
    )
    model = Encoder(config, rng=np.random.default_rng(a.seed))
    optimizer = nn.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.99), weight_decay=0.0)
    warmup = min(a.warmup, a.steps)
    began = time.perf_counter()
    model.train()
    with tqdm(total=a.steps, disable=a.quiet, unit="step", dynamic_ncols=True) as bar:
        for step in range(a.steps):
            x, _ = get_batch(corpus.train, a.batch_size, a.block_size, a.seed, step)
            inputs, targets = mask_characters(x, mask_id, np.random.default_rng([a.seed, 2, step]))
            _, loss = model(inputs, targets)
            optimizer.zero_grad()
            loss.backward()
            nn.clip_grad_norm_(model.parameters(), 1.0)
            for group in optimizer.param_groups:
                group["lr"] = nn.optim.cosine_with_warmup(step, a.lr, warmup, a.steps, a.lr / 10)
            optimizer.step()
            bar.set_postfix(loss=f"{loss.item():.3f}", refresh=False)
            bar.update(1)
    seconds = time.perf_counter() - began
    # Fixed validation windows and masks: text the model never trained on.
    val = [
        mask_characters(x, mask_id, np.random.default_rng([a.seed, 3, i]))
        for i, (x, _) in enumerate(
            eval_batches(corpus.val, a.batch_size, a.block_size, a.eval_batches, a.seed)
        )
    ]
    accuracy, n_masked = masked_accuracy(model, val)
    most_frequent = np.bincount(corpus.train).argmax()
    baseline = np.mean(np.concatenate([t[t != IGNORE_INDEX] for _, t in val]) == most_frequent)
    print(
        f"{model.describe()}, {model.num_parameters():,} parameters, {get_default_dtype()}; "
        f"data: {corpus.source}; trained {a.steps} steps in {seconds:.0f} s"
    )
    print(
        f"masked-token accuracy: {accuracy:.4f} vs unigram baseline {baseline:.4f} "
        f"(always {corpus.tokenizer.decode([most_frequent])!r}) on {n_masked} masked characters"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
