"""The primitive ops: each one forward, its VJP (backward) and its JVP side by side.

Notation: `g` is dL/d(output), the gradient arriving from above (notes 10.2: same shape as the
output). Each backward returns dL/d(input) for every input, in order. Broadcasting is undone in one
place, `unbroadcast`. The Transformer ops (softmax, layer_norm, attention, ...) live in
`autograd/functional.py` and follow the same pattern.

One VJP for every order: each backward below is written once, with what numpy arrays and Tensors
have in common (operators, .reshape, .transpose, .sum, and the helpers of the next section, which
dispatch on their argument). Called with arrays it is the fast first-order VJP; under
create_graph=True the engine calls it with Tensors (`Op.vjp`), the same lines then record a graph,
and the gradient can be differentiated again (autograd/higher_order.py).

Forward mode (autograd/forward_ad.py): each op's `jvp(out, *tangents)` turns the tangents of its
inputs (`a_dot`: how fast a moves along the chosen direction) into the tangent of its output,
from the arrays forward saved; it is the linear map whose transpose backward applies.
"""

from __future__ import annotations

import math
from itertools import pairwise
from typing import Any

import numpy as np

from autograd.tensor import Function, Tensor, _index_array, unbroadcast

# --- one backward for arrays and Tensors ---------------------------------------------------------


class Op(Function):
    """A Function whose backward, run on Tensors, is its differentiable VJP.

    Under create_graph `vjp` calls `backward` with g a Tensor and every saved array that is an
    input's or the output's array replaced by that Tensor. So an Op saves only its inputs, its
    output (the very array it returns) and constants (shapes, axes, masks): an array derived
    from an input would be a constant of the VJP, and its second derivative would be wrong.
    """

    def vjp(self, g: Tensor, output: Tensor) -> tuple[Tensor | None, ...]:
        saved = self.saved
        self.saved = _as_tensors(saved, (*self.inputs, output))
        try:
            return self.backward(g)
        finally:
            self.saved = saved


def _as_tensors(saved: tuple, tensors: tuple[Tensor, ...]) -> tuple:
    """Each saved array that is the array of one of `tensors`, as that Tensor. Tensors sharing one
    array (x and x.detach()) are matched in order: the k-th such array saved is the k-th tensor."""
    owners: dict[int, list[Tensor]] = {}
    for t in tensors:
        owners.setdefault(id(t.data), []).append(t)
    swapped = []
    for item in saved:
        candidates = owners.get(id(item)) if isinstance(item, np.ndarray) else None
        if not candidates:
            swapped.append(item)
        else:
            swapped.append(candidates.pop(0) if len(candidates) > 1 else candidates[0])
    return tuple(swapped)


def own(x: Any) -> Any:
    """x as an array of its own (a VJP never returns a view of g); a Tensor already is one."""
    return x.copy() if isinstance(x, np.ndarray) else x


def sum_to(x: Any, shape: tuple[int, ...], copy: bool = False) -> Any:
    """x summed back to `shape`: the VJP of broadcasting (unbroadcast, or the SumTo op)."""
    if isinstance(x, Tensor):
        return x if x.shape == shape else SumTo.apply(x, shape=shape)
    return unbroadcast(x, shape, copy=copy)


def broadcast_to(x: Any, shape: tuple[int, ...]) -> Any:
    """x repeated along broadcast dims up to `shape` (a read-only view for an array)."""
    if isinstance(x, Tensor):
        return x if x.shape == shape else BroadcastTo.apply(x, shape=shape)
    return np.broadcast_to(x, shape)


def select(cond: np.ndarray, a: Any, b: Any) -> Any:
    """cond ? a : b (np.where, or the Where op when a or b is a Tensor)."""
    if isinstance(a, Tensor) or isinstance(b, Tensor):
        return where(cond, a, b)
    return np.where(cond, a, b)


def scatter_add(g: Any, shape: tuple[int, ...], index: Any) -> Any:
    """zeros(shape) with g added at index (repeated indices accumulate): the VJP of indexing."""
    if isinstance(g, Tensor):
        return ScatterAdd.apply(g, shape=shape, index=index)
    return _scatter_add(g, shape, index)


