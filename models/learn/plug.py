"""Plugging a learner's functions into the engine in place of glassgrad's own.

The mechanism is the mutation test's (tests/test_mutation.py): a primitive's `backward` is a class
attribute, so assigning another function to it changes what every node of that class runs, and
the original is put back afterwards. Each learner function has one adapter here that turns the
node's saved state into the learner's arguments (the exercises' signatures are plain numpy, one
case each), so the whole engine — check_op, the worked example, a GPT — runs on the learner's code.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np

import autograd.functional as F
import autograd.ops as ops
import autograd.tensor as tensor
import nn.optim
from autograd import hooks


def _unbroadcast(learner: Callable) -> list:
    def unbroadcast(grad, shape, copy=False):
        if not isinstance(grad, np.ndarray):  # a Tensor (create_graph): not the learner's case
            return tensor.unbroadcast(grad, shape, copy)
        out = np.asarray(learner(grad, tuple(shape)))
        return out.copy() if copy and np.shares_memory(out, grad) else out

    return [(ops, "unbroadcast", unbroadcast)]


def _matmul(learner: Callable) -> list:
    own_matmul = ops.MatMul.backward

    def matmul(self, g):
        a, b = self.saved
        if a.ndim != 2 or b.ndim != 2:  # vectors and batches: glassgrad's own (not the exercise)
            return own_matmul(self, g)
        return tuple(learner(a, b, g))

    def linear(self, g):  # x @ W + b with x flattened to rows: the same product (notes 10.4)
        x, weight, has_bias = self.saved
        g2 = g.reshape(-1, g.shape[-1])
        dx, dw = learner(x.reshape(-1, x.shape[-1]), weight, g2)
        dx = np.asarray(dx).reshape(x.shape)
        return (dx, dw, ops.sum_to(g2, weight.shape[1:], copy=True)) if has_bias else (dx, dw)

    return [(ops.MatMul, "backward", matmul), (F.Linear, "backward", linear)]


def _div(learner: Callable) -> list:
    def backward(self, g):
        a, b = self.saved
        da, db = learner(a, b, g)
        return ops.sum_to(np.asarray(da), a.shape), ops.sum_to(np.asarray(db), b.shape)

    return [(ops.Div, "backward", backward)]


def _tanh(learner: Callable) -> list:
    return [(ops.Tanh, "backward", lambda self, g: (learner(self.saved[0], g),))]


def _sum(learner: Callable) -> list:
    def backward(self, g):
        shape, axes, keepdims = self.saved
        return (learner(g, shape, axes, keepdims),)

    return [(ops.Sum, "backward", backward)]


def _max(learner: Callable) -> list:
    def backward(self, g):
        a, _, axes, keepdims = self.saved
        return (learner(a, g, axes, keepdims),)

    return [(ops.Max, "backward", backward)]


def _run_backward(learner: Callable) -> list:
    own_loop = tensor.run_backward

    def run_backward(roots, seeds, retain_graph, observers=(), create_graph=False, inputs=None):
        # the learner's loop runs every plain backward(); autograd.grad, create_graph, traces and
        # autograd.compile keep glassgrad's own (they need more than the exercise asks)
        if create_graph or inputs is not None or observers or hooks.RECORDER or len(roots) != 1:
            return own_loop(roots, seeds, retain_graph, observers, create_graph, inputs)
        learner(roots[0], seeds[0])
        return None

    return [(tensor, "run_backward", run_backward)]


def _softmax(learner: Callable) -> list:
    def backward(self, g):
        a, axis = self.saved
        return (np.moveaxis(learner(np.moveaxis(a, axis, -1), np.moveaxis(g, axis, -1)), -1, axis),)

    return [(F.Softmax, "backward", backward)]


def _log_softmax(learner: Callable) -> list:
    def backward(self, g):
        y, axis = self.saved
        return (np.moveaxis(learner(np.moveaxis(y, axis, -1), np.moveaxis(g, axis, -1)), -1, axis),)

    return [(F.LogSoftmax, "backward", backward)]


def _cross_entropy(learner: Callable) -> list:
    def backward(self, g):
        logits, targets, ignore_index = self.saved
        rows = logits.reshape(-1, logits.shape[-1])
        dlogits = learner(rows, targets.reshape(-1), ignore_index) * g
        return (np.asarray(dlogits).reshape(logits.shape),)

    return [(F.CrossEntropy, "backward", backward)]


def _layer_norm(learner: Callable) -> list:
    def backward(self, g):
        x, weight, _, _, eps = self.saved
        return tuple(learner(x, weight, g, eps))

    return [(F.LayerNorm, "backward", backward)]


def _embedding(learner: Callable) -> list:
    def backward(self, g):
        idx, vocab_size = self.saved
        return (np.asarray(learner(idx, g, vocab_size), dtype=g.dtype),)

    return [(F.Embedding, "backward", backward)]


def _gather(learner: Callable) -> list:
    own_gather = F.Gather.backward

    def backward(self, g):
        shape, index, axis = self.saved
        axis %= len(shape)
        others = [d for d in range(len(shape)) if d != axis]
        if index.shape != g.shape or any(g.shape[d] != shape[d] for d in others):
            return own_gather(self, g)  # broadcast size-1 dims: glassgrad's own (not the exercise)
        return (np.asarray(learner(index, g, shape, axis), dtype=g.dtype),)

    return [(F.Gather, "backward", backward)]


def _attention(learner: Callable) -> list:
    def fused(self, g):
        q, k, v, _, _, causal = self.saved
        tq, tk = q.shape[2], k.shape[2]
        allowed = np.tril(np.ones((tq, tk), bool), tk - tq) if causal else np.ones((tq, tk), bool)
        return tuple(learner(q, k, v, g, allowed))

    def masked(self, g):
        q, k, v, _, _, allowed = self.saved
        return tuple(learner(q, k, v, g, allowed))

    return [(F.Attention, "backward", fused), (F.MaskedAttention, "backward", masked)]


def _adamw(learner: Callable) -> list:
    own_update = nn.optim.Adam._update

    def update(self, p, grad, group, state):
        if not self.decoupled:  # plain Adam is not the exercise
            return own_update(self, p, grad, group, state)
        if not state:
            state.update(step=0, exp_avg=np.zeros_like(p.data), exp_avg_sq=np.zeros_like(p.data))
        state["step"] += 1
        new_p, state["exp_avg"], state["exp_avg_sq"] = learner(
            p.data.copy(),
            grad.copy(),
            state["exp_avg"],
            state["exp_avg_sq"],
            state["step"],
            group["lr"],
            group["betas"],
            group["eps"],
            group["weight_decay"],
        )
        p.data[...] = new_p

    return [(nn.optim.Adam, "_update", update)]


# learner function name -> its adapter
ADAPTERS: dict[str, Callable[[Callable], list]] = {
    "unbroadcast": _unbroadcast,
    "matmul_backward": _matmul,
    "div_backward": _div,
    "tanh_backward": _tanh,
    "sum_backward": _sum,
    "max_backward": _max,
    "run_backward": _run_backward,
    "softmax_backward": _softmax,
    "log_softmax_backward": _log_softmax,
    "cross_entropy_backward": _cross_entropy,
    "layer_norm_backward": _layer_norm,
    "embedding_backward": _embedding,
    "gather_backward": _gather,
    "attention_backward": _attention,
    "adamw_step": _adamw,
}


@contextmanager
def plugged(functions: dict[str, Callable]) -> Iterator[None]:
    """Inside the block the engine runs the given learner functions (name -> function)."""
    patches = [patch for name, fn in functions.items() for patch in ADAPTERS[name](fn)]
    originals = [(owner, attr, owner.__dict__[attr]) for owner, attr, _ in patches]
    try:
        for owner, attr, replacement in patches:
            setattr(owner, attr, replacement)
        yield
    finally:
        for owner, attr, original in reversed(originals):
            setattr(owner, attr, original)
