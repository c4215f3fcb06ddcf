"""Hot-loop kernels on plain numpy arrays, each beside the numpy reference it must match.

Backends
--------
Every public function below dispatches to one of two implementations:

- ``"numba"`` (default): parallel Numba kernels (``prange`` over rows or heads).
- ``"numpy"``: the plain, vectorised numpy reference. Read these first; they are the spec.

Pick the backend with the environment variable ``GLASSGRAD_KERNELS=numpy`` (read once, at import),
``set_backend(name)``, or temporarily with ``with use_backend("numpy"): ...``. The setting is one
module-level value shared by all threads: switch it from one thread while no other thread is
calling kernels (``use_backend`` restores the previous value on exit, also on error).

Calling one path explicitly (tests, benchmarks)
-----------------------------------------------
Each topic module holds both variants side by side as ``<name>_numpy`` and ``<name>_numba``::

    from autograd.kernels import softmax, layernorm, embedding, attention
    softmax.softmax_forward_numpy(x)          # reference
    softmax.softmax_forward_numba(x)          # kernel
    attention.attention_forward_numba(q, k, v, causal=True)

or by name: ``get_kernel("softmax_forward", "numpy")``.

Lazy loading
------------
``import autograd.kernels`` imports neither Numba nor the topic modules. A topic module (which
imports Numba) is imported on the first call that needs it, and each Numba kernel is compiled on
its first call with a given dtype (``cache=True``: later processes load the compiled code from
``__pycache__``, and Numba's own runtime module from beside it: ``_runtime_cache``).

Threads
-------
Each Numba kernel is compiled twice: a serial build for small inputs and a parallel one (``prange``
over Numba's threads) above ``_common.PARALLEL_MIN_WORK`` inner-loop iterations. The first parallel
call starts the threads with OpenMP's passive wait policy (``start_threads``; spinning workers
slowed small parallel kernels ~40x on a busy machine). Call ``start_threads()`` yourself before
``numba.set_num_threads`` or any other parallel Numba code if those run first;
``start_threads(wait="spin")`` (the compiled decode step's choice) lets them poll a short while.

Conventions: inputs are numpy arrays (copied to C-contiguous float32/float64 if needed; companion
arrays are cast to the dtype of the first one), outputs are new arrays of that dtype, inputs are
never modified, and bad shapes raise ``ValueError`` naming the kernel and the shapes.
"""

import importlib
import os
from collections.abc import Callable
from contextlib import contextmanager
from typing import NamedTuple

from . import examples  # numpy only, like _common: importing them does not import Numba
from ._common import serially, start_threads

BACKENDS = ("numba", "numpy")


class Kernel(NamedTuple):
    """One kernel: the topic module that implements it, the autograd.functional op that calls
    it, and its example arguments (kernels/examples.py)."""

    topic: str
    op: str
    example: Callable


# THE table of kernels: the dispatch below, the kernel-vs-reference tests, the compile probe and the
# kernel benchmarks are all derived from it, so a new kernel is registered here and nowhere else.
KERNELS: dict[str, Kernel] = {
    "softmax_forward": Kernel("softmax", "softmax", examples.softmax_forward),
    "softmax_backward": Kernel("softmax", "softmax", examples.softmax_backward),
    "log_softmax_forward": Kernel("softmax", "log_softmax", examples.log_softmax_forward),
    "log_softmax_backward": Kernel("softmax", "log_softmax", examples.log_softmax_backward),
    "logsumexp_forward": Kernel("softmax", "logsumexp", examples.logsumexp_forward),
    "cross_entropy_forward": Kernel("softmax", "cross_entropy", examples.cross_entropy_forward),
    "gelu_forward": Kernel("gelu", "gelu", examples.gelu_forward),
    "gelu_backward": Kernel("gelu", "gelu", examples.gelu_backward),
    "silu_forward": Kernel("silu", "silu", examples.silu_forward),
    "silu_backward": Kernel("silu", "silu", examples.silu_backward),
    "swiglu_forward": Kernel("silu", "swiglu", examples.swiglu_forward),
    "swiglu_backward": Kernel("silu", "swiglu", examples.swiglu_backward),
    "layer_norm_forward": Kernel("layernorm", "layer_norm", examples.layer_norm_forward),
    "layer_norm_backward": Kernel("layernorm", "layer_norm", examples.layer_norm_backward),
    "rms_norm_forward": Kernel("layernorm", "rms_norm", examples.rms_norm_forward),
    "rms_norm_backward": Kernel("layernorm", "rms_norm", examples.rms_norm_backward),
    "embedding_backward": Kernel("embedding", "embedding", examples.embedding_backward),
    "attention_forward": Kernel("attention", "attention", examples.attention_forward),
    "attention_backward": Kernel("attention", "attention", examples.attention_backward),
    "quantized_matmul": Kernel("quantized", "quantized_linear", examples.quantized_matmul),
    "quantized_matmul_t": Kernel("quantized", "quantized_linear", examples.quantized_matmul_t),
    "quantize_rows": Kernel("quantized", "quantized_linear", examples.quantize_rows),
    "quantized_matvec_int8": Kernel(
        "quantized_int8", "quantized_linear", examples.quantized_matvec_int8
    ),
}