def concatenate(parts: list, axis: int) -> Any:
    if any(isinstance(p, Tensor) for p in parts):
        return concat(parts, axis)
    return np.concatenate(parts, axis=axis)


def exp(x: Any) -> Any:
    return x.exp() if isinstance(x, Tensor) else np.exp(x)


def log(x: Any) -> Any:
    return x.log() if isinstance(x, Tensor) else np.log(x)


def swap_last(x: Any) -> Any:
    """x with its last two axes swapped (the matrix transpose of a batch of matrices)."""
    return x.transpose(*range(x.ndim - 2), x.ndim - 1, x.ndim - 2)


def unsqueeze(x: Any, axis: int) -> Any:
    """x with a new size-1 axis at `axis` (np.expand_dims, as a reshape)."""
    shape = list(x.shape)
    shape.insert(axis % (x.ndim + 1), 1)
    return x.reshape(tuple(shape))


# --- elementwise binary ops (numpy broadcasting) ----------------------------------------------


class Add(Op):
    # out = a + b;  da = g, db = g
    def forward(self, a, b, out=None):
        self.save_for_backward(a.shape, b.shape)
        return np.add(a, b, out=out)

    def backward(self, g):
        a_shape, b_shape = self.saved
        return sum_to(g, a_shape, copy=True), sum_to(g, b_shape, copy=True)

    def backward_reads(self, c):  # neither a nor b
        return ()

    def compiled_forward(self, c):
        vals, (a, b), out = c.vals, (v.id for v in c.inputs), c.out
        return (lambda: self.forward(vals[a], vals[b], out=out)), "np.add(out=)"

    def compiled_backward(self, c):  # g into each input's gradient (summed back if broadcast)
        g = c.g
        # one input may take g's buffer itself as its gradient (no copy); the other gets a copy
        taken = next(
            (i for i, v in enumerate(c.inputs) if v.requires_grad and c.take_grad(i)), None
        )
        targets = [
            (c.add_grad(i), None if v.shape == g.shape else v.shape)
            for i, v in enumerate(c.inputs)
            if v.requires_grad and i != taken
        ]

        def run() -> None:
            for target, shape in targets:
                target(g if shape is None else unbroadcast(g, shape))

        if taken is not None:
            return (
                run,
                f"gradient handed down to input {taken} (no copy), copied / added into the other's",
            )
        return run, "gradient copied / added into the inputs' buffers"

    def batch_axis(self, axes, c):  # the operands' batch axes, aligned at the right, agree
        nd = len(c.out_shape)  # and a replicated operand is broadcast along that axis
        mapped = {x + nd - len(s) for s, x in zip(c.shapes, axes, strict=True) if x is not None}
        if len(mapped) != 1:
            return None
        axis = mapped.pop()
        for shape, x in zip(c.shapes, axes, strict=True):
            p = axis - (nd - len(shape))
            if x is None and p >= 0 and shape[p] != 1:
                return None
            if x is not None and shape[x] != c.out_shape[axis]:
                return None
        return axis

    def jvp(self, out, a_dot, b_dot):  # out_dot = a_dot + b_dot (broadcast)
        return a_dot + b_dot


class Sub(Op):
    # out = a - b;  da = g, db = -g
    def forward(self, a, b):
        self.save_for_backward(a.shape, b.shape)
        return a - b

    def backward(self, g):
        a_shape, b_shape = self.saved
        return sum_to(g, a_shape, copy=True), sum_to(-g, b_shape)

    def jvp(self, out, a_dot, b_dot):  # out_dot = a_dot - b_dot
        return a_dot - b_dot


