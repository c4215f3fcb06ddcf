"""Forward mode: a tangent carried beside each value, one JVP rule per primitive (notes 10.1).

Reverse mode (autograd/tensor.py) records the ops and walks them backwards, turning dL/d(output)
into dL/d(input): one pass per output, the graph kept in between. Forward mode walks them once,
forwards, turning the tangents of an op's inputs (how fast each input moves along a direction v)
into the tangent of its output: `Function.jvp`, the rule beside each op's forward and backward.
One pass per input direction, nothing recorded, nothing kept.

    with forward_ad.dual_level():
        x = forward_ad.make_dual(x0, v)       # x0 moving along v
        y = f(x)                              # ordinary code; each op pushes the tangent along
        value, tangent = forward_ad.unpack_dual(y)   # f(x0) and J_f(x0) v

`jvp(fn, primals, tangents)` is the same, JAX-style (autograd.jvp). `jacfwd` and `jacrev` build
whole Jacobians, column by column (one JVP per input element) or row by row (one VJP per output
element); `hvp` is forward-over-reverse: the tangent rides through the backward pass too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from autograd import hooks
from autograd.higher_order import _as_tuple, _inputs_of, _scalar, _zeros_for_unused, grad
from autograd.tensor import Function, Tensor, no_grad


class DualLevel:
    """An open dual_level: which tensors carry a tangent is stored on the tensors themselves
    (Tensor._tangent = (level, array)); a tangent from a closed level is ignored. The tensors made
    dual by hand are remembered, so that closing the level frees their tangents."""

    def __init__(self) -> None:
        self.made_dual: list[Tensor] = []

    def tangent(self, t: Tensor) -> np.ndarray | None:
        dual = t._tangent
        return dual[1] if dual is not None and dual[0] is self else None

    def attach(self, t: Tensor, tangent: np.ndarray) -> None:
        t._tangent = (self, tangent)

    def push(self, fn: Function, inputs: Sequence[Tensor], out: Tensor) -> None:
        """After fn's forward: out's tangent by fn's rule, if any input carries a tangent."""
        tangents = [self.tangent(t) for t in inputs]
        if all(d is None for d in tangents):
            return  # a constant for this level: no tangent, no work
        pairs = zip(inputs, tangents, strict=True)
        dots = [np.zeros_like(t.data) if d is None else d for t, d in pairs]
        dot = np.asarray(fn.jvp(out.data, *dots), dtype=out.dtype)
        if dot.shape != out.shape:
            raise RuntimeError(
                f"jvp of {fn.name}: produced a tangent of shape {dot.shape} for an output of "
                f"shape {out.shape} (a bug in that op's JVP rule)"
            )
        self.attach(out, dot)


@contextmanager
def dual_level() -> Iterator[DualLevel]:
    """Inside this block every op carries tangents (PyTorch's forward_ad.dual_level). One level
    at a time; on exit every tangent of the level is dropped (unpack_dual then gives None)."""
    if hooks.DUAL_LEVEL is not None:
        raise RuntimeError("dual_level: a dual level is already open (nesting is not supported)")
    level = DualLevel()
    hooks.DUAL_LEVEL = level
    try:
        yield level
    finally:
        hooks.DUAL_LEVEL = None
        for t in level.made_dual:  # (a model's parameter would keep its tangent alive)
            t._tangent = None


def _open_level(caller: str) -> DualLevel:
    if hooks.DUAL_LEVEL is None:
        raise RuntimeError(f"{caller}: no dual level is open; use `with dual_level():`")
    return hooks.DUAL_LEVEL


def make_dual(primal: Any, tangent: Any) -> Tensor:
    """`primal` moving along `tangent`, for the open dual level.

    An array (or number) becomes a new Tensor. A Tensor gets the tangent attached in place and
    is returned as itself (unlike PyTorch, which returns a view): so a model's parameters, which
    the model reads itself, can be made dual. The tangent takes the primal's dtype.
    """
    level = _open_level("make_dual")
    t = primal if isinstance(primal, Tensor) else Tensor(primal)
    dot = np.array(tangent.data if isinstance(tangent, Tensor) else tangent, dtype=t.dtype)
    if dot.shape != t.shape:
        raise ValueError(f"make_dual: tangent has shape {dot.shape} but the primal {t.shape}")
    level.attach(t, dot)
    level.made_dual.append(t)
    return t


def unpack_dual(t: Tensor) -> tuple[Tensor, np.ndarray | None]:
    """(the value, as a Tensor without tangent; its tangent, or None if it carries none)."""
    level = _open_level("unpack_dual")
    return t.detach(), level.tangent(t)


