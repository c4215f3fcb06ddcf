"""How a compiled step asks the optimizer for its update over flat buffers (fusion=True/"exact").

The engine sits below nn: it knows no optimizer class, parameter group or state entry, and moves
no parameter itself. It asks each optimizer whose step() the trace recorded (an nn.optim
Optimizer) for one thing:

    optimizer.fused_update(trained) -> FusedUpdate | None

`trained` holds the leaves (parameters) this step's backward sends a gradient to. None means
"replay my step()" (the base class's answer; Adam's when a parameter gets no gradient this step,
when dtypes or step counts differ, or for a subclass that changes the update). Otherwise the
optimizer has moved its parameters, gradients and state into flat buffers of its own, by its own
hand, and returns a FusedUpdate; `fused_update` below binds the parameters' new arrays and
gradient buffers to the plan's slots, so that the backward writes each gradient where the update
reads it. nn.optim.Adam and AdamW answer with nn.optim.FlatAdam (its arithmetic:
autograd/kernels/adam.py, also what their eager step() runs).
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from autograd.tensor import Tensor


class FusedUpdate(Protocol):
    """An optimizer's step over flat buffers, as plan.py and shard.py run it."""

    note: str  # one line for the plan's description
    flat_grad: np.ndarray  # every gradient, one array: a sharded step adds the other shards' here
    grad_buffers: list[tuple[Tensor, np.ndarray]]  # (parameter, its gradient: a view of flat_grad)

    def __call__(self) -> None:
        """The whole step: update(), then count()."""

    def update(self, part: int = 0, parts: int = 1) -> None:
        """Update piece `part` of `parts` (a batch-sharded step runs the pieces on its threads)."""

    def count(self) -> None:
        """Count the step, once, after every piece is updated."""


class Fusable(Protocol):
    """What the engine asks of an optimizer (nn.optim.Optimizer; its default answer is None)."""

    def fused_update(self, trained: list[Tensor]) -> FusedUpdate | None: ...


def fused_update(slots: Any, optimizer: Fusable, with_grad: set[int]) -> FusedUpdate | None:
    """The optimizer's FusedUpdate for this step, or None; called before the program is built.
    slots: a Plan (or shard.py's leaf slots), whose `vals` / `grads` of the parameters' leaves
    are set to the parameters' new arrays and gradient buffers."""
    step = optimizer.fused_update([v.tensor for v in slots.leaves if v.id in with_grad])
    if step is not None:
        leaf_of = {id(v.tensor): v for v in slots.leaves}
        for p, grad in step.grad_buffers:
            slots.vals[leaf_of[id(p)].id] = p.data
            slots.grads[leaf_of[id(p)].id] = grad
    return step