class Mul(Op):
    # out = a * b;  da = g * b, db = g * a
    def forward(self, a, b):
        self.save_for_backward(a, b)
        return a * b

    def backward(self, g):
        a, b = self.saved
        need_a, need_b = self.needs_input_grad  # x * constant: no reduction for the constant
        return (sum_to(g * b, a.shape) if need_a else None), (
            sum_to(g * a, b.shape) if need_b else None
        )

    def backward_reads(self, c):  # each factor only if the other one gets a gradient
        a, b = c.inputs
        return tuple(i for i, other in ((0, b), (1, a)) if other.requires_grad)

    # compiled, for factors of the output's shape (SwiGLU's silu(gate) * up): the products
    # into the output and gradient buffers; a broadcast factor replays forward and backward
    def compiled_forward(self, c):
        if any(v.shape != c.out.shape for v in c.inputs):
            return None
        vals, (a, b), out = c.vals, (v.id for v in c.inputs), c.out
        return (lambda: np.multiply(vals[a], vals[b], out=out)), "np.multiply(out=)"

    def compiled_backward(self, c):  # da = g * b, db = g * a, into the gradient buffers
        if any(v.shape != c.g.shape for v in c.inputs):
            return None
        vals, g, (a, b) = c.vals, c.g, c.inputs
        steps = []
        for i, other in ((0, b), (1, a)):
            if c.inputs[i].requires_grad:
                buf, then = c.grad(i)
                steps.append((buf, other.id, then))

        def run() -> None:
            for buf, other, then in steps:
                np.multiply(g, vals[other], out=buf)
                if then is not None:
                    then()

        return run, "np.multiply(out=) into the gradient buffers"

    batch_axis = Add.batch_axis  # elementwise with broadcasting, as Add

    def jvp(self, out, a_dot, b_dot):  # out_dot = a_dot b + a b_dot  (the product rule)
        a, b = self.saved
        return a_dot * b + a * b_dot


class Div(Op):
    # out = a / b;  da = g / b, db = -g * a / b^2
    def forward(self, a, b):
        self.save_for_backward(a, b)
        return a / b

    def backward(self, g):
        a, b = self.saved
        ga = g / b
        return sum_to(ga, a.shape), sum_to(-ga * a / b, b.shape)

    def jvp(self, out, a_dot, b_dot):  # out_dot = (a_dot - out b_dot) / b
        _, b = self.saved
        return (a_dot - out * b_dot) / b


class Pow(Op):
    # out = a ** b;  da = g * b * a^(b-1) (0 where b = 0), db = g * out * ln(a) (0 where a <= 0)
    def forward(self, a, b):
        out = np.asarray(a**b)  # an array, as saved: numpy makes 0-d results scalars
        self.save_for_backward(a, b, out)
        return out

    def backward(self, g):
        a, b, out = self.saved
        # b = 0: 0, not 0 * 0^-1 = NaN, at a = 0 (so d(da)/db misses a^-1 exactly there)
        ga = g * b * a ** select(b != 0, b - 1, 1)
        with np.errstate(divide="ignore", invalid="ignore"):
            log_a = select(a > 0, log(select(a > 0, a, 1)), 0)
        return sum_to(ga, a.shape), sum_to(g * out * log_a, b.shape)

    def jvp(self, out, a_dot, b_dot):  # out_dot = b a^(b-1) a_dot + out ln(a) b_dot (same guards)
        a, b, _ = self.saved
        with np.errstate(divide="ignore", invalid="ignore"):
            log_a = np.where(a > 0, np.log(np.where(a > 0, a, 1)), 0)
        return a_dot * b * a ** np.where(b != 0, b - 1, 1) + b_dot * out * log_a


