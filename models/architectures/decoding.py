"""A compiled decode step (notes 12.4): one new token through every layer, replayed from a flat
list of steps on preallocated buffers, so that a token costs its arithmetic and not Python.

Eager generation with the KV cache builds, per token and layer, a dozen Tensors and graph-free
ops (~15 ops x 30 layers for SmolLM2-135M); each allocates its output and checks its inputs. The
work itself is a handful of matrix-vector products whose cost is reading the weights once: a
135M model's 540 MB (float32) per token. DecodeStep walks the model once and keeps

    x (B, C)          the residual stream      h (B, C)          a norm's output
    q, k, v (B, n, D) a layer's heads (views of its one q | k | v product at batch 1)
    o (B, H, D)       the heads' outputs       ffn (B, FFN)      the MLP's hidden units
    logits (B, V)     the head's output

and the caches' own arrays (nn.LayerKVCache, (B, Hkv, capacity, D) per layer), then replays, per
token, the calls eager makes on operands of the same shapes and layout:

| eager op                        | the step                                                  |
|---------------------------------|-----------------------------------------------------------|
| embedding (+ learned positions) | np.take(out=), np.add(out=)                               |
| LayerNorm, RMSNorm              | the Numba row kernel eager's op runs, into h              |
| Linear                          | np.matmul(out=), bias in place (or forward_into)          |
| rotary (one position)           | kernels.rotary's pass, in place (F.apply_rotary's values) |
| KV cache append                 | k, v written into the cache at the position               |
| attention over the cache        | attention_forward_numba's one pass per query row          |
| GELU (tanh), SiLU, gate * up    | the Numba kernels into out (silu(gate) * up in one call)  |
| residual adds                   | np.add(out=) in place                                     |

With exact=True the logits equal eager's bit for bit in float32 and float64 (with the default
Numba kernels; GLASSGRAD_KERNELS=numpy makes eager run the numpy references, which sum in other
orders). By default products that read the same input run as one: a Llama layer's q_proj,
k_proj, v_proj (_fused_projections) and, for quantized layers, gate_proj and up_proj
(quantized_side_by_side); the same tokens, the logits within rounding (docs/decoding.md).

A Linear-like module plugs in by its product into a buffer: `nn.Linear` runs np.matmul on its
weight; any other module offering `forward_into(x, out)` (x (rows, in), out (rows, out), both
arrays of the model's dtype; it writes x's product into out and returns nothing) runs that, e.g.
a quantized linear with its own matrix-vector kernel; anything else (an unmerged LoRA adapter)
runs its own forward on x and is copied into out: correct, at eager's speed for that product.

The step reads the parameters' arrays as they are when it is built: build it again after the
weights change (generate() builds one per call).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

import nn
from autograd import Tensor, no_grad
from autograd.kernels import attention, gelu, layernorm, matvec, rotary, silu, start_threads

Step = Callable[[], None]


def _matmul(
    weight: np.ndarray, bias: np.ndarray | None, x: np.ndarray, out: np.ndarray, blocks: int | None
) -> Step:
    """out = x @ weight + bias as F.linear's forward makes it: the product, then the bias. With
    blocks (one row of x, a C-contiguous weight), the product is kernels.matvec's on Numba's
    threads, its rows summed in that many blocks; otherwise numpy's (BLAS)."""
    if blocks and x.shape[0] == 1 and weight.flags.c_contiguous:
        x_row, out_row = x[0], out[0]

        def product() -> None:
            matvec.matvec_into(x_row, weight, out_row, blocks)
            if bias is not None:
                np.add(out, bias, out=out)

        return product

    def blas_product() -> None:
        np.matmul(x, weight, out=out)
        if bias is not None:
            np.add(out, bias, out=out)

    return blas_product


def _product(
    linear: nn.Module, x: np.ndarray, out: np.ndarray, blocks: int | None, int8: bool = False
) -> Step:
    """out = linear(x) as one call (see the module docstring for what a module may offer);
    blocks: see _matmul; int8: a quantized linear's x quantized to int8 (DecodeStep's
    int8_activations)."""
    if type(linear) is nn.Linear:
        bias = None if linear.bias is None else linear.bias.data
        return _matmul(linear.weight.data, bias, x, out, blocks)
    if isinstance(linear, nn.QuantizedLinear):  # bound once: ~7 us of Python a call saved
        return linear.product_into(x, out, int8)
    forward_into = getattr(linear, "forward_into", None)
    if forward_into is not None:
        return lambda: forward_into(x, out)

    def module_forward() -> None:
        with no_grad():
            np.copyto(out, linear(Tensor(x, dtype=x.dtype)).data)

    return module_forward


