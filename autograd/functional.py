"""The Transformer ops: fused forwards with hand-written VJPs (notes ch. 6, 7, 9, 10).

Each op is one Function: forward, backward and jvp (forward mode's rule, autograd/forward_ad.py)
side by side, the formula in a comment and the notes' section where it is derived. The hot ones
(softmax, log_softmax, layer_norm, gelu, cross_entropy, embedding backward, attention) call
`autograd.kernels`, which runs either a Numba kernel or the plain numpy reference
(GLASSGRAD_KERNELS=numpy or kernels.use_backend("numpy")); their JVP rules are numpy beside them.

Under create_graph=True (docs/higher_order.md) the engine calls each op's `vjp` instead: an
`ops.Op` runs its own backward on Tensors; an op whose backward is a kernel or reads saved
statistics has a `vjp` beside it, the same formula in Tensor ops with those statistics recomputed
(attention: the composite reference, A recomputed).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from autograd import hooks, kernels
from autograd.ops import (
    Op,
    broadcast_to,
    concatenate,
    exp,
    scatter_add,
    swap_last,
    unsqueeze,
    where,
)
from autograd.tensor import Function, Tensor

# --- helpers ----------------------------------------------------------------------------------


def _tensor(x: Any) -> Tensor:
    return x if isinstance(x, Tensor) else Tensor(x)


def _int_array(index: Any, op: str, what: str) -> np.ndarray:
    """An index argument as an integer numpy array, or a clear error."""
    array = np.asarray(index.data if isinstance(index, Tensor) else index)
    if array.dtype.kind not in "iu":
        raise TypeError(f"{op}: {what} must be integers, got dtype {array.dtype} ({array.shape})")
    return array


def _check_range(index: np.ndarray, size: int, op: str, what: str) -> None:
    if index.size and (index.min() < 0 or index.max() >= size):
        bad = index[(index < 0) | (index >= size)].flat[0]
        raise IndexError(
            f"{op}: {what} {bad} is out of range [0, {size}) (index shape {index.shape})"
        )


def _axis(axis: int, ndim: int, op: str) -> int:
    if not -ndim <= axis < ndim:
        raise ValueError(f"{op}: axis {axis} is out of range for a {ndim}-d tensor")
    return axis % ndim


def _on_last_axis(kernel, axis: int, *arrays: np.ndarray):
    """Run a last-axis kernel along `axis` by moving that axis last and back."""
    if axis == arrays[0].ndim - 1:
        return kernel(*arrays)
    moved = kernel(*(np.moveaxis(a, axis, -1) for a in arrays))
    return np.moveaxis(moved, -1, axis)


# --- linear layer (notes 3.2, 10.4) -------------------------------------------------------------


def _matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    np.matmul(a, b, out=out)


class Linear(Op):
    # out = x @ W + b over the last axis of x (any leading dims), as one 2-d product:
    # dx = g @ W^T;  dW = x^T g;  db = sum of g over rows      (notes 10.4)
    # Flattening the leading dims turns dW into a single (in, N) @ (N, out) GEMM instead of a
    # batched product followed by a sum. A compiled step passes forward its output buffer and
    # its matmul (split over two threads with fusion=True).
    def forward(self, x, weight, bias=None, out=None, matmul=_matmul):
        if x.shape[-1] != weight.shape[0]:
            raise ValueError(
                f"linear: x's last dimension {x.shape[-1]} must equal weight's in_features "
                f"{weight.shape[0]} (x {x.shape}, weight {weight.shape})"
            )
        x2 = x.reshape(-1, x.shape[-1])
        if out is None:
            out = np.empty(x.shape[:-1] + weight.shape[1:], np.result_type(x, weight))
        out2 = out.reshape(x2.shape[0], weight.shape[1])
        matmul(x2, weight, out2)
        if bias is not None:
            np.add(out2, bias, out=out2)
        self.save_for_backward(x, weight, bias is not None)
        return out

    def backward(self, g):  # (on arrays, or on Tensors under create_graph: ops.Op)
        x, weight, has_bias = self.saved
        need_x, need_w = self.needs_input_grad[:2]
        g2 = g.reshape(-1, g.shape[-1])
        gx = (g2 @ weight.T).reshape(x.shape) if need_x else None
        gw = x.reshape(-1, x.shape[-1]).T @ g2 if need_w else None  # none for a frozen weight
        if not has_bias:
            return gx, gw
        return gx, gw, (g2.sum(axis=0) if self.needs_input_grad[2] else None)

    def backward_reads(self, c):  # x for dW, W for dx: each only if that gradient is made
        x, w = c.inputs[:2]
        return tuple(i for i, other in ((0, w), (1, x)) if other.requires_grad)

    def compiled_forward(self, c):
        vals, ids, out, matmul = c.vals, [v.id for v in c.inputs], c.out, c.matmul

        def run() -> None:
            self.forward(*[vals[i] for i in ids], out=out, matmul=matmul)

        return run, "np.matmul(out=)" + (" + bias in place" if len(ids) == 3 else "")

    def compiled_backward(self, c):  # backward's products, written into the gradient buffers
        vals, g, matmul = c.vals, c.g, c.matmul
        x, w = c.inputs[:2]
        g2 = g.reshape(-1, g.shape[-1])
        steps = []
        if x.requires_grad:
            gx, post = c.grad(0, (g2.shape[0], x.shape[-1]))
            steps.append((lambda gx=gx: matmul(g2, vals[w.id].T, gx), post))
        if w.requires_grad:
            gw, post = c.grad(1)

            def weight(gw=gw) -> None:
                xv = vals[x.id]
                matmul(xv.reshape(-1, xv.shape[-1]).T, g2, gw)

            steps.append((weight, post))
        if len(c.inputs) == 3 and c.inputs[2].requires_grad:
            gb, post = c.grad(2)
            if c.fusion is True:  # as a product with ones: 3x faster than the sum over rows
                ones = np.ones(g2.shape[0], g2.dtype)
                steps.append((lambda gb=gb: np.matmul(ones, g2, out=gb), post))
            else:  # backward's sum (its order of additions)
                steps.append((lambda gb=gb: np.sum(g2, axis=0, out=gb), post))

        def run() -> None:
            for step, post in steps:
                step()
                if post is not None:
                    post()

        return run, "np.matmul(out=) into the gradient buffers"

    def batch_axis(self, axes, c):  # x's rows, W and b replicated
        return _rowwise_axis(axes, c)

    def jvp(self, out, x_dot, w_dot, b_dot=None):  # out_dot = x_dot @ W + x @ W_dot + b_dot
        x, weight, _ = self.saved
        out_dot = x_dot @ weight + x @ w_dot
        return out_dot if b_dot is None else out_dot + b_dot


def _rowwise_axis(axes: list, c: Any) -> int | None:
    """The batch axis of an op applied to each row of its first input (not along its last
    axis), the other inputs replicated (Linear, LayerNorm)."""
    x = axes[0]
    if x is None or any(a is not None for a in axes[1:]) or x >= len(c.shapes[0]) - 1:
        return None
    return x


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """x @ weight + bias with weight (in, out) (notes 3.2), for x of any shape (..., in)."""
    if weight.ndim != 2 or (bias is not None and bias.shape != weight.shape[1:]):
        raise ValueError(
            f"linear: weight must be (in, out) and bias (out,), got weight {weight.shape}, "
            f"bias {None if bias is None else bias.shape}"
        )
    if bias is None:
        return Linear.apply(x, weight)
    return Linear.apply(x, weight, bias)


# --- rotary positions (notes 8.6) ---------------------------------------------------------------


def _rotate(x: Any, cos: np.ndarray, sin: np.ndarray) -> Any:
    """Rotate each coordinate pair (x[..., r], x[..., r + D/2]) by the angle whose cos/sin given."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)


def _rotate_into(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, out: np.ndarray, scratch):
    """_rotate(x, cos, sin) written into out, each half with _rotate's operations in its order
    (the same rounding); scratch: an array of one half's shape."""
    half = x.shape[-1] // 2
    x1, x2, y1, y2 = x[..., :half], x[..., half:], out[..., :half], out[..., half:]
    np.multiply(x1, cos, out=y1)
    np.subtract(y1, np.multiply(x2, sin, out=scratch), out=y1)  # y1 = x1 cos - x2 sin
    np.multiply(x1, sin, out=y2)
    np.add(y2, np.multiply(x2, cos, out=scratch), out=y2)  # y2 = x1 sin + x2 cos


