"""Chat fine-tuning (--sft) of a trained decoder: conversations whose loss counts the assistant's
tokens only (models/training/sft.py), rendered with the base model's chat template. The task of
`python -m models.train --init-from DIR --sft FILE.jsonl` (docs/finetune.md).

The settings, the checks and the model are language modelling's (language.py); the data, the
batches, the baseline and the sample differ: conversations split by conversation, batches of
--batch-size conversations padded to one length, and the held-out questions answered greedily.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from models.architectures.decoder import Decoder
from models.architectures.gpt import IGNORE_INDEX
from models.formats.tokenizer import load_tokenizer
from models.training.data import unigram_baseline
from models.training.sft import (
    chat_format,
    greedy_answer,
    pad_batch,
    read_conversations,
    sft_examples,
)
from models.training.step import Batch
from models.training.tasks.language import LanguageConfig, LanguageModelling


@dataclass
class ChatData:
    """Conversations as (inputs, targets) with targets at the assistant's tokens only, split by
    conversation; the held-out ones are also asked for answers."""

    tokenizer: Any
    train: list[tuple[np.ndarray, np.ndarray]]
    val: list[tuple[np.ndarray, np.ndarray]]
    held_out: list[list[dict[str, str]]]
    source: str
    pad_id: int
    evals: dict[str, list[tuple[np.ndarray, np.ndarray]]]


class ChatFineTuning(LanguageModelling):
    """Supervised fine-tuning on conversations (notes 9.2: a loss mask, not an attention mask)."""

    def prepare(self, c: LanguageConfig, saved: Path | None) -> ChatData:
        """--sft's conversations rendered with the base model's chat template (ChatML if it has
        none), encoded with its tokenizer, and split by conversation (10 % held out, at least
        one). Sets c.block_size to the longest conversation when it was not given."""
        tokenizer = load_tokenizer(saved)
        try:
            conversations = read_conversations(c.sft)
        except (OSError, ValueError) as exc:  # a missing file, a line that is no conversation
            raise SystemExit(f"train: --sft: {exc}") from None
        order = np.random.default_rng([c.seed, 2]).permutation(len(conversations))
        n_val = max(1, len(conversations) // 10)
        held = [conversations[i] for i in order[:n_val]]
        train = [conversations[i] for i in order[n_val:]]
        if not train:
            raise SystemExit(f"train: --sft {c.sft}: too few conversations to hold some out")
        render, encode = chat_format(tokenizer)
        try:
            examples = {
                name: sft_examples(chats, render, encode)
                for name, chats in (("train", train), ("val", held))
            }
        except ValueError as exc:  # a character or token the base model's tokenizer lacks
            raise SystemExit(f"train: --sft {c.sft}: {exc}") from None
        longest = max(len(x) for e in examples.values() for x, _ in e)
        if c.block_size is None:  # every batch padded to the longest conversation: one shape
            c.block_size = longest
        if longest > min(c.block_size, c.positions):  # cutting it would lose its answer: refuse
            raise SystemExit(
                f"train: --sft {c.sft}: a conversation is {longest} tokens long, more than "
                + (
                    f"the model's {c.positions} positions"
                    if longest > c.positions
                    else f"--block-size {c.block_size} (raise it, up to {c.positions})"
                )
            )
        pad_id = tokenizer.eot_id if getattr(tokenizer, "eot_id", None) is not None else 0
        evals = {
            name: [
                pad_batch(examples[name][i : i + c.batch_size], pad_id, c.block_size)
                for i in range(0, len(examples[name]), c.batch_size)
            ][: c.eval_batches]
            for name in ("train", "val")
        }
        return ChatData(tokenizer, examples["train"], examples["val"], held, c.sft, pad_id, evals)

    def batch(
        self, c: LanguageConfig, data: ChatData, step: int, rank: int, world_size: int
    ) -> Batch:
        """batch_size conversations, a function of (seed, step)."""
        rows = np.random.default_rng([c.seed, 1, step]).integers(0, len(data.train), c.batch_size)
        x, y = pad_batch([data.train[i] for i in rows], data.pad_id, c.block_size)
        return x[rank::world_size], y[rank::world_size]

    def baselines(self, data: ChatData) -> dict[str, float]:
        """The assistant tokens' frequencies."""
        train, val = (
            np.concatenate([y[y != IGNORE_INDEX] for _, y in d]) for d in (data.train, data.val)
        )
        return {"val": unigram_baseline(train, val, data.tokenizer.vocab_size)}

    def describe_data(self, data: ChatData) -> str:
        counted = sum(int((y != IGNORE_INDEX).sum()) for _, y in data.train)
        return (
            f"data: {data.source}, {len(data.train)} train / {len(data.val)} held-out "
            f"conversations, {counted:,} assistant tokens in the loss (the rest masked)"
        )

    def sample(self, model: Decoder, data: ChatData, c: LanguageConfig) -> str | None:
        """The held-out questions, answered greedily."""
        if c.sample_tokens <= 0:
            return None
        answers = held_out_answers(model, data)
        right = sum(a == m[-1]["content"] for a, m in zip(answers, data.held_out, strict=True))
        messages = data.held_out[0]
        return (
            f"--- held-out answers exactly right: {right}/{len(answers)}; the first ---\n"
            f"{messages[-2]['content']}\nanswer:   {answers[0]}\n"
            f"expected: {messages[-1]['content']}"
        )


def held_out_answers(model: Decoder, data: ChatData) -> list[str]:
    """The model's greedy answer to each held-out conversation's last question."""
    render, encode = chat_format(data.tokenizer)
    decode = data.tokenizer.decode
    return [greedy_answer(model, m[:-1], render, encode, decode) for m in data.held_out]