def _tangent_or_zeros(level: DualLevel, t: Any) -> Tensor:
    """t's tangent as a Tensor (zeros for an output that does not depend on the primals)."""
    if not isinstance(t, Tensor):
        raise TypeError(f"jvp: fn returned a {type(t).__name__}, not a Tensor")
    dot = level.tangent(t)
    return Tensor._make(np.zeros_like(t.data) if dot is None else dot, False)


def jvp(fn: Callable[..., Any], primals: Any, tangents: Any) -> tuple[Any, Any]:
    """(fn(*primals), J v) for tangents v, JAX-style: one tangent per primal, tuples in and out.

    One forward pass with the JVP rules (forward mode): fn runs on dual tensors inside a
    dual_level and the tangent of its output is J v.
    """
    ps, vs = _as_tuple(primals), _as_tuple(tangents)
    if len(vs) != len(ps):
        raise ValueError(f"jvp: {len(ps)} primals but {len(vs)} tangents")
    with dual_level() as level:
        xs = [
            make_dual(Tensor._make(p.data, False) if isinstance(p, Tensor) else p, v)
            for p, v in zip(ps, vs, strict=True)
        ]
        out = fn(*xs)
        dots = tuple(_tangent_or_zeros(level, o) for o in _as_tuple(out))
    values = tuple(o.detach() for o in _as_tuple(out))
    if isinstance(out, (list, tuple)):
        return values, dots
    return values[0], dots[0]


def _basis(shape: tuple[int, ...], dtype: Any) -> Iterator[np.ndarray]:
    """The unit arrays e_0, e_1, ... of `shape` (one per element, in C order)."""
    for i in range(int(np.prod(shape, dtype=np.int64))):
        e = np.zeros(shape, dtype=dtype)
        e.flat[i] = 1
        yield e


def jacfwd(fn: Callable[[Tensor], Tensor], x: Any) -> Tensor:
    """d fn(x) / dx, shape fn(x).shape + x.shape, column by column: one JVP (forward mode) per
    element of x. The cheap way when x is small and the output large."""
    (leaf,) = _inputs_of(x)
    columns = [jvp(fn, (leaf,), (e,))[1].data for e in _basis(leaf.shape, leaf.dtype)]
    out_shape = columns[0].shape if columns else fn(leaf).shape
    jac = np.stack(columns, axis=-1) if columns else np.zeros(out_shape + (0,), leaf.dtype)
    return Tensor._make(jac.reshape(out_shape + leaf.shape), False)


def jacrev(fn: Callable[[Tensor], Tensor], x: Any) -> Tensor:
    """d fn(x) / dx, shape fn(x).shape + x.shape, row by row: one forward pass, then one VJP
    (reverse mode) per element of the output. The cheap way when the output is small."""
    (leaf,) = _inputs_of(x)
    out = fn(leaf)
    rows = np.zeros((out.size, leaf.size), dtype=leaf.dtype)
    if out.requires_grad:
        for i, e in enumerate(_basis(out.shape, out.dtype)):
            (row,) = grad(out, leaf, e, retain_graph=True, allow_unused=True)
            if row is not None:
                rows[i] = row.data.reshape(-1)
    return Tensor._make(rows.reshape(out.shape + leaf.shape), False)


def hvp(fn: Callable[..., Tensor], inputs: Any, v: Any) -> tuple[Tensor, Any]:
    """(fn(*inputs), H v) for a scalar fn, forward-over-reverse: the inputs carry v as their
    tangent, the forward pass records the graph, and the backward pass runs its VJPs on Tensors
    (create_graph) but under no_grad: nothing of it is recorded, and the tangent of the gradient,
    d(grad fn)/dx v, is H v. One forward and one backward, each op doing its value and its
    tangent; no graph of the backward is kept (docs/benchmarks.md: on a GPT, the time of reverse
    over reverse and a third of its memory).

    inputs: a Tensor or a sequence; v has the same structure. Input Tensors that require grad
    are used as they are (fn may read them from a model); their tangent is dropped on return.
    """
    xs = _inputs_of(inputs)
    vs = _as_tuple(v)
    if len(vs) != len(xs):
        raise ValueError(f"hvp: {len(xs)} inputs but {len(vs)} vectors")
    with dual_level() as level:
        for x, u in zip(xs, vs, strict=True):
            make_dual(x, u)
        y = _scalar(fn, xs, "hvp")
        with no_grad():
            gs = grad(y, xs, create_graph=True, allow_unused=True)
        hv = tuple(_tangent_or_zeros(level, g) for g in _zeros_for_unused(gs, xs))
    return y.detach(), hv if isinstance(inputs, (list, tuple)) else hv[0]
