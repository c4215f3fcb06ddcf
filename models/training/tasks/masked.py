"""Masked-character prediction with the encoder (notes 8.7), the task of `python -m models.encoder`.

The demo corpus (models.training.data: the Python stdlib's source) is cut into windows; in each, 15
% of the characters are replaced by a MASK token and the model predicts them from the rest, read
both ways. A decoder-only GPT could only use the left side. The score is the fraction of masked
characters of the validation text predicted exactly, beside the unigram baseline: always
guessing the training text's most frequent character.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from autograd import no_grad
from models.architectures.encoder import Encoder, EncoderConfig
from models.architectures.gpt import IGNORE_INDEX
from models.formats.tokenizer import load_tokenizer, save_tokenizer
from models.training.config import TrainConfig, setting
from models.training.data import (
    Corpus,
    eval_batches,
    get_batch,
    prepare_corpus,
    refused_data,
    unigram_baseline,
)
from models.training.step import Batch
from models.training.task import Task


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


@dataclass
class MaskedData:
    """The corpus, the MASK id (one past the characters) and the fixed validation windows with
    their masks: text the model never trains on."""

    corpus: Corpus
    mask_id: int
    val: list[tuple[np.ndarray, np.ndarray]]

    @property
    def most_frequent(self) -> int:
        """The unigram baseline's guess: the training text's most frequent character."""
        return int(np.bincount(self.corpus.train).argmax())

    @property
    def masked_targets(self) -> np.ndarray:
        return np.concatenate([t[t != IGNORE_INDEX] for _, t in self.val])


@dataclass(kw_only=True)
class MaskedConfig(TrainConfig):
    """The encoder's settings. About 3 minutes on the 2-core machine (docs/seq2seq.md); at 3x
    that time, width 128 and 4 blocks reached 0.470 instead of 0.444."""

    data: str | None = setting(
        "UTF-8 text file (default: the Python standard library sources)", None, resume_keeps=True
    )
    block_size: int = setting("characters per window", 64, resume_keeps=True, positive=True)
    eval_batches: int = setting("validation batches", 16, positive=True)
    post_ln: bool = setting("the 2017 paper's Post-LN blocks", False, resume_keeps=True)
    positions: str = setting(
        "position encoding", "learned", choices=("learned", "sinusoidal"), resume_keeps=True
    )
    out: str | None = "runs/encoder"
    steps: int = 1000
    batch_size: int = 32
    n_layer: int = 3
    n_head: int = 4
    n_embd: int = 96
    lr: float = 3e-3
    warmup: int = 100


class MaskedCharacters(Task):
    """Masked-character prediction (notes 8.7) with the encoder: its task of the training loop."""

    name = "encoder"
    prog = "python -m models.encoder"
    description = "Train an encoder-only Transformer by masked-character prediction (8.7)."
    title = "encoder (masked characters)"
    Config = MaskedConfig
    blas_threads = 1  # small products (measured in docs/seq2seq.md)
    model_class, model_config_class = Encoder, EncoderConfig

    def prepare(self, c: MaskedConfig, saved: Path | None) -> MaskedData:
        tokenizer = None if saved is None else load_tokenizer(saved)
        with refused_data(self.name, c.data):
            corpus = prepare_corpus(c.data, tokenizer=tokenizer)
            windows = eval_batches(corpus.val, c.batch_size, c.block_size, c.eval_batches, c.seed)
        mask_id = corpus.tokenizer.vocab_size
        val = [
            mask_characters(x, mask_id, np.random.default_rng([c.seed, 3, i]))
            for i, (x, _) in enumerate(windows)
        ]
        return MaskedData(corpus, mask_id, val)

    def config_fields(self, c: MaskedConfig, data: MaskedData) -> dict[str, Any]:
        return {
            "vocab_size": data.mask_id + 1,
            "block_size": c.block_size,
            "pre_ln": not c.post_ln,
            "positions": c.positions,
        }

    def save_model(
        self, out: Path, model: Encoder, data: MaskedData, stamp: dict[str, str]
    ) -> None:
        super().save_model(out, model, data, stamp)
        save_tokenizer(data.corpus.tokenizer, out)

    def batch(
        self, c: MaskedConfig, data: MaskedData, step: int, rank: int, world_size: int
    ) -> Batch:
        """Windows of the training text with 15 % of their characters masked; the masks are
        drawn for the global batch, so every rank's rows are those of one process."""
        x, _ = get_batch(data.corpus.train, c.batch_size, c.block_size, c.seed, step)
        rng = np.random.default_rng([c.seed, 2, step])
        inputs, targets = mask_characters(x, data.mask_id, rng)
        return inputs[rank::world_size], targets[rank::world_size]

    def baselines(self, data: MaskedData) -> dict[str, float]:
        targets = data.masked_targets
        vocab = data.corpus.tokenizer.vocab_size
        return {
            "val": unigram_baseline(data.corpus.train, targets, vocab),
            "accuracy": float(np.mean(targets == data.most_frequent)),
        }

    def evaluate(self, model: Encoder, data: MaskedData, c: MaskedConfig) -> dict[str, float]:
        val = float(np.mean([model(inputs, targets)[1].item() for inputs, targets in data.val]))
        return {"val": val, "accuracy": masked_accuracy(model, data.val)[0]}

    def describe_data(self, data: MaskedData) -> str:
        c = data.corpus
        return (
            f"data: {c.source}, {len(c.train):,} train / {len(c.val):,} val characters, 15 % "
            f"masked; {len(data.masked_targets):,} masked validation characters"
        )

    def report(self, history: dict[str, Any], data: MaskedData, c: MaskedConfig) -> list[str]:
        always = data.corpus.tokenizer.decode([data.most_frequent])
        return [
            f"masked-token accuracy: {history['eval_accuracy'][-1]:.4f} vs unigram baseline "
            f"{history['baselines']['accuracy']:.4f} (always {always!r}) on "
            f"{len(data.masked_targets)} masked characters"
        ]
