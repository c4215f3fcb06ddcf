"""The Transformer ops written with plain numpy, the references check_op compares the engine's
forward with (and that a learner's own ops are compared with). Slow and obvious on purpose.
Row vectors; population variance in layernorm; the causal mask is the allowed set j <= i
(bottom-right aligned when there are more keys than queries)."""

from __future__ import annotations

import math

import numpy as np


def np_softmax(x, axis):
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)  # an all -inf slice gives zeros, not NaN
    e = np.exp(x - m)
    s = e.sum(axis=axis, keepdims=True)
    return np.divide(e, s, out=np.zeros_like(e), where=s > 0)


def np_logsumexp(x, axis, keepdims=False):
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    with np.errstate(divide="ignore"):
        out = np.log(np.exp(x - m).sum(axis=axis, keepdims=True)) + m
    return out if keepdims else np.squeeze(out, axis=axis)


def np_log_softmax(x, axis):
    with np.errstate(invalid="ignore"):
        out = x - np_logsumexp(x, axis, keepdims=True)
    return np.where(np.isneginf(x), -np.inf, out)


def np_cross_entropy(z, targets, ignore_index=-100):
    """mean over the kept rows of -log softmax(z)[target]; 0.0 when every target is ignored."""
    keep = targets != ignore_index
    if not keep.any():
        return np.float64(0.0)
    logp = np_log_softmax(z, -1)
    picked = np.take_along_axis(logp, np.where(keep, targets, 0)[..., None], -1)[..., 0]
    return -picked[keep].mean()


def np_layer_norm(x, w, b, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def np_rms_norm(a, weight, eps=1e-5):
    return a / np.sqrt((a * a).mean(-1, keepdims=True) + eps) * weight


def np_attention(q, k, v, causal, allowed=None):
    """softmax(q kᵀ/√d over the allowed keys) v, on (B, H, T, D) arrays; k and v may have fewer
    heads, each read by a group of query heads (repeated here, as HF's repeat_kv)."""
    k, v = (np.repeat(a, q.shape[1] // a.shape[1], axis=1) for a in (k, v))
    tq, tk = q.shape[2], k.shape[2]
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    rule = np.ones((tq, tk), bool) if allowed is None else allowed
    if causal:
        rule = rule & np.tril(np.ones((tq, tk), bool), tk - tq)
    return np_softmax(np.where(rule, s, -np.inf), -1) @ v


def np_gelu_tanh(a):
    return 0.5 * a * (1 + np.tanh(math.sqrt(2 / math.pi) * (a + 0.044715 * a**3)))


def np_gelu_exact(a):
    return a * 0.5 * (1 + np.vectorize(math.erf)(a / math.sqrt(2)))