def _norm(norm: nn.Module, x: np.ndarray, out: np.ndarray) -> Step:
    """out = norm(x) by the Numba row kernel eager's LayerNorm / RMSNorm runs."""
    rows = x.shape[0]
    rstd = np.empty(rows, np.float64)
    eps = float(norm.eps)
    weight = norm.weight.data
    if isinstance(norm, nn.RMSNorm):
        return lambda: layernorm._rms_norm_rows(x.size, x, weight, eps, out, rstd)
    if isinstance(norm, nn.LayerNorm):
        # F.layer_norm's defaults: weight 1, bias 0 where the module has none
        bias = np.zeros_like(weight) if norm.bias is None else norm.bias.data
        mean = np.empty(rows, np.float64)
        return lambda: layernorm._layer_norm_rows(x.size, x, weight, bias, eps, out, mean, rstd)
    raise TypeError(f"compiled decoding: no step for the norm {type(norm).__name__}")


def _block_parts(block: nn.Module) -> tuple[nn.Module, nn.Module, nn.Module, nn.Module]:
    """(attention's norm, attention, the MLP's norm, MLP) of a Pre-LN decoder block: nn.Block
    (GPT-2) or a Llama-family block (models.architectures.llama.LlamaBlock)."""
    if isinstance(block, nn.Block):
        if not block.pre_ln or block.cross_attn is not None:
            raise ValueError(
                "compiled decoding: only Pre-LN blocks without cross-attention, got "
                f"{type(block).__name__}({block.extra_repr()})"
            )
        return block.ln_1, block.attn, block.ln_mlp, block.mlp
    try:
        return block.input_layernorm, block.self_attn, block.post_attention_layernorm, block.mlp
    except AttributeError:
        raise TypeError(
            f"compiled decoding: no step for the block {type(block).__name__} (nn.Block or a "
            "Llama-family block: input_layernorm, self_attn, post_attention_layernorm, mlp)"
        ) from None


def _fused_projections(
    attn: nn.Module, exact: bool, blocks: int | None, int8: bool
) -> Callable[[np.ndarray, np.ndarray], Step] | None:
    """The product x -> q | k | v as one call, or None: GPT-2's c_attn as it is; Llama's q_proj,
    k_proj, v_proj when all three are plain nn.Linears (alike in bias), their weights copied once
    side by side into (C, (H + 2 Hkv) D). One matrix-vector product of 960 columns instead of
    576 + 192 + 192 (SmolLM2): OpenBLAS splits a gemv over its threads only from ~460 800
    values, so q_proj (576 x 576) ran on one thread; measured 34.5 -> 39.2 tokens/s at 2 threads
    (1 thread: 23.7 -> 24.3), for 66 MB more memory. Not with exact: each output column is the
    same dot product over the same inputs, but the BLAS kernel may round the columns at a
    block's edge otherwise than in the three narrower products (1.8e-15 apart seen in float64 on
    widths 24 | 12 | 12; SmolLM2's 576 | 192 | 192 gave the same tokens)."""
    if hasattr(attn, "c_attn"):
        return lambda x, out: _product(attn.c_attn, x, out, blocks, int8)
    projections = [attn.q_proj, attn.k_proj, attn.v_proj]
    if exact:
        return None
    if quantized_side_by_side(projections):
        fused = nn.QuantizedLinear.side_by_side(projections)
        return lambda x, out: _product(fused, x, out, blocks, int8)
    if any(type(p) is not nn.Linear for p in projections):
        return None
    biases = [p.bias for p in projections]
    if any(b is None for b in biases) and any(b is not None for b in biases):
        return None
    weight = np.concatenate([p.weight.data for p in projections], axis=1)
    bias = None if biases[0] is None else np.concatenate([b.data for b in biases])
    return lambda x, out: _matmul(weight, bias, x, out, blocks)


def side_by_side_groups(model: nn.Module) -> list[list[str]]:
    """The names of the layers that read the same input, per block (q_proj, k_proj, v_proj;
    gate, up): what a compiled step runs as one product when they are quantized alike
    (quantized_side_by_side). The loader packs them side by side as they arrive
    (models/formats/quantized.py), so that no step has to move them."""
    names = {id(module): name for name, module in model.named_modules()}
    groups = []
    for module in model.modules():
        if all(hasattr(module, p) for p in ("q_proj", "k_proj", "v_proj")):
            groups.append(
                [names[id(module.q_proj)], names[id(module.k_proj)], names[id(module.v_proj)]]
            )
        if isinstance(module, nn.GatedMLP):
            groups.append([names[id(module.c_gate)], names[id(module.c_fc)]])
    return groups