class MatMul(Op):
    # out = a @ b (np.matmul rules);  da = g @ b^T, db = a^T @ g  (notes 10.4), batch dims summed
    def forward(self, a, b):
        if a.ndim == 0 or b.ndim == 0:
            raise ValueError(f"matmul: operands must be at least 1-D, got {a.shape} and {b.shape}")
        k_a = a.shape[-1]
        k_b = b.shape[0] if b.ndim == 1 else b.shape[-2]
        if k_a != k_b:
            raise ValueError(
                f"shapes {a.shape} and {b.shape} do not chain: a's last dimension "
                f"{k_a} must equal the dimension {k_b} it multiplies in b"
            )
        self.save_for_backward(a, b)
        return a @ b

    def backward(self, g):
        a, b = self.saved
        # Treat vectors as matrices: a (k,) is a row (1, k), b (k,) is a column (k, 1).
        a2 = a[None, :] if a.ndim == 1 else a
        b2 = b[:, None] if b.ndim == 1 else b
        g2 = g
        if a.ndim == 1:
            g2 = unsqueeze(g2, -2 if b.ndim > 1 else 0)
        if b.ndim == 1:
            g2 = unsqueeze(g2, -1)
        need_a, need_b = self.needs_input_grad  # no product for an input that needs no grad
        ga = sum_to(g2 @ swap_last(b2), a2.shape).reshape(a.shape) if need_a else None
        gb = sum_to(swap_last(a2) @ g2, b2.shape).reshape(b.shape) if need_b else None
        return ga, gb

    def jvp(self, out, a_dot, b_dot):  # out_dot = a_dot @ b + a @ b_dot
        a, b = self.saved
        return a_dot @ b + a @ b_dot


# --- elementwise unary ops --------------------------------------------------------------------


class Neg(Op):
    # out = -a;  da = -g
    def forward(self, a):
        return -a

    def backward(self, g):
        return (-g,)

    def jvp(self, out, a_dot):  # out_dot = -a_dot
        return -a_dot


class Exp(Op):
    # out = e^a;  da = g * out
    def forward(self, a):
        out = np.asarray(np.exp(a))  # an array, as saved: numpy makes 0-d results scalars
        self.save_for_backward(out)
        return out

    def backward(self, g):
        (out,) = self.saved
        return (g * out,)

    def jvp(self, out, a_dot):  # out_dot = out a_dot
        return out * a_dot


class Log(Op):
    # out = ln a;  da = g / a
    def forward(self, a):
        self.save_for_backward(a)
        return np.log(a)

    def backward(self, g):
        (a,) = self.saved
        return (g / a,)

    def jvp(self, out, a_dot):  # out_dot = a_dot / a
        (a,) = self.saved
        return a_dot / a


class Sqrt(Op):
    # out = sqrt(a);  da = g / (2 out)
    def forward(self, a):
        out = np.asarray(np.sqrt(a))  # an array, as saved: numpy makes 0-d results scalars
        self.save_for_backward(out)
        return out

    def backward(self, g):
        (out,) = self.saved
        return (g / (2 * out),)

    def jvp(self, out, a_dot):  # out_dot = a_dot / (2 out)
        return a_dot / (2 * out)


class Tanh(Op):
    # out = tanh a;  da = g * (1 - out^2)
    def forward(self, a):
        out = np.asarray(np.tanh(a))  # an array, as saved: numpy makes 0-d results scalars
        self.save_for_backward(out)
        return out

    def backward(self, g):
        (out,) = self.saved
        return (g * (1 - out * out),)

    def jvp(self, out, a_dot):  # out_dot = (1 - out^2) a_dot
        return (1 - out * out) * a_dot


class Relu(Op):
    # out = max(a, 0);  da = g * [a > 0]  (the convention at 0 is 0, notes 8.2)
    def forward(self, a):
        self.save_for_backward(a)
        return np.maximum(a, 0)

    def backward(self, g):
        (a,) = self.saved
        return (g * (a > 0),)

    def jvp(self, out, a_dot):  # out_dot = [a > 0] a_dot
        (a,) = self.saved
        return a_dot * (a > 0)


class Sigmoid(Op):
    # out = 1 / (1 + e^-a);  da = g * out * (1 - out)
    def forward(self, a):
        # Two branches so that e^(-a) never overflows for large negative a.
        e = np.exp(-np.abs(a))
        out = np.where(a >= 0, 1 / (1 + e), e / (1 + e)).astype(a.dtype, copy=False)
        self.save_for_backward(out)
        return out

    def backward(self, g):
        (out,) = self.saved
        return (g * out * (1 - out),)

    def backward_reads(self, c):  # its own copy of the output, not the output's buffer
        return ()

    def jvp(self, out, a_dot):  # out_dot = out (1 - out) a_dot
        return out * (1 - out) * a_dot


