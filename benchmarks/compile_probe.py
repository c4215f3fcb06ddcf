"""First-call cost of each Numba kernel, measured in a fresh process.

Run twice by the kernels suite with the same empty NUMBA_CACHE_DIR: in the first process a
kernel's first call compiles it (and writes the cache), in the second it loads the cached code.
Cost = first call - second call on the same small float32 input (the second call is the run
itself). The first kernel in a process also pays for starting Numba's thread pool.

    NUMBA_CACHE_DIR=/tmp/x python -m benchmarks.compile_probe [kernel ...]   # prints JSON
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable

import numpy as np


def _cases() -> dict[str, Callable[[], object]]:
    from autograd.kernels import attention, embedding, layernorm, softmax

    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 16), dtype=np.float32)
    q = rng.standard_normal((1, 2, 8, 4), dtype=np.float32)
    y = softmax.softmax_forward_numpy(x)
    w, b = np.ones(16, np.float32), np.zeros(16, np.float32)
    _, mean, rstd = layernorm.layer_norm_forward_numpy(x, w, b, 1e-5)
    o, lse = attention.attention_forward_numpy(q, q, q, True)
    ids = rng.integers(0, 5, size=8)
    return {
        "softmax_forward": lambda: softmax.softmax_forward_numba(x),
        "softmax_backward": lambda: softmax.softmax_backward_numba(y, x),
        "log_softmax_forward": lambda: softmax.log_softmax_forward_numba(x),
        "log_softmax_backward": lambda: softmax.log_softmax_backward_numba(y, x),
        "logsumexp_forward": lambda: softmax.logsumexp_forward_numba(x),
        "cross_entropy_forward": lambda: softmax.cross_entropy_forward_numba(x, ids, -100, True),
        "layer_norm_forward": lambda: layernorm.layer_norm_forward_numba(x, w, b, 1e-5),
        "layer_norm_backward": lambda: layernorm.layer_norm_backward_numba(x, x, w, mean, rstd),
        "embedding_backward": lambda: embedding.embedding_backward_numba(ids, x, 5),
        "attention_forward": lambda: attention.attention_forward_numba(q, q, q, True),
        "attention_backward": lambda: attention.attention_backward_numba(q, q, q, o, lse, q, True),
    }


KERNELS = (
    "softmax_forward",
    "softmax_backward",
    "log_softmax_forward",
    "log_softmax_backward",
    "logsumexp_forward",
    "cross_entropy_forward",
    "layer_norm_forward",
    "layer_norm_backward",
    "embedding_backward",
    "attention_forward",
    "attention_backward",
)


def probe(names: list[str]) -> dict[str, float]:
    """{kernel: seconds of its first call beyond a normal call}, in the order given."""
    cases = _cases()  # imports the topic modules (and Numba) before any timing
    unknown = [n for n in names if n not in cases]
    if unknown:
        raise ValueError(f"compile_probe: unknown kernel(s) {unknown}; known: {list(cases)}")
    result = {}
    for name in names:
        start = time.perf_counter()
        cases[name]()
        first = time.perf_counter() - start
        start = time.perf_counter()
        cases[name]()
        result[name] = max(first - (time.perf_counter() - start), 0.0)
    return result


if __name__ == "__main__":
    print(json.dumps(probe(sys.argv[1:] or list(KERNELS))))
