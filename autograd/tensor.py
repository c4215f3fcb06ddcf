"""The graph core: Tensor, Function (one primitive = forward + VJP), and the backward loop.

Reverse mode in one paragraph (notes 10.2): every op records the inputs it was applied to; the
output of the whole computation is a scalar L; `L.backward()` visits the recorded ops from the
output back to the leaves, and each op turns the gradient of its output, dL/dout, into the
gradients of its inputs, dL/din (its vector-Jacobian product, VJP). A tensor used twice receives
the sum of both contributions (`+=`).
"""

from __future__ import annotations

import os
import threading
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

_default_dtype: np.dtype = np.dtype(np.float32)
_ENGINE_DIR = os.path.dirname(os.path.abspath(__file__))
_grad_mode = threading.local()  # per-thread: no_grad() in one thread never affects another


class _Anomaly:
    """Global switch for detect_anomaly(); a plain attribute so that 'off' costs one lookup."""

    enabled = False


def set_default_dtype(dtype: Any) -> None:
    """Set the float dtype new tensors get from Python numbers, lists and float arrays."""
    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.float64):
        raise ValueError(f"set_default_dtype: expected float32 or float64, got {dtype}")
    global _default_dtype
    _default_dtype = dtype


def get_default_dtype() -> np.dtype:
    return _default_dtype


def is_grad_enabled() -> bool:
    return getattr(_grad_mode, "enabled", True)


@contextmanager
def no_grad() -> Iterator[None]:
    """Inside this block ops record nothing: no graph, no saved arrays (inference, updates)."""
    previous = is_grad_enabled()
    _grad_mode.enabled = False
    try:
        yield
    finally:
        _grad_mode.enabled = previous


@contextmanager
def enable_grad() -> Iterator[None]:
    previous = is_grad_enabled()
    _grad_mode.enabled = True
    try:
        yield
    finally:
        _grad_mode.enabled = previous


@contextmanager
def detect_anomaly() -> Iterator[None]:
    """Check every forward output and backward gradient for NaN/Inf; name the op that made it.

    Each op created inside the block also remembers where in user code it was created, so the
    error points at the line to look at. Off by default; when off it costs one attribute read.
    """
    previous = _Anomaly.enabled
    _Anomaly.enabled = True
    try:
        yield
    finally:
        _Anomaly.enabled = previous


class AnomalyError(FloatingPointError):
    """A NaN or Inf appeared in a forward output or a backward gradient under detect_anomaly()."""


def unbroadcast(grad: np.ndarray, shape: tuple[int, ...], copy: bool = False) -> np.ndarray:
    """Sum `grad` back to `shape`: the VJP of numpy broadcasting (the one place it is done).

    A dimension that broadcasting added in front, or stretched from size 1, was used many times
    in the forward pass, so its gradient is the sum over those uses. copy=True: the result is
    never `grad` itself (a VJP must return arrays of its own; the engine adopts them as .grad).
    """
    if grad.shape == shape:
        return grad.copy() if copy else grad
    lead = grad.ndim - len(shape)
    stretched = tuple(lead + i for i, n in enumerate(shape) if n == 1 and grad.shape[lead + i] != 1)
    return grad.sum(axis=tuple(range(lead)) + stretched, keepdims=False).reshape(shape)


def _describe(arrays: Sequence[Any]) -> str:
    parts = []
    for a in arrays:
        if isinstance(a, np.ndarray):
            parts.append(f"{a.shape} {a.dtype}")
        else:
            parts.append(type(a).__name__)
    return ", ".join(parts)


