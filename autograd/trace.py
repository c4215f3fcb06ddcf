"""`backward(trace=True)`: print every step of the backward pass as it happens."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from autograd.tensor import Function, Tensor


def _label(tensor: Tensor) -> str:
    return tensor.name or (tensor.op.name if tensor.op is not None else "leaf")


class BackwardTracer:
    """Called by the backward loop once per op (step) and once per leaf reached."""

    def step(
        self,
        index: int,
        fn: Function,
        output: Tensor,
        grad: np.ndarray,
        input_grads: Sequence[np.ndarray | None],
        pending: dict[int, np.ndarray],
    ) -> None:
        print(
            f"[{index:3d}] {fn.name:<10} out {_label(output)} {output.shape}  "
            f"|grad in| = {np.linalg.norm(grad):.6f}"
        )
        for i, (parent, parent_grad) in enumerate(zip(fn.inputs, input_grads, strict=True)):
            if parent_grad is None or not parent.requires_grad:
                continue
            note = "  (accumulates: used more than once)" if id(parent) in pending else ""
            print(
                f"        -> input {i} {_label(parent)} {parent.shape}  "
                f"|grad| = {np.linalg.norm(parent_grad):.6f}{note}"
            )

    def leaf(self, tensor: Tensor, grad: np.ndarray) -> None:
        print(f"      leaf {_label(tensor)} {tensor.shape}  |grad| = {np.linalg.norm(grad):.6f}")
