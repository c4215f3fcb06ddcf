"""Timing method shared by every suite.

1. Warm-up: each variant's first call is timed on its own and reported as `warmup_s` (it holds
   Numba compilation or cache loading, first-touch allocations, PyTorch's lazy init).
2. Peak memory: one more, untimed call per variant with the kernel's peak-RSS counter reset
   (Linux /proc/self/clear_refs "5"): peak_mb = VmHWM after the call - VmRSS before it, i.e. the
   resident memory the call added at its peak (after glibc's malloc_trim, so that memory an
   earlier variant freed but the allocator kept is not silently reused). Where that is
   unavailable, the ru_maxrss delta (which only shows a new high-water mark) is used instead;
   `memory_method` says which.
3. Repetitions alternate between the variants (A B C A B C ...), so that a burst of load from
   other processes on a shared machine hits all of them alike; each reports median, min and max.
   No pause between calls: on this VM an idle vCPU takes milliseconds to wake, which a pause
   would charge to the next parallel call (a 0.4 ms Numba kernel measured 7 ms after 0.2 s idle).
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import resource
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

# Which variants this process times (None: all). The PyTorch variants run in a process of their
# own (see runner.py); there, the others are skipped and reported as NaN, to be merged.
variant_filter: Callable[[str], bool] | None = None


def _status_kb(field: str) -> int | None:
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _reset_peak_rss() -> bool:
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
        return True
    except OSError:
        return False


MEMORY_METHOD = (
    "VmHWM - VmRSS (peak RSS reset via /proc/self/clear_refs)"
    if _reset_peak_rss() and _status_kb("VmHWM") is not None
    else "ru_maxrss delta (new high-water marks only)"
)


def _release_free_memory() -> None:
    """Return the C allocator's cached free blocks to the OS (glibc), so that memory freed by an
    earlier variant does not hide this one's allocations from the RSS counters."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def peak_memory_mb(fn: Callable[[], Any]) -> float:
    """Resident memory (MiB) that one call of fn adds at its peak; see the module docstring."""
    gc.collect()
    _release_free_memory()
    if MEMORY_METHOD.startswith("VmHWM"):
        before = _status_kb("VmRSS")
        _reset_peak_rss()
        fn()
        return max(_status_kb("VmHWM") - before, 0) / 1024
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    fn()
    return (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024


def _summary(times: list[float]) -> dict[str, float]:
    ordered = sorted(times)
    mid = len(ordered) // 2
    median = ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
    return {"median_ms": median * 1e3, "min_ms": ordered[0] * 1e3, "max_ms": ordered[-1] * 1e3}


def measure(
    variants: dict[str, Callable[[], Any]], reps: int, memory: bool = True
) -> dict[str, dict[str, Any]]:
    """Time each zero-argument callable: warm-up, (peak memory), then `reps` alternating runs.

    Returns {variant: {"warmup_s", "median_ms", "min_ms", "max_ms", "reps", "peak_mb"?}}.
    """
    if reps < 1:
        raise ValueError(f"benchmarks: reps must be >= 1, got {reps}")
    results: dict[str, dict[str, Any]] = {}
    if variant_filter is not None:
        skipped = [name for name in variants if not variant_filter(name)]
        nan = float("nan")
        for name in skipped:
            results[name] = dict(warmup_s=nan, median_ms=nan, min_ms=nan, max_ms=nan, reps=0)
            if memory:
                results[name]["peak_mb"] = nan
        variants = {name: fn for name, fn in variants.items() if name not in skipped}
    for name, fn in variants.items():
        start = time.perf_counter()
        fn()
        results[name] = {"warmup_s": time.perf_counter() - start}
        if memory:
            results[name]["peak_mb"] = peak_memory_mb(fn)
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(reps):
        for name, fn in variants.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    for name in variants:
        results[name].update(_summary(times[name]), reps=reps)
    return results


def run_worker(command: Sequence[str], threads: int, what: str) -> dict:
    """Run one measurement in a fresh process of its own, as a user gets it: `command` prints a
    JSON line last. Its threads are set through the usual variables; OPENBLAS_CORETYPE and
    OPENBLAS_L2_SIZE are unset (some machines set them, and they slow a current numpy: OpenBLAS
    then picks its kernel for the CPU). Run from the repository root (`-m benchmarks.x` works)."""
    env = {
        k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
    }
    n = str(threads)
    env.update(OMP_NUM_THREADS=n, OPENBLAS_NUM_THREADS=n, NUMBA_NUM_THREADS=n)
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run(
        list(command), env=env, cwd=root, capture_output=True, text=True, check=False
    )
    if out.returncode:
        raise RuntimeError(f"{what} worker failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])
