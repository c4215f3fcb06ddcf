"""Softmax, log-softmax, logsumexp and fused cross-entropy over the last axis.

Notes: 6.2 (softmax), 7.3 (its Jacobian), 9.1-9.2 (log-likelihood loss), 10.3 (loss -> logits),
10.6 (backward through softmax).

Every function comes twice: `<name>_numpy` is the plain vectorised reference, `<name>_numba` the
row-parallel kernel held to it. Both subtract the row maximum m before exp, so exp never overflows:
softmax(x) = exp(x - m) / sum(exp(x - m)) and logsumexp(x) = m + log(sum(exp(x - m))).

Special rows (same in both paths):
- `-inf` entries get weight 0 (that is how a mask is written).
- A row that is entirely `-inf` (or empty) has no allowed entry: softmax gives an all-zero row,
  log_softmax an all `-inf` row, logsumexp `-inf`; no warning, no NaN.
- `+inf` or NaN anywhere in a row makes that whole row NaN (nothing sensible to return).
The Numba kernels sum exponentials in float64, also for float32 input.
"""

import numba
import numpy as np
from numba import prange

from ._common import FASTMATH, Kernel, float_array, int_array, last_axis, same_shape
from ._exp import exp

# ---------------------------------------------------------------------------------------------
# numpy reference
# ---------------------------------------------------------------------------------------------


def _row_max(x):
    """Row maximum, 0 for an all -inf (or empty) row, so that x - m is never -inf - -inf."""
    m = np.max(x, axis=-1, keepdims=True, initial=-np.inf)
    return np.where(np.isneginf(m), np.zeros_like(m), m)


def softmax_forward_numpy(x):
    """y = exp(x - m) / sum_j exp(x_j - m), m = max_j x_j, over the last axis (notes 6.2)."""
    x = float_array(x, "softmax_forward", "x")
    with np.errstate(invalid="ignore"):  # inf - inf = NaN is the documented answer
        e = np.exp(x - _row_max(x))
    s = np.sum(e, axis=-1, keepdims=True)
    return e / np.where(s == 0, np.ones_like(s), s)  # s == 0 only for a fully -inf row


def softmax_backward_numpy(y, gy):
    """gx = y * (gy - sum_j y_j gy_j) (notes 10.6)."""
    y = float_array(y, "softmax_backward", "y")
    gy = float_array(gy, "softmax_backward", "gy", dtype=y.dtype)
    same_shape(y, gy, "softmax_backward", ("y", "gy"))
    return y * (gy - np.sum(y * gy, axis=-1, keepdims=True))


def logsumexp_forward_numpy(x):
    """lse = m + log(sum_j exp(x_j - m)) over the last axis; shape x.shape[:-1]."""
    x = float_array(x, "logsumexp_forward", "x")
    last_axis(x, "logsumexp_forward")
    m = _row_max(x)
    with np.errstate(invalid="ignore", divide="ignore"):  # log(0) = -inf for a fully -inf row
        return (m + np.log(np.sum(np.exp(x - m), axis=-1, keepdims=True)))[..., 0]


def log_softmax_forward_numpy(x):
    """y = (x - m) - log(sum_j exp(x_j - m)) over the last axis.

    Written as (x - m) - log(s) rather than x - logsumexp(x): for large x (say 1e4) the second
    form cancels two nearly equal numbers and loses the digits of the small answer.
    """
    x = float_array(x, "log_softmax_forward", "x")
    last_axis(x, "log_softmax_forward")
    m = _row_max(x)
    with np.errstate(invalid="ignore", divide="ignore"):  # a fully -inf row: -inf - log(0) = NaN
        s = np.sum(np.exp(x - m), axis=-1, keepdims=True)
        y = (x - m) - np.log(s)
    return np.where(s == 0, -np.inf, y)  # s == 0 only for a fully -inf row


def log_softmax_backward_numpy(y, gy):
    """gx = gy - exp(y) * sum_j gy_j; exp(-inf) = 0, so masked entries pass gy through."""
    y = float_array(y, "log_softmax_backward", "y")
    gy = float_array(gy, "log_softmax_backward", "gy", dtype=y.dtype)
    same_shape(y, gy, "log_softmax_backward", ("y", "gy"))
    return gy - np.exp(y) * np.sum(gy, axis=-1, keepdims=True)