# --- reductions -------------------------------------------------------------------------------


def _normalize_axes(axis: Any, ndim: int, op: str) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    normalized = []
    for ax in axes:
        if not -ndim <= ax < max(ndim, 1):
            raise ValueError(f"{op}: axis {ax} is out of range for a {ndim}-d tensor")
        normalized.append(int(ax) % max(ndim, 1))
    if len(set(normalized)) != len(normalized):
        raise ValueError(f"{op}: repeated axis in {axis}")
    return tuple(normalized)


def _expand_reduced(g: Any, shape: tuple[int, ...], axes: tuple[int, ...], keepdims: bool):
    """g broadcast back over the reduced axes of an input of `shape` (put back as size-1 dims)."""
    if not keepdims:
        g = g.reshape(tuple(1 if d in axes else n for d, n in enumerate(shape)))
    return broadcast_to(g, shape)


class Sum(Op):
    # out = sum_axis a;  da = g broadcast back over the summed axes
    def forward(self, a, axis=None, keepdims=False):
        axes = _normalize_axes(axis, a.ndim, "sum")
        self.save_for_backward(a.shape, axes, keepdims)
        return np.sum(a, axis=axes, keepdims=keepdims)

    def backward(self, g):
        shape, axes, keepdims = self.saved
        return (own(_expand_reduced(g, shape, axes, keepdims)),)

    def jvp(self, out, a_dot):  # out_dot = sum_axis a_dot
        _, axes, keepdims = self.saved
        return np.sum(a_dot, axis=axes, keepdims=keepdims)


class Mean(Op):
    # out = sum_axis a / n;  da = g / n broadcast back
    def forward(self, a, axis=None, keepdims=False):
        axes = _normalize_axes(axis, a.ndim, "mean")
        count = int(np.prod([a.shape[ax] for ax in axes]))
        if count == 0:
            raise ValueError(f"mean: reducing axes {axes} of an empty tensor of shape {a.shape}")
        self.save_for_backward(a.shape, axes, keepdims, count)
        return np.mean(a, axis=axes, keepdims=keepdims)

    def backward(self, g):
        shape, axes, keepdims, count = self.saved
        return (_expand_reduced(g, shape, axes, keepdims) / count,)

    def jvp(self, out, a_dot):  # out_dot = mean_axis a_dot
        _, axes, keepdims, _ = self.saved
        return np.mean(a_dot, axis=axes, keepdims=keepdims)


class Max(Op):
    # out = max_axis a;  da = g where a == out, split evenly between ties
    def forward(self, a, axis=None, keepdims=False):
        axes = _normalize_axes(axis, a.ndim, "max")
        if a.size == 0:
            raise ValueError(f"max: empty tensor of shape {a.shape} has no maximum")
        out = np.max(a, axis=axes, keepdims=True)
        self.save_for_backward(a, out, axes, keepdims)
        return out if keepdims else np.squeeze(out, axis=axes)

    def backward(self, g):
        a, out, axes, keepdims = self.saved
        winners = a == out  # a boolean array, also for a Tensor a: the split is a constant
        share = (winners / winners.sum(axis=axes, keepdims=True)).astype(g.dtype)
        return (share * _expand_reduced(g, a.shape, axes, keepdims),)

    def jvp(self, out, a_dot):  # out_dot = a_dot at the maximum (the mean over ties, as backward)
        a, top, axes, keepdims = self.saved
        winners = a == top
        share = winners / winners.sum(axis=axes, keepdims=True)
        return np.sum(share * a_dot, axis=axes, keepdims=keepdims)


# --- shape ops --------------------------------------------------------------------------------


