"""autograd.compile: trace a training step once, plan its memory, replay it (docs/compile.md).

    step = autograd.compile(step_fn)   # step_fn(x, y): zero_grad, forward, loss, backward, update
    loss = step(x, y)                  # first call for these shapes: runs eagerly and traces
    loss = step(x, y)                  # later calls: replay the plan

Three stages, like tinygrad's TinyJit and llm.c's single activation buffer:

1. Trace. The first call for given argument shapes/dtypes runs step_fn eagerly (its results are
   the eager ones) while a Recorder (autograd.hooks.RECORDER) is told of every op
   (Function.apply), of the backward pass and the order of its VJPs, of zero_grad, gradient
   clipping and the optimizer update. Reading a traced tensor's value (`.item()`, `bool()`,
   `np.asarray`) means Python control flow on data, which a replay cannot follow: it is refused
   with a TraceError, as are ops inside backward (create_graph, higher order).
2. Plan (autograd/plan.py). Each value gets a slot; the ops the lowering knows (Linear,
   LayerNorm, GELU, add, embedding, views, ...) get output and gradient buffers from an arena
   planned from liveness (a buffer is reused once its value is dead), write them with `out=`,
   and accumulate gradients in place. Other ops replay their own forward/backward. With fusion
   on, AdamW runs as one kernel over a flat parameter buffer.
3. Replay. A list of closures over the slots: no Tensor or Function created, no topological sort.

A new shape or dtype of an argument traces again (one plan per key). Non-array arguments are part
of the key, by value. Arrays that a step computes outside any op from its arguments (not through
Tensor ops) are constants of the trace: pass them as arguments instead.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from autograd import hooks, kernels
from autograd.tensor import Function, Tensor, _storage


class TraceError(RuntimeError):
    """The step does something a replay could not repeat faithfully (said why, at trace time)."""


class Value:
    """One tensor of the trace. kind: "input" (argument `index`), "leaf" (a parameter or constant
    tensor, read from `tensor` at each replay) or "op" (the output of node `node`)."""

    __slots__ = ("id", "tensor", "kind", "index", "node", "shape", "dtype", "requires_grad")

    def __init__(self, vid: int, tensor: Tensor, kind: str, index: int = -1) -> None:
        self.id = vid
        self.tensor = tensor
        self.kind = kind
        self.index = index
        self.node: Node | None = None
        self.shape = tensor.shape
        self.dtype = tensor.dtype
        self.requires_grad = tensor.requires_grad


class Node:
    """One recorded op: the Function instance (replayed as it is), its input and output values,
    its keyword parameters, and which parameters are arguments of the step (by position)."""

    __slots__ = ("fn", "inputs", "params", "arg_params", "out", "view_of", "stats")

    def __init__(self, fn: Function, inputs: list[Value], params: dict, out: Value) -> None:
        self.fn = fn
        self.inputs = inputs
        self.params = params
        self.arg_params: dict[str, int] = {}
        self.out = out
        self.view_of: Value | None = None  # the input whose memory the output views, if any
        self.stats: Any = None  # what a lowered forward keeps for its backward

    @property
    def name(self) -> str:
        return self.fn.name


class Recorder:
    """The listener of autograd.hooks.RECORDER while one call of the step is traced."""

    def __init__(self, args: tuple) -> None:
        self.args = args
        self.values: dict[int, Value] = {}  # id(tensor) -> Value (the tensors are kept alive)
        self.nodes: list[Node] = []
        self.program: list[tuple] = []  # ("op", node) | ("backward", ...) | ("call", ...) | ...
        self.used_args: set[int] = set()
        self.in_backward = False
        self.backward_steps: list[tuple[Node, Value]] | None = None

    # --- values ----------------------------------------------------------------------------
    def value(self, t: Tensor) -> Value:
        v = self.values.get(id(t))
        if v is not None:
            return v
        arg = next((i for i, a in enumerate(self.args) if a is t._data), None)
        if arg is not None:
            self.used_args.add(arg)
            v = Value(len(self.values), t, "input", arg)
        else:
            self._refuse_view_of_argument(t._data, "a tensor")
            if t.requires_grad and t.grad is not None:
                raise TraceError(
                    f"compile: a parameter (shape {t.shape}) already has a .grad when the step "
                    "uses it, so the step would add to the previous step's gradient; call "
                    "optimizer.zero_grad() inside the step"
                )
            v = Value(len(self.values), t, "leaf")
        self.values[id(t)] = v
        return v

    def _refuse_view_of_argument(self, array: Any, what: str) -> None:
        if not isinstance(array, np.ndarray):
            return
        for i, a in enumerate(self.args):
            if isinstance(a, np.ndarray) and array is not a and _storage(array) is _storage(a):
                raise TraceError(
                    f"compile: {what} {array.shape} views argument {i} {a.shape} without being "
                    "it; a replay would not see the new argument's data. Pass the view itself "
                    "as the argument"
                )

    # --- events from the engine --------------------------------------------------------------
    def op(self, fn: Function, inputs: tuple[Tensor, ...], params: dict, out: Tensor) -> None:
        if self.in_backward:
            raise TraceError(
                f"compile: op {fn.name} ran inside backward (create_graph / higher-order "
                "gradients): a compiled step replays one first-order backward only; run this "
                "step eagerly"
            )
        node = Node(fn, [self.value(t) for t in inputs], params, None)  # type: ignore[arg-type]
        for key, p in params.items():
            arg = next((i for i, a in enumerate(self.args) if a is p), None)
            if arg is not None:
                node.arg_params[key] = arg
                self.used_args.add(arg)
            else:
                self._refuse_view_of_argument(p, f"parameter {key!r} of {fn.name}")
        v = Value(len(self.values), out, "op")
        v.node = node
        node.out = v
        self.values[id(out)] = v
        if isinstance(out._data, np.ndarray) and out._data.base is not None:
            storage = _storage(out._data)
            node.view_of = next(
                (i for i in node.inputs if _storage(i.tensor._data) is storage), None
            )
        self.nodes.append(node)
        self.program.append(("op", node))

    def read_value(self, t: Tensor, what: str) -> None:
        v = self.values.get(id(t))
        if v is not None and v.kind != "leaf":
            raise TraceError(
                f"compile: {what} of a tensor computed in the step (shape {t.shape}): its value "
                "changes every step, but Python code that depends on it would be frozen into "
                "the trace. Return the tensor from the step and read it outside"
            )

    def backward(self, root: Tensor, retain_graph: bool) -> hooks.Observer:
        if self.backward_steps is not None:
            raise TraceError("compile: a compiled step may run backward() once")
        if id(root) not in self.values:
            raise TraceError("compile: backward() of a tensor that the step did not compute")
        self.backward_steps = []
        self.in_backward = True
        self.program.append(("backward", self.values[id(root)], self.backward_steps))
        recorder = self

        class Steps(hooks.Observer):
            def backward_step(self, step, fn, output, grad, input_grads) -> None:
                recorder.backward_steps.append((recorder.values[id(output)].node, fn))

        return Steps()

    def backward_done(self) -> None:
        self.in_backward = False

    def call(self, name: str, fn: Callable, *args: Any) -> Any:
        """Run fn(*args) now and replay it at that point of every later step (nn code that
        works on the gradient arrays outside the graph: zero_grad, clip_grad_norm_)."""
        result = fn(*args)
        self.program.append(("call", name, fn, args, result))
        return result

    def optimizer_step(self, optimizer: Any) -> None:
        """optimizer.step() is about to run; replay it (or its fused form) at this point."""
        self.program.append(("optimizer", optimizer))

    # --- after the call ------------------------------------------------------------------------
    def check_arguments(self) -> None:
        for i, a in enumerate(self.args):
            if isinstance(a, np.ndarray) and i not in self.used_args:
                raise TraceError(
                    f"compile: argument {i} ({a.shape} {a.dtype}) never reached an op as it is "
                    "(it was converted or copied inside the step, e.g. by astype), so a replay "
                    f"could not feed it new data; pass it in the dtype the step uses"
                )


def _key(args: tuple) -> tuple:
    """Cache key: shape and dtype of every array argument, the value of every other one."""
    parts: list[Any] = [kernels.get_backend()]
    for a in args:
        if isinstance(a, np.ndarray):
            parts.append(("array", a.shape, a.dtype.str))
        else:
            try:
                hash(a)
            except TypeError:
                raise TypeError(
                    f"compile: argument {a!r} is neither a numpy array nor hashable; the "
                    "compiled step keys its plans by the array shapes and the other values"
                ) from None
            parts.append(("value", a))
    return tuple(parts)


class CompiledStep:
    """A step function with one traced plan per argument signature (see the module docstring)."""

    def __init__(self, step_fn: Callable, fusion: bool = True) -> None:
        self.step_fn = step_fn
        self.fusion = fusion
        self.plans: dict[tuple, Any] = {}
        self.__wrapped__ = step_fn
        self.__doc__ = step_fn.__doc__

    def __call__(self, *args: Any) -> Any:
        args = tuple(a.data if isinstance(a, Tensor) else a for a in args)
        key = _key(args)
        plan = self.plans.get(key)
        if plan is not None and plan.still_valid():
            return plan.replay(args)
        return self._trace(key, args)

    def _trace(self, key: tuple, args: tuple) -> Any:
        from autograd.plan import Plan  # the planner needs the lowering and the kernels

        if hooks.RECORDER is not None:
            raise TraceError("compile: a compiled step was called while another one traces")
        start = time.perf_counter()
        recorder = Recorder(args)
        hooks.RECORDER = recorder
        try:
            result = self.step_fn(*args)
        finally:
            hooks.RECORDER = None
            recorder.in_backward = False
        recorder.check_arguments()
        traced = time.perf_counter()
        plan = Plan(recorder, result, fusion=self.fusion)
        plan.trace_s = traced - start
        plan.plan_s = time.perf_counter() - traced
        self.plans[key] = plan
        return plan.first_result(result)

    def plan_for(self, *args: Any) -> Any:
        """The plan traced for these arguments' signature (None before the first such call)."""
        return self.plans.get(_key(tuple(a.data if isinstance(a, Tensor) else a for a in args)))


def compile(step_fn: Callable | None = None, *, fusion: bool = True) -> Any:
    """Trace `step_fn` on its first call per argument signature and replay it afterwards.

    fusion=False keeps every op's own arithmetic (a replay then equals eager bit for bit);
    fusion=True (default) also runs AdamW as one kernel over a flat parameter buffer.
    Usable as `compile(fn)`, `@compile` or `@compile(fusion=False)`.
    """
    if step_fn is None:
        return lambda fn: CompiledStep(fn, fusion=fusion)
    return CompiledStep(step_fn, fusion=fusion)
