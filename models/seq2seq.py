"""The encoder-decoder Transformer (the 2017 paper's architecture, notes 8.7) on digit tasks.

    python -m models.seq2seq --task reverse|sort|add

The encoder reads the source both ways (nn.EncoderBlock: no causal mask, padding masked out); the
decoder writes the target one token at a time with causal self-attention and reads the encoder's
output through cross-attention (nn.DecoderBlock: Q from the decoder, K/V from the encoder). One
token embedding serves source, target and the tied output head (notes 9.4).

Generation encodes the source once and projects each layer's cross-attention K/V from it once;
every step then costs one target position: its causal self-attention appends to a KV cache (notes
12.4) and its cross-attention reads the fixed source K/V. `generate(..., use_cache=False)`
recomputes everything from scratch each step and gives the same tokens.

The tasks are generated in code: `reverse` and `sort` a string of digits, `add` writes the sum of
two numbers. Held-out sequences are fixed by a hash of the source text (`is_held_out`), so
training never draws one, whatever the seed, and the final accuracy is on sources it never saw.

The training is the one loop of models/training/ (DigitTasks plugs in the batches, the
evaluation and the model's files; DigitsConfig holds its settings): checkpoints and loss.png in
--out (runs/seq2seq-TASK), --resume, Ctrl-C, --ddp, the compiled step: a batch carries its
source's padding mask as an array of its own (source_keys), a step argument, so each replay masks
its own batch's padding.
"""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import autograd.functional as F
import nn
from autograd import Tensor, no_grad
from models.data import unigram_baseline
from models.gpt import IGNORE_INDEX
from models.training.config import TrainConfig, setting
from models.training.loop import Trainer
from models.training.step import Batch
from models.training.task import Task as TrainingTask  # Task here: a digit task

# --- vocabulary and tasks -------------------------------------------------------------------------

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


def source_keys(src: np.ndarray) -> np.ndarray:
    """The source's padding mask as the (B, 1, 1, S) allowed set attention reads (True = a real
    token). A batch carries it as an array of its own, so that a compiled step takes it as an
    argument and each replay masks its own batch's padding (a mask computed inside the step from
    src would be a constant of the trace: docs/compile.md)."""
    return np.ascontiguousarray((src != PAD)[:, None, None, :])


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
        for name in ("max_src_len", "max_tgt_len", "vocab_size", "n_layer", "n_head", "n_embd"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"Seq2SeqConfig: {name} must be a positive integer, got {value!r}")
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


TRAINER = Trainer(DigitTasks())


def train(
    task: Task,
    steps: int,
    batch_size: int,
    config: Seq2SeqConfig,
    min_len: int,
    max_len: int,
    lr: float,
    warmup: int,
    seed: int,
    quiet: bool = False,
) -> Seq2Seq:
    """A model trained by the loop without writing files (the config's max lengths must be
    those of task and max_len)."""
    settings = {
        **TRAINER.task.defaults({"task": task.name}),
        "task": task.name,
        "out": None,
        "steps": steps,
        "batch_size": batch_size,
        "n_layer": config.n_layer,
        "n_head": config.n_head,
        "n_embd": config.n_embd,
        "dropout": config.dropout,
        "post_ln": not config.pre_ln,
        "positions": config.positions,
        "min_len": min_len,
        "max_len": max_len,
        "lr": lr,
        "min_lr": lr / 10,
        "warmup": warmup,
        "eval_every": steps,
        "seed": seed,
    }
    return TRAINER.fit(DigitsConfig(**settings), quiet=quiet)[0]


def main(argv: list[str] | None = None) -> int:
    return TRAINER.main(argv)


if __name__ == "__main__":
    sys.exit(main())
