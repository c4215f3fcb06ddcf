"""The tracing half of autograd.compile: what one traced call of a step did (docs/compile.md).

While a step is traced, autograd.hooks.RECORDER is a Recorder: Function.apply reports every op,
run_backward the order of its VJPs, Tensor.item / bool / np.asarray every read of a value, and nn
the calls that work on gradient arrays outside the graph (zero_grad, clip_grad_norm_,
Optimizer.step). What a replay could not repeat faithfully is refused here, at trace time, with
a TraceError that says why.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from autograd import hooks
from autograd.activation_checkpoint import Checkpoint
from autograd.tensor import Function, Tensor, _storage


class TraceError(RuntimeError):
    """The step does something a replay could not repeat faithfully (said why, at trace time)."""


class Value:
    """One tensor of the trace. kind: "input" (argument `index`), "leaf" (a parameter or constant
    tensor, read from `tensor` at each replay) or "op" (the output of node `node`).

    An op's output is held weakly: the traced call frees it when eager would (its consumers'
    backwards done), so tracing needs no more memory than the eager step; `tensor` is then None.
    """

    __slots__ = ("id", "_tensor", "kind", "index", "node", "shape", "dtype", "requires_grad")

    def __init__(self, vid: int, tensor: Tensor, kind: str, index: int = -1) -> None:
        self.id = vid
        self._tensor: Any = weakref.ref(tensor) if kind == "op" else tensor
        self.kind = kind
        self.index = index
        self.node: Node | None = None
        self.shape = tensor.shape
        self.dtype = tensor.dtype
        self.requires_grad = tensor.requires_grad

    @property
    def tensor(self) -> Tensor | None:
        held = self._tensor
        return held() if isinstance(held, weakref.ref) else held

    @tensor.setter
    def tensor(self, tensor: Tensor | None) -> None:
        self._tensor = tensor


class Node:
    """One recorded op: the Function instance (replayed as it is), its input and output values,
    and its keyword parameters (those that are arguments of the step are mapped to input buffers
    by the plan)."""

    __slots__ = ("fn", "inputs", "params", "out", "view_of")

    def __init__(self, fn: Function, inputs: list[Value], params: dict, out: Value) -> None:
        self.fn = fn
        self.inputs = inputs
        self.params = params
        self.out = out
        self.view_of: Value | None = None  # the input whose memory the output views, if any

    @property
    def name(self) -> str:
        return self.fn.name


class Segment:
    """The ops of one autograd.checkpoint call (a slice of the recorded nodes) and its output.
    The plan keeps their outputs only through the segment's forward and runs them again in
    backward, just before their VJPs (a Recompute entry among the backward steps)."""

    __slots__ = ("index", "nodes", "out", "start")

    def __init__(self, index: int, start: int) -> None:
        self.index = index
        self.start = start  # the index of its first node in Recorder.nodes
        self.nodes: list[Node] = []
        self.out: Value | None = None


class Recompute:
    """A backward step: run the segment's forward ops again (from its kept inputs)."""

    __slots__ = ("segment",)

    def __init__(self, segment: Segment) -> None:
        self.segment = segment