def _check_cross_entropy(logits, targets, ignore_index):
    """Validate; return logits, int64 targets, the non-ignored mask and its count.

    The range check stays here although autograd.functional checks too: a Numba kernel does no
    bounds checking, and one out-of-range target would write outside dlogits (heap corruption)."""
    kernel = "cross_entropy"
    logits = float_array(logits, kernel, "logits")
    targets = int_array(targets, kernel, "targets")
    if logits.ndim != 2 or targets.shape != logits.shape[:1]:
        raise ValueError(
            f"{kernel}: logits must be (N, V) and targets (N,), got logits {logits.shape} "
            f"and targets {targets.shape}"
        )
    valid = targets != ignore_index
    vocab = logits.shape[1]
    bad = np.flatnonzero(valid & ((targets < 0) | (targets >= vocab)))
    if bad.size:
        r = int(bad[0])
        raise ValueError(
            f"{kernel}: target {targets[r]} out of range [0, {vocab}) at row {r} "
            f"(logits {logits.shape}, ignore_index={ignore_index})"
        )
    return logits, targets, valid, int(np.count_nonzero(valid))


def cross_entropy_forward_numpy(logits, targets, ignore_index=-100, need_grad=True, grad_scale=1.0):
    """loss = mean over kept rows of (logsumexp(row) - row[target]);
    dlogits = (p - onehot) / n * grad_scale (the loss's gradient times an incoming dL/dloss).

    Notes 9.2 and 10.3. Rows whose target is `ignore_index` add nothing and get a zero gradient;
    if every row is ignored the loss is 0.0 and dlogits is all zero. The loss of a row is
    (m - row[t]) + log(s), s = sum_j exp(row_j - m) summed in float64.
    """
    logits, targets, valid, n_valid = _check_cross_entropy(logits, targets, ignore_index)
    rows = np.flatnonzero(valid)
    m = np.max(logits, axis=1, keepdims=True, initial=-np.inf)
    e = np.exp(logits - m)
    s = np.sum(e, axis=1, keepdims=True, dtype=np.float64)
    row_loss = (m[rows, 0] - logits[rows, targets[rows]]) + np.log(s[rows, 0])
    loss = float(np.sum(row_loss)) / n_valid if n_valid else 0.0
    if not need_grad:
        return loss, None
    dlogits = (e / s).astype(logits.dtype)
    dlogits[rows, targets[rows]] -= 1
    dlogits[~valid] = 0
    return loss, dlogits / max(n_valid, 1) * dlogits.dtype.type(grad_scale)


# ---------------------------------------------------------------------------------------------
# Numba kernels: one prange over rows; each row is read from memory once and then stays in cache.
# ---------------------------------------------------------------------------------------------


@numba.njit(cache=True, fastmath=FASTMATH)
def _max(row):
    """Maximum of a non-empty row, kept in the row's dtype (so exp below runs in float32 for
    float32 input). NaN entries are skipped unless row[0] is NaN; either way a row with a NaN
    becomes NaN later, through exp(NaN - m).

    A max over 8 independent running maxima: the compare-and-select of each does not depend on
    the others, so LLVM vectorises them (a single running max is one long dependency chain that
    it may not reorder without assuming "no NaN"); 2x faster than one chain on 128-wide rows.
    """
    m0 = m1 = m2 = m3 = m4 = m5 = m6 = m7 = row[0]
    n8 = row.size - row.size % 8
    for j in range(0, n8, 8):
        v0, v1, v2, v3 = row[j], row[j + 1], row[j + 2], row[j + 3]
        v4, v5, v6, v7 = row[j + 4], row[j + 5], row[j + 6], row[j + 7]
        m0 = v0 if v0 > m0 else m0
        m1 = v1 if v1 > m1 else m1
        m2 = v2 if v2 > m2 else m2
        m3 = v3 if v3 > m3 else m3
        m4 = v4 if v4 > m4 else m4
        m5 = v5 if v5 > m5 else m5
        m6 = v6 if v6 > m6 else m6
        m7 = v7 if v7 > m7 else m7
    for j in range(n8, row.size):
        v = row[j]
        m0 = v if v > m0 else m0
    m = row[0]  # NaN-skipping merge: a lane that stayed NaN (row[0] NaN) gives NaN only then
    for lane in (m0, m1, m2, m3, m4, m5, m6, m7):
        m = lane if lane > m else m
    return m


