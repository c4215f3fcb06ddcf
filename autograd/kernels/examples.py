"""Example arguments of every kernel, at any size: what the kernel-vs-reference tests, the compile
probe and the kernel benchmarks call each kernel with (the `KERNELS` table points here).

Each function takes (rng, dtype, rows, width) and returns the kernel's positional arguments.
Backward kernels get the outputs of their reference forward. Values include -inf entries where the
op allows them. numpy only; the reference modules are imported on the first call.
"""

from __future__ import annotations

import numpy as np


def _rows(rng, dtype, rows, width, with_inf=True):
    x = rng.standard_normal((rows, width)).astype(dtype)
    if with_inf and rows > 3:
        x[3, ::4] = -np.inf
    return x


def _ids(rng, rows, vocab, ignored=True):
    ids = rng.integers(0, vocab, rows)
    if ignored:
        ids[::5] = -100
    return ids


def softmax_forward(rng, dtype, rows, width):
    return (_rows(rng, dtype, rows, width),)


def softmax_backward(rng, dtype, rows, width):
    from autograd.kernels import softmax

    x = _rows(rng, dtype, rows, width)
    return softmax.softmax_forward_numpy(x), _rows(rng, dtype, rows, width, with_inf=False)


log_softmax_forward = logsumexp_forward = softmax_forward


def log_softmax_backward(rng, dtype, rows, width):
    from autograd.kernels import softmax

    x = _rows(rng, dtype, rows, width)
    return softmax.log_softmax_forward_numpy(x), _rows(rng, dtype, rows, width, with_inf=False)


def cross_entropy_forward(rng, dtype, rows, width):
    return _rows(rng, dtype, rows, width, with_inf=False), _ids(rng, rows, width), -100, True


def gelu_forward(rng, dtype, rows, width):
    return (3 * _rows(rng, dtype, rows, width, with_inf=False),)


def gelu_backward(rng, dtype, rows, width):
    x = (3 * _rows(rng, dtype, rows, width, with_inf=False)).clip(-5, 5)
    return _rows(rng, dtype, rows, width, with_inf=False), x, np.tanh(x)


def silu_forward(rng, dtype, rows, width):
    x = 3 * _rows(rng, dtype, rows, width, with_inf=False)
    x[0, :3] = [0.0, 40.0, -40.0]  # exact zero, and far on both sides (e^-|x| underflows)
    return (x,)


def silu_backward(rng, dtype, rows, width):
    return _rows(rng, dtype, rows, width, with_inf=False), *silu_forward(rng, dtype, rows, width)


def swiglu_forward(rng, dtype, rows, width):
    u = _rows(rng, dtype, rows, width, with_inf=False)
    u[-1, -1] = 0.0
    return *silu_forward(rng, dtype, rows, width), u


def swiglu_backward(rng, dtype, rows, width):
    return _rows(rng, dtype, rows, width, with_inf=False), *swiglu_forward(rng, dtype, rows, width)


def layer_norm_forward(rng, dtype, rows, width):
    x = _rows(rng, dtype, rows, width, with_inf=False)  # LayerNorm of a row with -inf is NaN
    w, b = (rng.standard_normal(width).astype(dtype) for _ in range(2))
    return x, w, b, 1e-5


def layer_norm_backward(rng, dtype, rows, width):
    from autograd.kernels import layernorm

    x, w, b, eps = layer_norm_forward(rng, dtype, rows, width)
    _, mean, rstd = layernorm.layer_norm_forward_numpy(x, w, b, eps)
    return _rows(rng, dtype, rows, width, with_inf=False), x, w, mean, rstd


def rms_norm_forward(rng, dtype, rows, width):
    x = _rows(rng, dtype, rows, width, with_inf=False)
    return x, rng.standard_normal(width).astype(dtype), 1e-5


def rms_norm_backward(rng, dtype, rows, width):
    from autograd.kernels import layernorm

    x, w, eps = rms_norm_forward(rng, dtype, rows, width)
    _, rstd = layernorm.rms_norm_forward_numpy(x, w, eps)
    return _rows(rng, dtype, rows, width, with_inf=False), x, w, rstd


