"""The graph core: Tensor, Function (one primitive = forward + VJP + JVP), and the backward loop.

Reverse mode in one paragraph (notes 10.2): every op records the inputs it was applied to; the
output of the whole computation is a scalar L; `L.backward()` visits the recorded ops from the
output back to the leaves, and each op turns the gradient of its output, dL/dout, into the
gradients of its inputs, dL/din (its vector-Jacobian product, VJP). A tensor used twice receives
the sum of both contributions (`+=`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from autograd import hooks

_default_dtype: np.dtype = np.dtype(np.float32)  # process-wide (a switch for tests, gradchecks)
_grad_mode = threading.local()  # per-thread: no_grad() in one thread never affects another


def set_default_dtype(dtype: Any) -> None:
    """Set the float dtype new tensors get from Python numbers, lists and float arrays.

    Process-wide, like torch.set_default_dtype; code that needs a dtype should pass dtype=.
    """
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


def describe(arrays: Sequence[Any]) -> str:
    """'(2, 3) float32, int' for error messages that name what an op was given."""
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
    dL/d(output) and returns one gradient per input array (None for an input that needs none),
    each an array of its own (never `grad` or a view of it). An instance is the graph node: it
    keeps the inputs until backward releases it. `needs_input_grad[i]` says whether input i
    requires grad: a backward may skip the gradient of an input that does not (a frozen weight's
    x^T g is the largest product of a Linear's backward). `vjp` is the same VJP on Tensors, for
    create_graph=True (autograd/higher_order.py). `jvp(out, *tangents)` is forward mode's rule:
    the tangent of the output from the tangents of the inputs (autograd/forward_ad.py).
    """

    __slots__ = ("inputs", "needs_input_grad", "saved", "saved_versions", "created_at")

    def save_for_backward(self, *arrays: Any) -> None:
        self.saved = arrays

    def forward(self, *arrays: np.ndarray, **params: Any) -> np.ndarray:
        raise NotImplementedError

    def backward(self, grad: np.ndarray) -> tuple[np.ndarray | None, ...]:
        raise NotImplementedError

    def vjp(self, grad: Tensor, output: Tensor) -> tuple[Tensor | None, ...]:
        """backward on Tensors, written with Tensor ops, so that the gradients it returns have a
        graph of their own (create_graph=True). `output` is the tensor this node produced."""
        raise NotImplementedError(
            f"{self.name} has no differentiable VJP (Function.vjp), so create_graph=True cannot "
            "differentiate through it; write one with Tensor ops (or see autograd.ops.Op)"
        )

    def jvp(self, out: np.ndarray, *tangents: np.ndarray) -> np.ndarray:
        """The tangent of the output (the array `out`) from one tangent per input (arrays of the
        inputs' shapes, zeros for an input that carries none); forward may have saved what it
        needs, as for backward. Called during forward, inside a dual_level (forward mode)."""
        raise NotImplementedError(
            f"{self.name} has no JVP rule (Function.jvp), so forward mode cannot go through it"
        )

    # --- the compiled form (autograd.compile, CONTRIBUTING.md "Adding an op") ----------------
    # A compiled step replays every op. These methods tell it how; the defaults mean "replay my
    # own forward and VJP" (the result copied into a planned buffer, the gradients added into
    # the inputs'), so a new op is compiled as soon as forward and backward exist. `c` is the
    # op's view of the plan (autograd.compile.plan.OpContext): its inputs' slots and Values, its
    # output and gradient buffers, scratch buffers, the `fusion` flag and `matmul`.

    def compiled_forward(self, c: Any) -> tuple[Callable[[], None], str] | None:
        """(a step writing this op's output into c.out, a note for the plan's printout), or
        None: the step calls forward() and copies its result. If the step does not call
        forward (which saves for backward), compiled_backward must return a step too."""
        return None

    def compiled_backward(self, c: Any) -> tuple[Callable[[], None], str] | None:
        """(a step adding the inputs' gradients from c.g into c.grad(i) buffers, a note), or
        None: the step calls backward() and adds what it returns."""
        return None

    def backward_reads(self, c: Any) -> tuple[int, ...] | None:
        """Positions of the inputs whose arrays the compiled backward reads (the plan keeps
        those buffers alive until then and reuses the rest); None: the inputs and the output,
        whatever the VJP saved."""
        return None

    def makes_view(self, params: dict) -> bool:
        """Whether forward returns a view of its first input (the same view of any array of
        that shape): a compiled step makes it once, on the input's buffer."""
        return False

    def batch_axis(self, axes: list[int | None], c: Any) -> int | None:
        """The output's batch axis, given each input's (None: replicated, at least one not),
        for a step sharded over the batch rows (autograd/compile/shard.py); None: this op does
        not keep the rows apart. c.shapes, c.out_shape, c.params, c.batched (the names of the
        keyword parameters that are the step's batched arguments) and c.n (shards) describe
        the call."""
        return None

    def replicated_params(self, params: dict) -> tuple[str, ...]:
        """The keyword array parameters (not step arguments) that are the same for every batch
        row, which a sharded step passes whole to each shard (rotary's angle tables); any other
        array parameter beside batched values keeps the step whole."""
        return ()

    def shard_params(self, params: dict, out_shape: tuple[int, ...]) -> dict:
        """The keyword parameters that give this op the output shape `out_shape` (one batch
        shard's): the same, unless a parameter spells the output's shape."""
        return params

    def batch_mean(self, params: dict) -> tuple[str, Callable[[np.ndarray], int]] | None:
        """For a loss that is a mean over batch rows: (the keyword parameter holding the rows,
        a function counting the rows of it that count); a sharded step weights each shard's loss
        by its count. None: not such a loss."""
        return None

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
            raise _op_error(cls.__name__, exc, arrays) from exc
        for observer in hooks.ACTIVE:
            observer.forward(fn, out_data, arrays)
        requires_grad = any(t._requires_grad for t in inputs) and is_grad_enabled()
        out = Tensor._make(out_data, requires_grad, _counter_of_viewed(out_data, inputs))
        if hooks.RECORDER is not None:  # autograd.compile is tracing this call
            hooks.RECORDER.op(fn, inputs, params, out)
        if hooks.DUAL_LEVEL is not None:  # forward mode: the tangent rides along (forward_ad)
            hooks.DUAL_LEVEL.push(fn, inputs, out)
        if requires_grad:
            fn.inputs = inputs
            fn.needs_input_grad = tuple(t._requires_grad for t in inputs)
            fn.saved_versions = _saved_versions(fn.saved, inputs, out)
            out._ctx = fn
        else:
            fn.saved = ()
        return out

    def release(self) -> None:
        """Drop the inputs and saved arrays once backward has run (the graph is freed)."""
        self.inputs = None
        self.saved = ()