class Recorder:
    """The listener of autograd.hooks.RECORDER while one call of the step is traced."""

    def __init__(self, args: tuple) -> None:
        self.args = args
        self.values: dict[int, Value] = {}  # id(tensor) -> Value, while that tensor lives
        self.recorded: list[Value] = []  # every Value, by id
        self.nodes: list[Node] = []
        self.program: list[tuple] = []  # ("op", node) | ("backward", ...) | ("call", ...) | ...
        self.used_args: set[int] = set()
        self.in_backward = False
        # the nodes of the backward running now, in the order of their VJPs (a step may run
        # several, one per micro-batch of gradient accumulation: the gradients add up), and
        # Recompute entries: a checkpointed segment run again
        self.backward_steps: list[Any] | None = None
        self.segments: list[Segment] = []
        self._open: Segment | None = None  # the segment whose first forward is being recorded
        self._replaying: Segment | None = None  # the segment its backward is running again
        self._replayed = 0  # how many of its ops ran again so far
        self._kept: list[Any] = []  # objects whose id() maps to something: kept alive
        self._segment_of_fn: dict[int, Segment] = {}  # id(Checkpoint node) -> its segment

    # --- values ----------------------------------------------------------------------------
    def value(self, t: Tensor) -> Value:
        v = self.values.get(id(t))
        if v is not None:
            return v
        arg = next((i for i, a in enumerate(self.args) if a is t._data), None)
        if arg is not None:
            self.used_args.add(arg)
            v = Value(len(self.recorded), t, "input", arg)
        else:
            self._refuse_view_of_argument(t._data, "a tensor")
            if t.requires_grad and t.grad is not None:
                raise TraceError(
                    f"compile: a parameter (shape {t.shape}) already has a .grad when the step "
                    "uses it, so the step would add to the previous step's gradient; call "
                    "optimizer.zero_grad() inside the step"
                )
            v = Value(len(self.recorded), t, "leaf")
        self.values[id(t)] = v
        self.recorded.append(v)
        return v

    def _map_until_freed(self, out: Tensor, v: Value) -> None:
        """values[id(out)] = v while out lives: a freed tensor's id may be reused by a new one."""
        values, key = self.values, id(out)
        values[key] = v

        def forget(_: Any) -> None:
            if values.get(key) is v:
                del values[key]

        v._tensor = weakref.ref(out, forget)

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
        if isinstance(fn, Checkpoint):
            return  # its segment's ops are recorded; segment_end maps its output
        if self._replaying is not None:
            self._replayed_op(fn, out)
            return
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
                self.used_args.add(arg)
            else:
                self._refuse_view_of_argument(p, f"parameter {key!r} of {fn.name}")
        v = Value(len(self.recorded), out, "op")
        v.node = node
        node.out = v
        self.recorded.append(v)
        self._map_until_freed(out, v)
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

    def backward(self, roots: Any, seeds: Any, create_graph: bool, inputs: Any) -> hooks.Observer:
        if self._replaying is not None and not create_graph:  # a checkpoint's own backward
            return self._steps()
        if create_graph:
            raise TraceError(
                "compile: backward with create_graph=True (higher-order gradients) cannot be "
                "compiled: a replay repeats one first-order backward; run this step eagerly"
            )
        if inputs is not None:
            raise TraceError(
                "compile: autograd.grad (gradients returned, not accumulated into .grad) cannot "
                "be compiled; call loss.backward() in the step"
            )
        if len(roots) != 1:
            raise TraceError("compile: backward of several outputs at once cannot be compiled")
        (root,), (seed,) = roots, seeds
        if id(root) not in self.values:
            raise TraceError("compile: backward() of a tensor that the step did not compute")
        if not (isinstance(seed, np.ndarray) and seed.size == 1 and seed.item() == 1):
            raise TraceError(
                "compile: backward(grad=...) with a gradient of its own cannot be compiled (the "
                "replay starts from dL/dL = 1); call backward() on a one-element loss"
            )
        self.backward_steps = []
        self.in_backward = True
        self.program.append(("backward", self.values[id(root)], self.backward_steps))
        return self._steps()

    def _steps(self) -> hooks.Observer:
        recorder = self

        class Steps(hooks.Observer):
            def backward_step(self, step, fn, output, grad, input_grads) -> None:
                if not isinstance(fn, Checkpoint):  # (its segment's VJPs are listed already)
                    recorder.backward_steps.append(recorder.values[id(output)].node)

        return Steps()

    def backward_done(self) -> None:
        if self._replaying is None:  # (the end of a checkpoint's own backward is not the end)
            self.in_backward = False

    # --- activation checkpointing (autograd.checkpoint) -----------------------------------------
    def segment_begin(self, args: Any, stand_ins: Any) -> None:
        """checkpoint() is about to run fn on stand-ins of its arguments: they are the
        arguments' values, and the ops until segment_end form one segment."""
        if self._open is not None:
            raise TraceError("compile: a checkpoint inside a checkpoint cannot be compiled")
        self._alias(args, stand_ins)
        self._open = Segment(len(self.segments), len(self.nodes))

    def segment_end(self, inner: Tensor | None, out: Tensor | None, fn: Any) -> None:
        """fn returned `inner`; checkpoint() returns `out` (None: fn needed no gradient, its ops
        stay ordinary ones), made by the Checkpoint node `fn`."""
        segment, self._open = self._open, None
        if out is None or segment is None or id(inner) not in self.values:
            return
        segment.nodes = self.nodes[segment.start :]
        segment.out = self.values[id(inner)]
        self.values[id(out)] = segment.out  # downstream ops read the segment's output
        self._kept.append(out)
        self.segments.append(segment)
        self._segment_of_fn[id(fn)] = segment
        self._kept.append(fn)

    def replay_begin(self, fn: Any, args: Any, stand_ins: Any) -> None:
        """The Checkpoint node `fn` runs its segment again in backward: a Recompute step, then
        (listed by the nested backward) the segment's VJPs."""
        segment = self._segment_of_fn[id(fn)]
        self._alias(args, stand_ins)
        self._replaying, self._replayed = segment, 0
        self.backward_steps.append(Recompute(segment))

    def replay_end(self) -> None:
        self._replaying = None

    def _replayed_op(self, fn: Function, out: Tensor) -> None:
        segment = self._replaying
        nodes = segment.nodes
        node = nodes[self._replayed] if self._replayed < len(nodes) else None
        if node is None or type(node.fn) is not type(fn):
            raise TraceError(
                f"compile: checkpointed segment {segment.index} ran other ops in backward than "
                f"in its forward ({fn.name}); a replay needs the same ops each time"
            )
        self._replayed += 1
        self.values[id(out)] = node.out
        self._kept.append(out)

    def _alias(self, args: Any, stand_ins: Any) -> None:
        for a, s in zip(args, stand_ins, strict=True):
            if isinstance(a, Tensor):
                self.values[id(s)] = self.value(a)
                self._kept.append(s)

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