def load_numba():
    """Start Numba's compiler once (~0.7 s per process: its target and registries), by calling
    one cached kernel; otherwise the first kernel call of a process pays it. Returns seconds."""
    import time

    import numpy as np

    from . import gelu

    start = time.perf_counter()
    x = np.zeros(1, np.float32)
    gelu._gelu_output.serial(x, x.copy(), np.float32(1.0), np.float32(1.0))
    return time.perf_counter() - start


def _checked(name):
    if name not in BACKENDS:
        raise ValueError(f"unknown kernel backend {name!r}; valid backends: {', '.join(BACKENDS)}")
    return name


_backend = _checked(os.environ.get("GLASSGRAD_KERNELS", "numba"))


def get_backend():
    """The current backend name: "numba" or "numpy"."""
    return _backend


def set_backend(name):
    """Make `name` ("numba" or "numpy") the backend for all threads."""
    global _backend
    _backend = _checked(name)


@contextmanager
def use_backend(name):
    """Temporarily switch the backend: ``with use_backend("numpy"): ...`` (module-wide)."""
    previous = get_backend()
    set_backend(name)
    try:
        yield
    finally:
        set_backend(previous)


def get_kernel(name, backend=None):
    """The implementation of public kernel `name` for `backend` (default: the current one)."""
    if name not in KERNELS:
        raise ValueError(f"unknown kernel {name!r}; known kernels: {', '.join(KERNELS)}")
    module = importlib.import_module(f"{__name__}.{KERNELS[name].topic}")
    return getattr(module, f"{name}_{_checked(backend or _backend)}")


# --- the dispatching public API; formulas and edge cases are documented on the references ---


def softmax_forward(x):
    """y = softmax(x) over the last axis (softmax.softmax_forward_numpy)."""
    return get_kernel("softmax_forward")(x)


def softmax_backward(y, gy):
    """gx = y * (gy - sum(y * gy, -1)) (softmax.softmax_backward_numpy)."""
    return get_kernel("softmax_backward")(y, gy)


def log_softmax_forward(x):
    """y = x - logsumexp(x) over the last axis (softmax.log_softmax_forward_numpy)."""
    return get_kernel("log_softmax_forward")(x)


def log_softmax_backward(y, gy):
    """gx = gy - exp(y) * sum(gy, -1) (softmax.log_softmax_backward_numpy)."""
    return get_kernel("log_softmax_backward")(y, gy)


def logsumexp_forward(x):
    """lse = log(sum(exp(x), -1)), shape x.shape[:-1] (softmax.logsumexp_forward_numpy)."""
    return get_kernel("logsumexp_forward")(x)


def cross_entropy_forward(logits, targets, ignore_index=-100, need_grad=True, grad_scale=1.0):
    """(loss, dlogits * grad_scale) of the mean NLL of log_softmax
    (softmax.cross_entropy_forward_numpy)."""
    kernel = get_kernel("cross_entropy_forward")
    return kernel(logits, targets, ignore_index, need_grad, grad_scale)


def gelu_forward(x):
    """(y, t) of tanh-GELU; t = tanh(u), kept for the backward (gelu.gelu_forward_numpy)."""
    return get_kernel("gelu_forward")(x)


def gelu_backward(gy, x, t):
    """gx of GELU, tanh approximation (gelu.gelu_backward_numpy)."""
    return get_kernel("gelu_backward")(gy, x, t)


def silu_forward(x):
    """y = x sigmoid(x) (silu.silu_forward_numpy)."""
    return get_kernel("silu_forward")(x)


def silu_backward(gy, x):
    """gx of SiLU, sigmoid recomputed from x (silu.silu_backward_numpy)."""
    return get_kernel("silu_backward")(gy, x)


def swiglu_forward(x, u):
    """y = silu(x) u, SwiGLU's gated product (silu.swiglu_forward_numpy)."""
    return get_kernel("swiglu_forward")(x, u)


def swiglu_backward(gy, x, u):
    """(gx, gu) of SwiGLU, sigmoid recomputed from x (silu.swiglu_backward_numpy)."""
    return get_kernel("swiglu_backward")(gy, x, u)


