"""Activation checkpointing: keep a segment's inputs, recompute its activations in backward.

Reverse mode keeps every activation a VJP reads from the forward pass until backward reaches it,
so a model's memory grows with its depth. `checkpoint(fn, *args)` trades compute for memory: it
runs fn, keeps only its inputs (and the states of the random generators it drew from), and drops
everything fn computed in between. When backward reaches the segment, it runs fn again from those
inputs, with the same dropout masks, and backpropagates through the fresh graph. One extra forward
of the segment per step; the segment's activations are alive only while its backward runs.

    y = autograd.checkpoint(block, x)      # as block(x), without keeping block's activations

The gradients are the un-checkpointed ones: the recomputation runs the same ops on the same
arrays. (Not to be confused with nn/checkpoint.py, which saves a model's weights to disk.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from autograd import hooks
from autograd.tensor import (
    Function,
    Tensor,
    _topological_order,
    enable_grad,
    is_grad_enabled,
    run_backward,
)


def checkpoint(fn: Callable[..., Tensor], *args: Any) -> Tensor:
    """fn(*args), of which backward keeps only args and recomputes the rest (see above).

    fn returns one Tensor. Tensor args are differentiated as inputs; anything else is passed
    through as it is. Parameters fn reads itself (a module's weights) get their gradients too:
    they are found in the graph of a first run. Outside grad mode, or inside a dual_level (forward
    mode keeps no activations), it is simply fn(*args).
    """
    if not is_grad_enabled() or hooks.DUAL_LEVEL is not None:
        return fn(*args)
    outer_log = hooks.RNG_LOG
    rng_log: list = []
    hooks.RNG_LOG = rng_log
    leaves = _fresh_leaves(args)
    recorder = hooks.RECORDER  # autograd.compile plans the segment (compile/recorder.py)
    made = _OpsMade()
    hooks.ACTIVE.append(made)
    try:
        if recorder is not None:
            recorder.segment_begin(args, leaves)
        out = fn(*leaves)
    finally:
        hooks.ACTIVE.remove(made)
        hooks.RNG_LOG = outer_log
        if outer_log is not None:  # a checkpoint inside a checkpoint: the outer one replays too
            outer_log.extend(rng_log)
    if not isinstance(out, Tensor):
        raise TypeError(f"checkpoint: fn must return one Tensor, got {type(out).__name__}")
    if not out.requires_grad:
        if recorder is not None:
            recorder.segment_end(out, None, None)
        return out
    inputs = [a for a in args if isinstance(a, Tensor)]
    stand_ins = {id(t) for t in leaves if isinstance(t, Tensor)}
    graph = _topological_order([out])
    outside = next((t for t in graph if t._ctx is not None and id(t._ctx) not in made.ids), None)
    if outside is not None:
        raise ValueError(
            f"checkpoint: fn reads a tensor of shape {outside.shape} made by {outside._ctx.name} "
            "outside it; pass it as an argument (fn may read its arguments and leaf tensors, "
            "such as parameters)"
        )
    params = [  # the other leaves of fn's graph: what fn reads itself
        t for t in graph if t._ctx is None and t.requires_grad and id(t) not in stand_ins
    ]
    for t in graph:  # the first run's graph is not needed: free what it saved now
        if t._ctx is not None:
            t._ctx.release()
    result = Checkpoint.apply(
        *inputs, *params, fn=fn, args=args, value=out.data, rng_states=_first_states(rng_log)
    )
    if recorder is not None:
        recorder.segment_end(out, result, result.op)
    return result


class Checkpoint(Function):
    # out = fn(args): forward keeps args only; backward runs fn again (same RNG states) and
    # backpropagates g through that graph: d(args) and d(params fn reads) = the segment's VJP
    def forward(self, *arrays, fn=None, args=(), value=None, rng_states=()):
        # the arrays are watched for in-place changes (autograd/tensor.py, _saved_versions)
        self.save_for_backward(fn, args, rng_states, *arrays)
        return value  # computed by checkpoint()'s first run, whose graph is then dropped

    def backward(self, g):
        _, args, _, *arrays = self.saved
        return self._replay(_fresh_leaves(args, arrays), g, create_graph=False)

    def vjp(self, g, output):  # the same replay, its VJPs on Tensors (create_graph)
        args, n_args = self.saved[1], sum(isinstance(a, Tensor) for a in self.saved[1])
        params = {id(p) for p in self.inputs[n_args:]}
        inputs = iter(self.inputs[:n_args])
        if any(id(t) in params for t in _topological_order(list(self.inputs[:n_args]))):
            raise NotImplementedError(
                "checkpoint: create_graph through a segment whose parameters also feed its "
                "inputs (weights shared with an earlier layer) is not supported"
            )
        # stand-ins that depend on the real inputs (an identity reshape), so that the gradients
        # returned can be differentiated with respect to those inputs too
        stand_ins = [next(inputs).reshape(a.shape) if isinstance(a, Tensor) else a for a in args]
        return self._replay(stand_ins, g, create_graph=True)

    def _replay(self, leaves: list[Any], g: Any, create_graph: bool) -> tuple:
        """Run fn again from `leaves` (its RNG states restored) and backpropagate g to them and to
        the parameters fn reads: one gradient per input of this node."""
        fn, args, rng_states, *_ = self.saved
        recorder = hooks.RECORDER
        if recorder is not None:
            recorder.replay_begin(self, args, leaves)
        with replayed_rng(rng_states), enable_grad():
            out = fn(*leaves)
        n_args = sum(isinstance(a, Tensor) for a in leaves)
        wanted = [t for t in leaves if isinstance(t, Tensor)] + list(self.inputs[n_args:])
        differentiable = [t for t in wanted if t.requires_grad]
        found = iter(
            run_backward(
                [out],
                [g],
                retain_graph=create_graph,
                observers=list(hooks.ACTIVE),
                create_graph=create_graph,
                inputs=differentiable,
            )
            if differentiable
            else []
        )
        if recorder is not None:
            recorder.replay_end()
        return tuple(next(found) if t.requires_grad else None for t in wanted)


class _OpsMade(hooks.Observer):
    """The ops fn's first run applies (to tell its graph from tensors made outside it)."""

    def __init__(self) -> None:
        self.ids: set[int] = set()

    def forward(self, fn: Any, out: Any, arrays: Any) -> None:
        self.ids.add(id(fn))


def _fresh_leaves(args: Sequence[Any], arrays: Sequence[np.ndarray] | None = None) -> list[Any]:
    """args with each Tensor replaced by a new leaf over the same array (or over `arrays`, the
    ones saved), needing a gradient where the original did: the graph of fn starts here."""
    found = iter(arrays) if arrays is not None else None
    leaves = []
    for a in args:
        if not isinstance(a, Tensor):
            leaves.append(a)
            continue
        data = a.data if found is None else next(found)
        leaves.append(Tensor._make(data, a.requires_grad, a._counter))
    return leaves


def _first_states(rng_log: Sequence[tuple[np.random.Generator, dict]]) -> tuple:
    """(generator, state) for each generator the segment drew from, its state before the first
    draw."""
    first: dict[int, tuple[np.random.Generator, dict]] = {}
    for rng, state in rng_log:
        first.setdefault(id(rng), (rng, state))
    return tuple(first.values())


@contextmanager
def replayed_rng(rng_states: Sequence[tuple[np.random.Generator, dict]]) -> Iterator[None]:
    """Each generator set back to its logged state (the recomputation draws the same masks), and
    afterwards to where it was (the stream the rest of the program sees is untouched)."""
    now = [(rng, rng.bit_generator.state) for rng, _ in rng_states]
    for rng, state in rng_states:
        rng.bit_generator.state = state
    try:
        yield
    finally:
        for rng, state in now:
            rng.bit_generator.state = state