def _op_error(op: str, exc: Exception, arrays: Sequence[Any]) -> Exception:
    """The same kind of error, naming the op and what it was given (numpy's own is the cause).

    The plain base class is used: numpy's subclasses (e.g. _UFuncNoLoopError) take other
    constructor arguments than a message.
    """
    base = next(k for k in (IndexError, TypeError, ValueError) if isinstance(exc, k))
    return base(f"{op}: {exc} (inputs: {describe(arrays)})")


# --- version counters: an in-place change of a saved array is caught at backward ------------------


class VersionCounter:
    """How many times a storage was changed in place. Tensors that view the same numpy storage
    (reshape, basic indexing, detach) share one counter, as in PyTorch."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0


def _storage(array: np.ndarray) -> np.ndarray:
    """The array that owns the memory `array` views."""
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array


def _counter_of_viewed(out: np.ndarray, inputs: Sequence[Tensor]) -> VersionCounter | None:
    """An output that views an input's storage shares that input's counter."""
    if not isinstance(out, np.ndarray) or out.base is None:
        return None
    storage = _storage(out)
    for t in inputs:
        if _storage(t._data) is storage:
            return t._counter
    return None


def _saved_versions(saved: Sequence[Any], inputs: Sequence[Tensor], out: Tensor) -> tuple:
    """(label, shape, counter, version) of every input and output whose storage backward reads."""
    storages = {id(_storage(a)) for a in saved if isinstance(a, np.ndarray)}
    if not storages:
        return ()
    watched = [(f"input {i}", t) for i, t in enumerate(inputs)] + [("its output", out)]
    return tuple(
        (label, t.shape, t._counter, t._counter.value)
        for label, t in watched
        if id(_storage(t._data)) in storages
    )


def _check_saved_versions(fn: Function) -> None:
    for label, shape, counter, version in fn.saved_versions:
        if counter.value != version:
            raise RuntimeError(
                f"backward of {fn.name}: {label} (shape {shape}) was modified in place after it "
                f"was saved for backward (version {version} -> {counter.value}); its gradient "
                "would be wrong. Use an out-of-place op or clone before changing it"
            )


class Tensor:
    """A numpy array plus what reverse mode needs: .grad, .requires_grad and the op that made it."""

    __slots__ = (
        "_data",
        "grad",
        "_requires_grad",
        "_ctx",
        "_counter",
        "_retains_grad",
        "name",
        "_tangent",
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
        self._counter = VersionCounter()
        self._retains_grad = False
        self.name = name
        self._tangent = None
        self._requires_grad = False
        self.requires_grad = requires_grad

    @classmethod
    def _make(
        cls, array: np.ndarray, requires_grad: bool, counter: VersionCounter | None = None
    ) -> Tensor:
        """Wrap an op's output without the conversions of __init__ (hot path)."""
        t = object.__new__(cls)
        t._data = array if isinstance(array, np.ndarray) else np.asarray(array)
        t.grad = None
        t._ctx = None
        t._counter = VersionCounter() if counter is None else counter
        t._retains_grad = False
        t.name = None
        t._tangent = None  # (dual level, tangent array) inside forward_ad.dual_level()
        t._requires_grad = requires_grad
        return t

    # --- the array and its metadata -------------------------------------------------------------
    @property
    def data(self) -> np.ndarray:
        return self._data

    @data.setter
    def data(self, value: Any) -> None:
        self._data = np.asarray(value.data if isinstance(value, Tensor) else value)
        self._counter.value += 1

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
    def _version(self) -> int:
        """How many in-place changes this tensor's storage has seen."""
        return self._counter.value

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
        if hooks.RECORDER is not None:
            hooks.RECORDER.read_value(self, "item()")
        if self._data.size != 1:
            raise ValueError(
                f"item: tensor has shape {self.shape}; only a one-element tensor has an item"
            )
        return self._data.item()

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        if hooks.RECORDER is not None:
            hooks.RECORDER.read_value(self, "np.asarray()")
        return self._data if dtype is None else self._data.astype(dtype, copy=False)

    def detach(self) -> Tensor:
        """The same array (and version counter), cut off from the graph."""
        return Tensor._make(self._data, False, self._counter)

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
        if hooks.RECORDER is not None:
            hooks.RECORDER.read_value(self, "bool()")
        return bool(self._data)

    # --- in-place changes: allowed only where no gradient can be corrupted --------------------
    def _check_inplace(self, what: str) -> None:
        if self.requires_grad and is_grad_enabled():
            raise RuntimeError(
                f"{what}: in-place change of a tensor that requires grad (shape {self.shape}); "
                "do it under no_grad() or on a detached tensor"
            )
        if hooks.DUAL_LEVEL is not None and hooks.DUAL_LEVEL.tangent(self) is not None:
            raise RuntimeError(
                f"{what}: in-place change of a dual tensor (shape {self.shape}): its tangent would "
                "no longer match its value; compute a new tensor instead"
            )

    def __setitem__(self, index: Any, value: Any) -> None:
        self._check_inplace("__setitem__")
        self._data[_index_array(index)] = value.data if isinstance(value, Tensor) else value
        self._counter.value += 1

    def _inplace(self, op: Any, other: Any, what: str) -> Tensor:
        self._check_inplace(what)
        op(self._data, other.data if isinstance(other, Tensor) else other, out=self._data)
        self._counter.value += 1
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
    def backward(
        self,
        grad: Any = None,
        retain_graph: bool | None = None,
        trace: bool = False,
        create_graph: bool = False,
    ) -> None:
        """Accumulate dself/dleaf into every leaf's .grad (notes 10.2: branches add up).

        grad: dL/dself; may be omitted only when self has one element (then it is 1).
        retain_graph: keep the recorded ops so that backward can run through them again
        (default: create_graph).
        trace: print every step of the backward pass (op, shapes, gradient norms).
        create_graph: the .grad of each leaf becomes a Tensor with a graph of its own, which can
        be differentiated again (as in PyTorch); see autograd.grad for the usual way.
        """
        if not self.requires_grad:
            raise RuntimeError(
                f"backward: this tensor (shape {self.shape}) does not require grad and has no graph"
            )
        seed = seed_gradient(self, grad, "backward")
        if create_graph:
            seed = Tensor._make(seed, False)
        observers = list(hooks.ACTIVE)
        if trace:  # registered by autograd/viz/trace.py (autograd/__init__ imports it)
            observers.append(hooks.TRACER())
        retain = create_graph if retain_graph is None else retain_graph
        run_backward([self], [seed], retain, observers, create_graph=create_graph)

    # Operators (+ - * / ** @, indexing, .sum(), .exp(), ...) are attached by autograd/ops.py,
    # where the ops are defined. Comparisons are elementwise and give plain boolean arrays (they
    # have no gradient); a Tensor is still hashed by identity.
    def __eq__(self, other: Any) -> np.ndarray:  # type: ignore[override]
        return self._data == _array_of(other)

    def __ne__(self, other: Any) -> np.ndarray:  # type: ignore[override]
        return self._data != _array_of(other)

    def __lt__(self, other: Any) -> np.ndarray:
        return self._data < _array_of(other)

    def __le__(self, other: Any) -> np.ndarray:
        return self._data <= _array_of(other)

    def __gt__(self, other: Any) -> np.ndarray:
        return self._data > _array_of(other)

    def __ge__(self, other: Any) -> np.ndarray:
        return self._data >= _array_of(other)


