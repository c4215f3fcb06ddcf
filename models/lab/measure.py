"""What the lab measures inside attention, on any decoder (GPT-2 or Llama family).

A `Probe` is set as every attention layer's `probe` (nn.Attention): the layer then computes its
weights A = softmax(q.k * scale) as Tensor ops (F.attention_weights) and hands them, and the
heads' outputs O = A v, to the probe, which records or edits them. Nothing of attention's math
is repeated here: the probe only reads and replaces A and O.

- `score_stats`: per head, the SD of the raw scores q.k (after rotary, before scaling) over the
  allowed (query, key) pairs, and the attention rows' mean entropy (notes 7.1, 7.3).
- `attribute`: for one prompt, one source position and the next token as target, per head: the
  weight from the last position to the source, the gradient attribution A * d log p / dA (one
  backward through the engine), and the change of log p when that one edge is removed (row
  renormalised) or when the head's output at the last position is zeroed (notes 13.3).

The ablations are forward re-runs, batched: each batch row carries one edit. An edit at the last
position changes only that position's computation (causal attention, notes 7.4-7.5), so the
prompt's other positions run once and fill a KV cache (notes 12.4) that every edited row then
reads: an ablation costs one position, not the whole prompt. The tests check this against a
direct recomputation of the whole prompt with the edited row.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import autograd
import autograd.functional as F
from autograd import Tensor, no_grad


@dataclass(frozen=True)
class Edit:
    """One intervention in batch row `row`, layer, head, at query position `query` (absolute).

    key None: the head's output at that position is zeroed (head ablation). key j: the weight
    A[query, j] is set to `value`; with renormalise the row is then divided by its new sum (edge
    ablation: value 0). Without renormalise the weight alone moves, as a derivative treats it.
    """

    row: int
    layer: int
    head: int
    query: int
    key: int | None = None
    value: float = 0.0
    renormalise: bool = True


@dataclass
class Probe:
    """Records each layer's raw scores and weights, and applies edits, during one forward."""

    model: Any
    edits: list[Edit] = field(default_factory=list)
    keep_scores: bool = False
    scores: dict[int, np.ndarray] = field(default_factory=dict)  # layer -> (B, H, Tq, Tk)
    weights_of: dict[int, Tensor] = field(default_factory=dict)  # layer -> A, in the graph

    def __post_init__(self) -> None:
        self.layer_of = {id(block.attn): i for i, block in enumerate(blocks(self.model))}

    # the two calls nn.Attention makes on its explicit path
    def weights(self, attn: Any, q: Tensor, k: Tensor, a: Tensor) -> Tensor:
        layer = self.layer_of[id(attn)]
        if self.keep_scores:  # q.k before the scale: what notes 7.1 reasons about
            k_all = F.per_query_head(k.data, q.shape[1])
            self.scores[layer] = q.data @ np.swapaxes(k_all, -1, -2)
        # the query rows are the sequence's last Tq positions (Tq = 1 after a KV cache)
        self.offset = a.shape[3] - a.shape[2]
        edits = [e for e in self.edits if e.layer == layer and e.key is not None]
        if edits:
            data = _editable(a)
            for e in edits:
                row = data[e.row, e.head, e.query - self.offset]
                row[e.key] = e.value
                if e.renormalise:
                    row /= row.sum()
            a = Tensor(data, dtype=data.dtype)
        self.weights_of[layer] = a
        return a

    def heads(self, attn: Any, o: Tensor) -> Tensor:
        layer = self.layer_of[id(attn)]
        edits = [e for e in self.edits if e.layer == layer and e.key is None]
        if not edits:
            return o
        data = _editable(o)  # (B, H, Tq, Dv)
        for e in edits:
            data[e.row, e.head, e.query - self.offset] = 0.0
        return Tensor(data, dtype=data.dtype)


def _editable(t: Tensor) -> np.ndarray:
    """A copy of t's values to edit: an edited forward is a measurement, nothing trains on it."""
    if autograd.is_grad_enabled() and t.requires_grad:
        raise RuntimeError("Probe: edits are forward re-runs; run them under autograd.no_grad()")
    return t.data.copy()


def blocks(model: Any) -> list[Any]:
    """The decoder's blocks (GPT-2's transformer.h, Llama's model.layers)."""
    return list(model.transformer.h)


@contextmanager
def probing(model: Any, probe: Probe):
    """Every attention layer of the model takes the explicit path with this probe."""
    layers = [block.attn for block in blocks(model)]
    for attn in layers:
        attn.probe = probe
    try:
        yield probe
    finally:
        for attn in layers:
            attn.probe = None


@contextmanager
def _only_embedding_grad(model: Any):
    """Only the token embedding requires grad: every A is still in the graph (it depends on the
    embedding), but the backward computes no weight gradient it does not need."""
    params = list(model.parameters())
    before = [p.requires_grad for p in params]
    model.requires_grad_(False)
    model.transformer.wte.weight.requires_grad = True
    try:
        yield
    finally:
        for p, flag in zip(params, before, strict=True):
            p.requires_grad = flag


