"""Gradient accumulation: the update of one batch N times larger, from N micro-batches.

A batch too large for memory is cut into N micro-batches; each runs forward and backward on its
own, and the gradients add up in .grad (notes 10.2: contributions add) before one optimizer step.
The loss of the large batch is the mean over all its counted targets (those != ignore_index),
K = k_1 + ... + k_N, while each micro-batch's loss is the mean over its own k_i. So micro-batch
i's loss enters with weight k_i / K, not 1 / N:

    L = (1 / K) sum_i sum_{t in i} l_t = sum_i (k_i / K) L_i

With 1 / N a micro-batch with few counted targets (short answers, much padding) would weigh as
much as a full one, and the update would not be the large batch's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from autograd import Tensor


def counted_targets(targets: Any, ignore_index: int = -100) -> int:
    """How many targets count in the loss (those that are not ignore_index)."""
    return int(np.count_nonzero(np.asarray(targets) != ignore_index))


def split_batch(x: np.ndarray, y: np.ndarray, n: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """(x, y) cut along the first axis into n micro-batches of equal size."""
    if n < 1 or len(x) % n or len(x) != len(y):
        raise ValueError(
            f"split_batch: a batch of {len(x)} rows (targets {len(y)}) does not split into "
            f"{n} equal micro-batches"
        )
    size = len(x) // n
    return [(x[i * size : (i + 1) * size], y[i * size : (i + 1) * size]) for i in range(n)]


def accumulate_gradients(
    loss_of: Callable[[Any, np.ndarray], Tensor],
    micro_batches: Sequence[tuple[Any, np.ndarray]],
    ignore_index: int = -100,
) -> float:
    """Forward and backward each (x, y) of `micro_batches`, adding its gradient into .grad with
    weight k_i / K (see the module docstring); return the large batch's loss.

    loss_of(x, y) is a micro-batch's mean loss over its counted targets (a GPT's model(x, y)[1]).
    Call optimizer.zero_grad() before and optimizer.step() after, as for one batch. A micro-batch
    without counted targets adds nothing and is not run.
    """
    counts = [counted_targets(y, ignore_index) for _, y in micro_batches]
    total = sum(counts)
    if total == 0:
        raise ValueError(
            f"accumulate_gradients: no target in {len(micro_batches)} micro-batches counts "
            f"(all are ignore_index={ignore_index})"
        )
    loss = 0.0
    for (x, y), k in zip(micro_batches, counts, strict=True):
        if k == 0:
            continue
        micro = loss_of(x, y)
        (micro * (k / total)).backward()
        loss += micro.item() * k / total
    return loss
