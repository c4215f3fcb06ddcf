"""Central-difference gradient checking (notes 11.7).

For a function f of tensors, the analytic gradient of L = sum(f(x) * R) (R a fixed random array,
so that every output element matters) is compared, element by element of every input, with
(L(x + eps e_i) - L(x - eps e_i)) / (2 eps).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from autograd.tensor import Tensor


@dataclass
class GradcheckResult:
    """The worst element over all inputs: where it is, and both values."""

    ok: bool
    max_abs_error: float
    max_rel_error: float
    input_index: int
    element_index: tuple[int, ...]
    analytic: float
    numeric: float

    def __str__(self) -> str:
        return (
            f"gradcheck {'passed' if self.ok else 'FAILED'}: worst element is input "
            f"{self.input_index}{list(self.element_index)}: analytic {self.analytic:.12g}, "
            f"numeric {self.numeric:.12g} (abs error {self.max_abs_error:.3g}, "
            f"rel error {self.max_rel_error:.3g})"
        )


class GradcheckError(AssertionError):
    def __init__(self, result: GradcheckResult) -> None:
        super().__init__(str(result))
        self.result = result


def gradcheck(
    fn: Callable[..., Tensor],
    inputs: Sequence[Tensor],
    eps: float = 1e-6,
    atol: float = 1e-6,
    rtol: float = 1e-6,
    seed: int = 0,
    raise_exception: bool = True,
) -> GradcheckResult:
    """Check fn's analytic gradients against central differences on every input element.

    Non-finite input elements (a legal -inf mask) are not perturbed, and non-finite output elements
    are left out of L. Inputs with requires_grad=True are checked; they must be float64
    (float32 differences are too coarse). An element passes when
    |analytic - numeric| <= atol + rtol * |numeric|; the reported relative error is
    |analytic - numeric| / max(1, |analytic|, |numeric|).
    Raises GradcheckError naming the worst element unless raise_exception=False.
    """
    checked = [i for i, t in enumerate(inputs) if t.requires_grad]
    if not checked:
        raise ValueError("gradcheck: no input has requires_grad=True")
    for i in checked:
        if inputs[i].dtype != np.float64:
            raise TypeError(
                f"gradcheck: input {i} has dtype {inputs[i].dtype}; use float64 "
                "(autograd.set_default_dtype(np.float64)) for central differences"
            )
    out = fn(*inputs)
    # Legal non-finite outputs (log_softmax of -inf is -inf) are left out of L: weight 0.
    finite = np.isfinite(out.data)
    weights = np.where(finite, np.random.default_rng(seed).standard_normal(out.shape), 0.0)

    def loss() -> float:
        value = np.asarray(fn(*inputs).data, dtype=np.float64)
        return float(np.sum(np.where(finite, value, 0.0) * weights))

    for t in inputs:
        t.grad = None
    out.backward(weights.astype(out.dtype))

    # (failed, rel error, input, element, analytic, numeric, abs error) of the worst element so far
    worst = (False, 0.0, checked[0], (0,) * inputs[checked[0]].ndim, 0.0, 0.0, 0.0)
    for i in checked:
        x = inputs[i].data
        analytic = inputs[i].grad if inputs[i].grad is not None else np.zeros_like(x)
        for index in np.ndindex(x.shape):
            original = x[index]
            if not np.isfinite(original):  # -inf has no neighbourhood: only ask for a finite grad
                if not np.isfinite(analytic[index]):
                    worst = (True, np.inf, i, index, float(analytic[index]), 0.0, np.inf)
                continue
            step = eps * max(1.0, abs(float(original)))  # relative step for large magnitudes
            x[index] = original + step
            plus = loss()
            x[index] = original - step
            minus = loss()
            x[index] = original
            numeric = (plus - minus) / (2 * step)
            a = float(analytic[index])
            abs_error = abs(a - numeric)
            rel_error = abs_error / max(1.0, abs(a), abs(numeric))
            passed = abs_error <= atol + rtol * abs(numeric)
            candidate = (not passed, rel_error, i, index, a, numeric, abs_error)
            if candidate[:2] > worst[:2]:
                worst = candidate
    failed, rel_error, i, index, a, numeric, abs_error = worst
    result = GradcheckResult(not failed, abs_error, rel_error, i, tuple(index), a, numeric)
    if failed and raise_exception:
        raise GradcheckError(result)
    return result
