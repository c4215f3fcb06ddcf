"""The digit tasks with the encoder-decoder (notes 8.7), the task of `python -m models.seq2seq`.

The tasks are generated in code: `reverse` and `sort` a string of digits, `add` writes the sum of
two numbers. Held-out sequences are fixed by a hash of the source text (`is_held_out`), so
training never draws one, whatever the seed, and the final accuracy is on sources it never saw.
A batch carries its source's padding mask as an array of its own (source_keys), a step argument,
so each replay of the compiled step masks its own batch's padding.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from models.architectures.gpt import IGNORE_INDEX
from models.architectures.seq2seq import (
    BOS,
    EOS,
    PAD,
    VOCAB,
    Seq2Seq,
    Seq2SeqConfig,
    decode,
    encode,
    source_keys,
)
from models.training.config import TrainConfig, setting
from models.training.data import unigram_baseline
from models.training.step import Batch
from models.training.task import Task as TrainingTask  # Task here: a digit task

# --- the tasks ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Task:
    """A source -> target function; lengths are the digits of the string (reverse, sort) or of
    each operand (add). The rest are the task's training defaults (measured in docs/seq2seq.md)."""

    name: str
    min_len: int
    max_len: int
    steps: int
    batch_size: int
    n_embd: int
    lr: float

    def source(self, rng: np.random.Generator, min_len: int, max_len: int) -> str:
        def digits() -> str:
            return "".join(map(str, rng.integers(0, 10, rng.integers(min_len, max_len + 1))))

        if self.name == "add":  # operands without leading zeros, like numbers are written
            return "+".join(str(int(digits())) for _ in range(2))
        return digits()

    def target(self, source: str) -> str:
        if self.name == "reverse":
            return source[::-1]
        if self.name == "sort":
            return "".join(sorted(source))
        a, b = source.split("+")
        return str(int(a) + int(b))

    def max_lengths(self, max_len: int) -> tuple[int, int]:
        """(longest source, longest target) for operands/strings of up to max_len digits."""
        if self.name == "add":
            return 2 * max_len + 1, max_len + 1
        return max_len, max_len


# reverse: >= 0.99 exact match in under 5 minutes on 2 busy cores, with margin. add learns slowest
# (the carry runs against the writing order): twice the width, bigger batches, a lower lr.
TASKS = {
    "reverse": Task("reverse", 2, 10, steps=800, batch_size=64, n_embd=32, lr=3e-3),
    "sort": Task("sort", 2, 10, steps=1000, batch_size=64, n_embd=32, lr=3e-3),
    "add": Task("add", 1, 3, steps=2000, batch_size=128, n_embd=64, lr=2e-3),
}


