"""Scaled dot-product attention, forward and backward (notes 7.1, 7.4, 10.5-10.7).

q is (B, H, Tq, D), k and v are (B, Hkv, Tk, D) with Hkv dividing H: query head h reads K/V head
h // (H / Hkv) (grouped-query attention, notes 8.1; Hkv = H is multi-head attention, Hkv = 1
multi-query). Per batch and query head, with scale = 1 / sqrt(D):
    S = q k^T * scale                       scores (Tq, Tk)
    P = softmax over the allowed keys of S  each row sums to 1 over its allowed set
    o = P v                                 (Tq, D)
    lse_i = log(sum_{j allowed} exp(S_ij))  kept for the backward: P_ij = exp(S_ij - lse_i)

Causal masking is an allowed set (notes 7.4): query row i may read keys j <= i + (Tk - Tq). The
mask is bottom-right aligned, so Tq < Tk is KV-cache decoding (the Tq new queries are the last
Tq positions), and Tq == Tk gives the usual j <= i. Causal needs Tq <= Tk: otherwise the first
rows would have no allowed key. Without causal every key is allowed.

Backward, given go = dL/do (notes 10.5-10.7):
    gv = P^T go,  dP = go v^T,  Di = rowsum(go * o),  dS = P * (dP - Di),
    gq = dS k * scale,  gk = dS^T q * scale.
(Di = rowsum(P * dP) because o = P v; it is the "weighted average" term of notes 10.6.) With
grouped K/V heads, gk and gv of a K/V head sum those of the query heads that read it.

The numpy reference builds the (Tq, Tk) score matrix per head. The fast path never does: it walks
blocks of BLOCK_Q query rows, and for each block takes only the keys that some row of the block may
read (causal: the block's past plus its diagonal part; the masked future is never computed):
    forward:  S = q_blk k^T (BLAS)  ->  P = softmax(S * scale), lse (Numba)  ->  o_blk = P v (BLAS)
    backward: S = q_blk k^T, dP = go_blk v^T (BLAS)  ->  P = exp(S * scale - lse),
              dS = P (dP - Di) scale (Numba)  ->  gq_blk = dS k, gv += P^T go, gk += dS^T q (BLAS)
Each product is one np.matmul batched over the B * H heads (numpy hands each head's matrices to
its BLAS sgemm/dgemm, ~4x faster per thread than the Numba loops it replaced), and the elementwise
steps are fused into one Numba pass over each row. Only o and one lse per row are stored; the
backward recomputes P from q, k and lse. Scratch: B * H * BLOCK_Q * Tk values for S (the
backward: twice that, plus B * H * Tk * D each for a partial gk or gv and for transposed copies of
k and v), i.e. O(B * H * T * D) while BLOCK_Q <= D; a (Tq, Tk) matrix per head exists only when
Tq <= BLOCK_Q, where it is that small anyway.

Both paths return o, gq, gk, gv and lse in the dtype of q (lse is summed in float64 first).
"""

import math

import numpy as np
from numba import prange

from ._common import Kernel, float_array
from ._exp import exp
from .softmax import _max

# Query rows per block of the fast path. Any positive value is correct (tests shrink it to cross
# block edges on small inputs); measured in docs/kernels.md.
BLOCK_Q = 64

# Up to this many query rows per K/V head, attention without a mask to apply (Tq = 1, or not
# causal) runs as one fused pass per row (_attend_all_keys), not as blocked BLAS products: a
# decoded token's heads (SmolLM2: 3 per K/V head; GPT-2: 1). More rows share each key read
# better in BLAS.
ONE_PASS_ROWS = 8