def log_probs(logits: Tensor) -> Tensor:
    """log p over the vocabulary at the last position, (B, V)."""
    return F.log_softmax(logits[:, -1, :], axis=-1)


def entropy(a: np.ndarray) -> np.ndarray:
    """The entropy in nats of each attention row (the last axis); 0 log 0 = 0."""
    logs = np.log(np.where(a > 0, a, 1.0))
    return -(a * logs).sum(axis=-1)


def score_stats(model: Any, ids: Any) -> list[dict[str, Any]]:
    """Per layer and head, on one sequence of token ids: score_sd, the standard deviation of the
    raw scores q.k (after rotary, before scaling) over every allowed (query, key) pair, beside
    sqrt(d_k), its value under the notes' assumption (7.1: unit-variance, independent q_r, k_r);
    entropy, the attention rows' entropy in nats averaged over the query positions (7.3)."""
    ids = np.asarray(ids, dtype=np.int64)
    probe = Probe(model, keep_scores=True)
    with no_grad(), probing(model, probe):
        model(ids[None])
    allowed = np.tril(np.ones((len(ids), len(ids)), dtype=bool))
    stats = []
    for layer in sorted(probe.scores):
        scores, a = probe.scores[layer][0], probe.weights_of[layer].data[0]
        for head in range(scores.shape[0]):
            stats.append(
                {
                    "layer": layer,
                    "head": head,
                    "score_sd": float(scores[head][allowed].astype(np.float64).std()),
                    "sqrt_dk": float(np.sqrt(model.config.head_dim)),
                    "entropy": float(entropy(a[head].astype(np.float64)).mean()),
                }
            )
    return stats


def edited_log_probs(model: Any, ids: Any, edits: list[Edit], n_rows: int, target_id: int):
    """log p(target_id) after the last of `ids`, one value per batch row, each row with its edits
    (every edit at the last position). The first len(ids) - 1 positions run once into a KV cache
    that all rows share; only the last position runs n_rows times."""
    ids = np.asarray(ids, dtype=np.int64)
    last = len(ids) - 1
    if any(e.query != last for e in edits):
        raise ValueError("edited_log_probs: every edit must be at the last position")
    with no_grad():
        prefix = model.new_kv_caches(1, len(ids))
        if last:
            model(ids[None, :last], kv_caches=prefix)
        caches = model.new_kv_caches(n_rows, len(ids))
        for one, rows in zip(prefix, caches, strict=True):  # the clean prefix, shared by all rows
            rows.k[:, :, :last], rows.v[:, :, :last] = one.k[:, :, :last], one.v[:, :, :last]
            rows.length = last
        with probing(model, Probe(model, edits)):
            logits, _ = model(np.repeat(ids[None, last:], n_rows, axis=0), kv_caches=caches)
        return log_probs(logits).data[:, target_id].astype(np.float64)


def attribute(model: Any, ids: Any, source_position: int, target_id: int) -> dict[str, Any]:
    """Per head: attention from the last position to source_position, gradient attribution
    (that weight x d log p(target) / d weight, by the engine's backward), and the change of
    log p(target) when the edge is ablated (weight 0, row renormalised) or the head's output at
    the last position is zeroed. Also log p(target) itself."""
    ids = np.asarray(ids, dtype=np.int64)
    target_position = len(ids) - 1
    probe = Probe(model)
    with probing(model, probe), _only_embedding_grad(model):  # one forward, one backward
        logits, _ = model(ids[None])
        logp = log_probs(logits)[0, target_id]
        layers = sorted(probe.weights_of)
        grads = autograd.grad(logp, [probe.weights_of[layer] for layer in layers])
    n_head = probe.weights_of[0].shape[1]
    pairs = [(layer, head) for layer in layers for head in range(n_head)]
    edits = []
    for i, (layer, head) in enumerate(pairs):  # row 0 is the clean run
        edits.append(Edit(1 + i, layer, head, target_position, source_position))
        edits.append(Edit(1 + len(pairs) + i, layer, head, target_position))
    edited = edited_log_probs(model, ids, edits, 1 + 2 * len(pairs), target_id)
    heads = []
    for i, (layer, head) in enumerate(pairs):
        index = (0, head, target_position, source_position)
        weight = float(probe.weights_of[layer].data[index])
        heads.append(
            {
                "layer": layer,
                "head": head,
                "attention": weight,
                "gradient_attribution": weight * float(grads[layer].data[index]),
                "edge_ablation": float(edited[1 + i] - edited[0]),
                "head_ablation": float(edited[1 + len(pairs) + i] - edited[0]),
            }
        )
    return {"log_prob": float(logp.data), "heads": heads}