def is_held_out(source: str) -> bool:
    """About 1 source in 10, chosen by a hash of its text: the same split on every run."""
    digest = hashlib.blake2b(source.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % 10 == 0


def sample_pairs(
    task: Task, rng: np.random.Generator, n: int, min_len: int, max_len: int, held_out: bool
) -> list[tuple[str, str]]:
    """n (source, target) pairs whose sources are all held out (held_out=True) or all not."""
    pairs = []
    while len(pairs) < n:
        source = task.source(rng, min_len, max_len)
        if is_held_out(source) == held_out:
            pairs.append((source, task.target(source)))
    return pairs


def held_out_set(
    task: Task, n: int, min_len: int, max_len: int, seed: int
) -> list[tuple[str, str]]:
    """n distinct held-out pairs (fewer if the lengths admit fewer), a function of the seed."""
    rng = np.random.default_rng([seed, 1])  # apart from the training batches' [seed, 0, step]
    pairs: dict[str, str] = {}
    for _ in range(20 * n):  # bounded: short lengths have few held-out sources
        if len(pairs) == n:
            break
        source, target = sample_pairs(task, rng, 1, min_len, max_len, held_out=True)[0]
        pairs[source] = target
    return list(pairs.items())


def to_arrays(pairs: list[tuple[str, str]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Right-padded (src, tgt_in, tgt_out): tgt_in = BOS + target, tgt_out = target + EOS.

    Padding is PAD in src (masked out of attention) and in tgt_in (causal: no earlier position
    reads it), and IGNORE_INDEX in tgt_out (out of the loss).
    """
    src_len = max(len(s) for s, _ in pairs)
    tgt_len = max(len(t) for _, t in pairs) + 1
    src = np.full((len(pairs), src_len), PAD, dtype=np.int64)
    tgt_in = np.full((len(pairs), tgt_len), PAD, dtype=np.int64)
    tgt_out = np.full((len(pairs), tgt_len), IGNORE_INDEX, dtype=np.int64)
    for row, (source, target) in enumerate(pairs):
        ids = encode(target)
        src[row, : len(source)] = encode(source)
        tgt_in[row, : len(ids) + 1] = [BOS, *ids]
        tgt_out[row, : len(ids) + 1] = [*ids, EOS]
    return src, tgt_in, tgt_out


# --- training and evaluation ----------------------------------------------------------------------


def exact_match(model: Seq2Seq, pairs: list[tuple[str, str]], batch_size: int = 500) -> float:
    """The fraction of pairs whose greedy output equals the target exactly."""
    correct = 0
    for i in range(0, len(pairs), batch_size):
        chunk = pairs[i : i + batch_size]
        src, _, _ = to_arrays(chunk)
        out = model.generate(src, model.config.max_tgt_len)
        correct += sum(decode(row) == target for row, (_, target) in zip(out, chunk, strict=True))
    return correct / len(pairs)


def same_length_pairs(
    task: Task, rng: np.random.Generator, n: int, min_len: int, max_len: int
) -> list[tuple[str, str]]:
    """n training pairs (never held out) whose sources all have the length of the first one drawn
    (length bucketing, --bucket): each pair is distributed as sample_pairs' given its source's
    length, and that length as sample_pairs' too.

    Such a batch has no padding in its source.
    Targets may still differ in length (add's carry): their padding needs no mask (causal
    self-attention, and IGNORE_INDEX in the loss).
    """
    pairs = sample_pairs(task, rng, 1, min_len, max_len, held_out=False)
    length = len(pairs[0][0])
    while len(pairs) < n:
        pair = sample_pairs(task, rng, 1, min_len, max_len, held_out=False)[0]
        if len(pair[0]) == length:
            pairs.append(pair)
    return pairs


@dataclass
class DigitData:
    """The task, its lengths and the fixed held-out pairs (never in a training batch)."""

    task: Task
    min_len: int
    max_len: int
    held_out: list[tuple[str, str]]


@dataclass(kw_only=True)
class DigitsConfig(TrainConfig):
    """The encoder-decoder's settings. Steps, batch size, width, learning rate, lengths and --out
    default to the --task's (TASKS, DigitTasks.defaults)."""

    task: str = setting(
        "the digit task", "reverse", choices=tuple(sorted(TASKS)), resume_keeps=True
    )
    min_len: int = setting("fewest digits of a string/operand", resume_keeps=True)
    max_len: int = setting("most digits of a string/operand", resume_keeps=True)
    post_ln: bool = setting("the 2017 paper's Post-LN blocks", False, resume_keeps=True)
    positions: str = setting(
        "position encoding", "learned", choices=("learned", "sinusoidal"), resume_keeps=True
    )
    eval_size: int = setting("held-out sequences to score", 1000, positive=True)
    bucket: bool = setting(
        "batches of one source length (no source padding)", False, resume_keeps=True
    )
    n_layer: int = 2
    n_head: int = 4
    warmup: int = 100
    eval_every: int = 200


class DigitTasks(TrainingTask):
    """The digit tasks (reverse, sort, add) with the encoder-decoder: its task of the loop."""

    name = "seq2seq"
    prog = "python -m models.seq2seq"
    description = (
        "Train an encoder-decoder Transformer on a digit task (notes 8.7). Steps, batch size, "
        "width, learning rate, lengths and --out (runs/seq2seq-TASK) default to the task's."
    )
    title = "encoder-decoder"
    Config = DigitsConfig
    betas = (0.9, 0.98)
    # Batches come in several shapes, one plan each. The fused AdamW moves the parameters into
    # its plan's flat buffer, so every change of shape would trace again (55 ms a step for
    # reverse --bucket, eager 7.4 ms); unfused plans stay valid side by side (6.4 ms).
    fusion = False
    blas_threads = 1  # tiny products: a second BLAS thread cost 3x on a busy machine
    model_class, model_config_class = Seq2Seq, Seq2SeqConfig

    def defaults(self, given: dict[str, Any]) -> dict[str, Any]:
        task = TASKS[given.get("task", "reverse")]
        return {
            **super().defaults(given),
            **{k: getattr(task, k) for k in ("steps", "batch_size", "n_embd", "lr")},
            "min_len": task.min_len,
            "max_len": task.max_len,
            "out": f"runs/seq2seq-{task.name}",
        }

    def check(self, c: DigitsConfig, given: dict[str, Any]) -> None:
        if not 1 <= c.min_len <= c.max_len:
            raise SystemExit(
                f"seq2seq: need 1 <= --min-len <= --max-len, got {c.min_len}, {c.max_len}"
            )

    def prepare(self, c: DigitsConfig, saved: Path | None) -> DigitData:
        task = TASKS[c.task]
        held_out = held_out_set(task, c.eval_size, c.min_len, c.max_len, c.seed)
        return DigitData(task, c.min_len, c.max_len, held_out)

    def config_fields(self, c: DigitsConfig, data: DigitData) -> dict[str, Any]:
        max_src, max_tgt = data.task.max_lengths(c.max_len)
        return {
            "max_src_len": max_src,
            "max_tgt_len": max_tgt + 1,  # + EOS
            "pre_ln": not c.post_ln,
            "positions": c.positions,
        }

    def batch(
        self, c: DigitsConfig, data: DigitData, step: int, rank: int, world_size: int
    ) -> Batch:
        """Fresh pairs (of one source length with --bucket): batch `step` is a function of
        (seed, step), and never holds a held-out source."""
        rng = np.random.default_rng([c.seed, 0, step])
        lengths = data.min_len, data.max_len
        if c.bucket:
            pairs = same_length_pairs(data.task, rng, c.batch_size, *lengths)
        else:
            pairs = sample_pairs(data.task, rng, c.batch_size, *lengths, held_out=False)
        src, tgt_in, tgt_out = (a[rank::world_size] for a in to_arrays(pairs))
        return src, tgt_in, tgt_out, source_keys(src)

    def tokens(self, batch: Batch) -> int:
        src, tgt_in = batch[:2]
        return src.size + tgt_in.size

    def baselines(self, data: DigitData) -> dict[str, float]:
        """The loss of predicting every target token (EOS included) by its frequency in
        training targets, ignoring the source and the target so far."""
        rng = np.random.default_rng(0)
        pairs = sample_pairs(data.task, rng, 2000, data.min_len, data.max_len, held_out=False)
        train = np.concatenate([encode(t) + [EOS] for _, t in pairs])
        held_out = np.concatenate([encode(t) + [EOS] for _, t in data.held_out])
        return {"val": unigram_baseline(train, held_out, len(VOCAB))}

    def evaluate(self, model: Seq2Seq, data: DigitData, c: DigitsConfig) -> dict[str, float]:
        """The held-out pairs' loss (teacher forcing, padded and masked) and exact match."""
        nats = count = 0.0
        for i in range(0, len(data.held_out), 500):
            src, tgt_in, tgt_out = to_arrays(data.held_out[i : i + 500])
            n = np.count_nonzero(tgt_out != IGNORE_INDEX)
            nats, count = nats + model(src, tgt_in, tgt_out)[1].item() * n, count + n
        return {"val": nats / count, "exact_match": exact_match(model, data.held_out)}

    def describe_data(self, data: DigitData) -> str:
        return (
            f"task {data.task.name}, {data.min_len}-{data.max_len} digits; "
            f"{len(data.held_out)} held-out sequences"
        )

    def report(self, history: dict[str, Any], data: DigitData, c: DigitsConfig) -> list[str]:
        return [
            f"exact-match accuracy: {history['eval_exact_match'][-1]:.4f} on "
            f"{len(data.held_out)} held-out sequences"
        ]

    def sample(self, model: Seq2Seq, data: DigitData, c: DigitsConfig) -> str:
        src, _ = data.held_out[0]
        out = model.generate(to_arrays(data.held_out[:1])[0], model.config.max_tgt_len)
        return f"e.g. {src} -> {decode(out[0])}"
