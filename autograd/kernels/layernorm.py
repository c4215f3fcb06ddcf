"""LayerNorm over the last axis: forward (notes 8.4) and backward (notes 10.8).

For one row x of length C:
    mean = sum(x) / C,  var = sum((x - mean)^2) / C  (population variance, two passes),
    rstd = 1 / sqrt(var + eps)  (eps inside the root),  xhat = (x - mean) * rstd,
    y = xhat * weight + bias.

The variance is computed from the centred values, never as E[x^2] - E[x]^2: with a large offset
and a tiny spread that difference cancels to noise (or below zero).

Both paths compute the statistics in float64, also for float32 input, and return `mean` and
`rstd` as float64 arrays shaped x.shape[:-1]: the backward rebuilds xhat from them, and a float32
mean of a row near 1e4 would be off by about 1e-3, which is a whole standard deviation when the
spread is that small. y, gx, gweight, gbias have the dtype of x.

RMSNorm (Llama's; notes 8.4 without the centring) lives here too, the same way:
    rstd = 1 / sqrt(sum(x^2) / C + eps),  xhat = x * rstd,  y = xhat * weight,
its rstd in float64, its backward gx = rstd * (u - xhat * mean(u * xhat)), u = gy * weight.
"""

import numpy as np
from numba import prange

from ._common import Kernel, float_array, last_axis

# Rows are split into this many fixed chunks for the weight/bias gradient sums: each chunk sums
# its rows into its own partial row, and the partials are added afterwards in chunk order. The
# chunks do not depend on the thread count, so neither does the result.
GRAD_CHUNKS = 64


def _check_forward(x, weight, bias):
    kernel = "layer_norm_forward"
    x = float_array(x, kernel, "x")
    weight = float_array(weight, kernel, "weight", dtype=x.dtype)
    bias = float_array(bias, kernel, "bias", dtype=x.dtype)
    last_axis(x, kernel)
    if x.shape[-1] == 0 or weight.shape != x.shape[-1:] or bias.shape != x.shape[-1:]:
        raise ValueError(
            f"{kernel}: weight {weight.shape} and bias {bias.shape} must be ({x.shape[-1]},) "
            f"for x {x.shape}, with at least one feature"
        )
    return x, weight, bias


def _check_backward(gy, x, weight, mean, rstd):
    kernel = "layer_norm_backward"
    x = float_array(x, kernel, "x")
    gy = float_array(gy, kernel, "gy", dtype=x.dtype)
    weight = float_array(weight, kernel, "weight", dtype=x.dtype)
    mean = float_array(mean, kernel, "mean", dtype=np.float64)
    rstd = float_array(rstd, kernel, "rstd", dtype=np.float64)
    last_axis(x, kernel)
    if (
        gy.shape != x.shape
        or weight.shape != x.shape[-1:]
        or mean.shape != x.shape[:-1]
        or rstd.shape != x.shape[:-1]
    ):
        raise ValueError(
            f"{kernel}: expected gy {x.shape}, weight {x.shape[-1:]}, mean and rstd "
            f"{x.shape[:-1]} for x {x.shape}; got gy {gy.shape}, weight {weight.shape}, "
            f"mean {mean.shape}, rstd {rstd.shape}"
        )
    return gy, x, weight, mean, rstd


def _check_rms_forward(x, weight):
    kernel = "rms_norm_forward"
    x = float_array(x, kernel, "x")
    weight = float_array(weight, kernel, "weight", dtype=x.dtype)
    last_axis(x, kernel)
    if x.shape[-1] == 0 or weight.shape != x.shape[-1:]:
        raise ValueError(
            f"{kernel}: weight {weight.shape} must be ({x.shape[-1]},) for x {x.shape}, with at "
            "least one feature"
        )
    return x, weight


def _check_rms_backward(gy, x, weight, rstd):
    kernel = "rms_norm_backward"
    x = float_array(x, kernel, "x")
    gy = float_array(gy, kernel, "gy", dtype=x.dtype)
    weight = float_array(weight, kernel, "weight", dtype=x.dtype)
    rstd = float_array(rstd, kernel, "rstd", dtype=np.float64)
    last_axis(x, kernel)
    if gy.shape != x.shape or weight.shape != x.shape[-1:] or rstd.shape != x.shape[:-1]:
        raise ValueError(
            f"{kernel}: expected gy {x.shape}, weight {x.shape[-1:]}, rstd {x.shape[:-1]} for "
            f"x {x.shape}; got gy {gy.shape}, weight {weight.shape}, rstd {rstd.shape}"
        )
    return gy, x, weight, rstd


