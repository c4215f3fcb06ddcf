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
2. Plan (plan.py beside this file; the recorder is recorder.py). Each value gets a slot and
   output and gradient buffers from an arena planned from liveness (a buffer is reused once its
   value is dead). Each op is asked for its compiled form (Function.compiled_forward /
   compiled_backward, beside its forward and VJP): a step writing into those buffers with
   `out=` and accumulating gradients in place; an op without one replays its own forward / VJP.
   With fusion on, AdamW runs as one kernel over a flat parameter buffer.
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
from autograd.compile.plan import Plan
from autograd.compile.recorder import Recorder, TraceError
from autograd.compile.shard import shard_count, sharded_plan
from autograd.tensor import Tensor


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

    def __init__(
        self, step_fn: Callable, fusion: bool | str = True, shards: int | None = None
    ) -> None:
        self.step_fn = step_fn
        self.fusion = fusion
        self.shards = shards
        shard_count(fusion, shards)  # a bad combination is refused now, not at the first call
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
        if hooks.RECORDER is not None:
            raise TraceError("compile: a compiled step was called while another one traces")
        start = time.perf_counter()
        recorder = Recorder(args)
        hooks.RECORDER = recorder
        try:
            result = self.step_fn(*args)  # with the BLAS's own threads, as eager runs it
        finally:
            hooks.RECORDER = None
            recorder.in_backward = False
        recorder.check_arguments()
        traced = time.perf_counter()
        plan, unsharded = sharded_plan(recorder, result, self.fusion, self.shards)
        if plan is None:
            plan = Plan(recorder, result, fusion=self.fusion)
            plan.unsharded = unsharded
        del recorder
        _release_freed_memory()  # the traced call's arrays, which the plan no longer holds
        plan.trace_s = traced - start
        plan.plan_s = time.perf_counter() - traced
        self.plans[key] = plan
        return result  # the traced call's own (eager) result

    def plan_for(self, *args: Any) -> Any:
        """The plan traced for these arguments' signature (None before the first such call)."""
        return self.plans.get(_key(tuple(a.data if isinstance(a, Tensor) else a for a in args)))


def _release_freed_memory() -> None:
    """Hand the memory the traced (eager) call freed back to the OS (glibc's malloc_trim), so
    that it does not stay resident beside the arena."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass  # not glibc: nothing to do


def compile(
    step_fn: Callable | None = None, *, fusion: bool | str = True, shards: int | None = None
) -> Any:
    """Trace `step_fn` on its first call per argument signature and replay it afterwards.

    fusion=False keeps every op's own arithmetic (a replay then equals eager bit for bit);
    fusion="exact" adds what keeps eager's arithmetic too: AdamW as one kernel over a flat
    parameter buffer; its products run whole with the BLAS's own threads, exactly the calls
    eager makes (so it equals eager bit for bit on any BLAS kernel);
    fusion=True (default) also splits large products over two threads itself, fuses
    self-attention (both round differently from eager) and shards the step over the BLAS's
    threads along the batch when it can (autograd/compile/shard.py).
    shards: threads to shard over (None: the BLAS's thread count with fusion=True; 1: never).
    Usable as `compile(fn)`, `@compile` or `@compile(fusion=False)`.
    """
    if step_fn is None:
        return lambda fn: CompiledStep(fn, fusion=fusion, shards=shards)
    return CompiledStep(step_fn, fusion=fusion, shards=shards)
