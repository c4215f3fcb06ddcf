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

from autograd import Tensor, get_default_dtype


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


def accumulation_weights(
    targets: Sequence[np.ndarray], ignore_index: int = -100, dtype: Any = None
) -> np.ndarray:
    """k_i / K for the micro-batches' targets (N,), in `dtype` (default: the default dtype).

    Computed outside the step: a compiled step takes them as an argument, since a count read
    from the targets inside it would be frozen into the trace."""
    counts = np.array([counted_targets(y, ignore_index) for y in targets], dtype=np.float64)
    total = counts.sum()
    if total == 0:
        raise ValueError(
            f"accumulation_weights: no target in {len(counts)} micro-batches counts (all are "
            f"ignore_index={ignore_index})"
        )
    return (counts / total).astype(get_default_dtype() if dtype is None else dtype)


def accumulate_gradients(
    loss_of: Callable[..., Tensor],
    micro_batches: Sequence[tuple[Any, ...]],
    weights: np.ndarray | None = None,
    ignore_index: int = -100,
) -> Tensor:
    """Forward and backward each micro-batch (x, ..., targets) with its loss weighted by k_i / K
    (see the module docstring), so that .grad adds up to the large batch's gradient; return the
    large batch's loss, sum_i (k_i / K) L_i.

    loss_of(*micro_batch) is its mean loss over its counted targets (a GPT's model(x, y)[1]).
    Call optimizer.zero_grad() before and optimizer.step() after, as for one batch. weights:
    accumulation_weights(...) of the targets (computed here when None); inside a compiled step
    pass them, and every micro-batch, as the step's own arguments:

        def step(weights, *arrays):        # x_1, y_1, x_2, y_2, ...
            optimizer.zero_grad()
            pairs = list(zip(arrays[::2], arrays[1::2]))
            loss = nn.accumulate_gradients(loss_of, pairs, weights)
            optimizer.step()
            return loss
    """
    if weights is None:
        weights = accumulation_weights([batch[-1] for batch in micro_batches], ignore_index)
    if len(weights) != len(micro_batches):
        raise ValueError(
            f"accumulate_gradients: {len(weights)} weights for {len(micro_batches)} micro-batches"
        )
    w = Tensor(weights, dtype=weights.dtype)
    total = None
    for i, batch in enumerate(micro_batches):
        weighted = loss_of(*batch) * w[i]
        weighted.backward()  # adds (k_i / K) dL_i into every .grad
        total = weighted if total is None else total + weighted
    return total