def layer_norm_forward(x, weight, bias, eps):
    """(y, mean, rstd) of LayerNorm over the last axis (layernorm.layer_norm_forward_numpy)."""
    return get_kernel("layer_norm_forward")(x, weight, bias, eps)


def layer_norm_backward(gy, x, weight, mean, rstd):
    """(gx, gweight, gbias) of LayerNorm (layernorm.layer_norm_backward_numpy)."""
    return get_kernel("layer_norm_backward")(gy, x, weight, mean, rstd)


def rms_norm_forward(x, weight, eps):
    """(y, rstd) of RMSNorm over the last axis (layernorm.rms_norm_forward_numpy)."""
    return get_kernel("rms_norm_forward")(x, weight, eps)


def rms_norm_backward(gy, x, weight, rstd):
    """(gx, gweight) of RMSNorm (layernorm.rms_norm_backward_numpy)."""
    return get_kernel("rms_norm_backward")(gy, x, weight, rstd)


def embedding_backward(idx, gy, num_embeddings, out=None):
    """gweight[w] = sum of gy rows whose id is w, or added into out (embedding.py's numpy one)."""
    return get_kernel("embedding_backward")(idx, gy, num_embeddings, out)


def attention_forward(q, k, v, causal=True):
    """(o, lse) of scaled dot-product attention (attention.attention_forward_numpy)."""
    return get_kernel("attention_forward")(q, k, v, causal)


def attention_backward(q, k, v, o, lse, go, causal=True):
    """(gq, gk, gv) of scaled dot-product attention (attention.attention_backward_numpy)."""
    return get_kernel("attention_backward")(q, k, v, o, lse, go, causal)


def quantized_matmul(x, weight):
    """x (N, in) @ W for a QuantizedWeight W (quantized.quantized_matmul_numpy)."""
    return get_kernel("quantized_matmul")(x, weight)


def _int8_applies(weight, int8_activations):
    """Whether x goes to W as int8: asked for, and W's format has that product."""
    if not int8_activations:
        return False
    from .quantized_int8 import FORMATS  # here: it imports Numba

    return weight.format in FORMATS


def quantized_matmul_into(x, weight, out, int8_activations=False):
    """out[...] = x @ W (quantized_matmul), out (N, out) of x's dtype; with the Numba backend a
    single C-contiguous row goes straight to the matrix-vector kernel, nothing allocated (the
    compiled decode step's call, ~200 a token). int8_activations: x's rows quantized to int8
    first (quantized_matvec_int8) where W's format has that product (q8_0, q4_0, q4_1; the
    others multiply x as it is)."""
    if _int8_applies(weight, int8_activations):
        if _backend == "numba":
            from .quantized_int8 import matvec_int8_into

            matvec_int8_into(x, weight, out)
        else:
            out[...] = quantized_matvec_int8(x, weight)
    elif _backend == "numba":
        from .quantized import matmul_into

        matmul_into(x, weight, out)
    else:
        out[...] = quantized_matmul(x, weight)


def bind_quantized_matmul_into(x, weight, out, int8_activations=False):
    """A call () -> None doing quantized_matmul_into(x, weight, out, int8_activations) on these
    very arrays, its checks and the kernel's arguments made once, with the backend in force now
    (the compiled decode step binds each product when it is built)."""
    int8_activations = _int8_applies(weight, int8_activations)
    if _backend != "numba":
        return lambda: quantized_matmul_into(x, weight, out, int8_activations)
    if int8_activations:
        from .quantized_int8 import bind_matvec_int8_into

        return bind_matvec_int8_into(x, weight, out)
    from .quantized import bind_matmul_into

    return bind_matmul_into(x, weight, out)


def quantized_matmul_t(g, weight):
    """g (N, out) @ W^T for a QuantizedWeight W (quantized.quantized_matmul_t_numpy)."""
    return get_kernel("quantized_matmul_t")(g, weight)


def quantized_matvec_int8(x, weight):
    """x (N, in) @ W with x's rows quantized to int8 per block, llama.cpp's decode arithmetic
    (quantized_int8.quantized_matvec_int8_numpy)."""
    return get_kernel("quantized_matvec_int8")(x, weight)


def quantize_rows(rows, fmt):
    """(d, quants, m, h) of rows (n, in)'s 32-value blocks (quantized.quantize_rows_numpy)."""
    return get_kernel("quantize_rows")(rows, fmt)


__all__ = [
    "load_numba",
    "BACKENDS",
    "KERNELS",
    "Kernel",
    "get_backend",
    "set_backend",
    "use_backend",
    "get_kernel",
    "serially",
    "start_threads",
    "quantized_matmul_into",
    "bind_quantized_matmul_into",
    *KERNELS,
]