# ---------------------------------------------------------------------------------------------
# numpy reference
# ---------------------------------------------------------------------------------------------


def layer_norm_forward_numpy(x, weight, bias, eps):
    """y = (x - mean) / sqrt(var + eps) * weight + bias over the last axis (notes 8.4)."""
    x, weight, bias = _check_forward(x, weight, bias)
    mean = np.mean(x, axis=-1, keepdims=True, dtype=np.float64)
    var = np.mean(np.square(x - mean), axis=-1, keepdims=True)  # two-pass, see module docstring
    rstd = 1.0 / np.sqrt(var + eps)
    y = ((x - mean) * rstd * weight + bias).astype(x.dtype)
    return y, mean[..., 0], rstd[..., 0]


def layer_norm_backward_numpy(gy, x, weight, mean, rstd):
    """gx = rstd * (u - mean(u) - xhat * mean(u * xhat)), u = gy * weight (notes 10.8).

    gweight = sum of gy * xhat and gbias = sum of gy over all leading axes.
    """
    gy, x, weight, mean, rstd = _check_backward(gy, x, weight, mean, rstd)
    mean, rstd = mean[..., None], rstd[..., None]
    xhat = (x - mean) * rstd  # float64
    u = gy * weight.astype(np.float64)
    gx = rstd * (
        u - np.mean(u, axis=-1, keepdims=True) - xhat * np.mean(u * xhat, -1, keepdims=True)
    )
    lead = tuple(range(x.ndim - 1))
    gweight = np.sum(gy * xhat, axis=lead)
    gbias = np.sum(gy, axis=lead, dtype=np.float64)
    return gx.astype(x.dtype), gweight.astype(x.dtype), gbias.astype(x.dtype)


def rms_norm_forward_numpy(x, weight, eps):
    """(y, rstd): y = x / sqrt(mean(x^2) + eps) * weight over the last axis, rstd in float64."""
    x, weight = _check_rms_forward(x, weight)
    rstd = 1.0 / np.sqrt(np.mean(np.square(x, dtype=np.float64), axis=-1, keepdims=True) + eps)
    return (x * rstd * weight).astype(x.dtype), rstd[..., 0]


def rms_norm_backward_numpy(gy, x, weight, rstd):
    """gx = rstd * (u - xhat * mean(u * xhat)), u = gy * weight, xhat = x * rstd;
    gweight = sum of gy * xhat over all leading axes."""
    gy, x, weight, rstd = _check_rms_backward(gy, x, weight, rstd)
    rstd = rstd[..., None]
    xhat = x * rstd  # float64
    u = gy * weight.astype(np.float64)
    gx = rstd * (u - xhat * np.mean(u * xhat, axis=-1, keepdims=True))
    gweight = np.sum(gy * xhat, axis=tuple(range(x.ndim - 1)))
    return gx.astype(x.dtype), gweight.astype(x.dtype)


# ---------------------------------------------------------------------------------------------
# Numba kernels: prange over rows (forward) or over fixed row chunks (backward)
# ---------------------------------------------------------------------------------------------


@Kernel
def _layer_norm_rows(x, weight, bias, eps, y, mean, rstd):
    n = x.shape[1]
    for r in prange(x.shape[0]):
        row = x[r]
        mu = 0.0
        for j in range(n):
            mu += row[j]
        mu /= n
        var = 0.0
        for j in range(n):
            d = row[j] - mu
            var += d * d
        rs = 1.0 / np.sqrt(var / n + eps)
        for j in range(n):
            y[r, j] = (row[j] - mu) * rs * weight[j] + bias[j]
        mean[r] = mu
        rstd[r] = rs


