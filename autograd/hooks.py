"""Observers of the engine: concerns that watch the graph core without living inside it.

The core calls every active observer at two points: after an op's forward (`forward`) and after
each VJP of the backward loop (`backward_step`, and `leaf` when a leaf's .grad is written). Anomaly
mode (autograd/anomaly.py) and the backward trace (autograd/viz/trace.py) are the two observers.
With none active the core pays one empty-list check per op.
"""

from __future__ import annotations

from typing import Any


class Observer:
    """Override the events you need; the defaults do nothing."""

    def forward(self, fn: Any, out: Any, arrays: Any) -> None:
        """fn.forward(*arrays) returned `out` (before the node is recorded)."""

    def backward_step(self, step: int, fn: Any, output: Any, grad: Any, input_grads: Any) -> None:
        """fn.backward(grad) returned `input_grads`; `output` is the tensor fn produced."""

    def leaf(self, tensor: Any, grad: Any) -> None:
        """`grad` was accumulated into the leaf `tensor`'s .grad."""


# Observers of every forward and backward in the process (detect_anomaly() adds one while active).
ACTIVE: list[Observer] = []

# The factory of the observer `backward(trace=True)` uses; autograd/viz/trace.py registers it.
TRACER: Any = None

# While autograd.compile traces a step: its recorder (autograd/compile/recorder.py), told of
# every op, every backward pass, every read of a tensor's value and every optimizer update;
# else None.
RECORDER: Any = None
