"""How a compiled step runs the ops it knows: into arena buffers, with `out=` (plan.py).

Each lowering is the op's own arithmetic (the same numpy calls or the same Numba kernel loops as
autograd/ops.py, autograd/functional.py and autograd/kernels), only writing into buffers planned
once, so a replay without fusion equals eager bit for bit. An op without a lowering here replays
its own forward / VJP. `forward(plan, node, position)` and `backward(...)` return
(closure, note) or (None, None) for "not lowered".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from autograd import functional as F
from autograd import kernels, ops

Lowered = tuple[Callable[[], None] | None, str | None]

_VIEWS = (ops.Reshape, ops.Transpose, ops.GetItem)


def _basic_view(node: Any) -> bool:
    """Reshape / Transpose / basic indexing whose traced output viewed its input (no copy)."""
    fn = node.fn
    if not isinstance(fn, _VIEWS) or node.view_of is None or node.view_of is not node.inputs[0]:
        return False
    return not isinstance(fn, ops.GetItem) or ops._is_basic_index(node.params.get("index"))


def view_input(node: Any) -> Any:
    """The input whose buffer a lowered view op's output shares (None if not a view)."""
    return node.inputs[0] if _basic_view(node) else None


def _numba() -> bool:
    return kernels.get_backend() == "numba"


def saved_for_backward(plan: Any, node: Any) -> list[Any]:
    """The values of the forward that node's backward reads: a lowered backward reads only what
    its formula needs (an add reads nothing, a linear its input), so the others can die early;
    an op that replays its own VJP may read any input or its output (fn.saved)."""
    fn = node.fn
    if _basic_view(node) or isinstance(fn, (ops.Add, F.Embedding, F.Rotary, ops.BroadcastTo)):
        return []  # (Rotary keeps its angle tables, BroadcastTo the input's shape)
    if isinstance(fn, ops.Reshape) and node.view_of is None:  # a copying reshape
        return []
    if isinstance(fn, (F.Linear, ops.Mul)):  # dx = g W^T, dW = x^T g; da = g b, db = g a
        a, b = node.inputs[:2]  # each factor only if the other one gets a gradient
        return [v for v, other in ((a, b), (b, a)) if other.requires_grad]
    if isinstance(fn, (F.SiLU, F.RMSNorm)):  # x (and leaves); s, xhat are recomputed from x
        return list(node.inputs)
    if isinstance(fn, ops.Sigmoid):  # its own copy of the output, not the output's buffer
        return []
    if isinstance(fn, (F.LayerNorm, F.Gelu)) and (type(fn) not in _NEEDS_NUMBA or _numba()):
        return list(node.inputs)
    if isinstance(fn, F.Attention) and _numba() and _fused_attention(plan, node):
        return list(node.inputs)  # q, k, v (P is recomputed from q and k), not the output
    return [*node.inputs, node.out]


# --- products on two threads ---------------------------------------------------------------------
# With fusion on and a BLAS allowed >= 2 threads, a replay runs BLAS single-threaded and splits
# each large product in two halves itself: one on a pool thread, one on the caller. OpenBLAS's own
# threads spin after each call, and on a busy machine a spinning thread steals the core the other
# one needs (a (2048, 128) @ (128, 512) product: median 10.0 ms with 2 BLAS threads, 2.6 ms split,
# load average 2.7); the pool thread sleeps on a queue instead.
SPLIT_MIN_WORK = 1 << 22  # multiply-adds below which a product runs whole (a split costs ~30 us)
_POOL: list[Any] = []


def _pool() -> Any:
    if not _POOL:
        from concurrent.futures import ThreadPoolExecutor

        _POOL.append(ThreadPoolExecutor(1, thread_name_prefix="glassgrad-matmul"))
    return _POOL[0]


