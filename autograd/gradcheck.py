"""Central-difference gradient checking (notes 11.7), of first and second derivatives.

For a function f of tensors, the analytic gradient of L = sum(f(x) * R) (R a fixed random array,
so that every output element matters) is compared, element by element of every input, with
(L(x + eps e_i) - L(x - eps e_i)) / (2 eps). gradgradcheck does the same one order up: f is
then the gradient that create_graph=True builds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from autograd.higher_order import grad
from autograd.ops import concat
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
    check: str = "gradcheck"  # which check, as the report names it

    def __str__(self) -> str:
        return (
            f"{self.check} {'passed' if self.ok else 'FAILED'}: worst element is input "
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
    create_graph: bool = False,
    check: str = "gradcheck",
) -> GradcheckResult:
    """Check fn's analytic gradients against central differences on every input element.

    Non-finite input elements (a legal -inf mask) are not perturbed, and non-finite output elements
    are left out of L. Inputs with requires_grad=True are checked; they must be float64
    (float32 differences are too coarse). An element passes when
    |analytic - numeric| <= atol + rtol * |numeric|; the reported relative error is
    |analytic - numeric| / max(1, |analytic|, |numeric|).
    create_graph=True: the analytic gradient is the one autograd.grad(create_graph=True) builds
    from the ops' differentiable VJPs (Function.vjp) instead of backward's.
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

    if create_graph:
        found = grad(
            out, [inputs[i] for i in checked], weights, create_graph=True, allow_unused=True
        )
        grads = {i: None if g is None else g.data for i, g in zip(checked, found, strict=True)}
    else:
        for t in inputs:
            t.grad = None
        out.backward(weights.astype(out.dtype))
        grads = {i: inputs[i].grad for i in checked}

    # (failed, rel error, input, element, analytic, numeric, abs error) of the worst element so far:
    # a failing element outranks any passing one; among equals the larger relative error wins.
    worst = (False, -1.0, checked[0], (0,) * inputs[checked[0]].ndim, 0.0, 0.0, 0.0)
    n_failed = 0
    for i in checked:
        x = inputs[i].data
        analytic = grads[i] if grads[i] is not None else np.zeros_like(x)
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
                # a NaN/Inf derivative never passes, not even against an infinite tolerance
                passed = bool(np.isfinite(abs_error)) and abs_error <= _tolerance(
                    atol, rtol, numeric
                )
            n_failed += not passed
            candidate = (not passed, rel_error, i, index, a, numeric, abs_error)
            if candidate[:2] > worst[:2]:
                worst = candidate
    failed, rel_error, i, index, a, numeric, abs_error = worst
    result = GradcheckResult(
        not failed, abs_error, max(rel_error, 0.0), i, tuple(index), a, numeric, n_failed, check
    )
    if failed and raise_exception:
        raise GradcheckError(result)
    return result


def gradgradcheck(
    fn: Callable[..., Tensor],
    inputs: Sequence[Tensor],
    eps: float = 1e-6,
    atol: float = 1e-6,
    rtol: float = 1e-6,
    seed: int = 0,
    raise_exception: bool = True,
) -> GradcheckResult:
    """Check fn's second derivatives (its double backward) against central differences.

    Two gradchecks, each reporting its worst element like gradcheck:
    1. the first gradient that create_graph=True builds (the ops' differentiable VJPs) against
       central differences of fn, so that the function differentiated next is the right one;
    2. that gradient as a function of the inputs and of the cotangent v (a fixed random array of
       fn's output shape, 0 on non-finite outputs), G(x, v) = grad(fn(x), x, v,
       create_graph=True), checked by gradcheck: its derivative with respect to x is the double
       backward, its derivative with respect to v the Jacobian the VJP applies. In the report of
       this check, input len(inputs) is v.
    Returns the result of check 2 (check 1 raises, or is returned, when it fails).
    """
    checked = [i for i, t in enumerate(inputs) if t.requires_grad]
    check = "gradgradcheck (first gradient, create_graph)"
    first = gradcheck(fn, inputs, eps, atol, rtol, seed, False, create_graph=True, check=check)
    if not first.ok:
        if raise_exception:
            raise GradcheckError(first)
        return first
    out = fn(*inputs)
    finite = np.isfinite(out.data)
    rng = np.random.default_rng(seed + 1)
    v = Tensor(np.where(finite, rng.standard_normal(out.shape), 0.0), requires_grad=True)

    def first_gradient(*args: Tensor) -> Tensor:
        *xs, cotangent = args
        wrt = [xs[i] for i in checked]
        found = grad(fn(*xs), wrt, cotangent * finite, create_graph=True, allow_unused=True)
        flat = [
            Tensor(np.zeros(x.size), dtype=x.dtype) if g is None else g.reshape(-1)
            for g, x in zip(found, wrt, strict=True)
        ]
        return concat(flat, axis=0)

    check = f"gradgradcheck (second derivatives; input {len(inputs)} is the cotangent v)"
    return gradcheck(
        first_gradient, [*inputs, v], eps, atol, rtol, seed + 2, raise_exception, check=check
    )
