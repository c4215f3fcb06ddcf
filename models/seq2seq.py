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
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

import autograd.functional as F
import nn
from autograd import Tensor, get_default_dtype, no_grad
from models.gpt import IGNORE_INDEX

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

    def encode(self, src: Any) -> tuple[Tensor, np.ndarray]:
        """The encoder's output (B, S, C) and the source's key mask (B, S), True = real token."""
        src = self._ids(src, "src", self.config.max_src_len)
        key_mask = src != PAD
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

    def forward(self, src: Any, tgt_in: Any, tgt_out: Any = None) -> tuple[Tensor, Tensor | None]:
        """Logits (B, T, V) for every target position, and the mean cross-entropy against
        tgt_out (IGNORE_INDEX = padding) when given (teacher forcing: the whole target at once)."""
        memory, key_mask = self.encode(src)
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

# The defaults every task shares; steps, batch size, width and lr are the task's (TASKS).
DEFAULTS: dict[str, Any] = {
    "task": "reverse",
    "n_layer": 2,
    "n_head": 4,
    "warmup": 100,
    "eval_size": 1000,
    "seed": 0,
}


def exact_match(model: Seq2Seq, pairs: list[tuple[str, str]], batch_size: int = 500) -> float:
    """The fraction of pairs whose greedy output equals the target exactly."""
    correct = 0
    for i in range(0, len(pairs), batch_size):
        chunk = pairs[i : i + batch_size]
        src, _, _ = to_arrays(chunk)
        out = model.generate(src, model.config.max_tgt_len)
        correct += sum(decode(row) == target for row, (_, target) in zip(out, chunk, strict=True))
    return correct / len(pairs)


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
    """AdamW with warmup and cosine decay on fresh batches: batch `step` is a function of
    (seed, step), and never holds a held-out source."""
    from tqdm import tqdm

    model = Seq2Seq(config, rng=np.random.default_rng(seed))
    optimizer = nn.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.0)
    model.train()
    with tqdm(total=steps, disable=quiet, unit="step", dynamic_ncols=True) as bar:
        for step in range(steps):
            rng = np.random.default_rng([seed, 0, step])
            src, tgt_in, tgt_out = to_arrays(
                sample_pairs(task, rng, batch_size, min_len, max_len, held_out=False)
            )
            _, loss = model(src, tgt_in, tgt_out)
            optimizer.zero_grad()
            loss.backward()
            nn.clip_grad_norm_(model.parameters(), 1.0)
            for group in optimizer.param_groups:
                group["lr"] = nn.optim.cosine_with_warmup(step, lr, warmup, steps, lr / 10)
            optimizer.step()
            bar.set_postfix(loss=f"{loss.item():.4f}", refresh=False)
            bar.update(1)
    return model


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m models.seq2seq",
        description="Train an encoder-decoder Transformer on a digit task (notes 8.7).",
    )
    d = DEFAULTS
    add = p.add_argument
    add("--task", choices=sorted(TASKS), default=d["task"], help="default %(default)s")
    # default None: the task's (TASKS)
    add("--steps", type=int, help="optimizer steps (default: the task's)")
    add("--batch-size", type=int, help="sequences per step (default: the task's)")
    add("--min-len", type=int, help="fewest digits of a string/operand (default: the task's)")
    add("--max-len", type=int, help="most digits of a string/operand (default: the task's)")
    add("--n-layer", type=int, default=d["n_layer"], help="blocks per side (default %(default)s)")
    add("--n-head", type=int, default=d["n_head"], help="default %(default)s")
    add("--n-embd", type=int, help="model width (default: the task's)")
    add("--lr", type=float, help="peak learning rate (default: the task's)")
    add("--warmup", type=int, default=d["warmup"], help="warmup steps (default %(default)s)")
    add("--post-ln", action="store_true", help="the 2017 paper's Post-LN blocks")
    add("--positions", choices=["learned", "sinusoidal"], default="learned")
    add("--eval-size", type=int, default=d["eval_size"], help="held-out sequences to score")
    add("--seed", type=int, default=d["seed"], help="default %(default)s")
    add("--quiet", action="store_true", help="no progress bar")
    return p


def main(argv: list[str] | None = None) -> int:
    from threadpoolctl import threadpool_limits

    # One BLAS thread: these products are tiny, and handing them to a second thread cost 3x on a
    # busy machine (docs/seq2seq.md). A context, so that callers (tests) keep their setting.
    with threadpool_limits(limits=1, user_api="blas"):
        return _main(build_parser().parse_args(argv))


def _main(args: argparse.Namespace) -> int:
    task = TASKS[args.task]
    for name in ("steps", "batch_size", "n_embd", "lr", "min_len", "max_len"):
        if getattr(args, name) is None:
            setattr(args, name, getattr(task, name))
    min_len, max_len = args.min_len, args.max_len
    if not 1 <= min_len <= max_len:
        raise SystemExit(f"seq2seq: need 1 <= --min-len <= --max-len, got {min_len}, {max_len}")
    max_src, max_tgt = task.max_lengths(max_len)
    config = Seq2SeqConfig(
        max_src_len=max_src,
        max_tgt_len=max_tgt + 1,  # + EOS
        n_layer=args.n_layer,
        n_head=args.n_head,
        n_embd=args.n_embd,
        pre_ln=not args.post_ln,
        positions=args.positions,
    )
    began = time.perf_counter()
    model = train(
        task,
        args.steps,
        args.batch_size,
        config,
        min_len,
        max_len,
        lr=args.lr,
        warmup=min(args.warmup, args.steps),
        seed=args.seed,
        quiet=args.quiet,
    )
    trained = time.perf_counter() - began
    pairs = held_out_set(task, args.eval_size, min_len, max_len, args.seed)
    accuracy = exact_match(model, pairs)
    total = time.perf_counter() - began
    src, _ = pairs[0]
    example = decode(model.generate(to_arrays(pairs[:1])[0], config.max_tgt_len)[0])
    print(
        f"{model.describe()}, {model.num_parameters():,} parameters, {get_default_dtype()}; "
        f"task {task.name}, {min_len}-{max_len} digits; trained {args.steps} steps in "
        f"{trained:.0f} s, {total:.0f} s with the evaluation; e.g. {src} -> {example}"
    )
    print(f"exact-match accuracy: {accuracy:.4f} on {len(pairs)} held-out sequences")
    return 0


if __name__ == "__main__":
    sys.exit(main())