class Reshape(Op):
    # out = a viewed with a new shape;  da = g viewed with a's shape
    def forward(self, a, shape=()):
        self.save_for_backward(a.shape)
        return a.reshape(shape)

    def backward(self, g):
        (shape,) = self.saved
        return (own(g.reshape(shape)),)

    def makes_view(self, params):
        return True

    def backward_reads(self, c):
        return ()

    def compiled_forward(self, c):  # a reshape that numpy had to copy (of a transposed view):
        vals, x = c.vals, c.inputs[0]  # the same C-order copy, into out
        target = c.out.reshape(x.shape)
        note = "copy into out (a reshape of a strided view)"
        return (lambda: np.copyto(target, vals[x.id])), note

    def compiled_backward(self, c):
        g, shape, add = c.g, c.inputs[0].shape, c.add_grad(0)
        return (lambda: add(g.reshape(shape))), "reshape into the input's gradient"

    def batch_axis(self, axes, c):  # each shard's rows: one contiguous block in both shapes
        (shape,), (axis,), new = c.shapes, axes, c.out_shape
        if math.prod(shape[:axis]) == 1:
            j = next((i for i, d in enumerate(new) if d != 1), None)
            if j is not None and new[j] % c.n == 0:
                return j
        return None

    def shard_params(self, params, out_shape):
        return {**params, "shape": out_shape}

    def jvp(self, out, a_dot):  # out_dot = a_dot viewed with out's shape
        return a_dot.reshape(out.shape)


class Transpose(Op):
    # out = a with axes permuted;  da = g with the inverse permutation
    def forward(self, a, axes=None):
        given = tuple(range(a.ndim))[::-1] if axes is None else tuple(axes)
        # normalised first: the inverse of (-1, 0) is argsort((1, 0)), not argsort((-1, 0))
        axes = tuple(int(ax) % a.ndim for ax in given if -a.ndim <= ax < a.ndim)
        if sorted(axes) != list(range(a.ndim)) or len(given) != a.ndim:
            raise ValueError(f"transpose: axes {given} are not a permutation of a {a.ndim}-d shape")
        self.save_for_backward(axes)
        return np.transpose(a, axes)

    def backward(self, g):
        (axes,) = self.saved
        return (own(g.transpose(*np.argsort(axes).tolist())),)

    def makes_view(self, params):
        return True

    def compiled_backward(self, c):
        g, add, inverse = c.g, c.add_grad(0), tuple(np.argsort(self.saved[0]))
        return (lambda: add(np.transpose(g, inverse))), "transpose into the input's gradient"

    def batch_axis(self, axes, c):  # where the permutation takes the batch axis
        given = self.saved[0] if self.saved else c.params.get("axes")
        perm = list(range(len(c.shapes[0])))[::-1] if given is None else list(given)
        return perm.index(axes[0] % len(perm))

    def jvp(self, out, a_dot):  # out_dot = a_dot with the same permutation
        (axes,) = self.saved
        return np.transpose(a_dot, axes)


def _is_basic_index(index: Any) -> bool:
    """Slices, ints, None and Ellipsis select each element at most once (no scatter-add needed)."""
    parts = index if isinstance(index, tuple) else (index,)
    return all(isinstance(p, (slice, int, np.integer)) or p is None or p is Ellipsis for p in parts)


class GetItem(Op):
    # out = a[index];  da = zeros, then g added at index (repeated indices accumulate)
    def forward(self, a, index=None):
        self.save_for_backward(a.shape, index)
        return a[index]

    def backward(self, g):
        shape, index = self.saved
        return (scatter_add(g, shape, index),)

    def makes_view(self, params):  # slices and integers (a view), not a gather
        return _is_basic_index(params.get("index"))

    def compiled_backward(self, c):  # g written (or added) into its region of the gradient
        g, index = c.g, c.params["index"]
        gx, first = c.grad_buffer(0)

        def run() -> None:
            if first:
                gx.fill(0)
                gx[index] = g
            else:
                gx[index] += g

        return run, "scatter into the input's gradient"

    def batch_axis(self, axes, c):  # an integer index on an axis before the batch axis
        index = c.params.get("index")
        if isinstance(index, (int, np.integer)) and axes[0] > 0:
            return axes[0] - 1
        return None

    def jvp(self, out, a_dot):  # out_dot = a_dot[index]
        _, index = self.saved
        return a_dot[index]


