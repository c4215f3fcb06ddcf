"""One optimizer step, written once: train_step. An eager run calls it; a compiled run hands the
same function to autograd.compile, which traces it once per batch shape and replays it.

    zero_grad -> forward + backward (grad_accum micro-batches) -> after_backward -> clip -> AdamW

EagerTrainStep and CompiledTrainStep are what the loop calls each step: both set the step's
learning rate, pack the batch into train_step's arguments (step_arguments) and stop the run on a
non-finite gradient norm. The eager one also runs the hooks a compiled replay cannot: the
caller's after_backward and the gradient Allreduce of --ddp (models/ddp.py).
"""

from __future__ import annotations

import copy
import math
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

import autograd
import nn
from autograd import Tensor
from models.ddp import SINGLE_PROCESS, Replicas

Batch = tuple[np.ndarray, ...]
LossFn = Callable[..., Tensor]
GradHook = Callable[[list[nn.Parameter]], None]


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """GPT-2 style decay: only the matmul weights; biases, LayerNorm gains and the embedding
    tables (the token table is also the tied output head) are not pulled towards zero."""
    tables = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    decay, no_decay = [], []
    for p in model.parameters():
        (decay if p.ndim == 2 and id(p) not in tables else no_decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def train_step(
    loss_fn: LossFn,
    optimizer: nn.optim.Optimizer,
    params: list[nn.Parameter],
    grad_clip: float,
    grad_accum: int,
    *arrays: np.ndarray,
    after_backward: Callable[[Tensor], None] | None = None,
) -> tuple[Tensor, Any]:
    """The step: (loss, gradient norm before clipping). arrays: the batch, or with grad_accum N
    the weights k_i / K then each micro-batch's arrays (step_arguments), whose gradients add up
    (nn.accumulate_gradients). after_backward(loss) runs between backward and the clip."""
    optimizer.zero_grad()
    if grad_accum > 1:
        k = (len(arrays) - 1) // grad_accum
        micro = [arrays[1 + i * k : 1 + (i + 1) * k] for i in range(grad_accum)]
        loss = nn.accumulate_gradients(loss_fn, micro, arrays[0])
    else:
        loss = loss_fn(*arrays)
        loss.backward()
    if after_backward is not None:
        after_backward(loss)
    norm = nn.clip_grad_norm_(params, grad_clip)
    optimizer.step()
    return loss, norm


def micro_batches(batch: Batch, n: int) -> list[Batch]:
    """The batch's arrays cut along their first axis into n micro-batches, each array a copy of
    its own (a compiled step takes each as an argument, and arguments must not share memory).
    The targets are each micro-batch's last array."""
    rows = len(batch[0])
    if rows % n:
        raise SystemExit(f"train: --grad-accum {n} does not divide the batch of {rows} rows")
    size = rows // n
    return [tuple(a[i * size : (i + 1) * size].copy() for a in batch) for i in range(n)]


def step_arguments(batch: Batch, grad_accum: int, dtype: np.dtype) -> Batch:
    """train_step's arrays for a batch: itself, or the micro-batches' weights (by their counted
    targets, nn.accumulation_weights) and every micro-batch's arrays."""
    if grad_accum == 1:
        return batch
    micro = micro_batches(batch, grad_accum)
    weights = nn.accumulation_weights([m[-1] for m in micro], dtype=dtype)
    return (weights, *[a for m in micro for a in m])


def _diverged(norm: float, loss: float) -> FloatingPointError:
    return FloatingPointError(
        f"train: the gradient norm is {norm} (loss {loss}); the run diverged, try a lower --lr"
    )


def _set_lr(optimizer: nn.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


class EagerTrainStep:
    """train_step run eagerly, with the hooks: after_backward(params) (the caller's) and the
    replicas' reduce (the --ddp Allreduce of the gradients, the loss and the stop request)."""

    def __init__(
        self,
        loss_fn: LossFn,
        optimizer: nn.optim.Optimizer,
        grad_clip: float,
        grad_accum: int = 1,
        after_backward: GradHook | None = None,
        replicas: Replicas = SINGLE_PROCESS,
    ) -> None:
        self.loss_fn, self.optimizer = loss_fn, optimizer
        self.grad_clip, self.grad_accum = grad_clip, grad_accum
        self.after_backward, self.replicas = after_backward, replicas
        self.params = [p for group in optimizer.param_groups for p in group["params"]]

    def __call__(
        self, batch: Batch, lr: float, stop: threading.Event | None = None
    ) -> tuple[float, float, bool]:
        """(loss, gradient norm, whether to stop after this step). The batch is this process's
        rows of the global batch; after the reduce every process holds the same averaged
        gradients, so the norm, the clipping and the update are identical everywhere."""
        _set_lr(self.optimizer, lr)
        reduced: list[tuple[float, bool]] = []

        def after_backward(loss: Tensor) -> None:
            if self.after_backward is not None:
                self.after_backward(self.params)
            reduced.append(self.replicas.reduce(loss.item(), stop is not None and stop.is_set()))

        arrays = step_arguments(batch, self.grad_accum, self.params[0].dtype)
        args = (self.loss_fn, self.optimizer, self.params, self.grad_clip, self.grad_accum)
        _, norm = train_step(*args, *arrays, after_backward=after_backward)
        ((loss, stop_now),) = reduced
        if not math.isfinite(norm):
            raise _diverged(norm, loss)
        return loss, norm, stop_now


class CompiledTrainStep:
    """train_step for one process without hooks, through autograd.compile (docs/compile.md).

    Traced on the first call of each batch shape and replayed after; the learning rate reaches
    the replay through the optimizer's param_groups, read at each replay.

    Every step is a replay, the first one too: the traced (eager) call is undone (parameters,
    optimizer state and dropout generators restored in place) and the step replayed. So a run
    resumed from a checkpoint, whose first step traces again, continues with exactly the
    uninterrupted run's losses, with the default fusion (the batch sharded over the BLAS's
    threads), whose rounding differs from eager's.
    """

    def __init__(
        self,
        model: nn.Module,
        loss_fn: LossFn,
        optimizer: nn.optim.Optimizer,
        grad_clip: float,
        fusion: bool | str = True,
        grad_accum: int = 1,
    ) -> None:
        self.model, self.optimizer, self.grad_accum = model, optimizer, grad_accum
        # the trainable parameters: the frozen ones are neither updated nor saved and restored
        self.params = [
            p for group in optimizer.param_groups for p in group["params"] if p.requires_grad
        ]
        args = (loss_fn, optimizer, self.params, grad_clip, grad_accum)
        self.step = autograd.compile(lambda *arrays: train_step(*args, *arrays), fusion=fusion)

    def __call__(
        self, batch: Batch, lr: float, stop: threading.Event | None = None
    ) -> tuple[float, float, bool]:
        _set_lr(self.optimizer, lr)
        arrays = step_arguments(batch, self.grad_accum, self.params[0].dtype)
        plan = self.step.plan_for(*arrays)
        # A call that will trace (a new batch shape, or parameters moved by another shape's
        # plan): trace, undo the traced step, then replay it.
        if plan is None or not plan.still_valid():
            saved = self._state()
            self.step(*arrays)
            self._restore(saved)
        loss, norm = self.step(*arrays)
        loss_value = loss.item()
        if not math.isfinite(norm):
            raise _diverged(norm, loss_value)
        return loss_value, norm, stop is not None and stop.is_set()

    def _state(self) -> tuple[list, list, list]:
        params = [p.data.copy() for p in self.params]
        opt = [
            {k: v.copy() if isinstance(v, np.ndarray) else v for k, v in st.items()}
            if (st := self.optimizer.state.get(p))
            else None
            for p in self.params
        ]
        rngs = [
            (g, copy.deepcopy(g.bit_generator.state))
            for m in self.model.modules()
            for g in vars(m).values()
            if isinstance(g, np.random.Generator)
        ]
        return params, opt, rngs

    def _restore(self, saved: tuple[list, list, list]) -> None:
        """Put the state back in place: the plan holds the arrays (the flat buffers)."""
        params, opt, rngs = saved
        for p, data in zip(self.params, params, strict=True):
            np.copyto(p.data, data)
        for p, before in zip(self.params, opt, strict=True):
            state = self.optimizer.state.get(p, {})
            for k, v in state.items():  # state made by the traced step: back to "none yet"
                old = (before or {}).get(k)
                if isinstance(v, np.ndarray):
                    if old is None:
                        v.fill(0)
                    else:
                        np.copyto(v, old)
                else:
                    state[k] = 0 if old is None else old
        for g, rng_state in rngs:
            g.bit_generator.state = rng_state