def embedding_backward(rng, dtype, rows, width):
    vocab = 7
    return _ids(rng, rows, vocab, ignored=False), _rows(rng, dtype, rows, width, False), vocab


def _qkv(rng, dtype, rows, width):
    """(B, H, T, D) = (2, 3, rows, width // 6 + 1): T not a multiple of the 64-row block."""
    shape = (2, 3, rows, width // 6 + 1)
    return tuple(rng.standard_normal(shape).astype(dtype) for _ in range(4))


def attention_forward(rng, dtype, rows, width):
    q, k, v, _ = _qkv(rng, dtype, rows, width)
    return q, k, v, True


def attention_backward(rng, dtype, rows, width):
    from autograd.kernels import attention

    q, k, v, go = _qkv(rng, dtype, rows, width)
    o, lse = attention.attention_forward_numpy(q, k, v, True)
    return q, k, v, o, lse, go, True


def _quantized_weight(rng, rows, width):
    """A QuantizedWeight of in = width rounded up to whole blocks and out = rows + 300, in a
    format drawn from KEPT."""
    from autograd.quantized import KEPT, block_size

    fmt = KEPT[rng.integers(len(KEPT))]
    n_in = -(-width // block_size(fmt)) * block_size(fmt)
    return quantized_weight(rng, fmt, n_in, rows + 300)


def quantized_weight(rng, fmt, n_in, n_out):
    """A QuantizedWeight (n_in, n_out) in fmt: quantize() of normal values, or for a format read
    from files only (FILE_FORMATS), random blocks whose f16 d (and dmin) are 1 / the largest
    integer product of a value at most (q4_k's s q 63 * 15, q5_k's 63 * 31, q6_k's s (q - 32)
    128 * 32), so that
    W's values lie within [-1, 1] as a real weight's do."""
    from autograd.quantized import FILE_FORMATS, QuantizedWeight, layout, quantize

    if fmt not in FILE_FORMATS:
        return quantize(rng.standard_normal((n_in, n_out)), fmt)
    largest = {"q4_k": 63 * 15, "q5_k": 63 * 31, "q6_k": 128 * 32}[fmt]
    arrays = {}
    for name, (dtype, per_row) in layout(fmt, n_in).items():
        shape = (n_out, *per_row)
        if dtype == np.float16:
            arrays[name] = (rng.random(shape) / largest).astype(np.float16)
        else:  # q4_k's and q5_k's s and m have 6 bits
            top = 64 if name.startswith("group_") and fmt != "q6_k" else 256
            arrays[name] = rng.integers(0, top, shape, dtype=np.uint8).view(dtype)
    return QuantizedWeight(fmt, (n_in, n_out), **arrays)


def quantized_matmul(rng, dtype, rows, width):
    weight = _quantized_weight(rng, rows, width)
    return rng.standard_normal((rows, weight.shape[0])).astype(dtype), weight


def quantize_rows(rng, dtype, rows, width):
    from autograd.quantized import BLOCK, FORMATS

    n_in = -(-width // BLOCK) * BLOCK
    values = rng.standard_normal((rows, n_in)).astype(dtype)
    values[0, :BLOCK] = 0.0  # a block of zeros: d = 0
    return values, FORMATS[rng.integers(len(FORMATS))]


def quantized_matmul_t(rng, dtype, rows, width):
    weight = _quantized_weight(rng, rows, width)
    return rng.standard_normal((rows, weight.shape[1])).astype(dtype), weight


def quantized_matvec_int8(rng, dtype, rows, width):
    from autograd.quantized import BLOCK

    fmt = ("q8_0", "q4_0", "q4_1")[rng.integers(3)]
    n_in = -(-width // BLOCK) * BLOCK
    weight = quantized_weight(rng, fmt, n_in, rows + 300)
    x = rng.standard_normal((3, n_in)).astype(dtype)
    x[0, :BLOCK] = 0.0  # a block of zeros: dx = 0
    return x, weight