class Rotary(Op):
    # Rotary position embedding (notes 8.6): position p turns the pair (x1_r, x2_r) by p * w_r:
    #   y1 = x1 cos - x2 sin,  y2 = x1 sin + x2 cos.
    # A rotation is orthogonal, so its VJP is the inverse rotation (angle -p * w_r):
    #   dx1 = g1 cos + g2 sin,  dx2 = -g1 sin + g2 cos.
    def forward(self, x, cos=None, sin=None):
        self.save_for_backward(cos, sin)
        return _rotate(x, cos, sin)

    def backward(self, g):
        cos, sin = self.saved
        return (_rotate(g, cos, -sin),)

    def backward_reads(self, c):  # its angle tables only
        return ()

    # compiled: _rotate's products and sums (the same rounding) into the output / gradient
    # buffer: kernels.rotary's one Numba pass over (B, H, T, D) heads, or numpy ufuncs with one
    # half-width scratch (no concatenate)
    def compiled_forward(self, c):
        vals, x, out = c.vals, c.inputs[0].id, c.out
        return self._compiled_rotation(c, lambda: vals[x], c.params["sin"], out)

    def compiled_backward(self, c):  # the inverse rotation (angle -p w_r), as backward's
        gx, then = c.grad(0)
        g = c.g
        rotate, note = self._compiled_rotation(c, lambda: g, -c.params["sin"], gx)
        return c.then(rotate, then), note + " into the gradient buffer"

    @staticmethod
    def _compiled_rotation(c, source, sin, out):
        cos = c.params["cos"]
        if c.numba and out.ndim == 4 and cos.ndim == 2:
            from autograd.kernels import rotary

            return (lambda: rotary.rotate_into(source(), cos, sin, out)), "one Numba pass"
        scratch = c.scratch((*out.shape[:-1], out.shape[-1] // 2), out.dtype)
        return (lambda: _rotate_into(source(), cos, sin, out, scratch)), "numpy ufuncs into out"

    def batch_axis(self, axes, c):  # x's rows: the (T, D/2) tables broadcast over (T, D) only
        (x,), tables = axes, c.params["cos"].ndim
        return x if x is not None and x < len(c.shapes[0]) - tables else None

    def replicated_params(self, params):  # the angle tables: one per position, not per row
        return ("cos", "sin")

    def jvp(self, out, x_dot):  # out_dot = x_dot rotated by the same angles (it is linear)
        cos, sin = self.saved
        return _rotate(x_dot, cos, sin)


def rotary_tables(
    max_len: int, head_dim: int, base: float = 10000.0, scaling: dict | None = None
) -> tuple[np.ndarray, ...]:
    """cos and sin of p * w_r for positions p < max_len, w_r = base^(-2r / D), r < D/2 (float64).

    HF's layout (rotate-half): w_r turns the pair (x_r, x_{r + D/2}). base is HF's rope_theta;
    scaling is HF's rope_scaling dict, None or of rope_type "llama3" (Llama 3.1/3.2)."""
    if head_dim % 2:
        raise ValueError(f"rotary: head_dim must be even to form coordinate pairs, got {head_dim}")
    inv_freq = base ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    if scaling is not None:
        inv_freq = _llama3_frequencies(inv_freq, scaling)
    angles = np.arange(max_len, dtype=np.float64)[:, None] * inv_freq[None, :]
    return np.cos(angles), np.sin(angles)


def _llama3_frequencies(inv_freq: np.ndarray, scaling: dict) -> np.ndarray:
    """Llama 3's longer context: wavelengths longer than original_max_position_embeddings /
    low_freq_factor turn `factor` times slower, those shorter than .../ high_freq_factor keep
    their speed, and the band between is interpolated (HF's _compute_llama3_parameters)."""
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind != "llama3":
        raise ValueError(f"rotary: rope_scaling type {kind!r} is not supported (only 'llama3')")
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_len = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    between = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    return np.where(between, (1 - smooth) * scaled / factor + smooth * scaled, scaled)


def apply_rotary(x: Tensor, cos: np.ndarray, sin: np.ndarray, offset: int = 0) -> Tensor:
    """Rotate x (B, H, T, D) for absolute positions offset .. offset + T - 1 (notes 8.6)."""
    t = x.shape[-2]
    if offset + t > cos.shape[0]:
        raise ValueError(
            f"rotary: positions up to {offset + t - 1} exceed the table's max_len {cos.shape[0]}"
        )
    c = cos[offset : offset + t].astype(x.dtype, copy=False)
    s = sin[offset : offset + t].astype(x.dtype, copy=False)
    return Rotary.apply(x, cos=c, sin=s)


# --- softmax family (notes 6.2, 7.3, 10.6) ----------------------------------------------------


class Softmax(Function):
    # a = e^(x - max) / sum e^(x - max);  dx = a * (g - sum(a * g))   (notes 10.6)
    # -inf entries get weight 0; a slice that is entirely -inf gives all zeros (no NaN).
    def forward(self, x, axis=-1):
        axis = _axis(axis, x.ndim, "softmax")
        a = _on_last_axis(kernels.softmax_forward, axis, x)
        self.save_for_backward(a, axis)
        return a

    def backward(self, g):
        a, axis = self.saved
        return (_on_last_axis(kernels.softmax_backward, axis, a, g),)

    def vjp(self, g, output):
        a, axis = output, self.saved[1]
        return (a * (g - (a * g).sum(axis=axis, keepdims=True)),)

    def jvp(self, out, x_dot):  # a_dot = a * (x_dot - sum(a * x_dot)): the Jacobian
        a, axis = self.saved  # diag(a) - a a^T is symmetric, so this is backward's kernel
        return _on_last_axis(kernels.softmax_backward, axis, a, x_dot)


class LogSoftmax(Function):
    # y = x - logsumexp(x);  dx = g - softmax(x) * sum(g)   (notes 9.2, 10.3)
    # -inf entries give -inf; an entirely -inf slice gives all -inf and gradient g (no NaN).
    def forward(self, x, axis=-1):
        axis = _axis(axis, x.ndim, "log_softmax")
        y = _on_last_axis(kernels.log_softmax_forward, axis, x)
        self.save_for_backward(y, axis)
        return y

    def backward(self, g):
        y, axis = self.saved
        return (_on_last_axis(kernels.log_softmax_backward, axis, y, g),)

    def vjp(self, g, output):
        y, axis = output, self.saved[1]
        return (g - y.exp() * g.sum(axis=axis, keepdims=True),)

    def jvp(self, out, x_dot):  # y_dot = x_dot - sum(softmax(x) * x_dot)
        y, axis = self.saved
        return x_dot - (np.exp(y) * x_dot).sum(axis=axis, keepdims=True)


class LogSumExp(Function):
    # out = ln sum e^x;  dx = g * softmax(x)   (an entirely -inf slice: out -inf, dx 0)
    def forward(self, x, axis=-1, keepdims=False):
        axis = _axis(axis, x.ndim, "logsumexp")
        moved = np.moveaxis(x, axis, -1)
        out = kernels.logsumexp_forward(moved)
        self.save_for_backward(x, axis)
        return np.expand_dims(out, axis) if keepdims else out

    def backward(self, g):
        x, axis = self.saved
        if g.ndim < x.ndim:
            g = np.expand_dims(g, axis)
        return (g * _on_last_axis(kernels.softmax_forward, axis, x),)

    def vjp(self, g, output):
        (x,), axis = self.inputs, self.saved[1]
        return ((unsqueeze(g, axis) if g.ndim < x.ndim else g) * softmax(x, axis),)

    def jvp(self, out, x_dot):  # out_dot = sum(softmax(x) * x_dot)
        x, axis = self.saved
        a = _on_last_axis(kernels.softmax_forward, axis, x)
        return (a * x_dot).sum(axis=axis).reshape(out.shape)


def softmax(x: Tensor, axis: int = -1) -> Tensor:
    """softmax along `axis` (notes 6.2): shift-invariant, computed max-subtracted."""
    return Softmax.apply(_tensor(x), axis=axis)


def log_softmax(x: Tensor, axis: int = -1) -> Tensor:
    """log(softmax(x)) along `axis`, without forming softmax (stable for large logits)."""
    return LogSoftmax.apply(_tensor(x), axis=axis)


def logsumexp(x: Tensor, axis: int = -1, keepdims: bool = False) -> Tensor:
    """ln sum exp(x) along `axis` (the softmax normaliser)."""
    return LogSumExp.apply(_tensor(x), axis=axis, keepdims=keepdims)


# --- normalisation (notes 8.4, 10.8) ----------------------------------------------------------


class LayerNorm(Function):
    # y = (x - mean) / sqrt(var + eps) * w + b, population variance over the last axis (8.4)
    # dx = rstd * (u - mean(u) - xhat * mean(u * xhat)), u = g * w;  dw = sum g*xhat; db = sum g
    def forward(self, x, weight, bias, eps=1e-5):
        if weight.shape != x.shape[-1:] or bias.shape != x.shape[-1:]:
            raise ValueError(
                f"layer_norm: weight {weight.shape} and bias {bias.shape} must have the shape of "
                f"x's last axis {x.shape[-1:]}"
            )
        y, mean, rstd = kernels.layer_norm_forward(x, weight, bias, eps)
        self.save_for_backward(x, weight, mean, rstd, eps)
        return y

    def backward(self, g):
        x, weight, mean, rstd, _ = self.saved
        grads = kernels.layer_norm_backward(g, x, weight, mean, rstd)
        # one fused pass makes all three (dw, db are its by-product sums); a frozen weight or
        # bias gets None, so that nothing is kept or passed on for it
        return tuple(
            gr if need else None for gr, need in zip(grads, self.needs_input_grad, strict=True)
        )

    # compiled: the Numba kernels of kernels.layer_norm_forward / _backward, into the buffers;
    # forward keeps mean and rstd (one per row) for backward, which reads x and w besides
    def backward_reads(self, c):
        return (0, 1, 2) if c.numba else None

    def compiled_forward(self, c):
        if not c.numba:
            return None
        from autograd.kernels import layernorm

        vals, (x, w, b), out = c.vals, (v.id for v in c.inputs), c.out
        eps, cols = float(c.params.get("eps", 1e-5)), out.shape[-1]
        rows = out.size // cols
        mean, rstd = np.empty(rows, np.float64), np.empty(rows, np.float64)
        self.saved = (mean, rstd)  # what compiled_backward reads
        out2 = out.reshape(rows, cols)

        def run() -> None:
            xv = vals[x].reshape(rows, cols)
            layernorm._layer_norm_rows(out.size, xv, vals[w], vals[b], eps, out2, mean, rstd)

        return run, "Numba kernel into out, mean/rstd kept"

    def compiled_backward(self, c):
        from autograd.kernels import layernorm

        vals, g, (x, w, _) = c.vals, c.g, c.inputs
        mean, rstd = self.saved
        cols = g.shape[-1]
        rows = g.size // cols
        chunks = min(layernorm.GRAD_CHUNKS, rows)
        gw_part, gb_part = np.zeros((chunks, cols)), np.zeros((chunks, cols))
        gw64, gb64 = np.empty(cols), np.empty(cols)
        # the kernel writes all three: a frozen weight or bias gets a scratch buffer
        gx, post_x = c.grad_or_scratch(0, (rows, cols))
        gw, post_w = c.grad_or_scratch(1, (cols,))
        gb, post_b = c.grad_or_scratch(2, (cols,))
        g2, then = g.reshape(rows, cols), c.then(post_x, post_w, post_b)

        def run() -> None:
            gw_part.fill(0)
            gb_part.fill(0)
            xv = vals[x.id].reshape(rows, cols)
            layernorm._layer_norm_backward_chunks(
                g.size, g2, xv, vals[w.id], mean, rstd, gx, gw_part, gb_part
            )
            np.copyto(gw, np.sum(gw_part, axis=0, out=gw64), casting="same_kind")
            np.copyto(gb, np.sum(gb_part, axis=0, out=gb64), casting="same_kind")
            then()

        return run, "Numba kernel into the gradient buffers"

    def batch_axis(self, axes, c):  # x's rows, w and b replicated
        return _rowwise_axis(axes, c)

    def vjp(self, g, output):  # the same formula in Tensor ops, the statistics recomputed
        (x, weight, _), eps = self.inputs, self.saved[-1]
        centred = x - x.mean(axis=-1, keepdims=True)
        rstd = 1 / ((centred * centred).mean(axis=-1, keepdims=True) + eps).sqrt()
        xhat = centred * rstd
        u = g * weight
        mean_u, mean_uxhat = u.mean(axis=-1, keepdims=True), (u * xhat).mean(axis=-1, keepdims=True)
        gx = rstd * (u - mean_u - xhat * mean_uxhat)
        return gx, _sum_rows(g * xhat), _sum_rows(g)

    def jvp(self, out, x_dot, w_dot, b_dot):  # y_dot = xhat_dot w + xhat w_dot + b_dot,
        # xhat_dot = rstd * (x_dot - mean(x_dot) - xhat * mean(x_dot * xhat))   (notes 10.8)
        x, weight, mean, rstd, _ = self.saved
        mean, rstd = mean[..., None], rstd[..., None]
        xhat = (x - mean) * rstd
        centred = x_dot - x_dot.mean(axis=-1, keepdims=True)
        xhat_dot = rstd * (centred - xhat * (x_dot * xhat).mean(axis=-1, keepdims=True))
        return xhat_dot * weight + xhat * w_dot + b_dot


def _sum_rows(x: Any) -> Any:
    """Sum over every axis but the last (the gradient of a per-feature weight or bias)."""
    return x.reshape(-1, x.shape[-1]).sum(axis=0)


def layer_norm(
    x: Tensor, weight: Tensor | None = None, bias: Tensor | None = None, eps: float = 1e-5
) -> Tensor:
    """LayerNorm over the last axis (notes 8.4); weight/bias None mean 1 and 0."""
    x = _tensor(x)
    n = x.shape[-1:]
    weight = _tensor(weight) if weight is not None else Tensor(np.ones(n, x.dtype), dtype=x.dtype)
    bias = _tensor(bias) if bias is not None else Tensor(np.zeros(n, x.dtype), dtype=x.dtype)
    return LayerNorm.apply(x, weight, bias, eps=eps)


class RMSNorm(Function):
    # y = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps);  (no centring, unlike LayerNorm, 8.4)
    # dx = rstd * (u - xhat * mean(u * xhat)), u = g * w, xhat = x * rstd;  dw = sum g * xhat
    # It keeps x (the graph holds it anyway) and one rstd per row; xhat is recomputed in backward.
    def forward(self, x, weight, eps=1e-5):
        if weight.shape != x.shape[-1:]:
            raise ValueError(f"rms_norm: weight {weight.shape} must have shape {x.shape[-1:]}")
        y, rstd = kernels.rms_norm_forward(x, weight, eps)
        self.save_for_backward(x, weight, rstd, eps)
        return y

    def backward(self, g):
        x, weight, rstd, _ = self.saved
        gx, gw = kernels.rms_norm_backward(g, x, weight, rstd)
        need_x, need_w = self.needs_input_grad
        return (gx if need_x else None), (gw if need_w else None)

    # compiled: the Numba kernels of kernels.rms_norm_forward / _backward, into the buffers
    def backward_reads(self, c):  # x and w (and rstd, kept by the compiled forward)
        return (0, 1)

    def compiled_forward(self, c):
        if not c.numba:
            return None
        from autograd.kernels import layernorm

        vals, (x, w), out = c.vals, (v.id for v in c.inputs), c.out
        eps, cols = float(c.params.get("eps", 1e-5)), out.shape[-1]
        rows = out.size // cols
        rstd = np.empty(rows, np.float64)
        self.saved = (rstd,)  # what compiled_backward reads
        out2 = out.reshape(rows, cols)

        def run() -> None:
            xv = vals[x].reshape(rows, cols)
            layernorm._rms_norm_rows(out.size, xv, vals[w], eps, out2, rstd)

        return run, "Numba kernel into out, rstd kept"

    def compiled_backward(self, c):
        from autograd.kernels import layernorm

        vals, g, (x, w), (rstd,) = c.vals, c.g, c.inputs, self.saved
        cols = g.shape[-1]
        rows = g.size // cols
        need_w = w.requires_grad  # a frozen weight (LoRA): its gradient is not made at all
        gw_part, gw64 = np.zeros((min(layernorm.GRAD_CHUNKS, rows), cols)), np.empty(cols)
        gx, post_x = c.grad_or_scratch(0, (rows, cols))
        gw, post_w = c.grad(1, (cols,)) if need_w else (None, None)
        g2, then = g.reshape(rows, cols), c.then(post_x, post_w)

        def run() -> None:
            xv = vals[x.id].reshape(rows, cols)
            if need_w:
                gw_part.fill(0)
            layernorm._rms_norm_backward_chunks(
                g.size, g2, xv, vals[w.id], rstd, gx, gw_part, need_w
            )
            if need_w:
                np.copyto(gw, np.sum(gw_part, axis=0, out=gw64), casting="same_kind")
            then()

        return run, "Numba kernel into the gradient buffers"

    def batch_axis(self, axes, c):  # x's rows, w replicated
        return _rowwise_axis(axes, c)

    def vjp(self, g, output):  # the statistics recomputed as Tensors, then the same rule
        (x, weight), eps = self.inputs, self.saved[-1]
        rstd = 1 / ((x * x).mean(axis=-1, keepdims=True) + eps).sqrt()
        xhat, u = x * rstd, g * weight
        need_x, need_w = self.needs_input_grad
        gx = rstd * (u - xhat * (u * xhat).mean(axis=-1, keepdims=True)) if need_x else None
        return gx, (_sum_rows(g * xhat) if need_w else None)

    def jvp(self, out, x_dot, w_dot):  # y_dot = xhat_dot w + xhat w_dot,
        # xhat_dot = rstd * (x_dot - xhat * mean(x_dot * xhat))
        x, weight, rstd, _ = self.saved
        rstd = rstd[..., None].astype(x.dtype)
        xhat = x * rstd
        xhat_dot = rstd * (x_dot - xhat * (x_dot * xhat).mean(axis=-1, keepdims=True))
        return xhat_dot * weight + xhat * w_dot


def rms_norm(x: Tensor, weight: Tensor, eps: float = 1e-5) -> Tensor:
    """RMSNorm over the last axis: x / sqrt(mean(x^2) + eps) * weight."""
    return RMSNorm.apply(_tensor(x), _tensor(weight), eps=eps)


# --- indexing: gather and embedding (notes 2.1, 10.9) -----------------------------------------


class Gather(Op):
    # out = take_along_axis(x, index, axis);  dx = zeros, then g scatter-added at index (10.9)
    def forward(self, x, index=None, axis=0):
        self.save_for_backward(x.shape, index, axis)
        return np.take_along_axis(x, index, axis=axis)

    def backward(self, g):
        shape, index, axis = self.saved
        # Full coordinates of every gathered element: `index` along axis, the output position
        # elsewhere, 0 along a size-1 dim of x that the forward broadcast (like take_along_axis).
        coords = list(np.indices(g.shape, sparse=True))
        for d, n in enumerate(shape):
            if n == 1 and d != axis:
                coords[d] = 0
        coords[axis] = np.broadcast_to(index, g.shape)
        return (scatter_add(g, shape, tuple(coords)),)

    def jvp(self, out, x_dot):  # out_dot = take_along_axis(x_dot, index, axis)
        _, index, axis = self.saved
        return np.take_along_axis(x_dot, index, axis=axis)


def gather(x: Tensor, index: Any, axis: int) -> Tensor:
    """Pick elements along `axis` like np.take_along_axis; repeated indices sum in backward."""
    x = _tensor(x)
    index = _int_array(index, "gather", "indices")
    axis = _axis(axis, x.ndim, "gather")
    if index.ndim != x.ndim:
        raise ValueError(f"gather: index {index.shape} must have as many dims as x {x.shape}")
    _check_range(index, x.shape[axis], "gather", "index")
    return Gather.apply(x, index=index, axis=axis)


class Embedding(Function):
    # out[..., :] = W[idx, :];  dW[w] = sum of g rows where idx == w   (notes 10.9)
    def forward(self, weight, idx=None, out=None):
        self.save_for_backward(idx, weight.shape[0])
        return np.take(weight, idx, axis=0, out=out)

    def backward(self, g):
        idx, num_embeddings = self.saved
        return (kernels.embedding_backward(idx, g, num_embeddings),)

    def backward_reads(self, c):  # the ids only (a step argument's buffer, always there)
        return ()

    def compiled_forward(self, c):
        vals, w, idx, out = c.vals, c.inputs[0].id, c.params["idx"], c.out
        return (lambda: self.forward(vals[w], idx, out)), "np.take(out=)"

    def compiled_backward(self, c):  # the rows added straight into the table's gradient (a
        # tied head's is there first): no zeroed (V, C) table, no pass adding it
        g, idx, num_embeddings = c.g, c.params["idx"], c.inputs[0].shape[0]
        if not c.inputs[0].requires_grad:
            return (lambda: None), "no gradient needed"
        gw, first = c.grad_buffer(0)

        def run() -> None:
            if first:
                gw.fill(0)
            kernels.embedding_backward(idx, g, num_embeddings, out=gw)

        return run, "scatter-add into the table's gradient"

    def batch_axis(self, axes, c):  # rows of the table for batched ids
        return 0 if axes == [None] and c.batched == ("idx",) else None

    def vjp(self, g, output):
        idx, num_embeddings = self.saved
        return (scatter_add(g, (num_embeddings, g.shape[-1]), idx),)

    def jvp(self, out, w_dot):  # out_dot = W_dot[idx]
        idx, _ = self.saved
        return w_dot[idx]


def embedding(weight: Tensor, idx: Any) -> Tensor:
    """Rows of `weight` (V, C) for integer ids `idx` of any shape -> idx.shape + (C,)."""
    weight = _tensor(weight)
    if weight.ndim != 2:
        raise ValueError(f"embedding: weight must be 2-d (V, C), got shape {weight.shape}")
    idx = _int_array(idx, "embedding", "token ids")
    _check_range(idx, weight.shape[0], "embedding", "id")
    return Embedding.apply(weight, idx=idx)


# --- loss (notes 9.2, 10.3) -------------------------------------------------------------------


class CrossEntropy(Function):
    # L = mean over kept rows of (logsumexp(l) - l[y]);  dl = (softmax(l) - onehot(y)) / n  (10.3)
    # The forward computes L only; the backward computes dl (times g) in one fused pass of its
    # own, so no (N, V) gradient array lives from the forward to the backward beside the logits.
    def forward(self, logits, targets=None, ignore_index=-100, out=None):
        flat_logits = logits.reshape(-1, logits.shape[-1])
        loss, _ = kernels.cross_entropy_forward(
            flat_logits, targets.reshape(-1), ignore_index, False
        )
        self.save_for_backward(logits, targets, ignore_index)
        if out is None:
            return np.asarray(loss, dtype=logits.dtype)
        out[...] = loss
        return out

    def backward(self, g):
        return (self._dlogits(g),)

    def _dlogits(self, g: Any) -> np.ndarray:
        logits, targets, ignore_index = self.saved
        flat = logits.reshape(-1, logits.shape[-1])
        _, dlogits = kernels.cross_entropy_forward(flat, targets.reshape(-1), ignore_index, True, g)
        return dlogits.reshape(logits.shape)

    # compiled: the Numba pass of kernels.cross_entropy_forward, the loss only in forward and
    # the gradient straight into the logits' gradient buffer in backward. With fusion=True the
    # forward also keeps each row's max and sum of exp (two numbers a row), and the backward is
    # then one pass a row instead of three (the same values: softmax._cross_entropy_grad_rows)
    def compiled_forward(self, c):
        if not c.numba:
            return None
        from autograd.kernels import softmax

        vals, logits, out = c.vals, c.inputs[0].id, c.out
        targets, ignore_index = c.params["targets"], c.params.get("ignore_index", -100)
        if c.fusion is not True:
            return (lambda: self.forward(vals[logits], targets, ignore_index, out)), (
                "Numba pass, the loss only"
            )
        vocab = c.inputs[0].shape[-1]
        rows = math.prod(c.inputs[0].shape) // vocab
        row_loss, row_max, row_sum = np.empty(rows), np.empty(rows, out.dtype), np.empty(rows)
        self.saved = (row_max, row_sum)  # what compiled_backward reads

        def run() -> None:
            x, flat, _, kept = softmax._check_cross_entropy(
                vals[logits].reshape(rows, vocab), targets.reshape(-1), ignore_index
            )
            softmax._cross_entropy_stats_rows(
                x.size, x, flat, ignore_index, row_loss, row_max, row_sum
            )
            out[...] = float(np.sum(row_loss)) / kept if kept else 0.0

        return run, "Numba pass: the loss, and each row's max and sum of exp kept for backward"

    def compiled_backward(self, c):
        from autograd.kernels import softmax

        vals, g, logits = c.vals, c.g, c.inputs[0]
        targets, ignore_index = c.params["targets"].reshape(-1), c.params.get("ignore_index", -100)
        gl, then = c.grad(0)
        gl_rows = gl.reshape(-1, gl.shape[-1])
        stats = self.saved if c.fusion is True else None  # (row max, row sum) from the forward
        row_loss = np.empty(gl_rows.shape[0], np.float64) if stats is None else None

        def run() -> None:
            kept = max(int(np.count_nonzero(targets != ignore_index)), 1)
            scale = float(g) / kept  # as kernels.cross_entropy_forward(..., grad_scale=g)
            rows = vals[logits.id].reshape(gl_rows.shape)
            if stats is not None:
                softmax._cross_entropy_grad_rows(
                    rows.size, rows, targets, ignore_index, *stats, scale, gl_rows
                )
            else:
                softmax._cross_entropy_rows(
                    rows.size, rows, targets, ignore_index, scale, True, row_loss, gl_rows
                )
            if then is not None:
                then()

        if stats is not None:
            return run, "Numba pass into the logits' gradient, from the forward's row max and sum"
        return run, "Numba pass into the logits' gradient"

    def batch_mean(self, params):  # the mean over the rows whose target is not ignored
        ignore_index = params.get("ignore_index", -100)
        return "targets", lambda targets: int(np.count_nonzero(targets != ignore_index))

    def vjp(self, g, output):  # (softmax(l) - onehot(y)) / n, with softmax(l) a Tensor
        (logits,), (_, targets, ignore_index) = self.inputs, self.saved
        kept = targets != ignore_index
        onehot = np.zeros(logits.shape, dtype=logits.dtype)
        np.put_along_axis(onehot, np.where(kept, targets, 0)[..., None], 1, axis=-1)
        row_weight = (kept / max(int(kept.sum()), 1)).astype(logits.dtype)[..., None]
        return ((softmax(logits) - onehot) * row_weight * g,)

    def jvp(self, out, l_dot):  # L_dot = sum(dL/dl * l_dot), dL/dl = (softmax(l) - onehot(y)) / n
        return np.sum(self._dlogits(1.0) * l_dot)


def cross_entropy(logits: Tensor, targets: Any, ignore_index: int = -100) -> Tensor:
    """Mean -ln softmax(logits)[target] over targets != ignore_index (notes 9.2).

    logits (..., V), targets int (...). If every target is ignored the loss is 0.0 with a zero
    gradient (there is nothing to average; PyTorch returns NaN here).
    """
    logits = _tensor(logits)
    targets = _int_array(targets, "cross_entropy", "targets")
    if logits.ndim < 1 or targets.shape != logits.shape[:-1]:
        raise ValueError(
            f"cross_entropy: targets {targets.shape} must have logits' shape without the last "
            f"(vocabulary) axis: logits {logits.shape}"
        )
    vocab = logits.shape[-1]
    bad = (targets != ignore_index) & ((targets < 0) | (targets >= vocab))
    if bad.any():
        row = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(
            f"cross_entropy: target {targets[row]} at {row} is out of range [0, {vocab}) and is "
            f"not ignore_index={ignore_index} (logits {logits.shape}, targets {targets.shape}): "
            f"targets must lie in [0, {vocab}) or be ignore_index"
        )
    return CrossEntropy.apply(logits, targets=targets, ignore_index=ignore_index)


# --- activations and dropout (notes 8.2) ------------------------------------------------------

_erf = np.frompyfunc(math.erf, 1, 1)  # exact erf; numpy has none (only the 'none' GELU uses it)


def _normal_cdf(x: np.ndarray) -> np.ndarray:
    """Phi(x) = (1 + erf(x / sqrt 2)) / 2 in x's dtype (an array for 0-d x too: frompyfunc gives
    a Python float there)."""
    return np.asarray(0.5 * (1 + _erf(x / math.sqrt(2.0))), dtype=x.dtype)


class Gelu(Function):
    # tanh:  y = x/2 (1 + t), t = tanh(u), u = s (x + 0.044715 x^3), s = sqrt(2/pi)
    #        dy/dx = (1 + t)/2 + x/2 (1 - t^2) s (1 + 3 * 0.044715 x^2)     (kernels.gelu)
    # none:  y = x Phi(x);  dy/dx = Phi(x) + x phi(x)
    def forward(self, x, approximate="tanh"):
        if approximate == "tanh":
            y, t = kernels.gelu_forward(x)
            self.save_for_backward(x, t, approximate)
            return y
        cdf = _normal_cdf(x)
        self.save_for_backward(x, cdf, approximate)
        return x * cdf

    def backward(self, g):
        x, saved, approximate = self.saved
        if approximate == "tanh":
            return (kernels.gelu_backward(g, x, saved),)
        return (g * (saved + x * _normal_pdf(x)),)

    # compiled (tanh): the Numba kernels of kernels.gelu_forward / _backward, y only: backward
    # recomputes tanh(u) from x (no (B, T, 4C) array of t written or kept per layer)
    def backward_reads(self, c):
        return (0,) if c.numba else None

    def compiled_forward(self, c):
        if not c.numba or c.params.get("approximate", "tanh") != "tanh":
            return None
        from autograd.kernels import gelu

        vals, x, out = c.vals, c.inputs[0].id, c.out
        flat_out = out.reshape(-1)
        s, a_s, _ = gelu.constants(out.dtype)
        return (
            lambda: gelu._gelu_output(out.size, vals[x].reshape(-1), flat_out, s, a_s)
        ), "Numba kernel into out"

    def compiled_backward(self, c):
        from autograd.kernels import gelu

        vals, g, x = c.vals, c.g, c.inputs[0]
        gx, then = c.grad(0, (g.size,))
        g1 = g.reshape(-1)
        s, a_s, a3_s = gelu.constants(g.dtype)

        def run() -> None:
            gelu._gelu_grads_of_x(g.size, g1, vals[x.id].reshape(-1), gx, s, a_s, a3_s)
            if then is not None:
                then()

        return run, "one Numba pass: tanh(u) recomputed from x, into the gradient buffer"

    def batch_axis(self, axes, c):  # elementwise
        return axes[0]

    def vjp(self, g, output):  # the same derivatives in Tensor ops (t and Phi recomputed)
        (x,), approximate = self.inputs, self.saved[2]
        if approximate == "none":
            return (g * (NormalCdf.apply(x) + x * _normal_pdf(x)),)
        s, c = math.sqrt(2 / math.pi), 0.044715
        t = (s * (x + c * x * x * x)).tanh()
        return (g * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * s * (1 + 3 * c * x * x)),)

    def jvp(self, out, x_dot):  # y_dot = dy/dx * x_dot (elementwise: backward's formula)
        x, saved, approximate = self.saved
        if approximate == "tanh":
            return kernels.gelu_backward(x_dot, x, saved)
        return x_dot * (saved + x * _normal_pdf(x))


def _normal_pdf(x: Any) -> Any:
    """phi(x) = e^(-x^2/2) / sqrt(2 pi), on arrays or Tensors."""
    return exp(-0.5 * x * x) * (1 / math.sqrt(2 * math.pi))


class NormalCdf(Op):
    # out = Phi(x) = (1 + erf(x / sqrt 2)) / 2;  dx = g * phi(x)   (notes 8.2: exact GELU's dy/dx)
    def forward(self, x):
        self.save_for_backward(x)
        return _normal_cdf(x)

    def backward(self, g):
        (x,) = self.saved
        return (g * _normal_pdf(x),)

    def jvp(self, out, x_dot):  # out_dot = phi(x) x_dot
        (x,) = self.saved
        return _normal_pdf(x) * x_dot


def gelu(x: Tensor, approximate: str = "tanh") -> Tensor:
    """GELU; approximate='tanh' (GPT-2's) or 'none' (exact, x * Phi(x))."""
    if approximate not in ("tanh", "none"):
        raise ValueError(f"gelu: approximate must be 'tanh' or 'none', got {approximate!r}")
    return Gelu.apply(_tensor(x), approximate=approximate)


def relu(x: Tensor) -> Tensor:
    """max(x, 0)."""
    return _tensor(x).relu()


class SiLU(Function):
    # y = x s, s = sigmoid(x);  dx = g s (1 + x (1 - s))   (product rule, with s' = s (1 - s))
    # One op, not x * sigmoid(x): it keeps x alone for the backward and recomputes s there, where
    # the two ops would keep s and x * s too (two more (B, T, FFN) arrays per layer until backward).
    def forward(self, x):
        self.save_for_backward(x)
        return kernels.silu_forward(x)

    def backward(self, g):
        (x,) = self.saved
        return (kernels.silu_backward(g, x),)

    # compiled: the Numba kernels of kernels.silu_forward / _backward, into the buffers
    def backward_reads(self, c):  # x (s is recomputed from it)
        return (0,)

    def compiled_forward(self, c):
        if not c.numba:
            return None
        from autograd.kernels import silu

        vals, x, out = c.vals, c.inputs[0].id, c.out
        flat_out = out.reshape(-1)
        return (
            lambda: silu._silu_values(out.size, vals[x].reshape(-1), flat_out)
        ), "Numba kernel into out"

    def compiled_backward(self, c):  # dx = g s (1 + x (1 - s)), s recomputed in the same pass
        from autograd.kernels import silu

        vals, g, x = c.vals, c.g.reshape(-1), c.inputs[0]
        gx, then = c.grad(0)
        flat_gx = gx.reshape(-1)

        def run() -> None:
            silu._silu_grads(g.size, g, vals[x.id].reshape(-1), flat_gx)
            if then is not None:
                then()

        return run, "one Numba pass: sigmoid recomputed from x, into the gradient buffer"

    def batch_axis(self, axes, c):  # elementwise
        return axes[0]

    def vjp(self, g, output):  # the same rule on Tensors (s from Tensor ops)
        (x,) = self.inputs
        s = x.sigmoid()
        return (g * s * (1 + x * (1 - s)),)

    def jvp(self, out, x_dot):  # y_dot = s (1 + x (1 - s)) x_dot: the backward's rule on x_dot
        (x,) = self.saved
        return kernels.silu_backward(x_dot, x)


def silu(x: Tensor) -> Tensor:
    """x * sigmoid(x) (SiLU, the gate of Llama's SwiGLU MLP, notes 8.2)."""
    return SiLU.apply(_tensor(x))


class SwiGLU(Function):
    # y = silu(a) b;  da = g b s (1 + a (1 - s)),  db = g silu(a)   (s = sigmoid(a); notes 8.2)
    # One op for the gated MLP's silu(x W_gate) * (x W_up): as silu then *, the product kept
    # silu(a) for its backward beside a and b (one more (B, T, FFN) array per layer), and the
    # backward took two passes.
    def forward(self, a, b):
        self.save_for_backward(a, b)
        return kernels.swiglu_forward(a, b)

    def backward(self, g):
        a, b = self.saved
        return kernels.swiglu_backward(g, a, b)

    # compiled: the Numba kernels of kernels.swiglu_forward / _backward, into the buffers
    def backward_reads(self, c):  # a and b (silu(a) is recomputed)
        return (0, 1)

    def compiled_forward(self, c):
        if not c.numba:
            return None
        from autograd.kernels import silu

        vals, (a, b), out = c.vals, (v.id for v in c.inputs), c.out
        flat_out = out.reshape(-1)

        def run() -> None:
            silu._silu_times(out.size, vals[a].reshape(-1), vals[b].reshape(-1), flat_out)

        return run, "Numba kernel into out (silu's values, then the product)"

    def compiled_backward(self, c):  # one pass: sigmoid recomputed from a, both gradients
        from autograd.kernels import silu

        vals, g, (a, b) = c.vals, c.g.reshape(-1), (v.id for v in c.inputs)
        (ga, then_a), (gb, then_b) = (c.grad_or_scratch(i, c.g.shape) for i in (0, 1))
        flat_ga, flat_gb, then = ga.reshape(-1), gb.reshape(-1), c.then(then_a, then_b)

        def run() -> None:
            silu._swiglu_grads(
                g.size, g, vals[a].reshape(-1), vals[b].reshape(-1), flat_ga, flat_gb
            )
            then()

        return run, "one Numba pass: sigmoid recomputed from a, into both gradient buffers"

    def batch_axis(self, axes, c):  # elementwise, on two arrays of one shape
        return axes[0] if axes[0] == axes[1] else None

    def vjp(self, g, output):  # the same rule on Tensors (s from Tensor ops)
        a, b = self.inputs
        s = a.sigmoid()
        return g * b * (s * (1 + a * (1 - s))), g * (a * s)

    def jvp(self, out, a_dot, b_dot):  # y_dot = silu'(a) a_dot b + silu(a) b_dot
        a, b = self.saved
        return kernels.silu_backward(a_dot * b, a) + kernels.silu_forward(a) * b_dot


def swiglu(a: Tensor, b: Tensor) -> Tensor:
    """silu(a) * b, SwiGLU's gated product (notes 8.2), for a and b of one shape: one op that
    keeps a and b for its backward (one pass), not silu(a) as well."""
    a, b = _tensor(a), _tensor(b)
    if a.shape != b.shape:
        raise ValueError(f"swiglu: a {a.shape} and b {b.shape} must have the same shape")
    return SwiGLU.apply(a, b)


class Dropout(Op):
    # y = x * keep, keep = Bernoulli(1 - p) / (1 - p) (inverted: the mean is unchanged)
    # dx = g * keep
    # The mask is drawn here, inside the op, so that a compiled step (autograd.compile), which
    # replays the ops, draws a new one from the same rng stream each step.
    def forward(self, x, p=0.5, rng=None):
        if hooks.RNG_LOG is not None:  # autograd.checkpoint will redraw this very mask
            hooks.RNG_LOG.append((rng, rng.bit_generator.state))
        scale = 0.0 if p == 1.0 else 1.0 / (1.0 - p)
        keep = (rng.random(x.shape) >= p).astype(x.dtype) * x.dtype.type(scale)
        self.save_for_backward(keep)
        return x * keep

    def backward(self, g):
        (keep,) = self.saved
        return (g * keep,)

    def jvp(self, out, x_dot):  # y_dot = x_dot * keep (the same mask)
        (keep,) = self.saved
        return x_dot * keep


_dropout_rng = np.random.default_rng(0)


def dropout(
    x: Tensor, p: float = 0.5, training: bool = True, rng: np.random.Generator | None = None
) -> Tensor:
    """Zero each element with probability p and scale the rest by 1/(1-p), in training only.

    rng: the Generator that draws the mask (pass one for reproducible runs); by default a
    module-level Generator seeded with 0.
    """
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout: p must be in [0, 1], got {p}")
    x = _tensor(x)
    if not training or p == 0.0:
        return x
    return Dropout.apply(x, p=p, rng=_dropout_rng if rng is None else rng)


# --- attention (notes 7.4, 10.5-10.7) ---------------------------------------------------------


class Attention(Function):
    # S = q k^T / sqrt(D) on the allowed set, A = softmax(S), O = A v  (notes 3.3, 7.4)
    # dv = A^T dO; dA = dO v^T; dS = A (dA - rowsum(dA A))   (notes 10.5, 10.6)
    # dq = dS k / sqrt(D); dk = dS^T q / sqrt(D)             (notes 10.7)
    # The kernel keeps only O and one log-sum-exp per row and recomputes A in backward.
    # k, v may have fewer heads than q (grouped-query attention, notes 8.1): query head h reads
    # K/V head h // (H / Hkv), and a K/V head's gradient sums those of its query heads.
    def forward(self, q, k, v, causal=True):
        o, lse = kernels.attention_forward(q, k, v, causal)
        self.save_for_backward(q, k, v, o, lse, causal)
        return o

    def backward(self, g):
        q, k, v, o, lse, causal = self.saved
        return kernels.attention_backward(q, k, v, o, lse, g, causal)

    # compiled, fusion=True (not "exact": its sums run in another order than the kernels'), for
    # self-attention (Tq = Tk, Dv = D): P = softmax(q k^T scale) by batched products over the
    # strided q/k/v views of the projections (no copies), each causal product over the allowed
    # row blocks only (_row_blocks). P, a (B, H, T, T) array, is T / D times the size of q: it is
    # kept from forward to backward while that is at most KEEP_PROBS_RATIO, and beyond it
    # backward recomputes it from q and k, as FlashAttention does.
    def _fused(self, c) -> bool:
        q, k, v = c.inputs
        return c.numba and c.fusion is True and q.shape[2:] == k.shape[2:] and k.shape == v.shape

    @staticmethod
    def _keeps_probs(c) -> bool:
        T, D = c.inputs[0].shape[2:]
        return T <= KEEP_PROBS_RATIO * D

    def backward_reads(self, c):  # q, k, v (dP = g v^T, gq = dS k, gk = dS^T q, P recomputed
        return (0, 1, 2) if self._fused(c) else None  # from q and k if not kept), not the output

    def compiled_forward(self, c):  # o = P v
        if not self._fused(c):
            return None
        vals, v, matmul, out = c.vals, c.inputs[2].id, c.matmul, c.out
        B, H, T, _ = out.shape
        kv_heads = c.inputs[2].shape[1]
        keep = self._keeps_probs(c)
        # kept: until this op's backward has run; else for this forward only
        probs = (c.kept if keep else c.scratch)((B, H, T, T), out.dtype)
        self.saved = (probs,) if keep else ()  # what compiled_backward reads
        probabilities = _attention_probs(c, probs)
        blocks = _row_blocks(T, bool(c.params.get("causal", True)))
        probs_g, out_g = _by_kv_head(probs, kv_heads), _by_kv_head(out, kv_heads)

        def run() -> None:
            probabilities()
            vv = vals[v][:, :, None]
            for r0, r1 in blocks:
                matmul(probs_g[..., r0:r1, :r1], vv[..., :r1, :], out_g[..., r0:r1, :])

        return run, (
            f"fused: q k^T, softmax in place, P v in {len(blocks)} causal row block(s); "
            f"no copies of q, k, v; P {'kept for backward' if keep else 'not kept'}"
        )

    def compiled_backward(self, c):
        # gv = P^T g;  dS = P (dP - rowsum(P dP)) scale, dP = g v^T;  gq = dS k;  gk = dS^T q;
        # with grouped K/V heads, gk and gv are made per query head, then summed over each group
        from autograd.kernels import attention

        vals, g, matmul = c.vals, c.g, c.matmul
        q, k, v = c.inputs
        scale = attention._scale(g)
        causal, kv_heads = bool(c.params.get("causal", True)), k.shape[1]
        B, H, T, D = g.shape
        kept = self.saved  # (P,) from the forward, or () when it is recomputed here
        probs = kept[0] if kept else c.scratch((B, H, T, T), g.dtype)
        dp = c.scratch((B, H, T, T), g.dtype)
        probabilities = _attention_probs(c, probs) if not kept else None  # P again, from q and k
        rows = probs.size // probs.shape[-1]
        p2, dp2 = probs.reshape(rows, -1), dp.reshape(rows, -1)
        probs_g, dp_g, g_g = (_by_kv_head(a, kv_heads) for a in (probs, dp, g))
        blocks, block = _row_blocks(T, causal), CAUSAL_BLOCK

        def per_query_head(i: int) -> tuple[np.ndarray, Any]:
            """(buffer for the products, then-what) for K or V's gradient: the gradient's own
            buffer, or (grouped heads) a per-query-head scratch then summed over each group."""
            buf, then = c.grad(i)
            if kv_heads == H:
                return buf, then
            full = c.scratch((B, H, T, D), g.dtype)
            summed = _by_kv_head(full, kv_heads)
            return full, c.then(lambda: np.sum(summed, axis=2, out=buf), then)

        steps = []
        if v.requires_grad:
            gv, then = per_query_head(2)

            def value() -> None:  # keys r0:r1 get P^T g from the queries r0: that see them
                for r0, r1 in blocks:
                    pt = probs[..., r0:, r0:r1].swapaxes(-1, -2)
                    matmul(pt, g[..., r0:, :], gv[..., r0:r1, :])

            steps.append((value, then))
        if q.requires_grad:
            gq, then = c.grad(0)
            gq_g = _by_kv_head(gq, kv_heads)

            def query() -> None:
                kv = vals[k.id][:, :, None]
                for r0, r1 in blocks:
                    matmul(dp_g[..., r0:r1, :r1], kv[..., :r1, :], gq_g[..., r0:r1, :])

            steps.append((query, then))
        if k.requires_grad:
            gk, then = per_query_head(1)

            def key() -> None:
                qv = vals[q.id]
                for r0, r1 in blocks:
                    matmul(dp[..., r0:, r0:r1].swapaxes(-1, -2), qv[..., r0:, :], gk[..., r0:r1, :])

            steps.append((key, then))

        def run() -> None:
            if probabilities is not None:
                probabilities()
            vv = vals[v.id][:, :, None]
            for r0, r1 in blocks:
                matmul(g_g[..., r0:r1, :], vv[..., :r1, :].swapaxes(-1, -2), dp_g[..., r0:r1, :r1])
            attention._probs_backward(dp.size, p2, dp2, causal, scale, block)  # in place: dS
            for step, then in steps:
                step()
                if then is not None:
                    then()

        return run, (
            f"fused: P {'from the forward' if kept else 'recomputed'}, four batched products "
            "(causal row blocks), one Numba pass"
        )

    def batch_axis(self, axes, c):  # over (B, H, T, D): each batch row attends to its own
        return 0 if axes == [0, 0, 0] and len(c.out_shape) == 4 else None

    def vjp(self, g, output):  # the composite reference: A recomputed from Tensor ops
        q, k, v = self.inputs
        kv_heads, (k, v) = k.shape[1], (per_query_head(t, q.shape[1]) for t in (k, v))
        tq, tk = q.shape[2], k.shape[2]
        allowed = np.tril(np.ones((tq, tk), dtype=bool), k=tk - tq) if self.saved[-1] else None
        scale = 1.0 / math.sqrt(q.shape[-1])
        gq, gk, gv = _attention_vjp(q, k, v, _attention_weights(q, k, allowed, scale), g, scale)
        return gq, _per_kv_head(gk, kv_heads), _per_kv_head(gv, kv_heads)

    def jvp(self, out, q_dot, k_dot, v_dot):  # the tangents of S, A and O (see _attention_jvp)
        q, k, v, _, _, causal = self.saved
        k, v, k_dot, v_dot = (per_query_head(t, q.shape[1]) for t in (k, v, k_dot, v_dot))
        tq, tk = q.shape[2], k.shape[2]
        allowed = np.tril(np.ones((tq, tk), dtype=bool), k=tk - tq) if causal else True
        scale = 1.0 / math.sqrt(q.shape[-1])
        scores = np.where(allowed, q @ np.swapaxes(k, -1, -2) * scale, -np.inf)
        a = kernels.softmax_forward(scores)
        return _attention_jvp(q, k, v, a, q_dot, k_dot, v_dot, scale)


# The fused attention keeps P for its backward while P is at most this many times the size of q
# (T <= 4 D: T 256 for heads of 64). SmolLM2-135M's fine-tuning step (a shard of 2 rows x T 256,
# 9 heads, 30 layers): 135 MiB of P a shard, ~65 ms a shard's step less (q k^T and the softmax
# not run again in backward). Longer sequences grow P as T^2: it is recomputed beyond.
KEEP_PROBS_RATIO = 4

# Causal products skip the masked future a block of query rows at a time: rows r0:r1 need keys
# :r1 only (T = 256: 10 of 16 (64 x 64) blocks of each T x T product; blocks of 32 ran slower).
# The softmax passes zero the future of rows r0:r1 up to key r1 only, where the products stop.
CAUSAL_BLOCK = 64


def _row_blocks(T: int, causal: bool) -> list[tuple[int, int]]:
    """Query-row blocks (r0, r1): rows r0:r1 of S = q k^T need keys :r1, and keys r0:r1 of
    P^T g need query rows r0: (causal); one block, the whole square, otherwise."""
    if not causal or T <= CAUSAL_BLOCK:
        return [(0, T)]
    return [(r0, min(r0 + CAUSAL_BLOCK, T)) for r0 in range(0, T, CAUSAL_BLOCK)]


def _by_kv_head(a: np.ndarray, kv_heads: int) -> np.ndarray:
    """(B, H, ...) -> (B, Hkv, H / Hkv, ...) view: each K/V head's query heads side by side, so
    that a product with the K/V head (given a size-1 axis there) broadcasts over the group."""
    return a.reshape(a.shape[0], kv_heads, a.shape[1] // kv_heads, *a.shape[2:])


def _attention_probs(c: Any, probs: np.ndarray) -> Any:
    """A step writing P = softmax(q k^T scale) into probs, over the allowed key blocks (causal:
    the future set to 0 inside each row block, and beyond the block's keys not written at all:
    no product reads there), for Attention's compiled forward and backward (c: its OpContext)."""
    from autograd.kernels import attention

    vals, (q, k), matmul = c.vals, (x.id for x in c.inputs[:2]), c.matmul
    causal, kv_heads = bool(c.params.get("causal", True)), c.inputs[1].shape[1]
    B, H, T, _ = probs.shape
    heads, lse = probs.reshape(B * H, T, T), np.empty((B * H, T), probs.dtype)
    scale, blocks, block = attention._scale(vals[q]), _row_blocks(T, causal), CAUSAL_BLOCK
    probs_g = _by_kv_head(probs, kv_heads)

    def run() -> None:
        qv, kv = _by_kv_head(vals[q], kv_heads), vals[k][:, :, None]
        for r0, r1 in blocks:
            matmul(qv[..., r0:r1, :], kv[..., :r1, :].swapaxes(-1, -2), probs_g[..., r0:r1, :r1])
        attention._probs_forward(probs.size, heads, scale, causal, 0, lse, 0, block)

    return run


def per_query_head(t: Any, heads: int) -> Any:
    """K or V (B, Hkv, T, D) -> (B, H, T, D): each K/V head repeated for the query heads that read
    it (grouped-query attention; HF's repeat_kv order). A Tensor (differentiable) or an array."""
    b, kv_heads, length, d = t.shape
    if kv_heads == heads:
        return t
    if isinstance(t, Tensor):
        grouped = (b, kv_heads, heads // kv_heads, length, d)
        return broadcast_to(t.reshape(b, kv_heads, 1, length, d), grouped).reshape(
            b, heads, length, d
        )
    return np.repeat(t, heads // kv_heads, axis=1)


def _per_kv_head(t: Any, kv_heads: int) -> Any:
    """(B, H, T, D) -> (B, Hkv, T, D): the sum over each K/V head's query heads."""
    b, heads, length, d = t.shape
    if kv_heads == heads:
        return t
    return t.reshape(b, kv_heads, heads // kv_heads, length, d).sum(axis=2)


class MaskedAttention(Function):
    # The same op with an explicit allowed set (boolean, broadcast to (B, H, Tq, Tk)); plain numpy.
    # causal: and j <= i + Tk - Tq. The set is combined here, inside the op, so that a compiled
    # step replays it with each call's mask (a mask given as a step argument: docs/compile.md).
    def forward(self, q, k, v, allowed=None, causal=False):
        if causal:
            tq, tk = q.shape[-2], k.shape[-2]
            below = np.tril(np.ones((tq, tk), dtype=bool), k=tk - tq)
            allowed = below if allowed is None else below & allowed
        scale = 1.0 / math.sqrt(q.shape[-1])
        scores = q @ np.swapaxes(k, -1, -2) * scale
        if allowed is not None:  # None: every key (value width != query width, no mask)
            scores = np.where(allowed, scores, -np.inf)
        a = kernels.softmax_forward(scores)
        self.save_for_backward(q, k, v, a, scale, allowed)
        return a @ v

    def backward(self, g):
        q, k, v, a, scale, _ = self.saved
        return _attention_vjp(q, k, v, a, g, scale)

    def vjp(self, g, output):
        q, k, v = self.inputs
        scale, allowed = self.saved[-2:]
        return _attention_vjp(q, k, v, _attention_weights(q, k, allowed, scale), g, scale)

    def jvp(self, out, q_dot, k_dot, v_dot):
        q, k, v, a, scale, _ = self.saved
        return _attention_jvp(q, k, v, a, q_dot, k_dot, v_dot, scale)


def _attention_weights(q: Tensor, k: Tensor, allowed: Any, scale: float) -> Tensor:
    """A = softmax(q k^T * scale) on the allowed set (None: everywhere), in Tensor ops."""
    scores = q @ swap_last(k) * scale
    return softmax(scores if allowed is None else where(allowed, scores, -np.inf), axis=-1)


def _attention_vjp(q: Any, k: Any, v: Any, a: Any, g: Any, scale: float) -> tuple:
    """dq, dk, dv of O = A v (notes 10.5-10.7), on arrays or Tensors; a is 0 off the allowed set,
    so dS is 0 there too."""
    ga = g @ swap_last(v)
    gs = a * (ga - (ga * a).sum(axis=-1, keepdims=True)) * scale
    return gs @ k, swap_last(gs) @ q, swap_last(a) @ g


def _attention_jvp(q, k, v, a, q_dot, k_dot, v_dot, scale: float) -> np.ndarray:
    """O_dot of O = A v (notes 10.5-10.7 run forwards): S_dot = (q_dot k^T + q k_dot^T) * scale;
    A_dot = A (S_dot - rowsum(A S_dot)) (softmax's JVP); O_dot = A_dot v + A v_dot. A is 0 off the
    allowed set, so A_dot is 0 there too."""
    s_dot = (q_dot @ np.swapaxes(k, -1, -2) + q @ np.swapaxes(k_dot, -1, -2)) * scale
    a_dot = a * (s_dot - (a * s_dot).sum(axis=-1, keepdims=True))
    return a_dot @ v + a @ v_dot


def attention_weights(
    q: Tensor, k: Tensor, causal: bool = True, mask: Any = None, scale: float | None = None
) -> Tensor:
    """A = softmax(q k^T * scale) on the allowed set, (B, H, Tq, Tk), as Tensor ops: the explicit
    path, in which every weight is a node of the graph that a caller can read, differentiate and
    edit before O = A v (models/lab measures attention so). scaled_dot_product_attention is the
    fused path, with the same result. scale: 1/sqrt(D) by default; k (B, Hkv, Tk, D) may have
    fewer heads than q (grouped-query); causal and mask as in scaled_dot_product_attention."""
    q, k = _tensor(q), _tensor(k)
    k = per_query_head(k, q.shape[1])
    tq, tk = q.shape[2], k.shape[2]
    allowed = np.tril(np.ones((tq, tk), dtype=bool), k=tk - tq) if causal else None
    if mask is not None:
        mask = np.asarray(mask.data if isinstance(mask, Tensor) else mask, dtype=bool)
        allowed = mask if allowed is None else allowed & mask
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    return _attention_weights(q, k, allowed, scale)


def scaled_dot_product_attention(
    q: Tensor, k: Tensor, v: Tensor, causal: bool = True, mask: Any = None
) -> Tensor:
    """softmax(q k^T / sqrt(D)) v over (B, H, T, D) inputs (notes 3.3, 7.4).

    q (B, H, Tq, D); k (B, Hkv, Tk, D); v (B, Hkv, Tk, Dv): Dv may differ from D, as in the
    notes' ch. 11 (the kernel handles Dv == D; other widths take the plain numpy path). Hkv may
    be a divisor of H (grouped-query attention, notes 8.1): query head h reads K/V head
    h // (H / Hkv).
    causal: query i may read keys j <= i + (Tk - Tq) (with Tq == Tk that is j <= i; a KV-cache
    step with Tq = 1 reads every cached key). mask: optional boolean allowed set broadcastable to
    (B, H, Tq, Tk), combined with causal. A query row with no allowed key is an error (notes 7.4:
    the softmax over an empty set has no meaning).
    """
    q, k, v = _tensor(q), _tensor(k), _tensor(v)
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(
            "scaled_dot_product_attention: q, k, v must be 4-d (B, H, T, D), got "
            f"{q.shape}, {k.shape}, {v.shape}"
        )
    if (
        q.shape[0] != k.shape[0]
        or k.shape[:3] != v.shape[:3]
        or q.shape[3] != k.shape[3]
        or k.shape[1] == 0
        or q.shape[1] % k.shape[1]
    ):
        raise ValueError(
            "scaled_dot_product_attention: expected q (B, H, Tq, D), k (B, Hkv, Tk, D) and "
            f"v (B, Hkv, Tk, Dv) with Hkv dividing H, got q {q.shape}, k {k.shape}, v {v.shape}"
        )
    tq, tk = q.shape[2], k.shape[2]
    if mask is None and (not causal or tq <= tk) and v.shape[3] == q.shape[3]:
        return Attention.apply(q, k, v, causal=causal)  # (its kernels read grouped K/V heads)
    k, v = per_query_head(k, q.shape[1]), per_query_head(v, q.shape[1])
    allowed = np.ones((tq, tk), dtype=bool)
    if causal:
        allowed = np.tril(allowed, k=tk - tq)
    if mask is not None:
        mask = np.asarray(mask.data if isinstance(mask, Tensor) else mask)
        if mask.dtype != np.bool_:
            raise TypeError(f"scaled_dot_product_attention: mask must be boolean, got {mask.dtype}")
        try:
            allowed = np.broadcast_to(allowed & mask, q.shape[:2] + (tq, tk))
        except ValueError:
            raise ValueError(
                f"scaled_dot_product_attention: mask {mask.shape} does not broadcast to "
                f"(B, H, Tq, Tk) = {q.shape[:2] + (tq, tk)}"
            ) from None
    empty = ~allowed.any(axis=-1)
    if empty.any():
        row = tuple(int(i) for i in np.argwhere(empty)[0])
        raise ValueError(
            f"scaled_dot_product_attention: query row {row} has no allowed key (a fully masked "
            f"row; q {q.shape}, k {k.shape}, causal={causal}); every row needs one (notes 7.4)"
        )
    return MaskedAttention.apply(q, k, v, allowed=mask, causal=causal)


__all__ = [
    "apply_rotary",
    "attention_weights",
    "cross_entropy",
    "dropout",
    "embedding",
    "gather",
    "gelu",
    "layer_norm",
    "linear",
    "log_softmax",
    "logsumexp",
    "relu",
    "rms_norm",
    "rotary_tables",
    "scaled_dot_product_attention",
    "silu",
    "softmax",
]
