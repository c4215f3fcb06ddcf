"""`backward(trace=True)`: print every step of the backward pass as it happens.

One block per op, in the order the backward loop runs them (outputs first, notes 10.2). From the
notes' ch. 11 example (`python -m models.worked_example --explain`)::

    [  1] MatMul -> logits (1, 3) float64  from h (1, 2), U (2, 3)  |grad in| = 1.141238
          -> h  (1, 2)  |g| = 1.388622  [[1.260945, 0.581626]]
          -> U  (2, 3)  |g| = 1.671304  [[ 0.248311,  0.425203, -0.673514], [ 0.431008, ...]]
    ...
    [ 16] Embedding -> X (2, 2) float64  from E (3, 2)  |grad in| = 2.050604
          grad of X  |g| = 2.050604  [[1.055387, 0.425203], [1.466503, 0.871611]]  (sum of 4 ...)
          -> E  (3, 2)  |g| = 2.050604  [[1.055387, 0.425203], [1.466503, 0.871611], [0.0000...]]
          leaf E (3, 2): .grad  |g| = 2.050604  [[1.055387, 0.425203], [1.466503, 0.871611], ...]

The header names the step (its index in the backward order), the op, the tensor it produced (its
`.name`, else `<Op output>`) with shape and dtype, the op's inputs, and the norm of the gradient
that arrived (dL/dout). Then one line per input that receives a gradient (dL/din, the op's VJP),
and one line per leaf whose .grad was written. Gradients with at most `max_values` elements are
printed in full, so small examples show the notes' numbers. A tensor used by several ops gets one
contribution from each: the trace marks each contribution added to an earlier one, and at the
tensor's own step prints the sum and how many contributions made it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from autograd import hooks
from autograd.tensor import Function, Tensor


def _label(tensor: Tensor) -> str:
    if tensor.name:
        return tensor.name
    if tensor.op is not None:
        return f"<{tensor.op.name} output>"
    return "<leaf>" if tensor.requires_grad else "<constant>"


def _values(grad: np.ndarray, max_values: int, decimals: int) -> str:
    if grad.size > max_values:
        return ""
    text = np.array2string(
        np.asarray(grad),
        precision=decimals,
        floatmode="fixed",
        separator=", ",
        suppress_small=True,
        max_line_width=10_000,
    )
    return "  " + text.replace("\n", "")  # one line per gradient, also for a matrix


class BackwardTracer(hooks.Observer):
    """Called by the backward loop once per op (step) and once per leaf reached; it keeps its
    own count of the contributions each tensor received, to show accumulations (notes 10.2).

    max_values: print a gradient's elements when it has at most this many (else only its norm).
    decimals: digits after the point for norms and values (6, like the notes' tables).
    """

    def __init__(self, max_values: int = 6, decimals: int = 6) -> None:
        self.max_values = max_values
        self.decimals = decimals
        # id(tensor) -> number of gradient contributions it has received so far.
        self._contributions: dict[int, int] = {}

    def _norm(self, grad: np.ndarray) -> str:
        return f"|g| = {np.linalg.norm(grad):.{self.decimals}f}"

    def _summed(self, tensor: Tensor) -> str:
        count = self._contributions.get(id(tensor), 1)
        return f"  (sum of {count} contributions)" if count > 1 else ""

    def backward_step(
        self,
        index: int,
        fn: Function,
        output: Tensor,
        grad: np.ndarray,
        input_grads: Sequence[np.ndarray | None],
    ) -> None:
        inputs = ", ".join(f"{_label(t)} {t.shape}" for t in fn.inputs)
        print(
            f"[{index:3d}] {fn.name} -> {_label(output)} {output.shape} {output.dtype}"
            f"  from {inputs}  |grad in| = {np.linalg.norm(grad):.{self.decimals}f}"
        )
        # The incoming gradient was already shown where it was produced, unless it is the seed
        # or the sum of several contributions.
        if id(output) not in self._contributions or self._summed(output):
            print(
                f"      grad of {_label(output)}  {self._norm(grad)}"
                f"{_values(grad, self.max_values, self.decimals)}{self._summed(output)}"
            )
        for parent, parent_grad in zip(fn.inputs, input_grads, strict=True):
            if parent_grad is None or not parent.requires_grad:
                continue
            # Counted per contribution, so that x * x (two from one step) is caught too.
            seen = self._contributions.get(id(parent), 0)
            self._contributions[id(parent)] = seen + 1
            note = f"  (adds to {seen} earlier: used more than once)" if seen else ""
            print(
                f"      -> {_label(parent)}  {parent.shape}  {self._norm(parent_grad)}"
                f"{_values(parent_grad, self.max_values, self.decimals)}{note}"
            )

    def leaf(self, tensor: Tensor, grad: np.ndarray) -> None:
        print(
            f"      leaf {_label(tensor)} {tensor.shape}: .grad  {self._norm(grad)}"
            f"{_values(grad, self.max_values, self.decimals)}{self._summed(tensor)}"
        )


hooks.TRACER = BackwardTracer