def quantized_side_by_side(layers: list[nn.Module]) -> bool:
    """Whether quantized layers can run as one product (nn.QuantizedLinear.side_by_side): one
    parallel loop instead of several, each of which costs its start (~200 a token), and no
    memory added (the blocks move side by side, the layers keep views). For one row (batch 1)
    each output is the same sum as apart (the matrix-vector kernel sums outputs on their own);
    more rows go through BLAS, which may round the columns otherwise, hence not with exact."""
    return all(type(layer) is nn.QuantizedLinear for layer in layers) and (
        len({(layer.weight.format, layer.in_features, layer.bias is None) for layer in layers}) == 1
    )


def _split_heads(qkv: np.ndarray, heads: list[int], head_dim: int) -> tuple[np.ndarray, ...]:
    """Views (B, n, D) of qkv's column blocks of n * D columns each (q | k | v)."""
    batch, views, start = qkv.shape[0], [], 0
    for n in heads:
        views.append(qkv[:, start : start + n * head_dim].reshape(batch, n, head_dim))
        start += n * head_dim
    return tuple(views)


class DecodeStep:
    """`step(tokens)`: the logits (B, V) of the next position after the cached ones, for tokens
    (B,) at that position; appends their keys and values to `caches` (which prefill filled, e.g.
    model(prompt, kv_caches=caches)). The logits array is the step's own, overwritten by the next
    call. Build with model.compile_decoder(caches) or DecodeStep(model, caches).

    exact: make every call eager makes, so that the logits equal eager's bit for bit; without
    it, Llama's q_proj, k_proj and v_proj run as one product (_fused_projections).
    int8_activations: a quantized layer (q8_0, q4_0, q4_1) multiplies its input quantized to int8
    per 32 values, as llama.cpp decodes (autograd/kernels/quantized_int8.py): 1.5-2.6x faster
    products on AVX2, logits no longer eager's (docs/quantization.md has the quality)."""

    def __init__(
        self,
        model: nn.Module,
        caches: list[nn.LayerKVCache],
        exact: bool = False,
        int8_activations: bool = False,
    ) -> None:
        c = model.config
        body = model.transformer
        dtype = body.ln_f.weight.dtype  # (a quantized wte's blocks are not the model's dtype)
        batch, kv_heads, capacity, head_dim = caches[0].k.shape
        if len(caches) != c.n_layer or kv_heads != c.n_kv_head or head_dim != c.head_dim:
            raise ValueError(
                f"DecodeStep: {model.describe()} needs {c.n_layer} caches of (B, {c.n_kv_head}, "
                f"capacity, {c.head_dim}), got {len(caches)} of {caches[0].k.shape}"
            )
        if exact and int8_activations:
            raise ValueError(
                "DecodeStep: exact (eager's logits bit for bit) and int8_activations (x rounded "
                "to int8) exclude each other"
            )
        self.model, self.caches, self.capacity, self.exact = model, caches, capacity, exact
        self.int8 = int8_activations
        # a token is ~200 short parallel loops back to back: let Numba's workers poll between
        # them rather than sleep (if nothing started them yet; see start_threads)
        start_threads(wait="spin")
        # one row on two threads or more: a Linear's product and a tied head run on Numba's
        # threads (kernels.matvec), split in one block of rows per thread; exact: eager's BLAS
        threads = matvec.numba_threads()
        self.blocks = threads if batch == 1 and threads >= 2 and not exact else None
        heads, width = c.n_head, c.n_head * c.head_dim
        self.tokens = np.zeros(batch, np.int64)
        self.position = 0  # the position of the token being decoded (= its cache slot)
        self.x = np.empty((batch, c.n_embd), dtype)
        self.h = np.empty_like(self.x)
        self.o = np.empty((batch, heads, head_dim), dtype)  # the heads' outputs
        self.ffn = np.empty((batch, c.ffn_hidden), dtype)
        self.gate = np.empty_like(self.ffn)
        self.branch = np.empty_like(self.x)  # a residual branch's output: attention's, the MLP's
        self.logits = np.empty((batch, c.vocab_size), dtype)
        # attention's scratch: scores (B * Hkv, group, capacity) and one log-sum-exp per row
        self.group = heads // kv_heads
        self.scores = np.empty(batch * heads * capacity, dtype)
        self.lse = np.empty((batch * kv_heads, self.group), dtype)
        self.rotation = self._rotation_tables(body, dtype) if c.positions == "rotary" else None
        self.steps: list[Step] = [self._embed(body)]
        for block, cache in zip(body.h, caches, strict=True):
            norm_1, attn, norm_2, mlp = _block_parts(block)
            self.steps.append(_norm(norm_1, self.x, self.h))
            self.steps.extend(self._attention(attn, cache, width))
            self.steps.append(lambda: np.add(self.x, self.branch, out=self.x))
            self.steps.append(_norm(norm_2, self.x, self.h))
            self.steps.extend(self._mlp(mlp))
            self.steps.append(lambda: np.add(self.x, self.branch, out=self.x))
        self.steps.append(_norm(body.ln_f, self.x, self.h))
        if c.tie_word_embeddings and isinstance(body.wte, nn.QuantizedEmbedding):
            self.steps.append(body.wte.attend_product(self.h, self.logits, self.int8))
        elif c.tie_word_embeddings:  # logits = h @ wte^T (notes 9.4), as eager's nn.linear
            wte = body.wte.weight.data
            if self.blocks and wte.flags.c_contiguous:
                h_row, logits_row = self.h[0], self.logits[0]
                self.steps.append(lambda: matvec.rows_matvec_into(wte, h_row, logits_row))
            else:
                self.steps.append(lambda: np.matmul(self.h, wte.T, out=self.logits))
        else:
            self.steps.append(_product(model.lm_head, self.h, self.logits, self.blocks, self.int8))

    def __call__(self, tokens: np.ndarray) -> np.ndarray:
        position = self.caches[0].length
        if position >= self.capacity:
            raise ValueError(
                f"DecodeStep: the caches hold {self.capacity} positions, all used; reset them "
                "and prefill the cropped window (generate() does)"
            )
        self.tokens[:] = tokens
        self.position = position
        for step in self.steps:
            step()
        for cache in self.caches:
            cache.length = position + 1
        return self.logits

    # --- the parts ----------------------------------------------------------------------------
    def _embed(self, body: nn.Module) -> Step:
        wpe = None if body.wpe is None else body.wpe.weight.data
        if isinstance(body.wte, nn.QuantizedEmbedding):  # the looked-up rows dequantized
            lookup = partial(body.wte.lookup_into, self.tokens, self.x)
        else:
            lookup = partial(np.take, body.wte.weight.data, self.tokens, axis=0, out=self.x)

        def embed() -> None:  # e_i (+ p_i for learned positions, notes 8.6)
            lookup()
            if wpe is not None:
                np.add(self.x, wpe[self.position], out=self.x)

        return embed

    def _rotation_tables(self, body: nn.Module, dtype: Any) -> tuple[np.ndarray, np.ndarray]:
        """cos, sin per position, (capacity, D / 2): the tables eager's rotary reads
        (RotaryPositions.tables), cast to the model's dtype as F.apply_rotary casts them."""
        cos, sin = _block_parts(body.h[0])[1].rotary.tables(self.capacity)
        return cos[: self.capacity].astype(dtype), sin[: self.capacity].astype(dtype)

    def _attention(self, attn: nn.Module, cache: nn.LayerKVCache, width: int) -> list[Step]:
        if attn.probe is not None or attn.score_scale is not None:
            raise ValueError(
                "compiled decoding runs attention's fused path: unset the layer's probe and "
                "score_scale (models/lab) or generate with compiled=False"
            )
        batch, kv_heads, _, head_dim = cache.k.shape
        heads, dtype = self.o.shape[1], self.o.dtype
        counts, kv_width = [heads, kv_heads, kv_heads], kv_heads * head_dim
        fused = _fused_projections(attn, self.exact, self.blocks, self.int8)
        if fused is not None:  # W_Q | W_K | W_V, one product
            qkv = np.empty((batch, width + 2 * kv_width), dtype)
            steps = [fused(self.h, qkv)]
            q, k, v = views = _split_heads(qkv, counts, head_dim)
            if batch > 1:  # qkv's column blocks are then not whole rows of q, k, v: copy them
                q, k, v = copies = [np.empty_like(view) for view in views]
                steps.append(
                    lambda: [np.copyto(c, view) for c, view in zip(copies, views, strict=True)]
                )
        else:  # three Linear-like modules, each its own product
            q, k, v = (np.empty((batch, n, head_dim), dtype) for n in counts)
            steps = [
                _product(attn.q_proj, self.h, q.reshape(batch, width), self.blocks, self.int8),
                _product(attn.k_proj, self.h, k.reshape(batch, kv_width), self.blocks, self.int8),
                _product(attn.v_proj, self.h, v.reshape(batch, kv_width), self.blocks, self.int8),
            ]
        # the new position's heads as (B, H, 1, D), for the rotation in place
        q_heads = q.reshape(batch, heads, 1, head_dim)
        k_heads = k.reshape(batch, kv_heads, 1, head_dim)
        # attention_forward_numba's one pass per query row (as eager's call for one position), q as
        # (B * Hkv, group, D) query rows per K/V head (grouped-query attention; group 1 is
        # GPT-2's multi-head case) over the cache's own arrays
        rows = batch * kv_heads
        queries = q.reshape(rows, self.group, head_dim)
        outputs = self.o.reshape(rows, self.group, head_dim)
        keys, values = (a.reshape(rows, self.capacity, head_dim) for a in (cache.k, cache.v))
        scores = self.scores.reshape(rows * self.group, self.capacity)
        scale = attention._scale(q)

        def attend() -> None:
            p, length = self.position, self.position + 1
            if self.rotation is not None:  # F.apply_rotary's values for position p
                cos, sin = self.rotation[0][p : p + 1], self.rotation[1][p : p + 1]
                rotary._rotate(q_heads.size, q_heads, False, cos, sin, q_heads, False)
                rotary._rotate(k_heads.size, k_heads, False, cos, sin, k_heads, False)
            cache.k[:, :, p] = k  # the cache's append
            cache.v[:, :, p] = v
            args = (queries, keys, values, length, scale, outputs, self.lse, scores)
            if self.blocks:  # polling threads: a parallel loop costs microseconds, not ~50
                attention._attend_all_keys.parallel(*args)
            else:
                attention._attend_all_keys(queries.size * length, *args)

        steps.append(attend)
        steps.append(
            _product(attn.c_proj, self.o.reshape(batch, width), self.branch, self.blocks, self.int8)
        )
        return steps

    def _mlp(self, mlp: nn.Module) -> list[Step]:
        """The MLP of h into self.branch (the buffer the residual add reads)."""
        ffn, gate = self.ffn, self.gate
        side_by_side = isinstance(mlp, nn.GatedMLP) and not self.exact
        if side_by_side and quantized_side_by_side([mlp.c_gate, mlp.c_fc]):
            fused = nn.QuantizedLinear.side_by_side([mlp.c_gate, mlp.c_fc])
            batch, hidden = gate.shape
            gate_up = np.empty((batch, 2 * hidden), gate.dtype)
            steps = [_product(fused, self.h, gate_up, self.blocks, self.int8)]
            if batch == 1:  # gate and up are the halves of gate_up's one row
                gate, up = gate_up[0, :hidden], gate_up[0, hidden:]
            else:
                up = np.empty_like(gate)

                def split() -> None:
                    np.copyto(gate, gate_up[:, :hidden])
                    np.copyto(up, gate_up[:, hidden:])

                steps.append(split)
            flat = (gate.reshape(-1), up.reshape(-1), ffn.reshape(-1))
            steps.append(lambda: silu._silu_times(gate.size, *flat))
            steps.append(_product(mlp.c_proj, ffn, self.branch, self.blocks, self.int8))
            return steps
        if isinstance(mlp, nn.GatedMLP):  # c_proj(silu(h W_gate) * (h W_up))
            up = np.empty_like(ffn)
            flat = (gate.reshape(-1), up.reshape(-1), ffn.reshape(-1))
            return [
                _product(mlp.c_gate, self.h, gate, self.blocks, self.int8),
                _product(mlp.c_fc, self.h, up, self.blocks, self.int8),
                lambda: silu._silu_times(gate.size, *flat),
                _product(mlp.c_proj, ffn, self.branch, self.blocks, self.int8),
            ]
        if isinstance(mlp, nn.MLP) and mlp.gelu.approximate == "tanh":  # c_proj(gelu(h W1 + b1))
            s, a_s, _ = gelu.constants(ffn.dtype)
            pre = np.empty_like(ffn)  # not in place: see silu._silu_times
            flat = (pre.reshape(-1), ffn.reshape(-1))
            return [
                _product(mlp.c_fc, self.h, pre, self.blocks, self.int8),
                lambda: gelu._gelu_output(pre.size, *flat, s, a_s),
                _product(mlp.c_proj, ffn, self.branch, self.blocks, self.int8),
            ]
        raise TypeError(f"compiled decoding: no step for the MLP {mlp!r}")