def split_matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """np.matmul(a, b, out=out) as two halves on two threads (rows, columns or batch)."""
    if out.size * a.shape[-1] < SPLIT_MIN_WORK:
        np.matmul(a, b, out=out)
        return
    if out.ndim > 2:  # batched over heads: split the leading axis
        h = out.shape[0] // 2
        parts = ((a[:h], b[:h], out[:h]), (a[h:], b[h:], out[h:]))
    elif out.shape[0] >= out.shape[1]:  # rows
        h = out.shape[0] // 2
        parts = ((a[:h], b, out[:h]), (a[h:], b, out[h:]))
    else:  # columns
        h = out.shape[1] // 2
        parts = ((a, b[:, :h], out[:, :h]), (a, b[:, h:], out[:, h:]))
    (a1, b1, o1), (a2, b2, o2) = parts
    other = _pool().submit(np.matmul, a1, b1, out=o1)
    np.matmul(a2, b2, out=o2)
    other.result()


# --- forward ------------------------------------------------------------------------------------


def forward(plan: Any, node: Any, position: int) -> Lowered:
    fn = node.fn
    if _basic_view(node):
        return _view_forward(plan, node)
    lower = _FORWARD.get(type(fn))
    if lower is None or (type(fn) in _NEEDS_NUMBA and not _numba()):
        return None, None
    accepts = _ACCEPTS.get(type(fn))
    if accepts is not None and not accepts(plan, node):
        return None, None
    out = plan.buffer(node.out, position)
    plan.vals[node.out.id] = out
    return lower(plan, node, out, position)


def _view_forward(plan: Any, node: Any) -> Lowered:
    # The view is made once, at plan time: its input buffer never moves.
    vals, i, fn = plan.vals, node.inputs[0].id, node.fn
    vals[node.out.id] = fn.forward(vals[i], **node.params)
    return (lambda: None), "view of its input's buffer (made once)"


def _linear_forward(plan: Any, node: Any, out: np.ndarray, position: int) -> Lowered:
    vals, matmul = plan.vals, plan.matmul
    ids = [v.id for v in node.inputs]
    out2 = out.reshape(-1, out.shape[-1])

    def run() -> None:
        x = vals[ids[0]]
        matmul(x.reshape(-1, x.shape[-1]), vals[ids[1]], out2)
        if len(ids) == 3:
            np.add(out2, vals[ids[2]], out=out2)

    return run, "np.matmul(out=)" + (" + bias in place" if len(ids) == 3 else "")


def _reshape_copy_forward(plan: Any, node: Any, out: np.ndarray, position: int) -> Lowered:
    # A reshape that numpy had to copy (its input was a transposed view): the same C-order copy
    vals, x = plan.vals, node.inputs[0]
    target = out.reshape(x.shape)
    return (lambda: np.copyto(target, vals[x.id])), "copy into out (a reshape of a strided view)"


def _add_forward(plan: Any, node: Any, out: np.ndarray, position: int) -> Lowered:
    vals, (a, b) = plan.vals, (v.id for v in node.inputs)
    return (lambda: np.add(vals[a], vals[b], out=out)), "np.add(out=)"


def _embedding_forward(plan: Any, node: Any, out: np.ndarray, position: int) -> Lowered:
    vals, w = plan.vals, node.inputs[0].id
    idx = plan.param(node, "idx")
    return (lambda: np.take(vals[w], idx, axis=0, out=out)), "np.take(out=)"


def _layer_norm_forward(plan: Any, node: Any, out: np.ndarray, position: int) -> Lowered:
    from autograd.kernels import layernorm

    vals, (x, w, b) = plan.vals, (v.id for v in node.inputs)
    eps = float(node.params.get("eps", 1e-5))
    c = out.shape[-1]
    rows = out.size // c
    mean, rstd = np.empty(rows, np.float64), np.empty(rows, np.float64)
    node.stats = (mean, rstd)  # read by the backward
    out2 = out.reshape(rows, c)

    def run() -> None:
        layernorm._layer_norm_rows(
            out.size, vals[x].reshape(rows, c), vals[w], vals[b], eps, out2, mean, rstd
        )

    return run, "Numba kernel into out, mean/rstd kept"


