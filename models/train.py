"""Train the GPT on text: `python -m models.train` (the README's main job).

By default a character-level GPT learns the Python standard library's own source (no download) in a
few minutes on two CPU cores, then prints a sample; `--tokenizer bpe --vocab-size N` trains on GPT-2
style byte-level BPE tokens learned from the training split instead. What is the GPT's here is
language modelling (GPTTrainer: next-token batches, train/val losses, the sample); the loop itself
(settings, steps, evaluation, checkpoints, --resume, Ctrl-C, the compiled step, --ddp) is
models/loop.py, shared with the encoder and the encoder-decoder (`mpiexec -n N python -m
models.train --ddp` runs it on MPI ranks, models/ddp.py).

Besides the loop's files, --out holds tokenizer.json (or, with --tokenizer bpe, GPT-2's vocab.json
+ merges.txt: the directory then loads like a GPT-2 download), and config.json carries GPT-2's
keys, so that GPT.from_pretrained loads model.safetensors.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import models
from models import loop
from models.data import Corpus, eval_batches, get_batch, prepare_corpus, unigram_baseline
from models.decoder import Decoder, DecoderConfig
from models.gpt import GPT, IGNORE_INDEX, GPTConfig
from models.llama import Llama, llama_config
from models.sft import chat_format, greedy_answer, pad_batch, read_conversations, sft_examples
from models.tokenizer import load_tokenizer, save_tokenizer


@dataclass
class LanguageData:
    """The corpus and the fixed evaluation windows of both splits."""

    corpus: Corpus
    evals: dict[str, list[tuple[np.ndarray, np.ndarray]]]

    @property
    def tokenizer(self) -> Any:
        return self.corpus.tokenizer


@dataclass
class ChatData:
    """--sft: conversations as (inputs, targets) with targets at the assistant's tokens only
    (models/sft.py), split by conversation; the held-out ones are also asked for answers."""

    tokenizer: Any
    train: list[tuple[np.ndarray, np.ndarray]]
    val: list[tuple[np.ndarray, np.ndarray]]
    held_out: list[list[dict[str, str]]]
    source: str
    pad_id: int
    evals: dict[str, list[tuple[np.ndarray, np.ndarray]]]


class GPTTrainer(loop.Trainer):
    """Next-token prediction on a corpus (notes 9): the GPT's kind of the loop."""

    name = "train"
    prog = "python -m models.train"
    description = "Train a GPT on characters or BPE tokens (default corpus: Python stdlib)."
    title = "GPT training"
    # The demo defaults: tuned to finish in a few minutes on 2 CPU cores (see docs/gpt.md).
    DEFAULTS: dict[str, Any] = {
        **loop.Trainer.DEFAULTS,
        "data": None,
        "sft": None,
        "arch": "gpt2",
        "tokenizer": "char",
        "vocab_size": 1024,
        "out": "runs/demo",
        "steps": 2000,
        "batch_size": 16,
        "block_size": 64,
        "n_layer": 4,
        "n_head": 4,
        "n_embd": 128,
        "lr": 3e-3,
        "min_lr": 3e-4,
        "warmup": 60,
        "weight_decay": 0.1,
        "eval_batches": 4,
        "seed": 1337,
        "sample_tokens": 400,
        "sample_prompt": "def ",
    }
    RUN_DEFINING = (
        *loop.COMMON_RUN_DEFINING,
        "data",
        "sft",
        "arch",
        "tokenizer",
        "vocab_size",
        "block_size",
    )
    model_class, config_class = GPT, GPTConfig

    def add_arguments(self, add: Any) -> None:
        add("--data", "UTF-8 text file to train on (default: Python standard library sources)")
        add(
            "--sft",
            'chat fine-tuning: a .jsonl file, one {"messages": [{"role", "content"}, ...]} '
            "per line; the loss counts the assistant's tokens only (with --init-from)",
        )
        add("--tokenizer", "characters or byte-level BPE", choices=["char", "bpe"])
        add(
            "--arch",
            "the new model's family: GPT-2 (LayerNorm, learned positions, GELU) or Llama "
            "(RMSNorm, rotary positions, SwiGLU)",
            choices=["gpt2", "llama"],
        )
        add("--vocab-size", "BPE vocabulary", type=int)
        add("--block-size", "context length", type=int)
        add("--eval-batches", "batches per evaluation", type=int)
        add("--sample-tokens", "length of the final sample (0: none)", type=int)
        add("--sample-prompt", "prompt of the final sample")

    def check_settings(self, settings: dict[str, Any], given: dict[str, Any]) -> None:
        if "vocab_size" in given and settings["tokenizer"] != "bpe":
            raise SystemExit("train: --vocab-size needs --tokenizer bpe")
        if settings["sft"] is not None:
            if not settings["init_from"]:
                raise SystemExit("train: --sft fine-tunes a trained model: give --init-from")
            if settings["data"] is not None:
                raise SystemExit("train: --sft and --data are two kinds of data: give one")
        if settings["init_from"]:
            if "arch" in given:
                raise SystemExit("train: --init-from brings its architecture; drop --arch")
            if "tokenizer" in given or "vocab_size" in given:
                raise SystemExit("train: --init-from brings its tokenizer; drop --tokenizer")
            positions = _pretrained_config(Path(settings["init_from"])).block_size
            settings["positions"] = positions
            if "block_size" not in given:  # --sft: the longest conversation (set when the data
                # is read); text: the default windows, or the checkpoint's if shorter
                chat = settings["sft"] is not None
                settings["block_size"] = None if chat else min(settings["block_size"], positions)
            elif settings["block_size"] > positions:
                raise SystemExit(
                    f"train: --block-size {settings['block_size']} exceeds the {positions} "
                    f"positions of --init-from {settings['init_from']}"
                )

    def pretrained_settings(self, directory: Path) -> dict[str, Any]:
        config = _pretrained_config(directory)
        return {k: getattr(config, k) for k in self.SHAPE}

    def pretrained(self, directory: Path, settings: dict[str, Any]) -> Decoder:
        """Any family models.from_pretrained reads (a GPT-2 or Llama-family directory)."""
        return models.from_pretrained(directory, dtype=settings["dtype"])

    def build(self, settings: dict[str, Any], data: Any) -> Decoder:
        if settings["arch"] == "gpt2":
            return super().build(settings, data)
        sizes = {k: settings[k] for k in ("n_layer", "n_head", "n_embd", "dropout")}
        config = llama_config(**sizes, **self.config_fields(settings, data))
        return Llama(config, rng=np.random.default_rng(settings["seed"])).to(settings["dtype"])

    def prepare(self, s: dict[str, Any], saved: Path | None) -> LanguageData | ChatData:
        if s["sft"] is not None:
            return _chat_data(s, load_tokenizer(saved))
        if saved is not None:  # the checkpoint's tokenizer (a BPE is not learned again)
            corpus = prepare_corpus(s["data"], tokenizer=load_tokenizer(saved))
        else:
            bpe = s["vocab_size"] if s["tokenizer"] == "bpe" else None
            corpus = prepare_corpus(s["data"], bpe_vocab_size=bpe)
        evals = {
            name: eval_batches(ids, s["batch_size"], s["block_size"], s["eval_batches"], s["seed"])
            for name, ids in (("train", corpus.train), ("val", corpus.val))
        }
        return LanguageData(corpus, evals)

    def config_fields(self, s: dict[str, Any], data: LanguageData) -> dict[str, Any]:
        return {"vocab_size": data.corpus.tokenizer.vocab_size, "block_size": s["block_size"]}

    def save_model(self, out: Path, model: GPT, data: Any, stamp: dict[str, str]) -> None:
        model.save_pretrained(out, metadata=stamp)
        save_tokenizer(data.tokenizer, out)

    def load_model(self, out: Path, settings: dict[str, Any]) -> Decoder:
        return models.from_pretrained(out, dtype=settings["dtype"])

    def batch(
        self, s: dict[str, Any], data: LanguageData, step: int, rank: int, world_size: int
    ) -> loop.Batch:
        if isinstance(data, ChatData):  # batch_size conversations, a function of (seed, step)
            rows = np.random.default_rng([s["seed"], 1, step]).integers(
                0, len(data.train), s["batch_size"]
            )
            x, y = pad_batch([data.train[i] for i in rows], data.pad_id, s["block_size"])
            return x[rank::world_size], y[rank::world_size]
        ids = data.corpus.train
        return get_batch(ids, s["batch_size"], s["block_size"], s["seed"], step, rank, world_size)

    def baselines(self, data: Any) -> dict[str, float]:
        if isinstance(data, ChatData):  # the assistant tokens' frequencies
            train, val = (
                np.concatenate([y[y != IGNORE_INDEX] for _, y in d]) for d in (data.train, data.val)
            )
            return {"val": unigram_baseline(train, val, data.tokenizer.vocab_size)}
        c = data.corpus
        return {"val": unigram_baseline(c.train, c.val, c.tokenizer.vocab_size)}

    def evaluate(
        self, model: GPT, data: LanguageData, settings: dict[str, Any]
    ) -> dict[str, float]:
        """The mean loss over the fixed windows of each split."""
        return {
            name: float(np.mean([model(x, y)[1].item() for x, y in batches]))
            for name, batches in data.evals.items()
        }

    def describe_data(self, data: Any) -> str:
        if isinstance(data, ChatData):
            counted = sum(int((y != IGNORE_INDEX).sum()) for _, y in data.train)
            return (
                f"data: {data.source}, {len(data.train)} train / {len(data.val)} held-out "
                f"conversations, {counted:,} assistant tokens in the loss (the rest masked)"
            )
        c = data.corpus
        return (
            f"data: {c.source}, {len(c.train):,} train / {len(c.val):,} val tokens; unigram "
            f"baseline {self.baselines(data)['val']:.3f} nats/token"
        )

    def sample(self, model: GPT, data: Any, s: dict[str, Any]) -> str | None:
        if s["sample_tokens"] <= 0:
            return None
        if isinstance(data, ChatData):  # the held-out questions, answered greedily
            answers = held_out_answers(model, data)
            right = sum(a == m[-1]["content"] for a, m in zip(answers, data.held_out, strict=True))
            messages = data.held_out[0]
            return (
                f"--- held-out answers exactly right: {right}/{len(answers)}; the first ---\n"
                f"{messages[-2]['content']}\nanswer:   {answers[0]}\n"
                f"expected: {messages[-1]['content']}"
            )
        tokenizer, prompt = data.corpus.tokenizer, s["sample_prompt"]
        text = sample_text(model, tokenizer, prompt, s["sample_tokens"], s["seed"])
        return f"--- sample (temperature 0.8) ---\n{text}"


