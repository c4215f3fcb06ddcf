"""Embedding backward: scatter-add output gradients into the rows of the table (notes 10.9).

The forward is just `weight[idx]` (numpy fancy indexing needs no kernel). Its gradient is
    gweight[w, :] = sum over positions i with idx[i] == w of gy[i, :],
so an id that appears several times receives the SUM of its rows, and unused rows stay zero.
Both paths add the rows of one id in their original order, so the result is deterministic.
"""

import numpy as np
from numba import prange

from ._common import Kernel, float_array, int_array


def _check(idx, gy, num_embeddings, out):
    kernel = "embedding_backward"
    idx = int_array(idx, kernel, "idx")
    gy = float_array(gy, kernel, "gy")
    if gy.shape[:-1] != idx.shape or gy.ndim != idx.ndim + 1:
        raise ValueError(f"{kernel}: gy {gy.shape} must be idx.shape + (C,) for idx {idx.shape}")
    num_embeddings = int(num_embeddings)
    if out is not None and (out.shape != (num_embeddings, gy.shape[-1]) or out.dtype != gy.dtype):
        raise ValueError(
            f"{kernel}: out {out.shape} {out.dtype} must be ({num_embeddings}, "
            f"{gy.shape[-1]}) {gy.dtype} for gy {gy.shape} {gy.dtype}"
        )
    flat = idx.reshape(-1)
    bad = np.flatnonzero((flat < 0) | (flat >= num_embeddings))
    if bad.size:
        raise ValueError(
            f"{kernel}: id {flat[bad[0]]} out of range [0, {num_embeddings}) "
            f"at flat position {bad[0]} of idx {idx.shape}"
        )
    return flat, gy.reshape(flat.size, gy.shape[-1]), num_embeddings


def embedding_backward_numpy(idx, gy, num_embeddings, out=None):
    """gweight[w] = sum_{i: idx[i] = w} gy[i] (notes 10.9); np.add.at adds repeats in order.
    out: a (num_embeddings, C) gradient to add gweight into (returned), as out + gweight."""
    flat, rows, num_embeddings = _check(idx, gy, num_embeddings, out)
    gweight = np.zeros((num_embeddings, rows.shape[1]), rows.dtype)
    np.add.at(gweight, flat, rows)
    return gweight if out is None else np.add(out, gweight, out=out)


@Kernel
def _scatter_add_segments(order, starts, ids, rows, gweight, add):
    """Segment s holds positions order[starts[s]:starts[s + 1]], all with id ids[s].

    One thread owns one output row, so there are no races and no atomics; each row is summed in
    float64 in the original position order (the sort that made `order` is stable), rounded to
    gweight's dtype, and written (or, with add, added to the row as numpy's out + sum would).
    """
    width = rows.shape[1]
    for s in prange(ids.size):
        acc = np.zeros(width, np.float64)
        for p in range(starts[s], starts[s + 1]):
            src = rows[order[p]]
            for j in range(width):
                acc[j] += src[j]
        out = gweight[ids[s]]
        total = np.empty(width, gweight.dtype)
        for j in range(width):
            total[j] = acc[j]
        for j in range(width):
            out[j] = out[j] + total[j] if add else total[j]


def embedding_backward_numba(idx, gy, num_embeddings, out=None):
    """Numba scatter-add; same contract as embedding_backward_numpy (with out, the rows of no id
    are not touched: no zeroed table, no pass over it)."""
    flat, rows, num_embeddings = _check(idx, gy, num_embeddings, out)
    gweight = np.zeros((num_embeddings, rows.shape[1]), rows.dtype) if out is None else out
    if flat.size == 0:
        return gweight
    # Group equal ids: a stable sort keeps each id's positions in their original order.
    order = np.argsort(flat, kind="stable")
    sorted_ids = flat[order]
    starts = np.flatnonzero(np.diff(sorted_ids, prepend=-1))  # first position of each id
    ids = sorted_ids[starts]
    starts = np.append(starts, flat.size)
    _scatter_add_segments(rows.size, order, starts, ids, rows, gweight, out is not None)
    return gweight