def _rms_norm_forward(plan: Any, node: Any, out: np.ndarray, position: int) -> Lowered:
    from autograd.kernels import layernorm

    vals, (x, w) = plan.vals, (v.id for v in node.inputs)
    eps = float(node.params.get("eps", 1e-5))
    c = out.shape[-1]
    rows = out.size // c
    rstd = np.empty(rows, np.float64)
    node.stats = rstd  # read by the backward
    out2 = out.reshape(rows, c)

    def run() -> None:
        layernorm._rms_norm_rows(out.size, vals[x].reshape(rows, c), vals[w], eps, out2, rstd)

    return run, "Numba kernel into out, rstd kept"


def _gelu_forward(plan: Any, node: Any, out: np.ndarray, position: int) -> Lowered:
    from autograd.kernels import gelu

    # y only: the backward recomputes tanh(u) from x (no (B, T, 4C) array of t written here or
    # kept per layer between the forward and the backward)
    vals, x = plan.vals, node.inputs[0].id
    flat_out = out.reshape(-1)
    s, a_s, _ = gelu.constants(out.dtype)
    return (
        lambda: gelu._gelu_output(out.size, vals[x].reshape(-1), flat_out, s, a_s)
    ), "Numba kernel into out"


def _fused_attention(plan: Any, node: Any) -> bool:
    """Self-attention (Tq = Tk, Dv = D; K/V heads may be grouped) with fusion=True (not "exact":
    its sums run in another order than eager's blocked kernel): run by _attention_forward."""
    q, k, v = node.inputs
    return plan.fusion is True and q.shape[2:] == k.shape[2:] and k.shape == v.shape


