"""Chat fine-tuning data: the loss mask (which positions count in the objective).

A rendered conversation is one token sequence: the user's turns, the template's markers and the
assistant's answers. The model reads all of it (the causal attention mask, notes 7.4, lets each
position see every earlier token), but the objective counts only the assistant's tokens (notes
9.2: "some chat fine-tuning computes the loss at the assistant's positions only; this is a loss
mask, not the causal attention mask: the latter controls the flow of information, the former which
positions enter the target"). So a user token still shapes the loss, through attention, at the
assistant's positions after it; it just never is a target itself. Padding is neither.

Next-token targets: position t predicts token t + 1, so its target is tokens[t + 1] when token
t + 1 is the assistant's, and IGNORE_INDEX otherwise.

Which tokens are the assistant's comes from the chat template itself, rendered on prefixes of
the conversation: the text of messages[:i] with the generation prompt (the assistant's header)
ends where the assistant's turn i begins, and the text of messages[:i + 1] ends after it (its
end-of-turn marker included, so the model learns to stop).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from models.architectures.gpt import IGNORE_INDEX


def tokens_and_mask(
    segments: Sequence[tuple[Sequence[int], bool]],
) -> tuple[np.ndarray, np.ndarray]:
    """Concatenate (token ids, trained) segments -> (tokens, trained mask), both (L,).

    A renderer yields one segment per piece of the template: the user's turn (False), the
    assistant's header (False), the assistant's answer and its end-of-turn token (True), ...
    """
    tokens = [np.asarray(ids, dtype=np.int64).reshape(-1) for ids, _ in segments]
    trained = [np.full(len(t), bool(flag)) for t, (_, flag) in zip(tokens, segments, strict=True)]
    if not tokens:
        raise ValueError("tokens_and_mask: no segments")
    return np.concatenate(tokens), np.concatenate(trained)


def loss_mask_targets(
    tokens: Any, trained: Any, ignore_index: int = IGNORE_INDEX
) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, targets) of one conversation: inputs = tokens[:-1], targets[t] = tokens[t + 1]
    where token t + 1 is trained (the assistant's), else ignore_index."""
    tokens = np.asarray(tokens, dtype=np.int64)
    trained = np.asarray(trained, dtype=bool)
    if tokens.ndim != 1 or trained.shape != tokens.shape or len(tokens) < 2:
        raise ValueError(
            f"loss_mask_targets: need tokens (L,) with L >= 2 and a trained mask of the same "
            f"shape, got tokens {tokens.shape}, mask {trained.shape}"
        )
    targets = np.where(trained[1:], tokens[1:], ignore_index)
    return tokens[:-1].copy(), targets


def pad_batch(
    examples: Sequence[tuple[np.ndarray, np.ndarray]],
    pad_id: int,
    length: int,
    ignore_index: int = IGNORE_INDEX,
) -> tuple[np.ndarray, np.ndarray]:
    """Stack (inputs, targets) pairs into (B, length) arrays: inputs padded with pad_id,
    targets with ignore_index (padding never counts); longer examples are cut at `length`."""
    if not examples:
        raise ValueError("pad_batch: no examples")
    x = np.full((len(examples), length), pad_id, dtype=np.int64)
    y = np.full((len(examples), length), ignore_index, dtype=np.int64)
    for row, (inputs, targets) in enumerate(examples):
        n = min(len(inputs), length)
        x[row, :n] = inputs[:n]
        y[row, :n] = targets[:n]
    return x, y


Render = Callable[[list[dict[str, Any]], bool], str]  # (messages, add_generation_prompt) -> text
Encode = Callable[[str], Sequence[int]]


def conversation_segments(messages: list[dict[str, Any]], render: Render) -> list[tuple[str, bool]]:
    """The rendered conversation as (text, is the assistant's) pieces, in order.

    render(messages, add_generation_prompt) is the model's chat template. Each assistant turn's
    text is render(messages[:i + 1]) minus render(messages[:i], add_generation_prompt=True); a
    template whose renders are not prefixes of one another cannot be split this way (an error).
    """
    if not any(m.get("role") == "assistant" for m in messages):
        raise ValueError("conversation_segments: the conversation has no assistant message")
    segments: list[tuple[str, bool]] = []
    done = ""
    for i, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        prompt, turn = render(messages[:i], True), render(messages[: i + 1], False)
        if not (prompt.startswith(done) and turn.startswith(prompt)):
            raise ValueError(
                f"conversation_segments: the chat template's text for the first {i} messages "
                "is not a prefix of its text for more of them, so the assistant's tokens cannot "
                "be located"
            )
        segments += [(prompt[len(done) :], False), (turn[len(prompt) :], True)]
        done = turn
    rest = render(messages, False)[len(done) :]  # anything after the last assistant turn
    return [(text, trained) for text, trained in [*segments, (rest, False)] if text]


