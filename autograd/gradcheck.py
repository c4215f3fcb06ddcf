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
    n_failed: int = 0  # elements outside atol + rtol * |numeric|

    def __str__(self) -> str:
        return (
            f"gradcheck {'passed' if self.ok else 'FAILED'}: worst element is input "
            f"{self.input_index}{list(self.element_index)}: analytic {self.analytic:.12g}, "
            f"numeric {self.numeric:.12g} (abs error {self.max_abs_error:.3g}, "
            f"rel error {self.max_rel_error:.3g}); {self.n_failed} element(s) out of tolerance"
        )


def _errors(analytic: float, numeric: float) -> tuple[float, float]:
    """|analytic - numeric|, and that over max(1, |analytic|, |numeric|); NaN counts as inf."""
    abs_error = abs(analytic - numeric)
    if not np.isfinite(abs_error):
        return np.inf, np.inf
    return abs_error, abs_error / max(1.0, abs(analytic), abs(numeric))


def _tolerance(atol: float, rtol: float, numeric: float) -> float:
    """atol + rtol * |numeric|, never NaN: an infinite rtol times a zero derivative adds nothing."""
    return atol + (rtol * abs(numeric) if numeric != 0 else 0.0)


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

    # (failed, rel error, input, element, analytic, numeric, abs error) of the worst element so far:
    # a failing element outranks any passing one; among equals the larger relative error wins.
    worst = (False, -1.0, checked[0], (0,) * inputs[checked[0]].ndim, 0.0, 0.0, 0.0)
    n_failed = 0
    for i in checked:
        x = inputs[i].data
        analytic = inputs[i].grad if inputs[i].grad is not None else np.zeros_like(x)
        for index in np.ndindex(x.shape):
            original = x[index]
            a = float(analytic[index])
            if not np.isfinite(original):  # -inf has no neighbourhood: only ask for a finite grad
                passed, numeric = bool(np.isfinite(a)), 0.0
                abs_error = rel_error = 0.0 if passed else np.inf
            else:
                step = eps * max(1.0, abs(float(original)))  # relative step for large magnitudes
                x[index] = original + step
                plus = loss()
                x[index] = original - step
                minus = loss()
                x[index] = original
                numeric = (plus - minus) / (2 * step)
                abs_error, rel_error = _errors(a, numeric)
                passed = abs_error <= _tolerance(atol, rtol, numeric)
            n_failed += not passed
            candidate = (not passed, rel_error, i, index, a, numeric, abs_error)
            if candidate[:2] > worst[:2]:
                worst = candidate
    failed, rel_error, i, index, a, numeric, abs_error = worst
    result = GradcheckResult(
        not failed, abs_error, max(rel_error, 0.0), i, tuple(index), a, numeric, n_failed
    )
    if failed and raise_exception:
        raise GradcheckError(result)
    return result