def _array_of(x: Any) -> Any:
    return x._data if isinstance(x, Tensor) else x


def _index_array(index: Any) -> Any:
    """Tensors inside an index stand for their integer/boolean arrays."""
    if isinstance(index, Tensor):
        return index.data
    if isinstance(index, tuple):
        return tuple(i.data if isinstance(i, Tensor) else i for i in index)
    return index


def seed_gradient(output: Tensor, grad: Any, caller: str) -> np.ndarray:
    """The gradient that starts a backward pass from `output`: a copy of `grad` (the caller's
    array must never become, or alias, some tensor's .grad), or 1 for a one-element output."""
    if grad is None:
        if output.size != 1:
            raise RuntimeError(
                f"{caller}: output has shape {output.shape}; a gradient can be implied only for "
                "a one-element output; pass grad= with the output's shape"
            )
        return np.ones_like(output._data)
    grad = np.array(grad.data if isinstance(grad, Tensor) else grad, dtype=output.dtype)
    if grad.shape != output.shape:
        raise ValueError(
            f"{caller}: grad has shape {grad.shape} but the output has shape {output.shape}"
        )
    if not np.isfinite(grad).all():
        raise ValueError(f"{caller}: the seed gradient contains NaN or Inf")
    return grad


def _topological_order(roots: Sequence[Tensor]) -> list[Tensor]:
    """Tensors of the roots' graph, every tensor after all the ops that consume it (outputs first).

    An explicit stack instead of recursion, so that a chain of 100,000 ops is fine.
    """
    post_order: list[Tensor] = []
    visited: set[int] = set()
    stack: list[tuple[Tensor, bool]] = [(root, False) for root in reversed(roots)]
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
        if fn.inputs is None:
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