def _scatter_add(g: np.ndarray, shape: tuple[int, ...], index: Any) -> np.ndarray:
    grad = np.zeros(shape, dtype=g.dtype)
    if _is_basic_index(index):
        grad[index] = g
    else:
        np.add.at(grad, index, g)
    return grad


class ScatterAdd(Op):
    # out = zeros(shape) with g added at index;  dg = gout[index]  (the transpose of GetItem)
    def forward(self, g, shape=(), index=None):
        self.save_for_backward(index)
        return _scatter_add(g, shape, index)

    def backward(self, g):
        (index,) = self.saved
        return (own(g[index]),)

    def jvp(self, out, g_dot):  # out_dot = zeros(shape) with g_dot added at index (it is linear)
        (index,) = self.saved
        return _scatter_add(g_dot, out.shape, index)


class SumTo(Op):
    # out = a summed back to `shape` (unbroadcast);  da = g broadcast to a's shape
    def forward(self, a, shape=()):
        self.save_for_backward(a.shape)
        return unbroadcast(a, shape, copy=True)

    def backward(self, g):
        (shape,) = self.saved
        return (own(broadcast_to(g, shape)),)

    def jvp(self, out, a_dot):  # out_dot = a_dot summed back to `shape` (it is linear)
        return unbroadcast(a_dot, out.shape)


class BroadcastTo(Op):
    # out = a repeated up to `shape` (numpy broadcasting);  da = g summed back to a's shape
    def forward(self, a, shape=()):
        self.save_for_backward(a.shape)
        return np.broadcast_to(a, shape).copy()  # an array of its own, not a read-only view

    def backward(self, g):
        (shape,) = self.saved
        return (sum_to(g, shape, copy=True),)

    def backward_reads(self, c):  # the input's shape only
        return ()

    def jvp(self, out, a_dot):  # out_dot = a_dot repeated up to `shape` (it is linear)
        return np.broadcast_to(a_dot, out.shape)


class Concat(Op):
    # out = concat(a_1..a_n, axis);  da_i = the slice of g that a_i occupies
    def forward(self, *arrays, axis=0):
        out = np.concatenate(arrays, axis=axis)
        axis %= out.ndim
        self.save_for_backward(axis, [a.shape[axis] for a in arrays])
        return out

    def backward(self, g):
        axis, sizes = self.saved
        parts = []
        for start, stop in pairwise(np.cumsum([0, *sizes]).tolist()):
            index = [slice(None)] * g.ndim
            index[axis] = slice(start, stop)
            parts.append(own(g[tuple(index)]))
        return tuple(parts)

    def jvp(self, out, *dots):  # out_dot = concat(a_1_dot..a_n_dot, axis)
        axis, _ = self.saved
        return np.concatenate(dots, axis=axis)


class Stack(Op):
    # out = stack(a_1..a_n, axis);  da_i = g taken at position i along the new axis
    def forward(self, *arrays, axis=0):
        out = np.stack(arrays, axis=axis)
        self.save_for_backward(axis if axis >= 0 else out.ndim + axis, len(arrays))
        return out

    def backward(self, g):
        axis, n = self.saved
        return tuple(own(g[(slice(None),) * axis + (i,)]) for i in range(n))

    def jvp(self, out, *dots):  # out_dot = stack(a_1_dot..a_n_dot, axis)
        axis, _ = self.saved
        return np.stack(dots, axis=axis)


class Where(Op):
    # out = cond ? a : b;  da = g where cond, db = g where not cond
    def forward(self, a, b, cond=None):
        self.save_for_backward(cond, a.shape, b.shape)
        return np.where(cond, a, b)

    def backward(self, g):
        cond, a_shape, b_shape = self.saved
        zero = g.dtype.type(0)
        return sum_to(select(cond, g, zero), a_shape), sum_to(select(cond, zero, g), b_shape)

    def jvp(self, out, a_dot, b_dot):  # out_dot = cond ? a_dot : b_dot
        cond = self.saved[0]
        return np.where(cond, a_dot, b_dot)


# --- free functions of the public API ---------------------------------------------------------


