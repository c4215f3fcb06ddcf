"""The plan of a compiled step: slots, an arena planned from liveness, and the replay program.

Built once from a Recorder (recorder.py). Every value of the trace has a slot in `vals`
(its forward array) and, if it needs one, in `grads`; both hold fixed buffers: arguments are
copied into their own buffers at the start of each replay, leaves are the parameters' arrays,
and op outputs and gradients live in arena buffers. The replay program is a flat list of
closures; each reads and writes slots, none creates a Tensor or a Function.

Liveness: a position is one op of the forward or one VJP of the backward, in trace order. An
op output is live from its op to the last position that may read it: its consumers, their
backwards (which read what they saved) and its own backward; a view extends the life of the
buffer it views. A non-leaf gradient lives from its first contribution to its producer's
backward. Dead buffers go back to a pool by size and are handed to the next value of that size.

Activation checkpointing (autograd.checkpoint, recorder.Segment): the values a segment makes live
only through its forward; in backward, a Recompute step runs the segment's ops again into
buffers of their own (taken then, released after the VJPs that read them), just before the
segment's VJPs. Slots are read when a step runs, so each phase binds its own arrays to the
segment's slots as it starts; the random generators its ops draw from are set back for the
recomputation (the same dropout masks) and then returned to where they were.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from autograd import kernels
from autograd.compile import matmul as products
from autograd.compile.optimizer import fused_update
from autograd.compile.recorder import Node, Recompute, Recorder, Segment, Value
from autograd.tensor import Tensor

FOREVER = math.inf


class Arena:
    """Buffers by size in bytes; `take` reuses a released one of the same size if there is one."""

    def __init__(self) -> None:
        self.free: dict[int, list[np.ndarray]] = {}
        self.buffers: list[np.ndarray] = []
        self.requested = 0  # bytes of all values, as if each had its own buffer
        self.live = self.peak_live = 0  # bytes in use now / at most: what a perfect fit needs

    def take(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        dtype = np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        self.requested += nbytes
        pool = self.free.get(nbytes)
        raw = pool.pop() if pool else None
        if raw is None:
            raw = np.empty(nbytes, np.uint8)
            self.buffers.append(raw)
        self.live += nbytes
        self.peak_live = max(self.peak_live, self.live)
        return raw.view(dtype).reshape(shape)

    def release(self, array: np.ndarray) -> None:
        raw = array.base if array.base is not None else array
        while raw.base is not None:
            raw = raw.base
        self.live -= raw.nbytes
        self.free.setdefault(raw.nbytes, []).append(raw)

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.buffers)


def result_values(result: Any, values: dict[int, Value]) -> list[Value]:
    found: list[Value] = []
    if isinstance(result, Tensor) and id(result) in values:
        found.append(values[id(result)])
    elif isinstance(result, (tuple, list)):
        for r in result:
            found += result_values(r, values)
    return found


class Plan:
    """Everything one argument signature replays (built once; see the module docstring)."""

    def __init__(self, rec: Recorder, result: Any, fusion: bool | str, shard: Any = None) -> None:
        """shard: None, or one shard's part of a batch-sharded step (shard.py): then the
        recorder holds that shard's share of the batch, the program is the forward and backward
        only, the parameters' gradients go to `shard.leaf_grads` and the loss is seeded with
        `shard.seed`; the caller runs the rest (reduction, clipping, the optimizer)."""
        self.fusion = fusion
        self.shard = shard
        self.values = rec.recorded  # (by id)
        self.vals: list[Any] = [None] * len(self.values)
        self.grads: list[Any] = [None] * len(self.values)
        self.arena = Arena()
        self.program: list[Callable[[], Any]] = []
        self.lines: list[str] = []
        self.trace_s = self.plan_s = 0.0
        self.unsharded = ""  # why the step is not sharded over threads (autograd/compile/shard.py)
        self._result_template = result
        self._call_results: dict[int, int] = {}  # id(result of a recorded call) -> call index
        self.call_out: list[Any] = []
        self.leaves = [v for v in self.values if v.kind == "leaf"]
        self.inputs: list[tuple[int, np.ndarray]] = []
        self._compiled = 0
        self._generic = 0
        # fusion=True: BLAS single-threaded during a replay, large products split over two threads.
        # Never with "exact": whether a split product rounds like the whole one depends on the
        # BLAS kernel (OpenBLAS's Haswell kernel does not), so exact products run whole, with the
        # BLAS's own threads, as eager calls them.
        self.blas = _blas_controller() if fusion is True and shard is None else None
        self.matmul = products.split_matmul if self.blas is not None else _matmul
        # Each array argument gets a buffer of its own, refilled at the start of every replay;
        # ops read the buffer (as a tensor's data, or as a parameter such as embedding ids).
        for i in sorted(rec.used_args):
            self.inputs.append((i, np.empty_like(rec.args[i])))
        self._input_arrays = {id(rec.args[i]): buf for i, buf in self.inputs}
        for v in self.values:
            if v.kind == "input":
                self.vals[v.id] = self._input_arrays[id(rec.args[v.index])]
            elif v.kind == "leaf":
                self.vals[v.id] = v.tensor._data
        returned = result_values(result, rec.values) if shard is None else [shard.root]
        self.returned = {v.id for v in returned}
        # returned tensors, by the identity of the traced ones: Tensors made once, whose arrays
        # are the arena buffers (overwritten by the next call, as in CUDA graphs / TinyJit)
        self._returned_ids = [(id(v.tensor), v.id) for v in returned] if shard is None else []
        for v in self.values:  # the traced call's arrays are not needed: free them now
            if v.kind != "leaf":
                v.tensor = None
        self._liveness(rec, returned)
        self.fused: dict[int, Callable[[], None]] = {}
        if shard is not None:
            for vid, grad in shard.leaf_grads.items():
                self.grads[vid] = grad
        elif fusion:
            with_grad = leaves_with_grad(rec)
            for entry in rec.program:
                if entry[0] == "optimizer":
                    step = fused_update(self, entry[1], with_grad)
                    if step is not None:
                        self.fused[id(entry[1])] = step
        self._build(rec)
        self.leaf_arrays = [v.tensor._data for v in self.leaves]  # after any re-homing
        self.outputs = {key: Tensor._make(self.vals[vid], False) for key, vid in self._returned_ids}

    # --- liveness -------------------------------------------------------------------------------
    def _liveness(self, rec: Recorder, returned: list[Value]) -> None:
        pos_f: dict[int, int] = {}
        pos_b: dict[int, int] = {}
        pos_r: dict[int, int] = {}  # the position of a checkpointed op's recomputation
        position = 0
        for entry in rec.program:
            if entry[0] == "op":
                pos_f[id(entry[1])] = position
                position += 1
            elif entry[0] == "backward":
                for step in entry[2]:
                    for node in step.segment.nodes if isinstance(step, Recompute) else [step]:
                        (pos_r if isinstance(step, Recompute) else pos_b)[id(node)] = position
                        position += 1
        self.pos_f, self.pos_b, self.pos_r = pos_f, pos_b, pos_r
        recomputed = [  # the checkpointed segments whose backward ran (so were recomputed)
            step.segment
            for entry in rec.program
            if entry[0] == "backward"
            for step in entry[2]
            if isinstance(step, Recompute)
        ]
        self.segment_of = {id(node): seg for seg in recomputed for node in seg.nodes}
        made_in = {node.out.id: seg for seg in recomputed for node in seg.nodes}
        self.root: dict[int, int] = {}  # value id -> id of the value owning its memory
        last: dict[int, float] = {}
        last_r: dict[int, float] = {}  # the recomputed buffers of checkpointed segments
        for node in rec.nodes:
            out = node.out.id
            view = node.view_of if node.view_of is not None else view_input(node)
            self.root[out] = self.root.get(view.id, view.id) if view is not None else out
            # this op uses its inputs and output; its backward, what the op says it reads
            saved = self._backward_reads(node)
            segment = self.segment_of.get(id(node))
            for v in [*node.inputs, node.out]:
                r = self.root.get(v.id, v.id)
                reads = pos_b.get(id(node), -1) if any(s is v for s in saved) else -1
                if segment is not None and made_in.get(r) is segment:
                    # made in this op's segment: the first buffer serves its forward only, the
                    # recomputed one the recomputation and the VJPs
                    last[r] = max(last.get(r, -1), pos_f[id(node)])
                    last_r[r] = max(last_r.get(r, -1), pos_r[id(node)], reads)
                else:  # (a segment's input is read again when the segment is recomputed)
                    again = pos_r.get(id(node), -1)
                    last[r] = max(last.get(r, -1), pos_f[id(node)], reads, again)
        for v in returned:
            last[self.root.get(v.id, v.id)] = FOREVER
        self.last_use, self.last_use_r = last, last_r
        self.recomputing = False  # while the Recompute steps are built

    # --- building the program ---------------------------------------------------------------
    def _build(self, rec: Recorder) -> None:
        self.release_at: dict[int, list[np.ndarray]] = {}
        self.phases: dict[int, dict] = {}  # a checkpointed segment's arrays and RNG states
        self.has_grad: set[int] = set()
        self.aliased: set[int] = set()  # gradients that are views of another value's gradient
        self.handed_down: set[int] = set()  # gradients whose buffer became an input's (take_grad)
        self.compiled: set[int] = set()
        self.consumers: dict[int, list[Node]] = {}
        for node in rec.nodes:
            for v in node.inputs:
                self.consumers.setdefault(v.id, []).append(node)
        for entry in rec.program:
            kind = entry[0]
            if kind == "op":
                self._forward(entry[1])
            elif kind == "backward":
                self._backward(entry[1], entry[2])
            elif kind == "call":
                _, name, fn, args, result = entry
                index = len(self.call_out)
                self.call_out.append(None)
                self._call_results[id(result)] = index
                self._emit(recorded_call(self.call_out, index, fn, args), f"call      {name}")
            elif kind == "optimizer":
                self._optimizer(entry[1])

    def _emit(self, step: Callable[[], Any], line: str) -> None:
        """Append one replay step and its line of the printout (program and lines align)."""
        self.program.append(step)
        self.lines.append(line)

    def buffer(self, v: Value, position: int) -> np.ndarray:
        """An arena buffer for op output v, released after the last position that reads it."""
        buf = self.arena.take(v.shape, v.dtype)
        last = self.last_use_r if self.recomputing else self.last_use
        self._release_after(buf, last.get(v.id, position))
        return buf

    def _release_after(self, buf: np.ndarray, position: float) -> None:
        if position != FOREVER:
            self.release_at.setdefault(int(position), []).append(buf)

    def _end_of(self, position: int) -> None:
        for buf in self.release_at.pop(position, []):
            self.arena.release(buf)

    def _backward_reads(self, node: Node) -> list[Value]:
        """The values of the forward that node's backward reads, as the op declares them
        (Function.backward_reads): the others can die early. A view's backward reads nothing."""
        if view_input(node) is not None:
            return []
        reads = node.fn.backward_reads(OpContext(self, node, -1))
        if reads is None:  # its own VJP: whatever forward saved, inputs or output
            return [*node.inputs, node.out]
        return [node.inputs[i] for i in reads]

    def _op_forward(self, node: Node, position: int) -> tuple[Callable[[], None], str]:
        """The op's forward step: a view made once, the op's compiled form (into its planned
        output buffer), or its own forward, copied (Function.compiled_forward)."""
        fn, vals = node.fn, self.vals
        if view_input(node) is not None:  # made once, at plan time: its input's buffer stays
            vals[node.out.id] = fn.forward(vals[node.inputs[0].id], **node.params)
            self.compiled.add(id(node))
            return (lambda: None), "view of its input's buffer (made once)"
        c = OpContext(self, node, position)
        compiled = fn.compiled_forward(c)
        if compiled is None:
            return self._generic_forward(c), "replays its own forward"
        self.compiled.add(id(node))
        return compiled

    def _forward(self, node: Node) -> None:
        segment = self.segment_of.get(id(node))
        if segment is not None and node is segment.nodes[0]:
            self._emit(
                self._segment_forward(segment),
                f"segment {segment.index}: its forward ({len(segment.nodes)} ops); only its "
                "inputs are kept, the rest is recomputed in backward",
            )
        position = self.pos_f[id(node)]
        step, note = self._op_forward(node, position)
        if id(node) in self.compiled:
            self._compiled += 1
        else:
            self._generic += 1
        self._emit(step, f"fwd  {position:4d} {node.name:<14} -> {_shape(node.out)}  {note}")
        self._end_of(position)
        if segment is not None and node is segment.nodes[-1]:
            self._segment_forward_done(segment)

    # --- checkpointed segments (see the module docstring) ---------------------------------------
    def _segment_forward(self, segment: Segment) -> Callable[[], None]:
        """The step that starts a segment's forward: its slots bound to the forward's arrays,
        the states of its generators noted (the recomputation draws the same numbers)."""
        generators = list(
            {
                id(p): p
                for node in segment.nodes
                for p in node.params.values()
                if isinstance(p, np.random.Generator)
            }.values()
        )
        phase = self.phases[segment.index] = {"forward": {}, "again": {}, "generators": []}
        vals = self.vals

        def run() -> None:
            for vid, array in phase["forward"].items():
                vals[vid] = array
            phase["generators"] = [(g, g.bit_generator.state) for g in generators]

        return run

    def _segment_forward_done(self, segment: Segment) -> None:
        phase = self.phases[segment.index]
        phase["forward"] = {node.out.id: self.vals[node.out.id] for node in segment.nodes}
        replayed = [node.fn for node in segment.nodes if id(node) not in self.compiled]
        if replayed:  # what those ops saved for their backward is recomputed as well

            def drop_saved() -> None:
                for fn in replayed:
                    fn.saved = ()

            self._emit(drop_saved, f"segment {segment.index}: drop what its replayed ops saved")

    def _recompute(self, segment: Segment) -> None:
        """The segment's ops again, into buffers of the recomputation, its generators set back
        to their states at its forward (and afterwards returned to where they were)."""
        phase, vals = self.phases[segment.index], self.vals

        def begin() -> None:
            for vid, array in phase["again"].items():
                vals[vid] = array
            phase["now"] = [(g, g.bit_generator.state) for g, _ in phase["generators"]]
            for g, state in phase["generators"]:
                g.bit_generator.state = state

        def end() -> None:
            for g, state in phase["now"]:
                g.bit_generator.state = state

        self._emit(begin, f"segment {segment.index}: recompute its forward")
        self.recomputing = True
        for node in segment.nodes:
            position = self.pos_r[id(node)]
            step, note = self._op_forward(node, position)
            self._emit(step, f"rfwd {position:4d} {node.name:<14} -> {_shape(node.out)}  {note}")
            self._end_of(position)
        self.recomputing = False
        phase["again"] = {node.out.id: self.vals[node.out.id] for node in segment.nodes}
        self._emit(end, f"segment {segment.index}: its generators back where they were")

    def param(self, node: Node, key: str) -> Any:
        """A keyword parameter of a recorded op, with the step's arguments (embedding ids,
        targets) replaced by their input buffers, which each replay refills."""
        p = node.params[key]
        return self._input_arrays.get(id(p), p)

    def _generic_forward(self, c: OpContext) -> Callable[[], None]:
        """fn.forward on the slots' arrays; the output is copied into its arena buffer (a view
        output stays a view: it shares its input's buffer)."""
        node = c.node
        fn, vals, ins, out = node.fn, self.vals, [v.id for v in node.inputs], node.out.id
        params = c.params
        if node.view_of is not None:

            def run_view() -> None:
                vals[out] = fn.forward(*[vals[i] for i in ins], **params)

            run_view()
            return run_view
        buf = c.out

        def run() -> None:
            np.copyto(buf, fn.forward(*[vals[i] for i in ins], **params))

        return run

    def _backward(self, root: Value, steps: list) -> None:
        seed = np.ones(root.shape, root.dtype) if self.shard is None else self.shard.seed
        self.grads[root.id] = seed
        self.backward_root = root.id
        self.has_grad.add(root.id)
        carried = self._carry_leaf_grads()
        hand_offs = self._hand_offs(steps)
        for node in steps:
            if isinstance(node, Recompute):
                self._recompute(node.segment)
                continue
            position = self.pos_b[id(node)]
            step, note = self._op_backward(node, position)
            self._emit(step, f"bwd  {position:4d} {node.name:<14} <- {_shape(node.out)}  {note}")
            for leaf in hand_offs.get(position, []):
                self._hand_off(leaf, position)
            self._end_of(position)
            out = node.out.id
            if out != root.id and self.grads[out] is not None:
                if out not in self.aliased and out not in self.handed_down:
                    self.arena.release(self.grads[out])
        if carried:
            self._emit(self._add_carried(carried), "leaf .grad += this backward's gradients")
        if self.shard is None:
            self._emit(self._set_leaf_grads(), "leaf .grad = its gradient buffer (parameters)")

    def _hand_offs(self, steps: list) -> dict[int, list[Value]]:
        """{position: the parameters whose gradient is complete after it}, for a shard that
        hands each one off as soon as it is (ShardRole.hand_off); {} otherwise."""
        if self.shard is None or self.shard.hand_offs is None:
            return {}
        last: dict[int, tuple[int, Value]] = {}
        for node in steps:  # a parameter's consumers' VJPs (views': after their consumers')
            if isinstance(node, Recompute):  # (a sharded step has no checkpointed segments)
                continue
            for v in node.inputs:
                if v.kind == "leaf" and v.requires_grad:
                    last[v.id] = (max(last.get(v.id, (-1,))[0], self.pos_b[id(node)]), v)
        hand_offs: dict[int, list[Value]] = {}
        for position, v in last.values():
            hand_offs.setdefault(position, []).append(v)
        return hand_offs

    def _hand_off(self, leaf: Value, position: int) -> None:
        mine = self.grads[leaf.id]
        step, line = self.shard.hand_off(leaf.id, mine)
        self._emit(step, f"          {line} ({_shape(leaf)})")
        if mine is not None and leaf.id not in self.shard.leaf_grads:
            self._release_after(mine, position)  # back to the arena once added

    def _carry_leaf_grads(self) -> dict[int, np.ndarray]:
        """Before a second backward of the step (gradient accumulation): each leaf gradient
        from an earlier one is set aside and this backward writes a fresh buffer, which is
        then added to it, as eager adds the backward's sum of contributions to .grad (so a
        tied weight's two contributions are summed first, in eager's order)."""
        carried = {}
        for v in self.leaves:
            if v.id in self.has_grad:
                carried[v.id] = self.grads[v.id]
                self.grads[v.id] = self.arena.take(v.shape, v.dtype)
                self.has_grad.discard(v.id)
        return carried

    def _add_carried(self, carried: dict[int, np.ndarray]) -> Callable[[], None]:
        pairs = [(old, self.grads[vid]) for vid, old in carried.items() if vid in self.has_grad]
        for vid, old in carried.items():
            self.arena.release(self.grads[vid])
            self.grads[vid] = old
            self.has_grad.add(vid)

        def run() -> None:
            for old, new in pairs:
                np.add(old, new, out=old)

        return run

    def _op_backward(self, node: Node, position: int) -> tuple[Callable[[], None], str]:
        """The op's VJP step: its compiled form (Function.compiled_backward) if its forward ran
        in its compiled form, else its own backward, the gradients added into the buffers."""
        compiled = None
        if view_input(node) is not None:
            x = node.inputs[0]
            if not x.requires_grad:
                return (lambda: None), "no gradient needed"
            if node.out.id in self.aliased:
                self.has_grad.add(x.id)  # complete once every view's consumers have written
                return (lambda: None), "nothing to do: its gradient is a view of its input's"
        if id(node) in self.compiled:
            compiled = node.fn.compiled_backward(OpContext(self, node, position))
        if compiled is None:
            return self._generic_backward(node, position), "replays its own VJP"
        return compiled

    def _generic_backward(self, node: Node, position: int) -> Callable[[], None]:
        fn, grads, out = node.fn, self.grads, node.out.id
        adds = []
        for v in node.inputs:
            target = self.grad_target(v, v.shape, position) if v.requires_grad else None
            adds.append(target)

        def run() -> None:
            for target, g in zip(adds, fn.backward(grads[out]), strict=True):
                if target is not None and g is not None:
                    target(g)

        return run

    def grad_target(self, v: Value, shape: tuple, position: int) -> Callable[[np.ndarray], None]:
        """A function that adds a contribution g to v's gradient: the first one is copied into
        v's gradient buffer, later ones are added in place (same values as eager's a + b)."""
        first = v.id not in self.has_grad
        buf = self.grad_buffer(v, position)
        view = buf.reshape(shape)
        if first:
            return lambda g: np.copyto(view, g)
        return lambda g: np.add(view, g, out=view)

    def grad_buffer(self, v: Value, position: int, first: bool = True) -> np.ndarray:
        """v's gradient buffer (taken from the arena on its first contribution).

        The gradient of a view whose input has only views as consumers (qkv[0], qkv[1], qkv[2]
        of one reshaped, transposed projection) is that same view of the input's gradient
        buffer: the VJPs write straight into the projection's gradient, and the view's own
        backward (a scatter or a transposed copy) has nothing left to do. So is a whole view's
        gradient while its input's has had no contribution yet (_whole_view_first).
        """
        if first and v.id not in self.has_grad:
            self.has_grad.add(v.id)
        if self.grads[v.id] is None:
            base = self._alias_base(v)
            if base is not None:  # (a whole view's first contribution is its base's first)
                whole = math.prod(v.shape) == math.prod(base.shape)
                base_buf = self.grad_buffer(base, position, first=whole)
                node = v.node
                self.grads[v.id] = node.fn.forward(base_buf, **node.params)
                self.aliased.add(v.id)
            elif v.kind == "leaf" and self.shard is None:  # (a flat view when fused)
                self.grads[v.id] = np.empty(v.shape, v.dtype)
            else:  # an op's output, or a shard's own gradient of a parameter (handed off)
                self.grads[v.id] = self.arena.take(v.shape, v.dtype)
        return self.grads[v.id]

    def take_grad(self, node: Node, i: int) -> bool:
        """Give input i of node (an add, whose output is no view) the output's gradient buffer
        itself as its gradient, when that gradient is exactly the output's (an operand of the
        same shape): no copy. Only for an op's output that is not a view (its gradient may have
        to be a region of its input's) and has no gradient yet (else the buffer holds earlier
        contributions), and an output gradient that is an arena buffer (not the backward's
        seed). The caller hands a buffer to one input at most. The buffer goes back to the arena
        after that input's producer's backward instead of after node's."""
        v, out = node.inputs[i], node.out
        takes = (
            v.kind == "op"
            and v.requires_grad
            and view_input(v.node) is None
            and v.id not in self.has_grad
            and (v.shape, v.dtype) == (out.shape, out.dtype)
            and out.id != self.backward_root
        )
        if takes:
            self.grads[v.id] = self.grads[out.id]
            self.has_grad.add(v.id)
            self.handed_down.add(out.id)
        return takes

    def _alias_base(self, v: Value) -> Value | None:
        """The input whose gradient buffer v's gradient can be a view of (see grad_buffer)."""
        node = v.node
        if node is None or view_input(node) is None:
            return None
        x = node.inputs[0]
        consumers = self.consumers.get(x.id, [])
        if self._whole_view_first(node, x):
            return x
        if not x.requires_grad or x.kind != "op" or x.id in self.returned:
            return None
        # every consumer a view of x whose backward runs (so that each region gets written)
        if any(view_input(c) is not x or id(c) not in self.pos_b for c in consumers):
            return None
        if len(consumers) == 1:
            return x
        # several views: only disjoint integer indices that cover the first axis
        indices = [c.params.get("index") for c in consumers]
        if all(isinstance(i, int) for i in indices) and sorted(indices) == list(range(x.shape[0])):
            return x
        return None

    def _whole_view_first(self, node: Node, x: Value) -> bool:
        """Whether node's output, a view of all of x (a tied head's wte^T), can have its gradient
        be that view of x's gradient although x has other consumers (the embedding lookup):
        with fusion=True only (a product then writes a transposed buffer, which BLAS rounds its
        own way), and only if nothing has contributed to x's gradient yet: the view's first
        contribution then writes all of it and every later one, to the view or to x, adds."""
        if self.fusion is not True or not x.requires_grad or x.id in self.returned:
            return False
        whole = math.prod(node.out.shape) == math.prod(x.shape)
        return whole and id(node) in self.pos_b and x.id not in self.has_grad

    def contribution(self, v: Value, shape: tuple, position: int) -> tuple[np.ndarray, Any]:
        """(array to write v's contribution into, then-what): the gradient buffer itself for the
        first contribution, else a scratch buffer that is then added in place."""
        first = v.id not in self.has_grad
        buf = self.grad_buffer(v, position).reshape(shape)
        if first:
            return buf, None
        scratch = self.scratch(shape, v.dtype, position)
        return scratch, lambda: np.add(buf, scratch, out=buf)

    def scratch(self, shape: tuple, dtype: Any, position: int) -> np.ndarray:
        """An arena buffer that only the step at `position` uses (released at its end)."""
        buf = self.arena.take(shape, dtype)
        self.release_at.setdefault(position, []).append(buf)
        return buf

    def kept(self, node: Node, shape: tuple, dtype: Any, position: int) -> np.ndarray:
        """An arena buffer that node's forward writes and its backward reads, released after
        that backward (a checkpointed segment's first forward: after that forward, since the
        recomputation keeps a buffer of its own; an op without backward: after its forward)."""
        buf = self.arena.take(shape, dtype)
        backward = self.pos_b.get(id(node), position)
        if id(node) in self.segment_of and not self.recomputing:
            backward = position
        self.release_at.setdefault(backward, []).append(buf)
        return buf

    def _set_leaf_grads(self) -> Callable[[], None]:
        pairs = [(v.tensor, self.grads[v.id]) for v in self.leaves if v.id in self.has_grad]

        def run() -> None:
            for t, g in pairs:
                t.grad = g

        return run

    def _optimizer(self, optimizer: Any) -> None:
        step = self.fused.get(id(optimizer))
        if step is None:
            self._emit(
                optimizer.step, f"call      {type(optimizer).__name__}.step (its own update)"
            )
        else:
            self._emit(step, f"fused     {step.note}")

    # --- replay -------------------------------------------------------------------------------
    def still_valid(self) -> bool:
        """False if a parameter's array was replaced, or it was frozen or unfrozen, since the
        plan was made (then retrace: the plan has gradient buffers for the trainable ones only)."""
        return all(
            v.tensor._data is a and v.tensor._requires_grad == v.requires_grad
            for v, a in zip(self.leaves, self.leaf_arrays, strict=True)
        )

    def replay(self, args: tuple) -> Any:
        self.load(args)
        with self._blas_limit():
            self.run()
        return self._result(self._result_template)

    def load(self, args: tuple) -> None:
        """Copy the step's array arguments into their buffers."""
        for index, buf in self.inputs:
            np.copyto(buf, args[index])

    def run(self) -> None:
        for step in self.program:
            step()

    def profile(self, args: tuple, reps: int = 5) -> list[tuple[float, str]]:
        """(median ms, line) of every replay step over `reps` replays, slowest first: where a
        compiled step spends its time (each step timed alone, so the sum exceeds the replay)."""
        times: list[list[float]] = [[] for _ in self.program]
        with self._blas_limit():
            for _ in range(reps):
                for index, buf in self.inputs:
                    np.copyto(buf, args[index])
                for i, step in enumerate(self.program):
                    start = time.perf_counter()
                    step()
                    times[i].append(time.perf_counter() - start)
        rows = [
            (1e3 * float(np.median(t)), line) for t, line in zip(times, self.lines, strict=True)
        ]
        return sorted(rows, reverse=True)

    def _blas_limit(self) -> Any:
        """BLAS single-threaded while a replay runs, when it splits the products itself."""
        if self.blas is None:
            return contextlib.nullcontext()
        return self.blas.limit(limits=1, user_api="blas")

    def _result(self, template: Any) -> Any:
        return step_result(template, self.outputs, self._call_results, self.call_out)

    # --- the printout -------------------------------------------------------------------------
    def describe(self) -> str:
        """The plan, one line per step, then the arena's sizes (docs/compile.md shows one)."""
        mib = 1 << 20
        steps = (
            f"{len(self.program)} replay steps; {self._compiled} ops in their compiled form "
            f"(out= buffers), {self._generic} replaying their own forward"
        )
        if self.shard is not None:  # the ShardedPlan's printout says the rest
            head = f"one shard: {steps}"
        else:
            head = (
                f"compiled step: {steps}; fusion "
                f"{ {True: 'on', False: 'off'}.get(self.fusion, self.fusion) }; traced in "
                f"{self.trace_s:.2f} s, planned in {self.plan_s:.2f} s"
                + (f"; not sharded: {self.unsharded}" if self.unsharded else "")
                + f"; products: {self._products()}"
            )
        arena = (
            f"arena: {len(self.arena.buffers)} buffers, {self.arena.nbytes / mib:.1f} MiB for "
            f"{self.arena.requested / mib:.1f} MiB of values and gradients (liveness reuse saves "
            f"{(self.arena.requested - self.arena.nbytes) / mib:.1f} MiB)"
        )
        return "\n".join([head, *self.lines, arena])

    def _products(self) -> str:
        if self.blas is not None:
            return (
                f"split over two threads from {products.SPLIT_MIN_WORK} multiply-adds (BLAS on "
                "one thread each)"
            )
        if self.fusion == "exact":
            return (
                "whole, with the BLAS's own threads, as eager calls them (a split product's "
                "rounding depends on the BLAS kernel)"
            )
        return "whole"