class Function:
    """One primitive op. Subclasses define `forward` and `backward` side by side.

    `forward(self, *arrays, **params)` computes the output from numpy arrays and may stash what
    backward needs with `self.save_for_backward(...)`. `backward(self, grad)` receives
    dL/d(output) and returns one gradient per input array (None for an input that needs none).
    An instance is the graph node: it keeps the inputs until backward releases it.
    """

    __slots__ = ("inputs", "saved", "_versions", "_saved_inputs", "_saves_output", "created_at")

    def save_for_backward(self, *arrays: Any) -> None:
        self.saved = arrays

    def forward(self, *arrays: np.ndarray, **params: Any) -> np.ndarray:
        raise NotImplementedError

    def backward(self, grad: np.ndarray) -> tuple[np.ndarray | None, ...]:
        raise NotImplementedError

    @property
    def name(self) -> str:
        return type(self).__name__

    @classmethod
    def apply(cls, *inputs: Tensor, **params: Any) -> Tensor:
        """Run forward on the inputs' arrays and, if any input needs a gradient, record the node."""
        fn = cls()
        fn.saved = ()
        arrays = [t.data for t in inputs]
        try:
            out_data = fn.forward(*arrays, **params)
        except (ValueError, IndexError, TypeError) as exc:
            # Name the op and what it was given instead of surfacing a deep numpy traceback.
            raise type(exc)(f"{cls.__name__}: {exc} (inputs: {_describe(arrays)})") from None
        requires_grad = any(t.requires_grad for t in inputs) and is_grad_enabled()
        out = Tensor._make(out_data, requires_grad)
        if _Anomaly.enabled:
            fn.created_at = traceback.extract_stack()[:-1]
            _check_finite(out_data, f"forward output of {cls.__name__}", fn, arrays)
        if requires_grad:
            fn.inputs = inputs
            # Version counters of the inputs whose arrays backward will read (saved-tensor safety).
            # (a saved reshape or slice of an input counts too: its .base is the input's array)
            saved = [a for a in fn.saved if isinstance(a, np.ndarray)]
            saved_ids = {id(a) for a in saved} | {id(a.base) for a in saved if a.base is not None}
            fn._saved_inputs = tuple(i for i, a in enumerate(arrays) if id(a) in saved_ids)
            fn._versions = tuple(inputs[i]._version for i in fn._saved_inputs)
            fn._saves_output = id(out_data) in saved_ids
            out._ctx = fn
        else:
            fn.saved = ()
        return out


def _check_finite(array: np.ndarray, what: str, fn: Function, arrays: Sequence[Any]) -> None:
    if np.issubdtype(array.dtype, np.floating) and not np.isfinite(array).all():
        bad = "NaN" if np.isnan(array).any() else "Inf"
        # The innermost frame outside the engine is the user's line that created the op.
        user_frames = [f for f in getattr(fn, "created_at", ()) if _ENGINE_DIR not in f.filename]
        origin = ""
        if user_frames:
            frame = user_frames[-1]
            origin = f"\n  op created at {frame.filename}:{frame.lineno}: {frame.line}"
        raise AnomalyError(
            f"detect_anomaly: {bad} in {what} (op {fn.name}, inputs: {_describe(arrays)}, "
            f"output shape {array.shape}){origin}"
        )


