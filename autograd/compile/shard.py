"""Batch sharding of a compiled step: n threads each replay the step on their rows of the batch.

A GPT step is independent across the rows of its batch until the loss averages them and the
weight gradients sum them. With fusion on and a BLAS allowed n >= 2 threads, autograd.compile
checks that the traced step has that form (`batch_axes`), plans it once per shard for B/n rows,
and replays the n plans side by side, each on one thread with single-threaded BLAS and serial
Numba kernels. Every core then works through its own rows with no hand-off inside the step,
where splitting each product and kernel over two threads hands work over hundreds of times a
step (and wakes a sleeping thread each time). After the shards, their parameter gradients are
summed into the real ones; the recorded clip_grad_norm_ and the optimizer run once, as traced.

The check gives every value of the trace a batch axis or None:
- batched: one axis holds the batch rows, each shard owning one contiguous block of it. The
  array arguments are batched on axis 0, and each op says where its output's batch axis is,
  given its inputs' (Function.batch_axis: Linear, LayerNorm, RMSNorm, GELU, SiLU and rotary
  keep their input's rows, attention over (B, H, T, D) axis 0, the views keep each shard's rows
  together, ...); an array parameter beside batched values must be one the op declares the same
  for every row (Function.replicated_params: rotary's angle tables);
- None (replicated): parameters and what is computed from them alone (wte transposed for the
  tied head, the position embedding), which every shard computes whole. Their gradients are
  each shard's partial sums, which add up as the leaves' do (a VJP is linear in its cotangent).
The loss must be a mean over batch rows (Function.batch_mean: the mean cross-entropy) of
batched values, with nothing computed from it. Anything else on a batched value (dropout's
random mask, a mean over the batch, an op without a batch rule) keeps the step whole; the
plan's printout says why.

Each shard after the first has gradient buffers of its own. While copies of every trained
parameter's gradient fit in SHARD_GRADIENT_BUDGET (LoRA, a frozen base), it keeps whole copies,
added into the first shard's after the shards. Above it (full training of a 135M model) it
hands each parameter's gradient off as soon as it is complete: after its last VJP, shard s waits
until shard s - 1 is done with that parameter, adds its gradient into the first shard's, and its
buffer goes back to its arena, so only the gradients being made take memory (a tied embedding's,
made by the head and completed by the lookup, for the whole backward).

The loss of the step is the mean over the kept rows (targets) of all shards. Shard s keeps k_s of
the K kept targets and its loss is its own mean, so the step's loss is sum_s (k_s / K) loss_s;
seeding shard s's backward with k_s / K gives exactly the full mean's gradient, (softmax -
onehot) / K per row (notes 10.3). The k_s are counted from the targets at every replay.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from autograd.compile.optimizer import fused_update
from autograd.compile.plan import (
    Plan,
    blas_threads,
    leaves_with_grad,
    one_blas_thread,
    recorded_call,
    result_values,
    step_result,
)
from autograd.compile.recorder import Node, Recorder, Value
from autograd.kernels import _common
from autograd.tensor import Tensor


class NotShardable(Exception):
    """The traced step is not row-separable over its batch (the message says where)."""


# --- the check: a batch axis for every value ------------------------------------------------------


def batch_axes(rec: Recorder, n: int) -> dict[int, int | None]:
    """{value id: its batch axis, or None if replicated}; raises NotShardable (with the reason)."""
    arrays = [a for a in rec.args if isinstance(a, np.ndarray)]
    if not arrays or any(a.ndim == 0 for a in arrays):
        raise NotShardable("an array argument without a batch axis")
    batch = arrays[0].shape[0]
    if any(a.shape[0] != batch for a in arrays) or batch % n:
        raise NotShardable(f"the arguments' first axes {[a.shape for a in arrays]} are not one "
                           f"batch divisible by {n}")  # fmt: skip
    args = {id(a) for a in arrays}
    axes: dict[int, int | None] = {}
    for v in rec.recorded:
        if v.kind == "input":
            axes[v.id] = 0
        elif v.kind == "leaf":
            axes[v.id] = None
    loss: Value | None = None
    for node in rec.nodes:
        if any(loss is v for v in node.inputs):
            raise NotShardable(f"{node.name} computes from the loss")
        if node.fn.batch_mean(node.params) is not None:
            if loss is not None:
                raise NotShardable("two losses")
            _check_loss(node, axes, args)
            loss = node.out
            continue
        axes[node.out.id] = _out_axis(node, axes, args, n)
    backward = [e for e in rec.program if e[0] == "backward"]
    if len(backward) != 1 or loss is None or backward[0][1] is not loss:
        raise NotShardable("the backward does not start from a loss that is a mean over rows")
    return axes


def _check_loss(node: Node, axes: dict, args: set[int]) -> None:
    rows, _ = node.fn.batch_mean(node.params)
    if axes[node.inputs[0].id] != 0 or id(node.params.get(rows)) not in args:
        raise NotShardable(f"the {node.name}'s input or {rows} are not batched on axis 0")


class BatchCall:
    """One op's call as its batch rule (Function.batch_axis) sees it."""

    def __init__(self, node: Node, batched: tuple[str, ...], n: int) -> None:
        self.shapes = [v.shape for v in node.inputs]
        self.out_shape = node.out.shape
        self.params = node.params
        self.batched = batched  # the keyword parameters that are batched step arguments
        self.n = n