@Kernel
def _softmax_rows(x, y):
    for r in prange(x.shape[0]):
        row, out = x[r], y[r]
        m = _max(row)
        if m == -np.inf:  # fully masked row -> all zero
            out[:] = 0
            continue
        s = 0.0
        for j in range(row.size):
            e = exp(row[j] - m)
            out[j] = e
            s += e
        inv = out.dtype.type(1.0 / s)  # a float64 factor would make the loop convert every value
        for j in range(row.size):
            out[j] = out[j] * inv


@Kernel
def _softmax_backward_rows(y, gy, gx):
    for r in prange(y.shape[0]):
        dot = 0.0
        for j in range(y.shape[1]):
            dot += y[r, j] * gy[r, j]
        d = gx.dtype.type(dot)  # summed in float64, applied in the row dtype (no conversions)
        for j in range(y.shape[1]):
            gx[r, j] = y[r, j] * (gy[r, j] - d)


@Kernel
def _logsumexp_rows(x, lse, y, want_y):
    """lse[r] = logsumexp(x[r]); if want_y also y[r] = log_softmax(x[r])."""
    for r in prange(x.shape[0]):
        row = x[r]
        m = _max(row)
        if m == -np.inf:
            lse[r] = -np.inf
            if want_y:
                y[r, :] = -np.inf
            continue
        s = 0.0
        for j in range(row.size):
            s += exp(row[j] - m)
        log_s = np.log(s)
        lse[r] = m + log_s
        if want_y:
            log_s_row = row.dtype.type(log_s)
            for j in range(row.size):
                y[r, j] = (row[j] - m) - log_s_row


@Kernel
def _log_softmax_backward_rows(y, gy, gx):
    for r in prange(y.shape[0]):
        total = 0.0
        for j in range(y.shape[1]):
            total += gy[r, j]
        t = gx.dtype.type(total)
        for j in range(y.shape[1]):
            gx[r, j] = gy[r, j] - exp(y[r, j]) * t


@Kernel
def _cross_entropy_rows(logits, targets, ignore_index, inv_n, need_grad, row_loss, dlogits):
    """One pass per row: max, then exp(x - m) (kept in dlogits), sum, loss, scaled gradient."""
    for r in prange(logits.shape[0]):
        t = targets[r]
        if t == ignore_index:
            row_loss[r] = 0.0
            if need_grad:
                dlogits[r, :] = 0
            continue
        row = logits[r]
        m = _max(row)
        s = 0.0
        if need_grad:
            d = dlogits[r]
            for j in range(row.size):
                e = exp(row[j] - m)
                d[j] = e
                s += e
            scale = d.dtype.type(inv_n / s)  # d = softmax / n, one division per row
            for j in range(row.size):
                d[j] = d[j] * scale
            d[t] -= inv_n
        else:
            for j in range(row.size):
                s += exp(row[j] - m)
        row_loss[r] = (m - row[t]) + np.log(s)


# The compiled step's cross-entropy (CrossEntropy.compiled_forward / _backward, fusion=True): the
# forward keeps each row's max m and sum s of exp(x - m), so that the backward is one pass per
# row (no max, no sum, no second pass to scale): the gradient in one write instead of three
# passes. The values are _cross_entropy_rows's, computed the same way (its reference:
# cross_entropy_forward_numpy).


@Kernel
def _cross_entropy_stats_rows(logits, targets, ignore_index, row_loss, row_max, row_sum):
    """Per row: the loss, the max m and s = sum exp(x - m) in float64 (for the grad pass)."""
    for r in prange(logits.shape[0]):
        t = targets[r]
        if t == ignore_index:
            row_loss[r] = 0.0
            continue
        row = logits[r]
        m = _max(row)
        s = 0.0
        for j in range(row.size):
            s += exp(row[j] - m)
        row_max[r], row_sum[r] = m, s
        row_loss[r] = (m - row[t]) + np.log(s)


