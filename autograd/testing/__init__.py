"""Checking an op, like numpy.testing: `check_op` is the one call that every op of glassgrad
passes, and that an op of your own can pass too.

>>> import numpy as np
>>> from autograd.testing import check_op
>>> check_op(lambda x: (x * x).sum(axis=0), lambda a: (a * a).sum(axis=0), [np.ones((2, 3))])

It checks, in float64: the forward against the same maths written with plain numpy; the backward
against central differences (autograd.gradcheck, with a step scaled to the inputs' magnitude); and
the discipline every VJP keeps (backward changes none of its arguments and returns fresh arrays).
A failure is an AssertionError naming the worst element (a GradcheckError for the gradient).

`check_op_twice` does the same one order up (the double backward that create_graph=True builds).
`check_jvp` checks the op's forward-mode rule (Function.jvp): J v against central differences
along a random direction, and against the op's own VJP by the transpose identity
<J v, u> = <v, J^T u>.
`autograd.testing.references` holds numpy references of the Transformer ops (softmax, layernorm,
attention, ...). `autograd.testing.strategies` holds reusable hypothesis strategies (shapes with
size-1 and broadcast dims, values with large magnitudes, exact zeros, -inf masks); it is the only
part that imports hypothesis, a test dependency: `autograd.testing` itself imports without it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from autograd import forward_ad
from autograd.gradcheck import gradcheck, gradgradcheck
from autograd.tensor import Tensor, set_default_dtype

# The property suite's bar: |analytic - numeric| <= TOLERANCE * (1 + |numeric|) on every element.
TOLERANCE = 1e-6


@dataclass(frozen=True)
class Example:
    """One case to check: check_op(op, reference, arrays, differentiable, forward_rtol)."""

    op: Callable
    reference: Callable | None
    arrays: list
    differentiable: list | None = None
    forward_rtol: float = 1e-10


def check_op(
    op: Callable[..., Tensor],
    reference: Callable[..., np.ndarray] | None,
    arrays: Sequence[np.ndarray],
    differentiable: Sequence[bool] | None = None,
    forward_rtol: float = 1e-10,
    eps: float | None = None,
) -> None:
    """Check `op` (Tensors -> Tensor) on float64 copies of `arrays`.

    Forward: equal to `reference` (the same maths written with plain numpy; None skips it) within
    forward_rtol. Backward: every input marked differentiable (all by default; the others are
    passed as plain arrays) is gradchecked against central differences with
    atol = rtol = TOLERANCE. The default step grows with the inputs' magnitude,
    1e-6 * max(1, |x|)^(1/3), balancing rounding error in L (which grows with |x|) against
    truncation error (which grows with the step): at |x| ~ 1e3 the step is 1e-5.
    Every node's VJP is also called by hand to check it mutates nothing and aliases nothing.
    Sets the default dtype to float64 (central differences need it).
    """
    inputs = _float64_inputs(arrays, differentiable)
    out = op(*inputs)
    assert out.dtype == np.float64, f"float64 in, {out.dtype} out"
    if reference is not None:
        expected = reference(*[np.array(a, dtype=np.float64) for a in arrays])
        np.testing.assert_allclose(out.data, expected, rtol=forward_rtol, atol=forward_rtol)
    check_vjp_discipline(out)
    op_of_tensors, tensors, eps = _of_tensors(op, inputs, eps)
    gradcheck(op_of_tensors, tensors, eps=eps, atol=TOLERANCE, rtol=TOLERANCE)


def check_op_twice(
    op: Callable[..., Tensor],
    arrays: Sequence[np.ndarray],
    differentiable: Sequence[bool] | None = None,
    eps: float | None = None,
) -> None:
    """gradgradcheck `op` on float64 copies of `arrays` (the same tolerance and step as check_op):
    the create_graph gradient against central differences of the op, then its derivatives (the
    double backward) against central differences of that gradient."""
    inputs = _float64_inputs(arrays, differentiable)
    op_of_tensors, tensors, eps = _of_tensors(op, inputs, eps)
    gradgradcheck(op_of_tensors, tensors, eps=eps, atol=TOLERANCE, rtol=TOLERANCE)


def check_example(example: Example) -> None:
    """check_op on an Example."""
    check_op(
        example.op,
        example.reference,
        example.arrays,
        example.differentiable,
        forward_rtol=example.forward_rtol,
    )


def check_example_twice(example: Example) -> None:
    """check_op_twice on an Example."""
    check_op_twice(example.op, example.arrays, example.differentiable)


def check_jvp(
    op: Callable[..., Tensor],
    arrays: Sequence[np.ndarray],
    differentiable: Sequence[bool] | None = None,
    eps: float | None = None,
    seed: int = 2,
) -> None:
    """The JVP rules of `op`'s primitives on float64 copies of `arrays`, two ways:

    1. J v (one forward pass with the JVP rules, autograd.forward_ad) against the central
       difference (f(x + eps v) - f(x - eps v)) / (2 eps) along a random direction v, scaled
       like check_op's steps (by max(1, |x|) per element; 0 on non-finite inputs), within
       TOLERANCE * (1 + |numeric|) on every finite output element;
    2. the transpose identity <J v, u> = <v, J^T u> for a random cotangent u (0 on non-finite
       outputs), J^T u from the op's own VJP: a rule and its transpose checked against each
       other, to rounding (1e-9 of the sum of the terms' magnitudes, and at least 1e-12 of
       |u|_1 max|v|: rounding relative to the values J v is made from).
    """
    inputs = _float64_inputs(arrays, differentiable)
    _, tensors, eps = _of_tensors(op, inputs, eps)
    rng = np.random.default_rng(seed)
    directions = {
        id(t): np.where(
            np.isfinite(t.data), rng.standard_normal(t.shape) * np.maximum(1, np.abs(t.data)), 0
        )
        for t in tensors
    }

    def at(step: float) -> np.ndarray:
        moved = [
            Tensor(x.data + step * directions[id(x)]) if isinstance(x, Tensor) else x
            for x in inputs
        ]
        return np.asarray(op(*moved).data, dtype=np.float64)

    with forward_ad.dual_level():
        duals = [
            forward_ad.make_dual(Tensor(x.data), directions[id(x)]) if isinstance(x, Tensor) else x
            for x in inputs
        ]
        value, tangent = forward_ad.unpack_dual(op(*duals))
    finite = np.isfinite(value.data)
    tangent = np.zeros(value.shape) if tangent is None else tangent
    assert np.isfinite(tangent[finite]).all(), "the JVP is not finite where the output is"
    with np.errstate(invalid="ignore"):
        numeric = np.where(finite, (at(eps) - at(-eps)) / (2 * eps), 0)
    analytic = np.where(finite, tangent, 0)
    bad = np.abs(analytic - numeric) > TOLERANCE * (1 + np.abs(numeric))
    assert not bad.any(), (
        f"JVP vs central differences: {int(bad.sum())} element(s) off, the first at "
        f"{np.argwhere(bad)[0].tolist()}: analytic {float(analytic[bad][0]):.12g}, "
        f"numeric {float(numeric[bad][0]):.12g}"
    )

    u = np.where(finite, rng.standard_normal(value.shape), 0)
    out = op(*inputs)
    for t in tensors:
        t.grad = None
    out.backward(u)
    forward_terms = analytic * u
    reverse_terms = [directions[id(t)] * t.grad for t in tensors]
    lhs, rhs = forward_terms.sum(), sum(r.sum() for r in reverse_terms)
    scale = np.abs(forward_terms).sum() + sum(np.abs(r).sum() for r in reverse_terms)
    # J v and J^T u round relative to the values they are made from, not to themselves: softmax's
    # p (v - <p, v>) cancels to ~1e-16 |v| where a p underflows (terms of 1e-261 then disagree)
    largest_v = max((np.abs(d).max(initial=0) for d in directions.values()), default=0)
    floor = 1e-12 * np.abs(u).sum() * largest_v
    assert abs(lhs - rhs) <= 1e-9 * scale + floor + 1e-300, (
        f"transpose identity: <J v, u> = {float(lhs):.12g} but <v, J^T u> = {float(rhs):.12g}"
    )


def check_example_jvp(example: Example) -> None:
    """check_jvp on an Example."""
    check_jvp(example.op, example.arrays, example.differentiable)


def check_vjp_discipline(out: Tensor, seed: int = 1) -> None:
    """MyGrad's checks, on every node of out's graph: backward(g) leaves g, the node's inputs and
    its output unchanged, and the gradients it returns share memory with none of g, the inputs or
    each other (the engine adopts a returned array as .grad without copying it)."""
    rng = np.random.default_rng(seed)
    nodes, seen, stack = [], set(), [out]
    while stack:
        t = stack.pop()
        if t.op is None or id(t) in seen:
            continue
        seen.add(id(t))
        nodes.append((t.op, t))
        stack.extend(t.op.inputs)
    for fn, output in nodes:
        g = rng.standard_normal(output.shape).astype(output.dtype)
        before = [g.copy(), output.data.copy(), *(t.data.copy() for t in fn.inputs)]
        grads = fn.backward(g)
        after = [g, output.data, *(t.data for t in fn.inputs)]
        labels = ["g", "its output", *(f"input {i}" for i in range(len(fn.inputs)))]
        for label, b, a in zip(labels, before, after, strict=True):
            np.testing.assert_array_equal(a, b, err_msg=f"{fn.name}.backward changed {label}")
        grads = [r for r in grads if r is not None]
        for i, r in enumerate(grads):
            others = [g, *(t.data for t in fn.inputs), *grads[:i]]
            assert not any(np.shares_memory(r, o) for o in others), (
                f"{fn.name}.backward: gradient {i} shares memory with g, an input or another "
                "gradient"
            )


def _float64_inputs(arrays, differentiable):
    set_default_dtype(np.float64)
    differentiable = differentiable or [True] * len(arrays)
    return [
        Tensor(np.array(a, dtype=np.float64), requires_grad=d) if d else a
        for a, d in zip(arrays, differentiable, strict=True)
    ]


def _of_tensors(op, inputs, eps):
    """op as a function of its Tensor inputs only, those inputs, and the central-difference step
    (see check_op) when eps is None."""
    tensors = [t for t in inputs if isinstance(t, Tensor)]
    if eps is None:
        finite = [np.abs(t.data[np.isfinite(t.data)]) for t in tensors]
        magnitude = max([1.0] + [float(f.max()) for f in finite if f.size])
        eps = 1e-6 * magnitude ** (1 / 3)

    def op_of_tensors(*ts):
        it = iter(ts)
        return op(*[next(it) if isinstance(x, Tensor) else x for x in inputs])

    return op_of_tensors, tensors, eps


__all__ = [
    "TOLERANCE",
    "Example",
    "check_example",
    "check_example_jvp",
    "check_example_twice",
    "check_jvp",
    "check_op",
    "check_op_twice",
    "check_vjp_discipline",
]
