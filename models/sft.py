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
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from models.gpt import IGNORE_INDEX


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