def view_input(node: Node) -> Value | None:
    """The input whose buffer node's output views (made once at plan time), or None: an op
    that makes views (Function.makes_view) whose traced output viewed its first input."""
    if node.view_of is None or node.view_of is not node.inputs[0]:
        return None
    return node.inputs[0] if node.fn.makes_view(node.params) else None


class OpContext:
    """One op of a plan as its compiled form sees it (Function.compiled_forward / _backward,
    backward_reads). At plan time the op asks for buffers; its step reads the slots `vals[id]`
    when it runs (a checkpointed segment rebinds them), writes `out` or the gradient buffers.

    fusion: the plan's flag (False, "exact" or True); matmul(a, b, out): np.matmul, or split
    over two threads; numba: whether the kernels run their Numba builds; inputs / params: the
    op's input Values (id, shape, dtype, requires_grad) and keyword parameters (the step's
    arguments replaced by their buffers, which each replay refills)."""

    def __init__(self, plan: Plan, node: Node, position: int) -> None:
        self.plan, self.node, self.position = plan, node, position
        self.fusion, self.matmul, self.vals = plan.fusion, plan.matmul, plan.vals
        self.inputs = node.inputs
        self.params = {k: plan.param(node, k) for k in node.params}
        self.numba = kernels.get_backend() == "numba"
        self._out: np.ndarray | None = None

    @property
    def out(self) -> np.ndarray:
        """The output's buffer (forward), taken from the arena when first asked for."""
        if self._out is None:
            self._out = self.plan.buffer(self.node.out, self.position)
            self.vals[self.node.out.id] = self._out
        return self._out

    @property
    def g(self) -> np.ndarray:
        """The gradient of the output (backward)."""
        return self.plan.grads[self.node.out.id]

    def grad(self, i: int, shape: tuple | None = None) -> tuple[np.ndarray, Any]:
        """(where to write input i's gradient, then-what): its gradient buffer for the first
        contribution (then None), else a scratch buffer that then-what adds into it."""
        v = self.inputs[i]
        return self.plan.contribution(v, v.shape if shape is None else shape, self.position)

    def grad_or_scratch(self, i: int, shape: tuple) -> tuple[np.ndarray, Any]:
        """grad(i), or a scratch buffer for an input that needs no gradient (a kernel that
        writes every gradient, for a frozen weight: no gradient buffer, and no .grad)."""
        v = self.inputs[i]
        if v.requires_grad:
            return self.grad(i, shape)
        return self.scratch(shape, v.dtype), None

    def add_grad(self, i: int) -> Callable[[np.ndarray], None]:
        """A function adding a gradient array into input i's gradient (copied if first)."""
        v = self.inputs[i]
        return self.plan.grad_target(v, v.shape, self.position)

    def grad_buffer(self, i: int) -> tuple[np.ndarray, bool]:
        """(input i's gradient buffer, whether this is its first contribution)."""
        v = self.inputs[i]
        first = v.id not in self.plan.has_grad
        return self.plan.grad_buffer(v, self.position), first

    def take_grad(self, i: int) -> bool:
        """Whether input i's gradient is now the output's gradient buffer itself (Plan.take_grad):
        then nothing is to be written for it."""
        return self.plan.take_grad(self.node, i)

    def scratch(self, shape: tuple, dtype: Any) -> np.ndarray:
        """A buffer for this step alone (back to the arena after it)."""
        return self.plan.scratch(shape, dtype, self.position)

    def kept(self, shape: tuple, dtype: Any) -> np.ndarray:
        """A buffer this op's forward writes for its backward to read (back to the arena after
        the backward: Plan.kept)."""
        return self.plan.kept(self.node, shape, dtype, self.position)

    @staticmethod
    def then(*posts: Callable[[], Any] | None) -> Callable[[], None]:
        """One function running the given then-whats (None ones skipped) in order."""
        posts = tuple(p for p in posts if p is not None)
        return lambda: [p() for p in posts]


