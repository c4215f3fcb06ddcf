"""Scaled dot-product attention, forward and backward (notes 7.1, 7.4, 10.5-10.7).

q is (B, H, Tq, D), k and v are (B, H, Tk, D); per batch and head, with scale = 1 / sqrt(D):
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
(Di = rowsum(P * dP) because o = P v; it is the "weighted average" term of notes 10.6.)

The numpy reference builds the (Tq, Tk) score matrix per head. The Numba kernels follow
FlashAttention-2: they walk key blocks of BLOCK_K columns, keep a running max m, running sum l and
a rescaled output accumulator per query row (online softmax), skip blocks that are entirely in
the masked future, and store only o and lse. The backward recomputes P block by block from q, k
and lse. No (Tq, Tk) buffer exists: per thread they use O(BLOCK_Q * (BLOCK_K + D)) scratch,
plus O(B * H * T * D) for transposed copies of k and v.

Both paths return o, gq, gk, gv and lse in the dtype of q (lse is summed in float64 first).
"""

import math

import numba
import numpy as np
from numba import prange

from ._common import FASTMATH, float_array

# Block sizes of the Numba kernels; any positive values are correct (tests shrink them to cross
# block edges on small inputs), these are fast on a 1 MiB L2 cache.
BLOCK_Q = 64
BLOCK_K = 64


