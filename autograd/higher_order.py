"""Gradients as values: autograd.grad, and what it builds: vjp, hessian, and the reverse-mode
versions of a JVP and an HVP that forward mode (autograd/forward_ad.py) is measured against.

`grad(outputs, inputs)` runs the same backward loop as `Tensor.backward` (autograd/tensor.py) but
returns the gradients instead of adding them to .grad. With `create_graph=True` the loop calls each
op's differentiable VJP (`Function.vjp`: the op's backward run on Tensors, see autograd/ops.py), so
the backward pass records a graph of its own, "just another program": the gradients it returns
can be differentiated again, any number of times (docs/higher_order.md).

    x = Tensor([1.0, 2.0], requires_grad=True)
    (g,) = autograd.grad((x ** 3).sum(), x, create_graph=True)   # 3 x^2, a Tensor with a graph
    (h,) = autograd.grad(g.sum(), x)                              # 6 x

J v without forward mode (`jvp_by_transpose`): J v is the derivative of the VJP u -> J^T u (which
is linear in u) along v, so it is two reverse passes, the first with create_graph. H v without
forward mode (`hvp_by_double_backward`): the gradient of <grad f, v>, reverse over reverse. The
engine's `autograd.jvp` and `autograd.hvp` use the JVP rules instead (one pass; forward over
reverse); these two stay as the reference they are checked and measured against
(docs/forward_mode.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from autograd import hooks
from autograd.tensor import Tensor, run_backward, seed_gradient


def _as_tuple(items: Any) -> tuple:
    return tuple(items) if isinstance(items, (list, tuple)) else (items,)


def grad(
    outputs: Tensor | Sequence[Tensor],
    inputs: Tensor | Sequence[Tensor],
    grad_outputs: Any = None,
    retain_graph: bool | None = None,
    create_graph: bool = False,
    allow_unused: bool = False,
) -> tuple[Tensor | None, ...]:
    """d(sum_i <outputs_i, grad_outputs_i>)/d(inputs_j), one Tensor per input (torch.autograd.grad).

    grad_outputs: one per output (arrays or Tensors); may be omitted for one-element outputs
    (then 1). A Tensor that requires grad stays part of the graph under create_graph, so the
    result can be differentiated with respect to it too (jvp relies on this).
    retain_graph: keep the graph for another backward (default: create_graph).
    create_graph: the gradients are Tensors with a graph, differentiable again.
    allow_unused: an input that no output depends on gets None instead of an error.
    The inputs' .grad is left alone.
    """
    outputs, inputs = _as_tuple(outputs), _as_tuple(inputs)
    seeds = [None] * len(outputs) if grad_outputs is None else list(_as_tuple(grad_outputs))
    if len(seeds) != len(outputs):
        raise ValueError(f"grad: {len(outputs)} outputs but {len(seeds)} grad_outputs")
    for i, t in enumerate(inputs):
        if not isinstance(t, Tensor) or not t.requires_grad:
            raise ValueError(f"grad: input {i} is not a Tensor that requires grad")
    roots, root_seeds = [], []
    for i, (out, seed) in enumerate(zip(outputs, seeds, strict=True)):
        if not isinstance(out, Tensor):
            raise TypeError(f"grad: output {i} is a {type(out).__name__}, not a Tensor")
        if not out.requires_grad:
            continue  # a constant output: it contributes nothing (an error below if nothing does)
        if create_graph and isinstance(seed, Tensor):
            if seed.shape != out.shape:
                raise ValueError(
                    f"grad: grad_outputs[{i}] has shape {seed.shape}, output {out.shape}"
                )
            root_seeds.append(seed)
        else:
            array = seed_gradient(out, seed, "grad")
            root_seeds.append(Tensor._make(array, False) if create_graph else array)
        roots.append(out)
    if not roots:
        raise RuntimeError("grad: no output requires grad; there is no graph to differentiate")
    retain = create_graph if retain_graph is None else retain_graph
    found = run_backward(roots, root_seeds, retain, list(hooks.ACTIVE), create_graph, inputs)
    results = []
    for i, g in enumerate(found):
        if g is None and not allow_unused:
            raise RuntimeError(
                f"grad: input {i} (shape {inputs[i].shape}) is not used by the outputs' graph; "
                "pass allow_unused=True to get None for it"
            )
        results.append(g if g is None or isinstance(g, Tensor) else Tensor._make(g, False))
    return tuple(results)


def _leaves(primals: Any) -> tuple[Tensor, ...]:
    """Fresh leaf Tensors holding the primals' values (a Tensor keeps its dtype)."""
    return tuple(
        Tensor(p.data.copy(), requires_grad=True, dtype=p.dtype)
        if isinstance(p, Tensor)
        else Tensor(p, requires_grad=True)
        for p in _as_tuple(primals)
    )


def _zeros_for_unused(grads: Sequence[Tensor | None], like: Sequence[Tensor]) -> tuple[Tensor, ...]:
    return tuple(
        Tensor._make(np.zeros_like(t.data), False) if g is None else g
        for g, t in zip(grads, like, strict=True)
    )