def _by_kv_head(a: np.ndarray, kv_heads: int) -> np.ndarray:
    """(B, H, ...) -> (B, Hkv, H / Hkv, ...) view: each K/V head's query heads side by side, so
    that a product with the K/V head (given a size-1 axis there) broadcasts over the group."""
    return a.reshape(a.shape[0], kv_heads, a.shape[1] // kv_heads, *a.shape[2:])


# Causal products skip the masked future a block of query rows at a time: rows r0:r1 need keys
# :r1 only (T = 256: 10 of 16 (64 x 64) blocks of each T x T product; blocks of 32 ran slower).
CAUSAL_BLOCK = 64


def _row_blocks(T: int, causal: bool) -> list[tuple[int, int]]:
    """Query-row blocks (r0, r1): rows r0:r1 of S = q k^T need keys :r1, and keys r0:r1 of
    P^T g need query rows r0: (causal); one block, the whole square, otherwise."""
    if not causal or T <= CAUSAL_BLOCK:
        return [(0, T)]
    return [(r0, min(r0 + CAUSAL_BLOCK, T)) for r0 in range(0, T, CAUSAL_BLOCK)]


def _silu_forward(plan: Any, node: Any, out: np.ndarray, position: int) -> Lowered:
    from autograd.kernels import silu

    vals, x, flat_out = plan.vals, node.inputs[0].id, out.reshape(-1)
    return (
        lambda: silu._silu_values(out.size, vals[x].reshape(-1), flat_out)
    ), "Numba kernel into out"


def _attention_probs(plan: Any, node: Any, probs: np.ndarray) -> Callable[[], None]:
    """A step writing P = softmax(q k^T scale) into probs, over the allowed key blocks (causal:
    the future set to 0). The forward and the backward both run it: P is not kept in between (a
    (B, H, T, T) array per layer, more than q, k and v), as in FlashAttention."""
    from autograd.kernels import attention

    vals, (q, k), matmul = plan.vals, (x.id for x in node.inputs[:2]), plan.matmul
    causal, kv_heads = bool(node.params.get("causal", True)), node.inputs[1].shape[1]
    B, H, T, _ = probs.shape
    heads, lse = probs.reshape(B * H, T, T), np.empty((B * H, T), probs.dtype)
    scale, blocks = attention._scale(vals[q]), _row_blocks(T, causal)
    probs_g = _by_kv_head(probs, kv_heads)

    def run() -> None:
        qv, kv = _by_kv_head(vals[q], kv_heads), vals[k][:, :, None]
        for r0, r1 in blocks:
            matmul(qv[..., r0:r1, :], kv[..., :r1, :].swapaxes(-1, -2), probs_g[..., r0:r1, :r1])
        attention._probs_forward(probs.size, heads, scale, causal, 0, lse, 0)

    return run


def _attention_forward(plan: Any, node: Any, out: np.ndarray, position: int) -> Lowered:
    # Fusion (not eager's blocked kernel): P = softmax(q k^T scale) (_attention_probs), o = P v.
    # Batched np.matmul over the heads on the strided q/k/v views of the projections: no copies.
    vals, v, matmul = plan.vals, node.inputs[2].id, plan.matmul
    B, H, T, _ = out.shape
    kv_heads = node.inputs[2].shape[1]
    probs = plan.scratch((B, H, T, T), out.dtype, position)  # for this forward only
    probabilities = _attention_probs(plan, node, probs)
    blocks = _row_blocks(T, bool(node.params.get("causal", True)))
    probs_g, out_g = _by_kv_head(probs, kv_heads), _by_kv_head(out, kv_heads)

    def run() -> None:
        probabilities()
        vv = vals[v][:, :, None]
        for r0, r1 in blocks:
            matmul(probs_g[..., r0:r1, :r1], vv[..., :r1, :], out_g[..., r0:r1, :])

    return run, (
        f"fused: q k^T, softmax in place, P v in {len(blocks)} causal row block(s); "
        "no copies of q, k, v"
    )


def _cross_entropy_forward(plan: Any, node: Any, out: np.ndarray, position: int) -> Lowered:
    # the loss only; its gradient is made by the backward, straight into the logits' gradient
    vals, logits = plan.vals, node.inputs[0].id
    targets = plan.param(node, "targets").reshape(-1)
    ignore_index = node.params.get("ignore_index", -100)

    def run() -> None:
        z = vals[logits]
        rows = z.reshape(-1, z.shape[-1])
        out[...] = kernels.cross_entropy_forward(rows, targets, ignore_index, False)[0]

    return run, "Numba pass, the loss only"


_ACCEPTS = {
    F.Attention: _fused_attention,
    F.Gelu: lambda plan, node: node.params.get("approximate", "tanh") == "tanh",
}

_FORWARD = {
    F.Attention: _attention_forward,
    F.SiLU: _silu_forward,
    F.CrossEntropy: _cross_entropy_forward,
    ops.Reshape: _reshape_copy_forward,
    F.Linear: _linear_forward,
    ops.Add: _add_forward,
    F.Embedding: _embedding_forward,
    F.LayerNorm: _layer_norm_forward,
    F.RMSNorm: _rms_norm_forward,
    F.Gelu: _gelu_forward,
}
_NEEDS_NUMBA = {F.LayerNorm, F.RMSNorm, F.Gelu, F.SiLU, F.Attention, F.CrossEntropy}


# --- backward -----------------------------------------------------------------------------------


def backward(plan: Any, node: Any, position: int) -> Lowered:
    fn = node.fn
    if _basic_view(node):
        lower = _view_backward
    else:
        lower = _BACKWARD.get(type(fn))
        if lower is None or not plan.lowered_forward(node):
            return None, None
    return lower(plan, node, position)


def _then(*posts: Any) -> Callable[[], None]:
    posts = tuple(p for p in posts if p is not None)
    return lambda: [p() for p in posts]


def _view_backward(plan: Any, node: Any, position: int) -> Lowered:
    x = node.inputs[0]
    if not x.requires_grad:
        return (lambda: None), "no gradient needed"
    if node.out.id in plan.aliased:
        plan.has_grad.add(x.id)  # complete once every view's consumers have written theirs
        return (lambda: None), "nothing to do: its gradient is a view of its input's"
    g = plan.grads[node.out.id]
    fn = node.fn
    if isinstance(fn, ops.GetItem):
        index = node.params["index"]
        first = x.id not in plan.has_grad
        gx = plan.grad_buffer(x, position)

        def run_index() -> None:
            if first:
                gx.fill(0)
                gx[index] = g
            else:
                gx[index] += g

        return run_index, "scatter into the input's gradient"
    target = plan.grad_target(x, x.shape, position)
    if isinstance(fn, ops.Reshape):
        return (lambda: target(g.reshape(x.shape))), "reshape into the input's gradient"
    inverse = tuple(np.argsort(fn.saved[0] if fn.saved else node.params["axes"]))
    return (lambda: target(np.transpose(g, inverse))), "transpose into the input's gradient"


def _linear_backward(plan: Any, node: Any, position: int) -> Lowered:
    vals, g, matmul = plan.vals, plan.grads[node.out.id], plan.matmul
    x, w = node.inputs[0], node.inputs[1]
    bias = node.inputs[2] if len(node.inputs) == 3 else None
    g2 = g.reshape(-1, g.shape[-1])
    n = g2.shape[0]
    steps = []
    if x.requires_grad:
        gx, post = plan.contribution(x, (n, x.shape[-1]), position)
        steps.append((lambda gx=gx: matmul(g2, vals[w.id].T, gx), post))
    if w.requires_grad:
        gw, post = plan.contribution(w, w.shape, position)
        xid = x.id

        def weight(gw=gw) -> None:
            xv = vals[xid]
            matmul(xv.reshape(-1, xv.shape[-1]).T, g2, gw)

        steps.append((weight, post))
    if bias is not None and bias.requires_grad:
        gb, post = plan.contribution(bias, bias.shape, position)
        if plan.fusion is True:  # as a product with ones: 3x faster than the sum over rows
            ones = np.ones(n, g2.dtype)
            steps.append((lambda gb=gb: np.matmul(ones, g2, out=gb), post))
        else:  # eager's sum (its order of additions)
            steps.append((lambda gb=gb: np.sum(g2, axis=0, out=gb), post))

    def run() -> None:
        for step, post in steps:
            step()
            if post is not None:
                post()

    return run, "np.matmul(out=) into the gradient buffers"


def _reshape_copy_backward(plan: Any, node: Any, position: int) -> Lowered:
    x = node.inputs[0]
    if not x.requires_grad:
        return (lambda: None), "no gradient needed"
    g = plan.grads[node.out.id]
    target = plan.grad_target(x, x.shape, position)
    return (lambda: target(g.reshape(x.shape))), "copy into the input's gradient"


def _add_backward(plan: Any, node: Any, position: int) -> Lowered:
    g = plan.grads[node.out.id]
    targets = []
    for v in node.inputs:
        if not v.requires_grad:
            continue
        target = plan.grad_target(v, v.shape, position)
        if v.shape == g.shape:
            targets.append((target, None))
        else:  # numpy broadcasting: summed back to v's shape, as autograd.tensor.unbroadcast
            targets.append((target, v.shape))

    def run() -> None:
        for target, shape in targets:
            target(g if shape is None else ops.unbroadcast(g, shape))

    return run, "gradient copied / added into the inputs' buffers"


def _embedding_backward(plan: Any, node: Any, position: int) -> Lowered:
    w = node.inputs[0]
    if not w.requires_grad:
        return (lambda: None), "no gradient needed"
    g = plan.grads[node.out.id]
    idx = plan.param(node, "idx")
    target = plan.grad_target(w, w.shape, position)
    return (lambda: target(kernels.embedding_backward(idx, g, w.shape[0]))), "kernel, then added"


def _silu_backward(plan: Any, node: Any, position: int) -> Lowered:
    # dx = g s (1 + x (1 - s)), s recomputed from x in the same pass
    from autograd.kernels import silu

    x = node.inputs[0]
    if not x.requires_grad:
        return (lambda: None), "no gradient needed"
    vals, g = plan.vals, plan.grads[node.out.id].reshape(-1)
    gx, post = plan.contribution(x, x.shape, position)
    flat_gx = gx.reshape(-1)

    def run() -> None:
        silu._silu_grads(g.size, g, vals[x.id].reshape(-1), flat_gx)
        if post is not None:
            post()

    return run, "one Numba pass: sigmoid recomputed from x, into the gradient buffer"


def _cross_entropy_backward(plan: Any, node: Any, position: int) -> Lowered:
    # dl = (softmax(l) - onehot(y)) g / n, written by the kernel into the logits' gradient buffer
    from autograd.kernels import softmax

    logits = node.inputs[0]
    if not logits.requires_grad:
        return (lambda: None), "no gradient needed"
    vals, g = plan.vals, plan.grads[node.out.id]
    targets = plan.param(node, "targets").reshape(-1)
    ignore_index = node.params.get("ignore_index", -100)
    gl, post = plan.contribution(logits, logits.shape, position)
    gl_rows = gl.reshape(-1, gl.shape[-1])
    row_loss = np.empty(gl_rows.shape[0], np.float64)

    def run() -> None:
        z = vals[logits.id]
        kept = max(int(np.count_nonzero(targets != ignore_index)), 1)
        scale = float(g) / kept  # as kernels.cross_entropy_forward(..., grad_scale=g)
        rows = z.reshape(gl_rows.shape)
        softmax._cross_entropy_rows(
            rows.size, rows, targets, ignore_index, scale, True, row_loss, gl_rows
        )
        if post is not None:
            post()

    return run, "Numba pass into the logits' gradient"


def _layer_norm_backward(plan: Any, node: Any, position: int) -> Lowered:
    from autograd.kernels import layernorm

    vals, g = plan.vals, plan.grads[node.out.id]
    x, w, b = node.inputs
    mean, rstd = node.stats
    c = g.shape[-1]
    rows = g.size // c
    chunks = min(layernorm.GRAD_CHUNKS, rows)
    gw_part, gb_part = np.zeros((chunks, c)), np.zeros((chunks, c))
    gw64, gb64 = np.empty(c), np.empty(c)
    # The kernel writes all three; a value that needs no gradient (a frozen weight or bias, an
    # input computed from frozen parameters only) gets a scratch buffer instead of a gradient.
    gx, post_x = _contribution_or_scratch(plan, x, (rows, c), position)
    gw, post_w = _contribution_or_scratch(plan, w, (c,), position)
    gb, post_b = _contribution_or_scratch(plan, b, (c,), position)
    g2 = g.reshape(rows, c)
    post = _then(post_x, post_w, post_b)

    def run() -> None:
        gw_part.fill(0)
        gb_part.fill(0)
        xv = vals[x.id].reshape(rows, c)
        layernorm._layer_norm_backward_chunks(
            g.size, g2, xv, vals[w.id], mean, rstd, gx, gw_part, gb_part
        )
        np.copyto(gw, np.sum(gw_part, axis=0, out=gw64), casting="same_kind")
        np.copyto(gb, np.sum(gb_part, axis=0, out=gb64), casting="same_kind")
        post()

    return run, "Numba kernel into the gradient buffers"


def _rms_norm_backward(plan: Any, node: Any, position: int) -> Lowered:
    from autograd.kernels import layernorm

    vals, g, (x, w), rstd = plan.vals, plan.grads[node.out.id], node.inputs, node.stats
    c = g.shape[-1]
    rows = g.size // c
    gw_part, gw64 = np.zeros((min(layernorm.GRAD_CHUNKS, rows), c)), np.empty(c)
    gx, post_x = _contribution_or_scratch(plan, x, (rows, c), position)
    gw, post_w = _contribution_or_scratch(plan, w, (c,), position)
    g2, post = g.reshape(rows, c), _then(post_x, post_w)

    def run() -> None:
        gw_part.fill(0)
        xv = vals[x.id].reshape(rows, c)
        layernorm._rms_norm_backward_chunks(g.size, g2, xv, vals[w.id], rstd, gx, gw_part)
        np.copyto(gw, np.sum(gw_part, axis=0, out=gw64), casting="same_kind")
        post()

    return run, "Numba kernel into the gradient buffers"


def _contribution_or_scratch(plan: Any, v: Any, shape: tuple, position: int) -> tuple:
    """plan.contribution(v) if v requires grad, else a scratch buffer released after `position`
    (no gradient buffer, and no .grad, for a frozen parameter)."""
    if v.requires_grad:
        return plan.contribution(v, shape, position)
    return plan.scratch(shape, v.dtype, position), None


def _gelu_backward(plan: Any, node: Any, position: int) -> Lowered:
    from autograd.kernels import gelu

    vals, g, x = plan.vals, plan.grads[node.out.id], node.inputs[0]
    gx, post = plan.contribution(x, (g.size,), position)
    g1 = g.reshape(-1)
    s, a_s, a3_s = gelu.constants(g.dtype)

    def run() -> None:
        gelu._gelu_grads_of_x(g.size, g1, vals[x.id].reshape(-1), gx, s, a_s, a3_s)
        if post is not None:
            post()

    return run, "one Numba pass: tanh(u) recomputed from x, into the gradient buffer"


def _attention_backward(plan: Any, node: Any, position: int) -> Lowered:
    # gv = P^T g;  dS = P (dP - rowsum(P dP)) scale, dP = g v^T;  gq = dS k;  gk = dS^T q
    # (notes 10.5), each product over the allowed blocks only (_row_blocks); with grouped K/V
    # heads, gk and gv are made per query head and then summed over each K/V head's group
    from autograd.kernels import attention

    vals, g, matmul = plan.vals, plan.grads[node.out.id], plan.matmul
    q, k, v = node.inputs
    scale = attention._scale(g)
    causal, kv_heads = bool(node.params.get("causal", True)), k.shape[1]
    B, H, T, D = g.shape
    probs, dp = (plan.scratch((B, H, T, T), g.dtype, position) for _ in range(2))
    probabilities = _attention_probs(plan, node, probs)  # P again, from q and k
    rows = probs.size // probs.shape[-1]
    p2, dp2 = probs.reshape(rows, -1), dp.reshape(rows, -1)
    probs_g, dp_g, g_g = (_by_kv_head(a, kv_heads) for a in (probs, dp, g))
    blocks = _row_blocks(T, causal)

    def per_query_head(x: Any) -> tuple[np.ndarray, Any]:
        """(buffer for the products, then-what) for K or V's gradient: the gradient's own
        buffer, or (grouped heads) a per-query-head scratch then summed over each group."""
        buf, post = plan.contribution(x, x.shape, position)
        if kv_heads == H:
            return buf, post
        full = plan.scratch((B, H, T, D), g.dtype, position)
        summed = _by_kv_head(full, kv_heads)
        return full, _then(lambda: np.sum(summed, axis=2, out=buf), post)

    steps = []
    if v.requires_grad:
        gv, post = per_query_head(v)

        def value() -> None:  # keys r0:r1 get P^T g from the queries r0: that see them
            for r0, r1 in blocks:
                matmul(probs[..., r0:, r0:r1].swapaxes(-1, -2), g[..., r0:, :], gv[..., r0:r1, :])

        steps.append((value, post))
    if q.requires_grad:
        gq, post = plan.contribution(q, q.shape, position)
        gq_g = _by_kv_head(gq, kv_heads)

        def query() -> None:
            kv = vals[k.id][:, :, None]
            for r0, r1 in blocks:
                matmul(dp_g[..., r0:r1, :r1], kv[..., :r1, :], gq_g[..., r0:r1, :])

        steps.append((query, post))
    if k.requires_grad:
        gk, post = per_query_head(k)

        def key() -> None:
            qv = vals[q.id]
            for r0, r1 in blocks:
                matmul(dp[..., r0:, r0:r1].swapaxes(-1, -2), qv[..., r0:, :], gk[..., r0:r1, :])

        steps.append((key, post))

    def run() -> None:
        probabilities()
        vv = vals[v.id][:, :, None]
        for r0, r1 in blocks:
            matmul(g_g[..., r0:r1, :], vv[..., :r1, :].swapaxes(-1, -2), dp_g[..., r0:r1, :r1])
        attention._probs_backward(dp.size, p2, dp2, causal, scale)  # in place: dS
        for step, post in steps:
            step()
            if post is not None:
                post()

    return run, "fused: P recomputed, four batched products (causal row blocks), one Numba pass"


_BACKWARD = {
    F.Attention: _attention_backward,
    F.SiLU: _silu_backward,
    F.CrossEntropy: _cross_entropy_backward,
    ops.Reshape: _reshape_copy_backward,
    F.Linear: _linear_backward,
    ops.Add: _add_backward,
    F.Embedding: _embedding_backward,
    F.LayerNorm: _layer_norm_backward,
    F.RMSNorm: _rms_norm_backward,
    F.Gelu: _gelu_backward,
}