def _check(kernel, q, k, v, causal):
    q = float_array(q, kernel, "q")
    k = float_array(k, kernel, "k", dtype=q.dtype)
    v = float_array(v, kernel, "v", dtype=q.dtype)
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(
            f"{kernel}: q, k, v must be (B, H, T, D); got q {q.shape}, k {k.shape}, v {v.shape}"
        )
    if q.shape[:2] + q.shape[3:] != k.shape[:2] + k.shape[3:] or k.shape != v.shape:
        raise ValueError(
            f"{kernel}: q {q.shape}, k {k.shape} and v {v.shape} must agree in B, H, D "
            f"(and k, v in T)"
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


def attention_forward_numpy(q, k, v, causal=True):
    """o = softmax(q k^T / sqrt(D), over allowed keys) v; lse = log-sum-exp of those scores."""
    q, k, v = _check("attention_forward", q, k, v, causal)
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
    scale = 1.0 / math.sqrt(q.shape[-1])
    p = np.exp((q @ k.swapaxes(-1, -2)) * scale - lse[..., None])
    if causal:
        p = np.where(_allowed(q.shape[2], k.shape[2]), p, 0)
    gv = p.swapaxes(-1, -2) @ go
    dp = go @ v.swapaxes(-1, -2)
    di = np.sum(go * o, axis=-1, keepdims=True)
    ds = p * (dp - di) * q.dtype.type(scale)
    return ds @ k, ds.swapaxes(-1, -2) @ q, gv


# ---------------------------------------------------------------------------------------------
# Numba kernels (FlashAttention-2 style). Heads are flattened to bh = b * H + h. Inner loops run
# over a contiguous axis with no loop-carried sum, so LLVM turns them into SIMD: scores are
# built from the transposed keys kT (D, Tk) as s[j] += q[i, d] * kT[d, j].
# ---------------------------------------------------------------------------------------------


@numba.njit(parallel=True, cache=True, fastmath=FASTMATH)
def _flash_forward(q, kT, v, scale, causal, block_q, block_k, o, lse):
    n_heads, tq, d_head = q.shape
    tk = v.shape[1]
    shift = tk - tq  # causal: row i reads keys j <= i + shift
    n_qblocks = (tq + block_q - 1) // block_q
    # one task per (head, query block): tasks are independent, so no synchronisation at all
    for task in prange(n_heads * n_qblocks):
        bh, i0 = task // n_qblocks, (task % n_qblocks) * block_q
        i1 = min(i0 + block_q, tq)
        acc = np.zeros((i1 - i0, d_head), q.dtype)  # unnormalised o rows
        m = np.full(i1 - i0, -np.inf, q.dtype)  # running max of each row's scores
        l = np.zeros(i1 - i0, np.float64)  # running sum of exp(score - m)
        s = np.empty(block_k, q.dtype)
        # keys beyond the last row's allowed set are never visited (the masked future)
        k_end = min(tk, i1 + shift) if causal else tk
        for j0 in range(0, k_end, block_k):
            for i in range(i0, i1):
                r = i - i0
                j1 = min(j0 + block_k, i + shift + 1) if causal else min(j0 + block_k, tk)
                if j1 <= j0:
                    continue  # this whole key block is in row i's future
                n = j1 - j0
                s[:n] = 0
                qi = q[bh, i]
                for d in range(d_head):
                    qd = qi[d]
                    krow = kT[bh, d, j0:j1]
                    for j in range(n):
                        s[j] += qd * krow[j]
                m_new = m[r]
                for j in range(n):
                    s[j] *= scale
                    m_new = max(m_new, s[j])
                # rescale what was summed under the old max: exp(m_old - m_new) <= 1
                alpha = np.exp(m[r] - m_new)
                l[r] *= alpha
                accr = acc[r]
                for c in range(d_head):
                    accr[c] *= alpha
                for j in range(n):
                    p = np.exp(s[j] - m_new)
                    l[r] += p
                    vrow = v[bh, j0 + j]
                    for c in range(d_head):
                        accr[c] += p * vrow[c]
                m[r] = m_new
        for i in range(i0, i1):
            r = i - i0
            for c in range(d_head):
                o[bh, i, c] = acc[r, c] / l[r]
            lse[bh, i] = m[r] + np.log(l[r])


@numba.njit(parallel=True, cache=True, fastmath=FASTMATH)
def _flash_backward(q, k, kT, vT, go, lse, di, scale, causal, block_k, gq, gk, gv):
    """gq, gk, gv must be zero on entry; one task per head owns all three for that head."""
    n_heads, tq, d_head = q.shape
    tk = k.shape[1]
    shift = tk - tq
    for bh in prange(n_heads):
        s = np.empty(block_k, q.dtype)
        dp = np.empty(block_k, q.dtype)
        for j0 in range(0, tk, block_k):
            # gk, gv rows j0:j0+block_k stay in cache while all query rows that see them pass
            i_start = max(0, j0 - shift) if causal else 0
            for i in range(i_start, tq):
                j1 = min(j0 + block_k, i + shift + 1) if causal else min(j0 + block_k, tk)
                n = j1 - j0
                s[:n] = 0
                dp[:n] = 0
                qi, goi, gqi = q[bh, i], go[bh, i], gq[bh, i]
                for d in range(d_head):
                    qd, god = qi[d], goi[d]
                    krow, vrow = kT[bh, d, j0:j1], vT[bh, d, j0:j1]
                    for j in range(n):
                        s[j] += qd * krow[j]
                        dp[j] += god * vrow[j]
                for j in range(n):
                    s[j] = np.exp(s[j] * scale - lse[bh, i])  # recomputed P_ij
                    dp[j] = s[j] * (dp[j] - di[bh, i]) * scale  # dS_ij, 1/sqrt(D) folded in
                for j in range(n):
                    p, ds = s[j], dp[j]
                    gvj, gkj, kj = gv[bh, j0 + j], gk[bh, j0 + j], k[bh, j0 + j]
                    for c in range(d_head):
                        gvj[c] += p * goi[c]
                        gkj[c] += ds * qi[c]
                        gqi[c] += ds * kj[c]


def _scale(q):
    """1 / sqrt(D) as a scalar of q's dtype, so that float32 kernels compute in float32."""
    return q.dtype.type(1.0 / math.sqrt(q.shape[-1]))


def _heads(a):
    """(B, H, T, D) -> (B * H, T, D) view."""
    return a.reshape(-1, *a.shape[2:])


def _transposed_heads(a):
    """(B, H, T, D) -> contiguous (B * H, D, T), so a key's d-th entries are adjacent in memory."""
    return np.ascontiguousarray(_heads(a).transpose(0, 2, 1))


def attention_forward_numba(q, k, v, causal=True):
    """FlashAttention-2 style forward; same contract as attention_forward_numpy."""
    q, k, v = _check("attention_forward", q, k, v, causal)
    o = np.empty_like(q)
    lse = np.empty(q.shape[:3], q.dtype)
    _flash_forward(
        _heads(q), _transposed_heads(k), _heads(v), _scale(q), causal, BLOCK_Q, BLOCK_K, _heads(o),
        lse.reshape(-1, q.shape[2]),
    )  # fmt: skip
    return o, lse


def attention_backward_numba(q, k, v, o, lse, go, causal=True):
    """FlashAttention-2 style backward; same contract as attention_backward_numpy."""
    kernel = "attention_backward"
    q, k, v = _check(kernel, q, k, v, causal)
    o = _check_grad(kernel, "o", o, q)
    go = _check_grad(kernel, "go", go, q)
    lse = _check_grad(kernel, "lse", lse, q[..., 0])
    di = np.sum(go * o, axis=-1, dtype=np.float64).astype(q.dtype)  # Di = rowsum(go * o)
    gq, gk, gv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    _flash_backward(
        _heads(q), _heads(k), _transposed_heads(k), _transposed_heads(v), _heads(go),
        lse.reshape(-1, q.shape[2]), di.reshape(-1, q.shape[2]), _scale(q), causal, BLOCK_K,
        _heads(gq), _heads(gk), _heads(gv),
    )  # fmt: skip
    return gq, gk, gv