def _check(kernel, q, k, v, causal):
    q = float_array(q, kernel, "q")
    k = float_array(k, kernel, "k", dtype=q.dtype)
    v = float_array(v, kernel, "v", dtype=q.dtype)
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(
            f"{kernel}: q, k, v must be (B, H, T, D); got q {q.shape}, k {k.shape}, v {v.shape}"
        )
    if (
        q.shape[0] != k.shape[0]
        or q.shape[3] != k.shape[3]
        or k.shape != v.shape
        or k.shape[1] == 0
        or q.shape[1] % k.shape[1]
    ):
        raise ValueError(
            f"{kernel}: q {q.shape}, k {k.shape} and v {v.shape} must agree in B and D, k and v "
            f"in every axis, and k's heads must divide q's"
        )
    tq, tk = q.shape[2], k.shape[2]
    if tk == 0 or (causal and tq > tk):
        raise ValueError(
            f"{kernel}: q {q.shape} with k {k.shape}, causal={causal}: some query row would "
            f"have no allowed key (need Tk >= 1, and Tq <= Tk when causal)"
        )
    return q, k, v


def _check_grad(kernel, name, a, like):
    a = float_array(a, kernel, name, dtype=like.dtype)
    if a.shape != like.shape:
        raise ValueError(f"{kernel}: {name} {a.shape} must have shape {like.shape}")
    return a


def _allowed(tq, tk):
    """Causal allowed set as a (Tq, Tk) bool matrix: j <= i + (Tk - Tq)."""
    return np.arange(tk)[None, :] <= np.arange(tq)[:, None] + (tk - tq)


# ---------------------------------------------------------------------------------------------
# numpy reference: explicit (Tq, Tk) scores per head
# ---------------------------------------------------------------------------------------------