class Tensor:
    """A numpy array plus what reverse mode needs: .grad, .requires_grad and the op that made it."""

    __slots__ = (
        "_data",
        "grad",
        "_requires_grad",
        "_ctx",
        "_version",
        "_retains_grad",
        "name",
        "__weakref__",
    )
    __array_ufunc__ = None  # `ndarray + Tensor` defers to Tensor.__radd__ instead of unwrapping

    def __init__(
        self,
        data: Any,
        requires_grad: bool = False,
        dtype: Any = None,
        name: str | None = None,
    ) -> None:
        if isinstance(data, Tensor):
            data = data.data
        # Floats take the default dtype unless dtype= says otherwise; ints and bools stay as they
        # are (they index, they are never differentiated).
        array = np.asarray(data, dtype=dtype)
        if dtype is None and array.dtype.kind == "f" and array.dtype != _default_dtype:
            array = array.astype(_default_dtype)
        self._data = array
        self.grad: np.ndarray | None = None
        self._ctx: Function | None = None
        self._version = 0
        self._retains_grad = False
        self.name = name
        self._requires_grad = False
        self.requires_grad = requires_grad

    @classmethod
    def _make(cls, array: np.ndarray, requires_grad: bool) -> Tensor:
        """Wrap an op's output without the conversions of __init__ (hot path)."""
        t = object.__new__(cls)
        t._data = array if isinstance(array, np.ndarray) else np.asarray(array)
        t.grad = None
        t._ctx = None
        t._version = 0
        t._retains_grad = False
        t.name = None
        t._requires_grad = requires_grad
        return t

    # --- the array and its metadata -------------------------------------------------------------
    @property
    def data(self) -> np.ndarray:
        return self._data

    @data.setter
    def data(self, value: Any) -> None:
        self._data = np.asarray(value.data if isinstance(value, Tensor) else value)
        self._version += 1

    @property
    def requires_grad(self) -> bool:
        return self._requires_grad

    @requires_grad.setter
    def requires_grad(self, value: bool) -> None:
        if value and self._data.dtype.kind not in "fc":
            raise TypeError(
                f"Tensor: only float tensors can require grad, got dtype {self._data.dtype} "
                f"with shape {self._data.shape}"
            )
        self._requires_grad = bool(value)

    @property
    def shape(self) -> tuple[int, ...]:
        return self._data.shape

    @property
    def ndim(self) -> int:
        return self._data.ndim

    @property
    def size(self) -> int:
        return self._data.size

    @property
    def dtype(self) -> np.dtype:
        return self._data.dtype

    @property
    def is_leaf(self) -> bool:
        return self._ctx is None

    @property
    def op(self) -> Function | None:
        """The node that produced this tensor (None for a leaf)."""
        return self._ctx

    def numpy(self) -> np.ndarray:
        return self._data

    def item(self) -> float:
        if self._data.size != 1:
            raise ValueError(
                f"item: tensor has shape {self.shape}; only a one-element tensor has an item"
            )
        return self._data.item()

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        return self._data if dtype is None else self._data.astype(dtype, copy=False)

    def detach(self) -> Tensor:
        """The same array, cut off from the graph."""
        return Tensor._make(self._data, False)

    def retain_grad(self) -> Tensor:
        """Keep .grad on this non-leaf tensor after backward (for inspecting intermediate steps)."""
        self._retains_grad = True
        return self

    def zero_grad(self) -> None:
        self.grad = None

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        extra = ", requires_grad=True" if self.requires_grad else ""
        if self._ctx is not None:
            extra += f", op={self._ctx.name}"
        body = np.array2string(self._data, precision=4, separator=", ", prefix="Tensor(")
        return f"Tensor({body}, dtype={self.dtype}{extra})"

    def __hash__(self) -> int:
        return id(self)

    def __bool__(self) -> bool:
        return bool(self._data)

    # --- in-place changes: allowed only where no gradient can be corrupted --------------------
    def _check_inplace(self, what: str) -> None:
        if self.requires_grad and is_grad_enabled():
            raise RuntimeError(
                f"{what}: in-place change of a tensor that requires grad (shape {self.shape}); "
                "do it under no_grad() or on a detached tensor"
            )

    def __setitem__(self, index: Any, value: Any) -> None:
        self._check_inplace("__setitem__")
        self._data[_index_array(index)] = value.data if isinstance(value, Tensor) else value
        self._version += 1

    def _inplace(self, op: Any, other: Any, what: str) -> Tensor:
        self._check_inplace(what)
        op(self._data, other.data if isinstance(other, Tensor) else other, out=self._data)
        self._version += 1
        return self

    def __iadd__(self, other: Any) -> Tensor:
        return self._inplace(np.add, other, "+=")

    def __isub__(self, other: Any) -> Tensor:
        return self._inplace(np.subtract, other, "-=")

    def __imul__(self, other: Any) -> Tensor:
        return self._inplace(np.multiply, other, "*=")

    def __itruediv__(self, other: Any) -> Tensor:
        return self._inplace(np.divide, other, "/=")

    # --- backward ------------------------------------------------------------------------------
    def backward(self, grad: Any = None, retain_graph: bool = False, trace: bool = False) -> None:
        """Accumulate dself/dleaf into every leaf's .grad (notes 10.2: branches add up).

        grad: dL/dself; may be omitted only when self has one element (then it is 1).
        retain_graph: keep the recorded ops so that backward can run through them again.
        trace: print every step of the backward pass (op, shapes, gradient norms).
        """
        if not self.requires_grad:
            raise RuntimeError(
                f"backward: this tensor (shape {self.shape}) does not require grad and has no graph"
            )
        if grad is None:
            if self.size != 1:
                raise RuntimeError(
                    f"backward: output has shape {self.shape}; a gradient can be implied only for "
                    "a one-element output; pass grad= with the output's shape"
                )
            grad = np.ones_like(self._data)
        else:
            # a copy: the caller's array must never become (or alias) some tensor's .grad
            grad = np.array(grad.data if isinstance(grad, Tensor) else grad, dtype=self.dtype)
            if grad.shape != self.shape:
                raise ValueError(
                    f"backward: grad has shape {grad.shape} but the output has shape {self.shape}"
                )
            if not np.isfinite(grad).all():
                raise ValueError("backward: the seed gradient contains NaN or Inf")
        run_backward(self, grad, retain_graph, trace)

    # --- operators (the ops themselves live in autograd/ops.py) --------------------------------
    def _lift(self, other: Any) -> Tensor:
        if isinstance(other, Tensor):
            return other
        return Tensor._make(
            np.asarray(other, dtype=self.dtype if self.dtype.kind == "f" else None), False
        )

    def __add__(self, other: Any) -> Tensor:
        return _ops.Add.apply(self, self._lift(other))

    def __radd__(self, other: Any) -> Tensor:
        return _ops.Add.apply(self._lift(other), self)

    def __sub__(self, other: Any) -> Tensor:
        return _ops.Sub.apply(self, self._lift(other))

    def __rsub__(self, other: Any) -> Tensor:
        return _ops.Sub.apply(self._lift(other), self)

    def __mul__(self, other: Any) -> Tensor:
        return _ops.Mul.apply(self, self._lift(other))

    def __rmul__(self, other: Any) -> Tensor:
        return _ops.Mul.apply(self._lift(other), self)

    def __truediv__(self, other: Any) -> Tensor:
        return _ops.Div.apply(self, self._lift(other))

    def __rtruediv__(self, other: Any) -> Tensor:
        return _ops.Div.apply(self._lift(other), self)

    def __pow__(self, other: Any) -> Tensor:
        return _ops.Pow.apply(self, self._lift(other))

    def __rpow__(self, other: Any) -> Tensor:
        return _ops.Pow.apply(self._lift(other), self)

    def __matmul__(self, other: Any) -> Tensor:
        return _ops.MatMul.apply(self, self._lift(other))

    def __rmatmul__(self, other: Any) -> Tensor:
        return _ops.MatMul.apply(self._lift(other), self)

    def __neg__(self) -> Tensor:
        return _ops.Neg.apply(self)

    def __getitem__(self, index: Any) -> Tensor:
        return _ops.GetItem.apply(self, index=_index_array(index))

    # Comparisons give plain boolean arrays: they have no gradient.
    def __lt__(self, other: Any) -> np.ndarray:
        return self._data < np.asarray(other)

    def __le__(self, other: Any) -> np.ndarray:
        return self._data <= np.asarray(other)

    def __gt__(self, other: Any) -> np.ndarray:
        return self._data > np.asarray(other)

    def __ge__(self, other: Any) -> np.ndarray:
        return self._data >= np.asarray(other)

    def exp(self) -> Tensor:
        return _ops.Exp.apply(self)

    def log(self) -> Tensor:
        return _ops.Log.apply(self)

    def sqrt(self) -> Tensor:
        return _ops.Sqrt.apply(self)

    def tanh(self) -> Tensor:
        return _ops.Tanh.apply(self)

    def relu(self) -> Tensor:
        return _ops.Relu.apply(self)

    def sigmoid(self) -> Tensor:
        return _ops.Sigmoid.apply(self)

    def sum(self, axis: Any = None, keepdims: bool = False) -> Tensor:
        return _ops.Sum.apply(self, axis=axis, keepdims=keepdims)

    def mean(self, axis: Any = None, keepdims: bool = False) -> Tensor:
        return _ops.Mean.apply(self, axis=axis, keepdims=keepdims)

    def max(self, axis: Any = None, keepdims: bool = False) -> Tensor:
        return _ops.Max.apply(self, axis=axis, keepdims=keepdims)

    def reshape(self, *shape: Any) -> Tensor:
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        return _ops.Reshape.apply(self, shape=shape)

    def transpose(self, *axes: Any) -> Tensor:
        if len(axes) == 1 and isinstance(axes[0], (tuple, list)):
            axes = tuple(axes[0])
        return _ops.Transpose.apply(self, axes=axes or None)

    @property
    def T(self) -> Tensor:
        return self.transpose()