def _out_axis(node: Node, axes: dict, args: set[int], n: int) -> int | None:
    """The batch axis of node's output (None: replicated), by the op's rule (batch_axis)."""
    a = [axes[v.id] for v in node.inputs]
    batched = tuple(k for k, p in node.params.items() if id(p) in args)
    if all(x is None for x in a) and not batched:
        return None  # parameters only: every shard computes it whole
    replicated = node.fn.replicated_params(node.params)
    constants = [
        k
        for k, p in node.params.items()
        if isinstance(p, np.ndarray) and id(p) not in args and k not in replicated
    ]
    if constants:  # an array beside batched values might be batch-shaped: it cannot be cut
        raise NotShardable(f"{node.name} with a constant array {constants} beside batched values")
    axis = node.fn.batch_axis(a, BatchCall(node, batched, n))
    if axis is not None:
        return axis
    if batched:
        raise NotShardable(f"{node.name} with the step's argument as {list(batched)}")
    raise NotShardable(f"{node.name} {tuple(node.out.shape)} on batched values")


# --- one shard's trace: the recorded ops for B/n rows ---------------------------------------------


class ShardTrace:
    """A Recorder's forward and backward with every batched shape cut to one shard's rows (what
    Plan reads: args, used_args, recorded, nodes, program). Nodes get their own Function copy."""

    def __init__(self, rec: Recorder, axes: dict[int, int | None], n: int) -> None:
        self.args = tuple(
            np.empty((a.shape[0] // n, *a.shape[1:]), a.dtype) if isinstance(a, np.ndarray) else a
            for a in rec.args
        )
        own = {id(a): h for a, h in zip(rec.args, self.args, strict=True)}
        self.used_args = set(rec.used_args)
        self.segments: list = []  # (a step with checkpointed segments is not sharded)
        clones: dict[int, Value] = {}
        for v in rec.recorded:
            c = Value.__new__(Value)
            c.id, c.kind, c.index, c.node = v.id, v.kind, v.index, None
            c.tensor = v.tensor if v.kind == "leaf" else None
            c.dtype, c.requires_grad = v.dtype, v.requires_grad
            axis = axes.get(v.id)
            c.shape = tuple(d // n if i == axis else d for i, d in enumerate(v.shape))
            clones[v.id] = c
        self.recorded = list(clones.values())
        nodes: dict[int, Node] = {}
        self.nodes = []
        for node in rec.nodes:
            params = {k: own.get(id(p), p) for k, p in node.params.items()}
            out = clones[node.out.id]
            params = node.fn.shard_params(params, out.shape)
            c = Node(copy.copy(node.fn), [clones[v.id] for v in node.inputs], params, out)
            c.view_of = clones[node.view_of.id] if node.view_of is not None else None
            out.node = c
            nodes[id(node)] = c
            self.nodes.append(c)
        self.program: list[tuple] = []
        for entry in rec.program:
            if entry[0] == "op":
                self.program.append(("op", nodes[id(entry[1])]))
            elif entry[0] == "backward":
                root = clones[entry[1].id]
                self.program.append(("backward", root, [nodes[id(s)] for s in entry[2]]))
        self.root = root


class ShardRole:
    """What Plan needs to know of its shard: the loss, its seed, where leaf gradients go (the
    given buffers; a parameter without one gets an arena buffer, handed off when complete)."""

    def __init__(
        self,
        root: Value,
        leaf_grads: dict[int, np.ndarray],
        index: int = 0,
        hand_offs: HandOffs | None = None,
    ) -> None:
        self.root = root
        self.seed = np.ones(root.shape, root.dtype)  # k_s / K, written before each replay
        self.leaf_grads = leaf_grads
        self.index, self.hand_offs = index, hand_offs

    def hand_off(self, leaf: int, mine: np.ndarray | None) -> tuple[Callable[[], None], str]:
        """The step after this shard's last contribution to a parameter's gradient (mine):
        the first shard's is the real gradient already; shard s > 0 waits until shard s - 1 is
        done with it, then adds its own in (the adds of one parameter run one at a time)."""
        offs, s = self.hand_offs, self.index
        if s == 0:
            return (lambda: offs.done(0, leaf)), "hand-off  this gradient is complete"
        real = offs.real[leaf]

        def add() -> None:
            offs.wait(s - 1, leaf)
            if mine is not None:
                np.add(real, mine, out=real)
            offs.done(s, leaf)

        return add, "hand-off  added into the first shard's gradient once that is complete"


class ShardFailed(RuntimeError):
    """A shard stopped waiting for a hand-off: another shard failed (its error is raised)."""


class HandOffs:
    """The shards' hand-offs of each parameter's gradient within a replay (ShardRole.hand_off).
    A shard that fails sets every flag, so that none waits for it forever."""

    def __init__(self, n: int, real: dict[int, np.ndarray]) -> None:
        self.real = real
        self.flags = [{leaf: threading.Event() for leaf in real} for _ in range(n)]
        self.failed = False

    def reset(self) -> None:
        self.failed = False
        for flags in self.flags:
            for flag in flags.values():
                flag.clear()

    def done(self, shard: int, leaf: int) -> None:
        self.flags[shard][leaf].set()

    def wait(self, shard: int, leaf: int) -> None:
        self.flags[shard][leaf].wait()
        if self.failed:
            raise ShardFailed("another shard of the step failed")

    def abort(self) -> None:
        self.failed = True
        for flags in self.flags:
            for flag in flags.values():
                flag.set()


class _Leaves:
    """The leaves' slots, as optimizer.fused_update reads and writes them on a Plan."""

    def __init__(self, rec: Recorder) -> None:
        self.leaves = sorted((v for v in rec.recorded if v.kind == "leaf"), key=lambda v: v.id)
        self.vals: list[Any] = [None] * len(rec.recorded)
        self.grads: list[Any] = [None] * len(rec.recorded)


# --- the sharded plan ----------------------------------------------------------------------------

_POOL: list[Any] = []


def _pool(workers: int) -> Any:
    if not _POOL or _POOL[0]._max_workers < workers:
        from concurrent.futures import ThreadPoolExecutor

        if _POOL:  # a plan with more shards: the smaller pool's threads end once idle
            _POOL[0].shutdown(wait=False)
        _POOL[:] = [ThreadPoolExecutor(workers, thread_name_prefix="glassgrad-shard")]
    return _POOL[0]


def shard_count(fusion: bool | str, shards: int | None) -> int:
    """Threads to shard over: `shards` if given, else the BLAS's thread count with fusion=True
    (the fusion whose rounding may differ from eager's), else 1."""
    if shards is not None:
        if shards > 1 and fusion is not True:
            raise ValueError(f"compile: shards={shards} needs fusion=True (got {fusion!r}): the "
                             "shards' sums run in another order than eager's")  # fmt: skip
        return max(int(shards), 1)
    return blas_threads() if fusion is True else 1


class ShardedPlan:
    """A compiled step replayed as n shard plans on n threads, then the reduction and the rest."""

    def __init__(
        self, rec: Recorder, result: Any, n: int, axes: dict[int, int | None], hand_off: bool
    ) -> None:
        """hand_off: the shards after the first add each parameter's gradient into the first's
        as soon as both are complete, from an arena buffer (no copy of every gradient)."""
        self.n = n
        self.blas = one_blas_thread()  # made once: finding the BLAS libraries takes ~2 ms
        self.trace_s = self.plan_s = 0.0
        self.batch = next(a for a in rec.args if isinstance(a, np.ndarray)).shape[0]
        self.rows = self.batch // n
        loss_node = next(e for e in rec.program if e[0] == "backward")[1].node
        # the loss's rows (the targets) and how many of them count (those not ignored)
        rows, self.count = loss_node.fn.batch_mean(loss_node.params)
        self.counted_index = next(i for i, a in enumerate(rec.args) if a is loss_node.params[rows])
        root = loss_node.out
        returned = result_values(result, rec.values)
        if any(v is not root for v in returned):
            raise NotShardable("the step returns a tensor other than the loss")
        self.loss = Tensor._make(np.zeros(root.shape, root.dtype), False)
        self.outputs = {id(root.tensor): self.loss}
        self._result_template = result
        self.lines: list[str] = []
        # Before the shards (zero_grad), after them (clip_grad_norm_, the optimizer), in order.
        first_op = next(i for i, e in enumerate(rec.program) if e[0] != "call")
        backward_at = next(i for i, e in enumerate(rec.program) if e[0] == "backward")
        if any(e[0] not in ("op", "backward") for e in rec.program[first_op:backward_at]):
            raise NotShardable("a call between the step's ops")
        pre, post = rec.program[:first_op], rec.program[backward_at + 1 :]
        for v in rec.recorded:  # the traced call's arrays: free them before the buffers
            if v.kind != "leaf":
                v.tensor = None
        # The optimizer's flat buffers first (parameters move there), then one plan per shard.
        with_grad = leaves_with_grad(rec)
        slots = _Leaves(rec)
        optimizers = [e[1] for e in post if e[0] == "optimizer"]
        fused = {id(o): fused_update(slots, o, with_grad) for o in optimizers}
        flat = [step.flat_grad for step in fused.values() if step is not None]
        self.shards: list[Plan] = []
        self.reduce: list[tuple[np.ndarray, np.ndarray]] = []  # (the gradient, a shard's part)
        with_grad_leaves = [v for v in slots.leaves if v.id in with_grad]
        real = {v.id: slots.grads[v.id] for v in with_grad_leaves if slots.grads[v.id] is not None}
        real |= {v.id: np.empty(v.shape, v.dtype) for v in with_grad_leaves if v.id not in real}
        self.hand_offs = HandOffs(n, real) if hand_off else None
        for s in range(n):
            if s == 0 or hand_off:
                grads = real if s == 0 else {}
            else:
                grads = self._private_grads(real, flat)
            trace = ShardTrace(rec, axes, n)
            role = ShardRole(trace.root, grads, s, self.hand_offs)
            self.shards.append(Plan(trace, None, True, role))
        self.call_out: list[Any] = []
        self._call_results: dict[int, int] = {}
        self.pre = [self._post_step(e, fused) for e in pre]
        leaves = [(v.tensor, real[v.id]) for v in slots.leaves if v.id in real]
        self.post = [(lambda: [setattr(t, "grad", g) for t, g in leaves], "leaf .grad = its "
                      "gradient buffer (the first shard's, the others added in)")]  # fmt: skip
        self.post += [self._post_step(e, fused) for e in post]

    def _private_grads(self, real: dict, flat: list[np.ndarray]) -> dict[int, np.ndarray]:
        """Gradient buffers of a shard after the first, laid out like the real ones."""
        copies = {id(f): np.empty_like(f) for f in flat}
        for f in flat:
            self.reduce.append((f, copies[id(f)]))
        grads = {}
        for vid, g in real.items():
            base = next((f for f in flat if np.shares_memory(f, g)), None)
            if base is None:
                grads[vid] = np.empty_like(g)
                self.reduce.append((g, grads[vid]))
            else:
                start = g.__array_interface__["data"][0] - base.__array_interface__["data"][0]
                start //= g.itemsize
                grads[vid] = copies[id(base)][start : start + g.size].reshape(g.shape)
        return grads

    def _post_step(self, entry: tuple, fused: dict) -> tuple[Callable[[], Any], str]:
        if entry[0] == "optimizer":
            step = fused.get(id(entry[1]))
            if step is None:
                return entry[1].step, f"call      {type(entry[1]).__name__}.step (its own update)"

            def update(step: Any = step) -> None:  # 1/n of every group on each thread
                self._parallel(lambda part: self._serially(step.update, part, self.n))
                step.count()

            return update, f"fused     {step.note}, on {self.n} threads"
        _, name, fn, args, result = entry
        index = len(self.call_out)
        self.call_out.append(None)
        self._call_results[id(result)] = index
        return recorded_call(self.call_out, index, fn, args), f"call      {name}"

    # --- replay -------------------------------------------------------------------------------
    def still_valid(self) -> bool:
        return all(plan.still_valid() for plan in self.shards)

    def replay(self, args: tuple) -> Any:
        self._seed(args[self.counted_index])
        for step, _ in self.pre:
            step()
        if self.hand_offs is not None:
            self.hand_offs.reset()
        with self.blas():
            self._parallel(lambda s: self._run_shard(s, args))
            self._parallel(self._add_gradients)
        np.copyto(self.loss.data, sum(float(p.shard.seed) * float(p.vals[p.shard.root.id])
                                      for p in self.shards))  # fmt: skip
        for step, _ in self.post:
            step()
        return self._result(self._result_template)

    def _seed(self, counted: np.ndarray) -> None:
        kept = [self.count(counted[s * self.rows : (s + 1) * self.rows]) for s in range(self.n)]
        total = sum(kept)
        for plan, k in zip(self.shards, kept, strict=True):
            plan.shard.seed[...] = k / total if total else 0.0

    def _parallel(self, work: Callable[[int], None]) -> None:
        """work(s) for every shard s, s = 0 on this thread; raises the first failure (not a
        shard's ShardFailed, which only says that it stopped waiting for a failed one)."""
        others = [_pool(self.n - 1).submit(work, s) for s in range(1, self.n)]
        errors: list[BaseException] = []
        try:
            work(0)
        except BaseException as exc:
            errors.append(exc)
        for f in others:
            try:
                f.result()
            except BaseException as exc:
                errors.append(exc)
        if errors:
            raise next((e for e in errors if not isinstance(e, ShardFailed)), errors[0])

    def _run_shard(self, s: int, args: tuple, timed: list | None = None) -> None:
        rows = slice(s * self.rows, (s + 1) * self.rows)
        plan = self.shards[s]
        try:
            with _common.serially():
                plan.load(tuple(a[rows] if isinstance(a, np.ndarray) else a for a in args))
                if timed is None:
                    plan.run()
                else:
                    for step in plan.program:
                        start = time.perf_counter()
                        step()
                        timed.append(time.perf_counter() - start)
        except BaseException:
            if self.hand_offs is not None:
                self.hand_offs.abort()
            raise

    @staticmethod
    def _serially(fn: Callable, *args: Any) -> None:
        """fn(*args) with this thread's kernels in their serial builds (no Numba threads)."""
        with _common.serially():
            fn(*args)

    def _add_gradients(self, part: int) -> None:
        """Thread `part` adds its 1/n of every other shard's gradients into the real ones."""
        for total, other in self.reduce:
            size = total.size
            lo, hi = part * size // self.n, (part + 1) * size // self.n
            t, o = total.reshape(-1)[lo:hi], other.reshape(-1)[lo:hi]
            np.add(t, o, out=t)

    def _result(self, template: Any) -> Any:
        return step_result(template, self.outputs, self._call_results, self.call_out)

    def profile(self, args: tuple, reps: int = 5) -> list[tuple[float, str]]:
        """(median ms, line) per step of the first shard (the others run beside it as usual),
        then the reduction and the steps after the shards; slowest first."""
        first = self.shards[0]
        times: list[list[float]] = [[] for _ in first.program]
        rest: list[list[float]] = [[] for _ in range(1 + len(self.post))]
        for _ in range(reps):
            self._seed(args[self.counted_index])
            if self.hand_offs is not None:
                self.hand_offs.reset()
            timed: list[float] = []
            with self.blas():
                self._parallel(lambda s, t=timed: self._run_shard(s, args, t if s == 0 else None))
                start = time.perf_counter()
                self._parallel(self._add_gradients)
                rest[0].append(time.perf_counter() - start)
            for i, t in enumerate(timed):
                times[i].append(t)
            for i, (step, _) in enumerate(self.post):
                start = time.perf_counter()
                step()
                rest[1 + i].append(time.perf_counter() - start)
        lines = [*first.lines, "reduce    the other shards' gradients", *(l for _, l in self.post)]
        rows = [
            (1e3 * float(np.median(t)), line) for t, line in zip(times + rest, lines, strict=True)
        ]
        return sorted(rows, reverse=True)

    def describe(self) -> str:
        mib = 1 << 20
        head = (f"compiled step, sharded over {self.n} threads along the batch ({self.batch} "
                f"rows, {self.rows} per shard); traced in {self.trace_s:.2f} s, planned in "
                f"{self.plan_s:.2f} s")  # fmt: skip
        arena = sum(p.arena.nbytes for p in self.shards)
        private = sum(o.nbytes for _, o in self.reduce)
        if self.hand_offs is None:
            reduce = f"the other shards' gradients into the first's ({private / mib:.1f} MiB)"
        else:
            reduce = "nothing left: each gradient was handed off as it was complete"
        return "\n".join([
            head,
            *(line for _, line in self.pre),
            "each shard, on its own thread (BLAS on 1 thread, serial Numba kernels):",
            *("  " + line for line in self.shards[0].describe().splitlines()),
            f"reduce    {reduce}",
            *(line for _, line in self.post),
            f"arenas: {arena / mib:.1f} MiB in all",
        ])  # fmt: skip


# The sharding's memory policy: the shards after the first keep whole copies of the gradients
# while those take at most this much, else hand each one off when complete (see the module
# docstring). Copies: a few MiB with LoRA or a frozen base, the model's size in full training.
# Measured on the SmolLM2-135M fine-tuning step (docs/benchmarks.md, 2026-12-02): LoRA, 3.5 MiB
# of copies, 3.54 s whole -> 2.94 s sharded; full, 513 MiB of copies, 4.73 -> 4.17 s but peak
# RSS 4076 -> 4805 MiB, above PyTorch's 4470 (so then it stayed whole). GPT small's 41 MiB: copies.
SHARD_GRADIENT_BUDGET = 256 << 20


def gradient_copy_bytes(rec: Recorder, n: int) -> int:
    """Bytes of the gradient buffers the n - 1 shards after the first would add."""
    with_grad = leaves_with_grad(rec)
    leaves = [v for v in rec.recorded if v.id in with_grad]
    per_shard = sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in leaves)
    return (n - 1) * per_shard


def sharded_plan(rec: Recorder, result: Any, fusion: bool | str, shards: int | None) -> Any:
    """A ShardedPlan, or (None, why not) when the step stays whole."""
    n = shard_count(fusion, shards)
    if n < 2:
        return None, "one thread" if fusion is True else f"fusion={fusion!r}"
    if rec.segments:
        return None, "checkpointed segments (their recomputation is planned whole)"
    try:
        axes = batch_axes(rec, n)
    except NotShardable as exc:
        return None, str(exc)
    hand_off = gradient_copy_bytes(rec, n) > SHARD_GRADIENT_BUDGET
    try:
        return ShardedPlan(rec, result, n, axes, hand_off), None
    except NotShardable as exc:
        return None, str(exc)


__all__ = [
    "SHARD_GRADIENT_BUDGET",
    "NotShardable",
    "ShardedPlan",
    "batch_axes",
    "gradient_copy_bytes",
    "shard_count",
    "sharded_plan",
]