def held_out_answers(model: GPT, data: ChatData) -> list[str]:
    """The model's greedy answer to each held-out conversation's last question."""
    render, encode = chat_format(data.tokenizer)
    decode = data.tokenizer.decode
    return [greedy_answer(model, m[:-1], render, encode, decode) for m in data.held_out]


def _chat_data(s: dict[str, Any], tokenizer: Any) -> ChatData:
    """--sft's conversations rendered with the base model's chat template (ChatML if it has
    none), encoded with its tokenizer, and split by conversation (10 % held out, at least one)."""
    conversations = read_conversations(s["sft"])
    order = np.random.default_rng([s["seed"], 2]).permutation(len(conversations))
    n_val = max(1, len(conversations) // 10)
    held = [conversations[i] for i in order[:n_val]]
    train = [conversations[i] for i in order[n_val:]]
    if not train:
        raise SystemExit(f"train: --sft {s['sft']}: too few conversations to hold some out")
    render, encode = chat_format(tokenizer)
    try:
        examples = {
            name: sft_examples(c, render, encode) for name, c in (("train", train), ("val", held))
        }
    except ValueError as exc:  # a character or token the base model's tokenizer lacks
        raise SystemExit(f"train: --sft {s['sft']}: {exc}") from None
    longest = max(len(x) for e in examples.values() for x, _ in e)
    positions = s["positions"]  # the base model's (check_settings read them)
    if s["block_size"] is None:  # every batch padded to the longest conversation: one shape
        s["block_size"] = longest
    if longest > min(s["block_size"], positions):  # cutting it would lose its answer: refuse
        raise SystemExit(
            f"train: --sft {s['sft']}: a conversation is {longest} tokens long, more than "
            + (
                f"the model's {positions} positions"
                if longest > positions
                else f"--block-size {s['block_size']} (raise it, up to {positions})"
            )
        )
    pad_id = tokenizer.eot_id if getattr(tokenizer, "eot_id", None) is not None else 0
    evals = {
        name: [
            pad_batch(examples[name][i : i + s["batch_size"]], pad_id, s["block_size"])
            for i in range(0, len(examples[name]), s["batch_size"])
        ][: s["eval_batches"]]
        for name in ("train", "val")
    }
    return ChatData(tokenizer, examples["train"], examples["val"], held, s["sft"], pad_id, evals)


def _pretrained_config(path: Path) -> DecoderConfig:
    """The model settings of what models.from_pretrained reads (a directory or a .gguf file)."""
    try:
        return models.pretrained_config(path)
    except (FileNotFoundError, ValueError, ImportError) as exc:
        raise SystemExit(f"train: --init-from {path}: {exc}") from None


def sample_text(model: GPT, tokenizer: Any, prompt: str, n_tokens: int, seed: int) -> str:
    """Prompt + n_tokens sampled at temperature 0.8 (a little sharper than the model)."""
    ids = np.asarray(tokenizer.encode(prompt), dtype=np.int64) if prompt else np.array([0])
    out = model.generate(ids[None, :], n_tokens, temperature=0.8, rng=np.random.default_rng(seed))
    return tokenizer.decode(out[0])


TRAINER = GPTTrainer()


def main(argv: list[str] | None = None) -> int:
    """Console entry point (glassgrad-train)."""
    return TRAINER.main(argv)


if __name__ == "__main__":
    sys.exit(main())