def encode_conversation(
    messages: list[dict[str, Any]], render: Render, encode: Encode
) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, trained mask) of one conversation: each piece of conversation_segments encoded
    on its own. Checked against encoding the whole text at once, so that a merge across a piece
    boundary (possible with BPE where no special token separates them) is an error, not a
    silently different sequence."""
    segments = conversation_segments(messages, render)
    tokens, trained = tokens_and_mask([(encode(text), flag) for text, flag in segments])
    whole = np.asarray(encode("".join(text for text, _ in segments)), dtype=np.int64)
    if not np.array_equal(whole, tokens):
        raise ValueError(
            "encode_conversation: the pieces of the rendered conversation encode differently "
            "from the whole text (a token spans a turn boundary); the template should separate "
            "turns with special tokens"
        )
    return tokens, trained


def read_conversations(path: str | os.PathLike) -> list[list[dict[str, str]]]:
    """One conversation per line: {"messages": [{"role": ..., "content": ...}, ...]}."""
    conversations = []
    for number, line in enumerate(Path(path).read_text("utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{number}: not valid JSON ({exc})") from None
        messages = record.get("messages") if isinstance(record, dict) else None
        if not isinstance(messages, list) or not all(
            isinstance(m, dict)
            and isinstance(m.get("role"), str)
            and isinstance(m.get("content"), str)
            for m in messages
        ):
            raise ValueError(
                f'{path}:{number}: expected {{"messages": [{{"role": str, "content": str}}, ...]}}'
            )
        if not any(m["role"] == "assistant" for m in messages):
            raise ValueError(f"{path}:{number}: the conversation has no assistant message")
        conversations.append(messages)
    if not conversations:
        raise ValueError(f"{path}: no conversations")
    return conversations


def sft_examples(
    conversations: Sequence[list[dict[str, Any]]], render: Render, encode: Encode
) -> list[tuple[np.ndarray, np.ndarray]]:
    """(inputs, targets) of each conversation, targets only at the assistant's tokens."""
    return [loss_mask_targets(*encode_conversation(m, render, encode)) for m in conversations]


def chatml(messages: list[dict[str, Any]], add_generation_prompt: bool = False) -> str:
    """ChatML, the layout SmolLM2 and Qwen2 use: <|im_start|>role\\ncontent<|im_end|>\\n per
    message, then <|im_start|>assistant\\n when the model is to answer. The template of a model
    directory that has no chat template of its own."""
    text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")


END_OF_TURN = "<|im_end|>"


def chat_format(tokenizer: Any) -> tuple[Render, Encode]:
    """(render, encode) of a tokenizer: its own chat template (a Hugging Face tokenizer's
    tokenizer_config.json), whose special tokens it encodes as single tokens, or ChatML as
    text when it has none."""
    if getattr(tokenizer, "chat_template", None):

        def render(messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
            return tokenizer.apply_chat_template(
                messages, add_generation_prompt=add_generation_prompt, tokenize=False
            )

        return render, lambda text: tokenizer.encode(text, allowed_special="all")
    return chatml, tokenizer.encode


def greedy_answer(
    model: Any,
    messages: list[dict[str, Any]],
    render: Render,
    encode: Encode,
    decode: Any,
    max_new_tokens: int = 48,
) -> str:
    """The model's greedy answer to a conversation that ends with the user's turn, up to the end
    of its turn (ChatML's <|im_end|>)."""
    ids = np.asarray(encode(render(messages, True)), dtype=np.int64)[None]
    room = model.config.block_size - ids.shape[1]
    out = model.generate(ids, max(0, min(max_new_tokens, room)), temperature=0.0)
    return decode(out[0, ids.shape[1] :]).split(END_OF_TURN)[0]