def vjp(fn: Callable[..., Any], primals: Any) -> tuple[Any, Callable[..., Any]]:
    """(fn(*primals), vjp_fn), JAX-style: vjp_fn(cotangent) -> one gradient per primal.

    cotangent has the structure of fn's output (one array/Tensor, or a tuple of them); vjp_fn
    can be called any number of times (the graph is kept).
    """
    xs = _leaves(primals)
    out = fn(*xs)
    outs = _as_tuple(out)

    def vjp_fn(cotangent: Any) -> tuple[Tensor, ...]:
        grads = grad(outs, xs, _as_tuple(cotangent), retain_graph=True, allow_unused=True)
        return _zeros_for_unused(grads, xs)

    return out, vjp_fn


def jvp_by_transpose(fn: Callable[..., Any], primals: Any, tangents: Any) -> tuple[Any, Any]:
    """(fn(*primals), J v) for tangents v, JAX-style (one tangent per primal, tuples in and out).

    By two reverse passes (the transpose trick, no JVP rule used): g(u) = J^T u is computed with
    create_graph for a dummy cotangent u (g is linear in u, so u's value does not matter), and
    J v = d<g(u), v>/du.
    """
    xs = _leaves(primals)
    vs = _as_tuple(tangents)
    if len(vs) != len(xs):
        raise ValueError(f"jvp: {len(xs)} primals but {len(vs)} tangents")
    for i, (x, v) in enumerate(zip(xs, vs, strict=True)):
        if np.shape(v.data if isinstance(v, Tensor) else v) != x.shape:
            raise ValueError(f"jvp: tangent {i} has shape {np.shape(v)}, primal {x.shape}")
    out = fn(*xs)
    outs = _as_tuple(out)
    us = [Tensor(np.zeros_like(o.data), requires_grad=True) for o in outs]
    live = [i for i, o in enumerate(outs) if o.requires_grad]
    tangent_outs = [Tensor._make(np.zeros_like(o.data), False) for o in outs]
    if live:
        roots = [outs[i] for i in live]
        gs = grad(roots, xs, [us[i] for i in live], create_graph=True, allow_unused=True)
        pairs = [(g, v) for g, v in zip(gs, vs, strict=True) if g is not None and g.requires_grad]
        if pairs:
            found = grad(
                [g for g, _ in pairs],
                [us[i] for i in live],
                [v.data if isinstance(v, Tensor) else v for _, v in pairs],
                allow_unused=True,
            )
            for i, t in zip(live, found, strict=True):
                if t is not None:
                    tangent_outs[i] = t
    detached = tuple(o.detach() for o in outs)
    if isinstance(out, (list, tuple)):
        return detached, tuple(tangent_outs)
    return detached[0], tangent_outs[0]


def _scalar(fn: Callable[..., Any], xs: Sequence[Tensor], caller: str) -> Tensor:
    y = fn(*xs)
    if not isinstance(y, Tensor) or y.size != 1:
        raise ValueError(f"{caller}: fn must return a one-element Tensor, got {np.shape(y)}")
    return y


def _inputs_of(inputs: Any) -> tuple[Tensor, ...]:
    """Tensors that require grad are used as they are (a model's parameters, read by fn through
    the model); anything else becomes a fresh leaf."""
    return tuple(
        t if isinstance(t, Tensor) and t.requires_grad else _leaves(t)[0] for t in _as_tuple(inputs)
    )


def hvp_by_double_backward(fn: Callable[..., Tensor], inputs: Any, v: Any) -> tuple[Tensor, Any]:
    """(fn(*inputs), H v) for a scalar fn: the gradient of <grad fn, v> (reverse over reverse).

    inputs: a Tensor or a sequence; v has the same structure. Input Tensors that require grad
    are differentiated as they are, so fn may ignore its arguments and read them from a model.
    """
    xs = _inputs_of(inputs)
    vs = _as_tuple(v)
    if len(vs) != len(xs):
        raise ValueError(f"hvp: {len(xs)} inputs but {len(vs)} vectors")
    y = _scalar(fn, xs, "hvp")
    gs = grad(y, xs, create_graph=True, allow_unused=True)
    terms = [
        (g * (u.data if isinstance(u, Tensor) else u)).sum()
        for g, u in zip(gs, vs, strict=True)
        if g is not None and g.requires_grad
    ]
    if terms:
        dot = terms[0]
        for term in terms[1:]:
            dot = dot + term
        hv = _zeros_for_unused(grad(dot, xs, allow_unused=True), xs)
    else:  # fn is at most linear in its inputs: H = 0
        hv = _zeros_for_unused([None] * len(xs), xs)
    return y.detach(), hv if isinstance(inputs, (list, tuple)) else hv[0]


def hessian(fn: Callable[[Tensor], Tensor], x: Any) -> Tensor:
    """d^2 fn / dx dx for a scalar fn of one (small) input: shape x.shape + x.shape.

    One reverse pass through the gradient's graph per element of x (row i: grad of g[i]).
    """
    (leaf,) = _inputs_of(x)
    y = _scalar(fn, [leaf], "hessian")
    (g,) = grad(y, leaf, create_graph=True, allow_unused=True)
    rows = np.zeros((leaf.size, leaf.size), dtype=leaf.dtype)
    if g is not None and g.requires_grad:
        for i in range(leaf.size):
            e = np.zeros(leaf.shape, dtype=leaf.dtype)
            e.flat[i] = 1
            (row,) = grad(g, leaf, e, retain_graph=True, allow_unused=True)
            if row is not None:
                rows[i] = row.data.reshape(-1)
    return Tensor._make(rows.reshape(leaf.shape + leaf.shape), False)
