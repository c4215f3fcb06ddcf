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
    """One small float32 call of every Numba kernel of the kernels package's table."""
    from autograd.kernels import KERNELS, get_kernel

    rng = np.random.default_rng(0)
    cases = {}
    for name, kernel in KERNELS.items():
        fn, args = get_kernel(name, "numba"), kernel.example(rng, np.float32, 8, 16)
        cases[name] = lambda fn=fn, args=args: fn(*args)
    return cases


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
    from autograd.kernels import KERNELS

    print(json.dumps(probe(sys.argv[1:] or list(KERNELS))))