def _matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    np.matmul(a, b, out=out)


def one_blas_thread() -> Callable[[], Any]:
    """A function returning a context with BLAS on one thread (threadpoolctl's controller is
    found once, here: finding it scans the loaded libraries, ~2 ms); a no-op without it."""
    controller = _blas_controller()
    if controller is None:
        return contextlib.nullcontext
    return lambda: controller.limit(limits=1, user_api="blas")


def blas_threads() -> int:
    """The BLAS's thread count (1 without threadpoolctl, which the sharded replay needs)."""
    controller = _blas_controller()
    if controller is None:
        return 1
    return min(lib.num_threads for lib in controller.lib_controllers if lib.user_api == "blas")


def _blas_controller() -> Any:
    """threadpoolctl's controller when the BLAS may use >= 2 threads (then a replay splits the
    products itself, see matmul.split_matmul); None without threadpoolctl or with 1 thread."""
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:
        return None
    controller = ThreadpoolController()
    blas = [lib for lib in controller.lib_controllers if lib.user_api == "blas"]
    if not blas or min(lib.num_threads for lib in blas) < 2:
        return None
    return controller


def leaves_with_grad(rec: Recorder) -> set[int]:
    """Leaves that the recorded backward sends a gradient to."""
    found: set[int] = set()
    for entry in rec.program:
        if entry[0] == "backward":
            for node in entry[2]:
                if isinstance(node, Node):
                    found |= {v.id for v in node.inputs if v.kind == "leaf" and v.requires_grad}
    return found


def step_result(template: Any, outputs: dict, call_results: dict, call_out: list) -> Any:
    """What the traced call returned, with its tensors replaced by this replay's (`outputs`, by
    the traced tensor's id) and the results of recorded calls by this replay's (`call_out`)."""
    if isinstance(template, Tensor):
        return outputs.get(id(template), template)
    if isinstance(template, (tuple, list)):
        return type(template)(step_result(t, outputs, call_results, call_out) for t in template)
    index = call_results.get(id(template))
    return template if index is None else call_out[index]


def recorded_call(out: list, index: int, fn: Callable, args: tuple) -> Callable[[], None]:
    def run() -> None:
        out[index] = fn(*args)

    return run


def _shape(v: Value) -> str:
    return f"{tuple(v.shape)} {v.dtype}"


__all__ = [
    "Arena",
    "OpContext",
    "Plan",
    "blas_threads",
    "one_blas_thread",
    "leaves_with_grad",
    "recorded_call",
    "result_values",
]