def _index_array(index: Any) -> Any:
    """Tensors inside an index stand for their integer/boolean arrays."""
    if isinstance(index, Tensor):
        return index.data
    if isinstance(index, tuple):
        return tuple(i.data if isinstance(i, Tensor) else i for i in index)
    return index


def _topological_order(root: Tensor) -> list[Tensor]:
    """Tensors of root's graph, every tensor after all the ops that consume it (outputs first).

    An explicit stack instead of recursion, so that a chain of 100,000 ops is fine.
    """
    post_order: list[Tensor] = []
    visited: set[int] = set()
    stack: list[tuple[Tensor, bool]] = [(root, False)]
    while stack:
        tensor, inputs_done = stack.pop()
        if inputs_done:
            post_order.append(tensor)
            continue
        if id(tensor) in visited:
            continue
        visited.add(id(tensor))
        stack.append((tensor, True))
        fn = tensor._ctx
        if fn is None:
            continue
        if not hasattr(fn, "inputs") or fn.inputs is None:
            raise RuntimeError(
                f"backward: the graph through {fn.name} (output shape {tensor.shape}) was already "
                "released by an earlier backward(); pass retain_graph=True to the first backward "
                "to run backward twice"
            )
        for parent in fn.inputs:
            if parent._requires_grad and id(parent) not in visited:
                stack.append((parent, False))
    post_order.reverse()
    return post_order