def _per_query_head(a, heads):
    """(B, Hkv, T, D) -> (B, H, T, D): each K/V head repeated for the query heads that read it."""
    return np.repeat(a, heads // a.shape[1], axis=1)


def _per_kv_head(a, kv_heads):
    """(B, H, T, D) -> (B, Hkv, T, D): the sum over each K/V head's group of query heads."""
    b, h, t, d = a.shape
    return a.reshape(b, kv_heads, h // kv_heads, t, d).sum(axis=2)


def attention_forward_numpy(q, k, v, causal=True):
    """o = softmax(q k^T / sqrt(D), over allowed keys) v; lse = log-sum-exp of those scores."""
    q, k, v = _check("attention_forward", q, k, v, causal)
    k, v = _per_query_head(k, q.shape[1]), _per_query_head(v, q.shape[1])
    s = (q @ k.swapaxes(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
    if causal:
        s = np.where(_allowed(q.shape[2], k.shape[2]), s, -np.inf)
    m = np.max(s, axis=-1, keepdims=True)  # finite: every row has an allowed key
    e = np.exp(s - m)
    l = np.sum(e, axis=-1, keepdims=True, dtype=np.float64)
    o = (e / l).astype(q.dtype) @ v
    return o, (m[..., 0] + np.log(l[..., 0])).astype(q.dtype)


def attention_backward_numpy(q, k, v, o, lse, go, causal=True):
    """gv = P^T go, dS = P * (go v^T - rowsum(go * o)), gq = dS k * scale, gk = dS^T q * scale."""
    kernel = "attention_backward"
    q, k, v = _check(kernel, q, k, v, causal)
    o = _check_grad(kernel, "o", o, q)
    go = _check_grad(kernel, "go", go, q)
    lse = _check_grad(kernel, "lse", lse, q[..., 0])
    kv_heads = k.shape[1]
    k, v = _per_query_head(k, q.shape[1]), _per_query_head(v, q.shape[1])
    scale = 1.0 / math.sqrt(q.shape[-1])
    p = np.exp((q @ k.swapaxes(-1, -2)) * scale - lse[..., None])
    if causal:
        p = np.where(_allowed(q.shape[2], k.shape[2]), p, 0)
    gv = p.swapaxes(-1, -2) @ go
    dp = go @ v.swapaxes(-1, -2)
    di = np.sum(go * o, axis=-1, keepdims=True)
    ds = p * (dp - di) * q.dtype.type(scale)
    gk = ds.swapaxes(-1, -2) @ q
    return ds @ k, _per_kv_head(gk, kv_heads), _per_kv_head(gv, kv_heads)


# ---------------------------------------------------------------------------------------------
# Blocked kernels: numpy's BLAS does the products, Numba the fused elementwise steps. Heads are
# flattened to bh = b * H + h, so every product is one np.matmul batched over B * H heads.
# ---------------------------------------------------------------------------------------------


@Kernel
def _probs_forward(s, scale, causal, first, lse, i0, block):
    """Scores -> probabilities in place, one row per (head, query); lse[bh, i0 + r] per row.

    s is (heads, n, width) = q_block k^T (unscaled). Row r may read keys j < first + r + 1 when
    causal (first = i0 + Tk - Tq); the masked future inside the diagonal block is set to 0, so
    the products with v that follow ignore it: up to the end of row r's block of `block` columns
    (r // block + 1) * block, where the products stop (block = width: the whole row).
    """
    n_heads, n, width = s.shape
    for task in prange(n_heads * n):
        bh, r = task // n, task % n
        row = s[bh, r]
        end = min(width, first + r + 1) if causal else width
        m = _max(row[:end])
        # the sum in the row dtype, over LLVM's vector lanes (reassoc): a float64 sum of float32
        # values converts each one and ran the whole kernel 1.4x slower
        total = row.dtype.type(0.0)
        for j in range(end):
            e = exp((row[j] - m) * scale)  # scale > 0, so the max of the scaled row is m*scale
            row[j] = e
            total += e
        inv = row.dtype.type(1.0) / total
        for j in range(end):
            row[j] = row[j] * inv
        row[end : min(width, (r // block + 1) * block)] = 0
        lse[bh, i0 + r] = m * scale + np.log(total)


@Kernel
def _ds_backward(s, dp, lse, di, scale, causal, first, i0):
    """In place: s (scores) -> P = exp(s * scale - lse), dp (= go v^T) -> dS = P (dp - Di) scale.

    Same row layout and masking as _probs_forward; masked entries become 0 in both.
    """
    n_heads, n, width = s.shape
    for task in prange(n_heads * n):
        bh, r = task // n, task % n
        srow, drow = s[bh, r], dp[bh, r]
        end = min(width, first + r + 1) if causal else width
        row_lse, row_di = lse[bh, i0 + r], di[bh, i0 + r]
        for j in range(end):
            p = exp(srow[j] * scale - row_lse)
            srow[j] = p
            drow[j] = p * (drow[j] - row_di) * scale
        srow[end:] = 0
        drow[end:] = 0


@Kernel
def _probs_backward(p, dp, causal, scale, block):
    """In place: dp (= go v^T) -> dS = P (dP - rowsum(P dP)) scale, row by row (notes 10.5).

    p and dp are (rows, T) for self-attention (Tq = Tk) with P kept; when causal, row r (query
    i = r % T) reads only its keys j <= i, and its masked future is set to 0 (where P is 0) up
    to the end of its block of `block` columns, (i // block + 1) * block, as _probs_forward's.
    The compiled step's fused attention backward (Attention.compiled_backward); the scale is
    applied here, to the contiguous dS, not afterwards to gq and gk (strided views: 4x slower
    per value).
    """
    rows, width = p.shape
    for r in prange(rows):
        end = r % width + 1 if causal else width
        d = dp.dtype.type(0.0)  # in the row dtype, over vector lanes (as _probs_forward)
        for j in range(end):
            d += p[r, j] * dp[r, j]
        for j in range(end):
            dp[r, j] = p[r, j] * (dp[r, j] - d) * scale
        for j in range(end, min(width, (r % width // block + 1) * block)):  # as _probs_forward
            dp[r, j] = 0


@Kernel
def _row_dots(a, b, out):
    """out[r] = sum_c a[r, c] * b[r, c], summed in float64, stored in out's dtype."""
    for r in prange(a.shape[0]):
        total = 0.0
        for c in range(a.shape[1]):
            total += a[r, c] * b[r, c]
        out[r] = total


@Kernel
def _attend_all_keys(q, keys, values, length, scale, o, lse, scores):
    """Query rows that may each read every one of keys 0:length (KV-cache decoding, and any
    attention without a causal mask): per row the scores, softmax and P v in one pass, with no
    BLAS call and no (rows, Tk) array between them.

    q and o are (n, rows, D): the rows that read K/V head n (its query heads' rows side by side),
    keys and values (n, capacity, D) of which the first length positions are read (a KV cache's
    arrays as they are), lse (n, rows), scores a scratch of (n * rows, >= length). For a few rows
    (decoding a token) a BLAS product of 64-wide rows costs more in its call than in its work:
    SmolLM2's 3 query heads per K/V head over 150 cached positions took ~40 us a layer in the
    blocked path's two np.matmul calls and softmax pass, 14 us here.
    """
    rows, group, d_head = q.shape
    for r in prange(rows):  # per K/V head: each key and value row is read once for its group
        block = scores[r * group : (r + 1) * group]
        for j in range(length):
            for g in range(group):
                s = q.dtype.type(0.0)
                for c in range(d_head):
                    s += q[r, g, c] * keys[r, j, c]
                block[g, j] = s
        inv = np.empty(group, q.dtype)
        for g in range(group):
            row = block[g, :length]
            m = _max(row)
            total = q.dtype.type(0.0)
            for j in range(length):
                e = exp((row[j] - m) * scale)  # as _probs_forward: the scaled row's max is m*scale
                row[j] = e
                total += e
            inv[g] = q.dtype.type(1.0) / total
            lse[r, g] = m * scale + np.log(total)
        o[r] = 0
        for j in range(length):
            for g in range(group):
                p = block[g, j] * inv[g]
                for c in range(d_head):
                    o[r, g, c] += p * values[r, j, c]


def _scale(q):
    """1 / sqrt(D) as a scalar of q's dtype, so that float32 kernels compute in float32."""
    return q.dtype.type(1.0 / math.sqrt(q.shape[-1]))


def _heads(a):
    """(B, H, T, D) -> (B * H, T, D) view."""
    return a.reshape(a.shape[0] * a.shape[1], *a.shape[2:])  # not -1: T may be 0


def _transposed(a, tq):
    """(heads, Tk, D) -> (heads, D, Tk), for products q @ a^T with Tq query rows.

    OpenBLAS multiplies by a row-major (D, Tk) matrix 1.1-3x faster than by the transposed view
    a.swapaxes(1, 2) at D = 64, but the copy itself costs about one product with ~32 query rows;
    so copy only when there are at least that many (KV-cache decoding, Tq = 1, uses the view).
    """
    view = a.swapaxes(1, 2)
    return np.ascontiguousarray(view) if tq >= 32 else view


def _query_blocks(tq, tk, causal):
    """(i0, i1, width): query rows i0:i1 and the keys 0:width that any of them may read."""
    for i0 in range(0, tq, BLOCK_Q):
        i1 = min(i0 + BLOCK_Q, tq)
        yield i0, i1, (min(tk, i1 + tk - tq) if causal else tk)


def _scratch(buffer, *shape):
    """A C-contiguous (shape) view on the front of a flat scratch buffer."""
    return buffer[: math.prod(shape)].reshape(shape)


def _grouped(a, kv_heads):
    """(B * H, ...) -> (B * Hkv, H / Hkv, ...) view: each K/V head's query heads side by side,
    so that one np.matmul with the K/V head broadcast over them serves the whole group."""
    return a.reshape(kv_heads, a.shape[0] // kv_heads, *a.shape[1:])


def _add_groups(target, part, kv_heads):
    """target (B * Hkv, ...) += part (B * H, ...) summed over each K/V head's query heads."""
    target += part if part.shape[0] == kv_heads else _grouped(part, kv_heads).sum(axis=1)


def attention_forward_numba(q, k, v, causal=True):
    """Blocked forward (BLAS products, Numba softmax); same contract as attention_forward_numpy."""
    q, k, v = _check("attention_forward", q, k, v, causal)
    (n_heads, tq, _), tk = _heads(q).shape, k.shape[2]
    qh, kh, vh = _heads(q), _heads(k), _heads(v)
    n_kv = kh.shape[0]
    o = np.empty_like(q)
    oh = _heads(o)
    lse = np.empty((n_heads, tq), q.dtype)
    scale = _scale(q)
    rows = n_heads // n_kv * tq  # query rows per K/V head
    if (tq == 1 or not causal) and rows <= ONE_PASS_ROWS:  # every row reads every key
        grouped = (n_kv, rows, q.shape[-1])  # a K/V head's query heads' rows, C-contiguous
        scores = np.empty((n_heads * tq, tk), q.dtype)
        o_rows, lse_rows = oh.reshape(grouped), lse.reshape(grouped[:2])
        _attend_all_keys(
            q.size * tk, qh.reshape(grouped), kh, vh, tk, scale, o_rows, lse_rows, scores
        )
        return o, lse.reshape(q.shape[:3])
    buffer = np.empty(n_heads * min(BLOCK_Q, tq) * tk, q.dtype)
    kT, vg = _transposed(kh, tq)[:, None], vh[:, None]  # broadcast over each group
    qg, og = _grouped(qh, n_kv), _grouped(oh, n_kv)
    for i0, i1, width in _query_blocks(tq, tk, causal):
        s = _scratch(buffer, n_heads, i1 - i0, width)
        sg = _grouped(s, n_kv)
        np.matmul(qg[:, :, i0:i1], kT[..., :width], out=sg)
        _probs_forward(s.size, s, scale, causal, i0 + tk - tq, lse, i0, width)
        np.matmul(sg, vg[:, :, :width], out=og[:, :, i0:i1])
    return o, lse.reshape(q.shape[:3])


def attention_backward_numba(q, k, v, o, lse, go, causal=True):
    """Blocked backward (BLAS products, Numba dS); same contract as attention_backward_numpy."""
    kernel = "attention_backward"
    q, k, v = _check(kernel, q, k, v, causal)
    o = _check_grad(kernel, "o", o, q)
    go = _check_grad(kernel, "go", go, q)
    lse = _check_grad(kernel, "lse", lse, q[..., 0])
    (n_heads, tq, d_head), tk = _heads(q).shape, k.shape[2]
    qh, kh, vh, goh = _heads(q), _heads(k), _heads(v), _heads(go)
    n_kv = kh.shape[0]
    di = np.empty((n_heads, tq), q.dtype)  # Di = rowsum(go * o)
    rows_shape = (n_heads * tq, d_head)
    _row_dots(go.size, go.reshape(rows_shape), o.reshape(rows_shape), di.reshape(-1))
    gq, gk, gv = np.empty_like(q), np.zeros_like(k), np.zeros_like(v)
    gqh, gkh, gvh = _heads(gq), _heads(gk), _heads(gv)
    scale = _scale(q)
    rows = min(BLOCK_Q, tq)
    s_buffer, dp_buffer = (np.empty(n_heads * rows * tk, q.dtype) for _ in range(2))
    part_buffer = np.empty(n_heads * tk * d_head, q.dtype)
    kT, vT = _transposed(kh, tq)[:, None], _transposed(vh, tq)[:, None]
    qg, gog, gqg, kg = _grouped(qh, n_kv), _grouped(goh, n_kv), _grouped(gqh, n_kv), kh[:, None]
    for i0, i1, width in _query_blocks(tq, tk, causal):
        s = _scratch(s_buffer, n_heads, i1 - i0, width)
        dp = _scratch(dp_buffer, n_heads, i1 - i0, width)
        part = _scratch(part_buffer, n_heads, width, d_head)
        np.matmul(qg[:, :, i0:i1], kT[..., :width], out=_grouped(s, n_kv))
        np.matmul(gog[:, :, i0:i1], vT[..., :width], out=_grouped(dp, n_kv))
        _ds_backward(s.size, s, dp, lse.reshape(n_heads, tq), di, scale, causal, i0 + tk - tq, i0)
        np.matmul(_grouped(dp, n_kv), kg[:, :, :width], out=gqg[:, :, i0:i1])  # gq: dS k
        np.matmul(s.swapaxes(1, 2), goh[:, i0:i1], out=part)  # gv += P^T go
        _add_groups(gvh[:, :width], part, n_kv)
        np.matmul(dp.swapaxes(1, 2), qh[:, i0:i1], out=part)  # gk += dS^T q
        _add_groups(gkh[:, :width], part, n_kv)
    return gq, gk, gv
