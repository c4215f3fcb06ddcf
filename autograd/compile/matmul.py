"""Products on two threads: a compiled step's `matmul` with fusion=True (plan.py).

With fusion on and a BLAS allowed >= 2 threads, a replay runs BLAS single-threaded and splits
each large product in two halves itself: one on a pool thread, one on the caller. OpenBLAS's own
threads spin after each call, and on a busy machine a spinning thread steals the core the other
one needs (a (2048, 128) @ (128, 512) product: median 10.0 ms with 2 BLAS threads, 2.6 ms split,
load average 2.7); the pool thread sleeps on a queue instead.
"""

from __future__ import annotations

from typing import Any

import numpy as np

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
