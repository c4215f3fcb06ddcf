"""What machine the figures come from: CPU, BLAS build and kernel, threads, and the sgemm peak.

Everything here is measured or read in the benchmarking process itself, so the report states the
conditions the timings were taken under (same threads for BLAS, Numba and PyTorch).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import sys
import time
from typing import Any

import numpy as np

# OpenBLAS reads these once, when numpy loads it; OPENBLAS_CORETYPE forces one kernel (e.g. the
# generic "Prescott" one), which can be several times slower than the one OpenBLAS would pick.
BLAS_ENV_VARS = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


def cpu_name() -> str:
    """The CPU model from /proc/cpuinfo (Linux), else what platform knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def blas_info() -> list[dict[str, Any]]:
    """threadpoolctl's view of the loaded BLAS / OpenMP libraries (kernel architecture, threads)."""
    from threadpoolctl import threadpool_info

    keys = ("user_api", "internal_api", "prefix", "version", "architecture", "num_threads")
    return [{k: info.get(k) for k in keys} for info in threadpool_info()]


def set_threads(n: int | None) -> None:
    """Use n threads in BLAS (all pools threadpoolctl sees), Numba and PyTorch (if loaded).

    None leaves every library at its default. The BLAS limit is process-wide and stays set.
    """
    from autograd.kernels import start_threads

    # First, before anything calls numba.get/set_num_threads: that would launch the OpenMP
    # workers spinning, and a spinning worker slowed the tiny training step from 22 to 37 ms.
    start_threads()
    if n is None:
        return
    if n < 1:
        raise ValueError(f"benchmarks: --threads must be >= 1, got {n}")
    import numba
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=n)
    numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
    torch = sys.modules.get("torch")  # only where torch runs: importing it here would load it
    if torch is not None:
        torch.set_num_threads(n)


def torch_module():
    """The torch module when it is installed (an optional extra), else None."""
    try:
        import torch
    except ImportError:
        return None
    return torch


def torch_installed() -> bool:
    """Whether torch can be imported, without importing it."""
    return importlib.util.find_spec("torch") is not None


def thread_counts() -> dict[str, int | None]:
    import numba

    blas = [info["num_threads"] for info in blas_info() if info["user_api"] == "blas"]
    torch = sys.modules.get("torch")
    return {
        "blas": blas[0] if blas else None,
        "numba": numba.get_num_threads(),
        "torch": torch.get_num_threads() if torch is not None else None,
    }


def environment(reexec_from: dict[str, str] | None = None) -> dict[str, Any]:
    """The header of every report: date, machine, library versions, BLAS kernel, threads."""
    import numba

    blas_env = {name: os.environ.get(name) for name in BLAS_ENV_VARS}
    return {
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "cpu": cpu_name(),
        "logical_cpus": os.cpu_count(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "numba": numba.__version__,
        "torch": importlib.metadata.version("torch") if torch_installed() else None,
        "blas": blas_info(),
        "blas_env": blas_env,
        "blas_env_removed_by_reexec": reexec_from or {},
        "threads": thread_counts(),
        "load_average_1min": load_average(),
    }


def load_average() -> float | None:
    """The 1-minute load average: other processes competing for the cores skew the timings."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def blas_env_warning() -> str | None:
    """A warning with the exact command to use when OpenBLAS tuning variables are set."""
    present = [name for name in BLAS_ENV_VARS if os.environ.get(name)]
    if not present:
        return None
    setting = ", ".join(f"{name}={os.environ[name]}" for name in present)
    unset = " ".join(f"-u {name}" for name in BLAS_ENV_VARS)
    return (
        f"warning: {setting} is set, so OpenBLAS runs a forced kernel, not the one it would pick "
        f"for this CPU. For a user's figures run: env {unset} python -m benchmarks ..."
    )


def sgemm_peak(n: int, reps: int) -> dict[str, Any]:
    """Best GFLOP/s of a float32 (n, n) @ (n, n) np.matmul: the practical ceiling for the models.

    2 n^3 flops per product; the best of `reps` timed runs after one warm-up (the peak is what
    the hardware and BLAS can reach, so the minimum time is the honest estimate).
    """
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    out = np.empty((n, n), dtype=np.float32)
    np.matmul(a, b, out=out)
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        np.matmul(a, b, out=out)
        times.append(time.perf_counter() - start)
    best = min(times)
    return {
        "n": n,
        "reps": reps,
        "best_ms": best * 1e3,
        "median_ms": float(np.median(times)) * 1e3,
        "gflops": 2.0 * n**3 / best / 1e9,
    }