def lift(like: Tensor, other: Any) -> Tensor:
    """`other` as a constant Tensor for an op with `like`. Dtypes then follow numpy's promotion
    (NEP 50): an array keeps its dtype (float32 + float64 array -> float64), while a Python or
    numpy scalar takes the float dtype of `like` (float32 + 2.5 -> float32)."""
    if isinstance(other, Tensor):
        return other
    weak = np.ndim(other) == 0 and not isinstance(other, np.ndarray)
    dtype = like.dtype if weak and like.dtype.kind == "f" else None
    return Tensor._make(np.asarray(other, dtype=dtype), False)


def _tensors(items: Any, op: str) -> list[Tensor]:
    items = list(items)
    if not items:
        raise ValueError(f"{op}: needs at least one tensor")
    like = next((t for t in items if isinstance(t, Tensor)), None)
    return [
        t if isinstance(t, Tensor) else (lift(like, t) if like is not None else Tensor(t))
        for t in items
    ]


def concat(tensors: Any, axis: int = 0) -> Tensor:
    """Join tensors along an existing axis (like np.concatenate)."""
    return Concat.apply(*_tensors(tensors, "concat"), axis=axis)


def stack(tensors: Any, axis: int = 0) -> Tensor:
    """Join tensors along a new axis (like np.stack)."""
    return Stack.apply(*_tensors(tensors, "stack"), axis=axis)


def where(cond: Any, a: Any, b: Any) -> Tensor:
    """Elementwise choice: a where cond is true, else b (cond is a constant, no gradient)."""
    cond = np.asarray(cond.data if isinstance(cond, Tensor) else cond)
    if cond.dtype != np.bool_:
        raise TypeError(f"where: cond must be boolean, got dtype {cond.dtype}")
    a, b = _tensors([a, b], "where")
    return Where.apply(a, b, cond=cond)


# --- Tensor's operators and methods: each one applies an op of this file ----------------------


def _binary(op: type[Function]):
    def method(self: Tensor, other: Any) -> Tensor:
        return op.apply(self, lift(self, other))

    def reflected(self: Tensor, other: Any) -> Tensor:
        return op.apply(lift(self, other), self)

    return method, reflected


Tensor.__add__, Tensor.__radd__ = _binary(Add)
Tensor.__sub__, Tensor.__rsub__ = _binary(Sub)
Tensor.__mul__, Tensor.__rmul__ = _binary(Mul)
Tensor.__truediv__, Tensor.__rtruediv__ = _binary(Div)
Tensor.__pow__, Tensor.__rpow__ = _binary(Pow)
Tensor.__matmul__, Tensor.__rmatmul__ = _binary(MatMul)
Tensor.__neg__ = lambda self: Neg.apply(self)
Tensor.__getitem__ = lambda self, index: GetItem.apply(self, index=_index_array(index))
Tensor.exp = lambda self: Exp.apply(self)
Tensor.log = lambda self: Log.apply(self)
Tensor.sqrt = lambda self: Sqrt.apply(self)
Tensor.tanh = lambda self: Tanh.apply(self)
Tensor.relu = lambda self: Relu.apply(self)
Tensor.sigmoid = lambda self: Sigmoid.apply(self)
Tensor.sum = lambda self, axis=None, keepdims=False: Sum.apply(self, axis=axis, keepdims=keepdims)
Tensor.mean = lambda self, axis=None, keepdims=False: Mean.apply(self, axis=axis, keepdims=keepdims)
Tensor.max = lambda self, axis=None, keepdims=False: Max.apply(self, axis=axis, keepdims=keepdims)


def _reshape(self: Tensor, *shape: Any) -> Tensor:
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    return Reshape.apply(self, shape=shape)


def _transpose(self: Tensor, *axes: Any) -> Tensor:
    if len(axes) == 1 and isinstance(axes[0], (tuple, list)):
        axes = tuple(axes[0])
    return Transpose.apply(self, axes=axes or None)


Tensor.reshape = _reshape
Tensor.transpose = _transpose
Tensor.T = property(lambda self: Transpose.apply(self))