def _reaching(order: list[Tensor], targets: set[int]) -> set[int]:
    """Ids of the tensors in `order` from which some target can be reached (targets included)."""
    reach: set[int] = set()
    for tensor in reversed(order):  # inputs before the ops that consume them
        fn = tensor._ctx
        if id(tensor) in targets or (fn is not None and any(id(p) in reach for p in fn.inputs)):
            reach.add(id(tensor))
    return reach


def run_backward(
    roots: Sequence[Tensor],
    seeds: Sequence[Any],
    retain_graph: bool,
    observers: Sequence[hooks.Observer] = (),
    create_graph: bool = False,
    inputs: Sequence[Tensor] | None = None,
) -> list[Any] | None:
    """The backward loop: walk the ops from the outputs to the leaves, applying each VJP.

    create_graph: apply each op's `vjp` (Tensors in, Tensors out) instead of its numpy
    `backward`: the gradients are then Tensors whose own graph can be differentiated again.
    inputs: return the gradients of these tensors (None where none arrived) instead of
    accumulating into the leaves' .grad, running only the ops on a path to them (autograd.grad).
    """
    recorder = hooks.RECORDER
    if recorder is not None:  # autograd.compile records the order of the VJPs (or refuses)
        observers = [*observers, recorder.backward(roots, seeds, create_graph, inputs)]
    pending: dict[int, Any] = {}  # gradients waiting for their tensor
    for root, seed in zip(roots, seeds, strict=True):
        key = id(root)
        pending[key] = pending[key] + seed if key in pending else seed
    order = _topological_order(roots)
    wanted = {id(t) for t in inputs} if inputs is not None else None
    reach = _reaching(order, wanted) if wanted is not None else None
    found: dict[int, Any] = {}
    adopted: set[int] = set()  # arrays that became some tensor's .grad during this pass
    for step, tensor in enumerate(order):
        if not retain_graph:
            order[step] = None  # its consumers came first: now nothing here holds its array
        grad = pending.pop(id(tensor), None)
        if grad is None:
            continue
        fn = tensor._ctx
        if wanted is not None:
            if id(tensor) in wanted:
                found[id(tensor)] = grad
            if fn is None or not any(id(p) in reach for p in fn.inputs):
                continue  # nothing below this tensor is asked for
        elif fn is None or tensor._retains_grad:
            _accumulate(tensor, grad, adopted)
        if fn is None:
            for observer in observers:
                observer.leaf(tensor, grad)
            continue
        _check_saved_versions(fn)
        input_grads = fn.vjp(grad, tensor) if create_graph else fn.backward(grad)
        for observer in observers:
            observer.backward_step(step, fn, tensor, grad, input_grads)
        for parent, parent_grad in zip(fn.inputs, input_grads, strict=True):
            if parent_grad is None or not parent._requires_grad:
                continue
            _check_gradient_shape(fn, parent, parent_grad)
            key = id(parent)
            # a tensor used twice: its contributions add (notes 10.2)
            pending[key] = pending[key] + parent_grad if key in pending else parent_grad
        if not retain_graph:
            fn.release()
    if recorder is not None:
        recorder.backward_done()
    return None if inputs is None else [found.get(id(t)) for t in inputs]


def _check_gradient_shape(fn: Function, parent: Tensor, grad: np.ndarray) -> None:
    if grad.shape != parent.shape:
        raise RuntimeError(
            f"backward of {fn.name}: produced a gradient of shape {grad.shape} "
            f"for an input of shape {parent.shape} (a bug in that op's VJP)"
        )


def _accumulate(tensor: Tensor, grad: Any, adopted: set[int]) -> None:
    """tensor.grad += grad. A first gradient that this backward pass owns outright (a fresh
    array, not a view, not handed out before) becomes .grad as it is: no copy of every parameter
    gradient each step. Anything else is copied, so two .grad arrays never share memory. A
    Tensor gradient (create_graph) is kept as a Tensor, its graph with it."""
    if isinstance(grad, Tensor):
        tensor.grad = grad if tensor.grad is None else grad + tensor.grad
    elif tensor.grad is not None:
        tensor.grad += grad
    elif grad.dtype == tensor.dtype and grad.flags.owndata and id(grad) not in adopted:
        adopted.add(id(grad))
        tensor.grad = grad
    else:
        tensor.grad = np.array(grad, dtype=tensor.dtype, copy=True)