def run_backward(root: Tensor, seed: np.ndarray, retain_graph: bool, trace: bool) -> None:
    """The backward loop: walk the ops from the output to the leaves, applying each VJP."""
    order = _topological_order(root)
    tracer = None
    if trace:
        from autograd.trace import BackwardTracer

        tracer = BackwardTracer()
    pending: dict[int, np.ndarray] = {id(root): seed}
    adopted: set[int] = set()  # arrays that became some tensor's .grad during this pass
    for step, tensor in enumerate(order):
        grad = pending.pop(id(tensor), None)
        if grad is None:
            continue
        fn = tensor._ctx
        if fn is None or tensor._retains_grad:
            _accumulate(tensor, grad, adopted)
            if fn is None:
                if tracer is not None:
                    tracer.leaf(tensor, grad)
                continue
        _check_versions(fn, tensor)
        input_grads = fn.backward(grad)
        if tracer is not None:
            tracer.step(step, fn, tensor, grad, input_grads, pending)
        for parent, parent_grad in zip(fn.inputs, input_grads, strict=True):
            if parent_grad is None or not parent._requires_grad:
                continue
            if parent_grad.shape != parent.shape:
                raise RuntimeError(
                    f"backward of {fn.name}: produced a gradient of shape {parent_grad.shape} "
                    f"for an input of shape {parent.shape} (a bug in that op's VJP)"
                )
            if _Anomaly.enabled:
                _check_finite(parent_grad, f"gradient produced by {fn.name}.backward", fn, [grad])
            key = id(parent)
            if key in pending:
                pending[key] = pending[key] + parent_grad  # a tensor used twice: contributions add
            else:
                pending[key] = parent_grad
        if not retain_graph:
            fn.inputs = None
            fn.saved = ()


def _check_versions(fn: Function, output: Tensor) -> None:
    for index, version in zip(fn._saved_inputs, fn._versions, strict=True):
        tensor = fn.inputs[index]
        if tensor._version != version:
            raise RuntimeError(
                f"backward of {fn.name}: input {index} (shape {tensor.shape}) was modified in "
                f"place after it was saved for backward (version {version} -> {tensor._version}); "
                "its gradient would be wrong. Use an out-of-place op or clone before changing it"
            )
    if fn._saves_output and output._version != 0:
        raise RuntimeError(
            f"backward of {fn.name}: its output (shape {output.shape}) was modified in place "
            f"after it was saved for backward (version 0 -> {output._version})"
        )


def _accumulate(tensor: Tensor, grad: np.ndarray, adopted: set[int]) -> None:
    """tensor.grad += grad. A first gradient that this backward pass owns outright (a fresh
    array, not a view, not handed out before) becomes .grad as it is: no copy of every parameter
    gradient each step. Anything else is copied, so two .grad arrays never share memory."""
    if tensor.grad is not None:
        tensor.grad += grad
    elif grad.dtype == tensor.dtype and grad.flags.owndata and id(grad) not in adopted:
        adopted.add(id(grad))
        tensor.grad = grad
    else:
        tensor.grad = np.array(grad, dtype=tensor.dtype, copy=True)


from autograd import ops as _ops  # noqa: E402  (ops subclass Function defined above)