@Kernel
def _cross_entropy_grad_rows(logits, targets, ignore_index, row_max, row_sum, inv_n, dlogits):
    """dlogits = (exp(x - m) / s - onehot(t)) inv_n per row (m, s: _cross_entropy_stats_rows)."""
    for r in prange(logits.shape[0]):
        t = targets[r]
        d = dlogits[r]
        if t == ignore_index:
            d[:] = 0
            continue
        row, m = logits[r], row_max[r]
        scale = d.dtype.type(inv_n / row_sum[r])  # as _cross_entropy_rows: one division per row
        for j in range(row.size):
            d[j] = exp(row[j] - m) * scale
        d[t] -= inv_n


def softmax_forward_numba(x):
    """Numba softmax over the last axis; same contract as softmax_forward_numpy."""
    x = float_array(x, "softmax_forward", "x")
    rows = last_axis(x, "softmax_forward")
    y = np.empty_like(x)
    if x.size:  # the kernels assume non-empty rows
        _softmax_rows(x.size, rows, y.reshape(rows.shape))
    return y


def softmax_backward_numba(y, gy):
    """Numba gx = y * (gy - sum(y * gy)); same contract as softmax_backward_numpy."""
    y = float_array(y, "softmax_backward", "y")
    gy = float_array(gy, "softmax_backward", "gy", dtype=y.dtype)
    same_shape(y, gy, "softmax_backward", ("y", "gy"))
    gx = np.empty_like(y)
    _softmax_backward_rows(y.size, *(last_axis(a, "softmax_backward") for a in (y, gy, gx)))
    return gx


def logsumexp_forward_numba(x):
    """Numba logsumexp over the last axis; same contract as logsumexp_forward_numpy."""
    x = float_array(x, "logsumexp_forward", "x")
    rows = last_axis(x, "logsumexp_forward")
    lse = np.full(rows.shape[0], -np.inf, x.dtype)  # stays -inf for empty rows
    if x.size:
        _logsumexp_rows(x.size, rows, lse, rows[:0], False)
    return lse.reshape(x.shape[:-1])


def log_softmax_forward_numba(x):
    """Numba log-softmax over the last axis; same contract as log_softmax_forward_numpy."""
    x = float_array(x, "log_softmax_forward", "x")
    rows = last_axis(x, "log_softmax_forward")
    y = np.empty_like(x)
    if x.size:
        _logsumexp_rows(x.size, rows, np.empty(rows.shape[0], x.dtype), y.reshape(rows.shape), True)
    return y


def log_softmax_backward_numba(y, gy):
    """Numba gx = gy - exp(y) * sum(gy); same contract as log_softmax_backward_numpy."""
    y = float_array(y, "log_softmax_backward", "y")
    gy = float_array(gy, "log_softmax_backward", "gy", dtype=y.dtype)
    same_shape(y, gy, "log_softmax_backward", ("y", "gy"))
    gx = np.empty_like(y)
    _log_softmax_backward_rows(y.size, *(last_axis(a, "log_softmax_backward") for a in (y, gy, gx)))
    return gx


def cross_entropy_forward_numba(logits, targets, ignore_index=-100, need_grad=True, grad_scale=1.0):
    """Fused Numba log-softmax + NLL; same contract as cross_entropy_forward_numpy."""
    logits, targets, valid, n_valid = _check_cross_entropy(logits, targets, ignore_index)
    row_loss = np.empty(logits.shape[0], np.float64)
    dlogits = np.empty_like(logits) if need_grad else logits[:0]
    inv_n = float(grad_scale) / max(n_valid, 1)  # (p - onehot) times this, in one pass
    _cross_entropy_rows(
        logits.size, logits, targets, ignore_index, inv_n, need_grad, row_loss, dlogits
    )
    # per-row losses summed afterwards, in a fixed order: the result does not depend on threads
    loss = float(np.sum(row_loss)) / n_valid if n_valid else 0.0
    return loss, (dlogits if need_grad else None)