@Kernel
def _layer_norm_backward_chunks(gy, x, weight, mean, rstd, gx, gweight_part, gbias_part):
    rows, n = x.shape
    chunks = gweight_part.shape[0]
    for c in prange(chunks):
        gw, gb = gweight_part[c], gbias_part[c]
        for r in range(c * rows // chunks, (c + 1) * rows // chunks):
            mu, rs = mean[r], rstd[r]
            sum_u = 0.0
            sum_uxhat = 0.0
            for j in range(n):
                xhat = (x[r, j] - mu) * rs
                u = gy[r, j] * weight[j]
                sum_u += u
                sum_uxhat += u * xhat
                gw[j] += gy[r, j] * xhat
                gb[j] += gy[r, j]
            mean_u, mean_uxhat = sum_u / n, sum_uxhat / n
            for j in range(n):
                xhat = (x[r, j] - mu) * rs
                gx[r, j] = rs * (gy[r, j] * weight[j] - mean_u - xhat * mean_uxhat)


def layer_norm_forward_numba(x, weight, bias, eps):
    """Numba LayerNorm forward; same contract as layer_norm_forward_numpy."""
    x, weight, bias = _check_forward(x, weight, bias)
    rows = last_axis(x, "layer_norm_forward")
    y = np.empty_like(x)
    mean = np.empty(rows.shape[0], np.float64)
    rstd = np.empty(rows.shape[0], np.float64)
    _layer_norm_rows(x.size, rows, weight, bias, float(eps), y.reshape(rows.shape), mean, rstd)
    return y, mean.reshape(x.shape[:-1]), rstd.reshape(x.shape[:-1])


def layer_norm_backward_numba(gy, x, weight, mean, rstd):
    """Numba LayerNorm backward; same contract as layer_norm_backward_numpy."""
    gy, x, weight, mean, rstd = _check_backward(gy, x, weight, mean, rstd)
    rows = last_axis(x, "layer_norm_backward")
    gx = np.empty_like(x)
    chunks = min(GRAD_CHUNKS, rows.shape[0])
    gweight_part = np.zeros((chunks, rows.shape[1]), np.float64)
    gbias_part = np.zeros((chunks, rows.shape[1]), np.float64)
    _layer_norm_backward_chunks(
        x.size,
        gy.reshape(rows.shape),
        rows,
        weight,
        mean.reshape(-1),
        rstd.reshape(-1),
        gx.reshape(rows.shape),
        gweight_part,
        gbias_part,
    )
    gweight = gweight_part.sum(axis=0).astype(x.dtype)
    return gx, gweight, gbias_part.sum(axis=0).astype(x.dtype)


@Kernel
def _rms_norm_rows(x, weight, eps, y, rstd):
    n = x.shape[1]
    for r in prange(x.shape[0]):
        row = x[r]
        squares = 0.0
        for j in range(n):
            squares += row[j] * row[j]
        rs = 1.0 / np.sqrt(squares / n + eps)
        for j in range(n):
            y[r, j] = row[j] * rs * weight[j]
        rstd[r] = rs


@Kernel
def _rms_norm_backward_chunks(gy, x, weight, rstd, gx, gweight_part, need_w):
    """gx, and each chunk's partial sum of gw (when need_w: a frozen weight's is not made)."""
    rows, n = x.shape
    chunks = gweight_part.shape[0]
    for c in prange(chunks):
        gw = gweight_part[c]
        for r in range(c * rows // chunks, (c + 1) * rows // chunks):
            rs = rstd[r]
            sum_uxhat = 0.0
            for j in range(n):
                xhat = x[r, j] * rs
                sum_uxhat += gy[r, j] * weight[j] * xhat
                if need_w:
                    gw[j] += gy[r, j] * xhat
            mean_uxhat = sum_uxhat / n
            for j in range(n):
                gx[r, j] = rs * (gy[r, j] * weight[j] - x[r, j] * rs * mean_uxhat)


def rms_norm_forward_numba(x, weight, eps):
    """Numba RMSNorm forward; same contract as rms_norm_forward_numpy."""
    x, weight = _check_rms_forward(x, weight)
    rows = last_axis(x, "rms_norm_forward")
    y = np.empty_like(x)
    rstd = np.empty(rows.shape[0], np.float64)
    _rms_norm_rows(x.size, rows, weight, float(eps), y.reshape(rows.shape), rstd)
    return y, rstd.reshape(x.shape[:-1])


def rms_norm_backward_numba(gy, x, weight, rstd):
    """Numba RMSNorm backward; same contract as rms_norm_backward_numpy."""
    gy, x, weight, rstd = _check_rms_backward(gy, x, weight, rstd)
    rows = last_axis(x, "rms_norm_backward")
    gx = np.empty_like(x)
    gweight_part = np.zeros((min(GRAD_CHUNKS, rows.shape[0]), rows.shape[1]), np.float64)
    _rms_norm_backward_chunks(
        x.size, gy.reshape(rows.shape), rows, weight, rstd.reshape(-1), gx.reshape(rows.shape),
        gweight_part, True,
    )  # fmt: skip
    return gx, gweight_part.sum(axis=0).astype(x.dtype)
