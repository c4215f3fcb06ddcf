"""Run the selected suites under one set of conditions and collect one results dict."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from benchmarks import ddp, suites, system
from benchmarks.configs import FLOPS_FORMULA, STANDARD, BenchConfig
from benchmarks.timing import MEMORY_METHOD

# Suite name -> runner(ctx, configs). A new suite registers here and adds its table in report.py.
SUITES: dict[str, Callable[[suites.Context, list[BenchConfig]], list[dict[str, Any]]]] = {
    "ops": lambda ctx, configs: suites.ops_suite(ctx, configs[-1]),
    "kernels": lambda ctx, configs: suites.kernels_suite(ctx),
    "train": lambda ctx, configs: suites.train_suite(ctx, configs),
    "generate": lambda ctx, configs: suites.generate_suite(
        ctx, configs[-1], suites.decode_contexts(configs[-1], ctx.quick)
    ),
    # tokens/s at 1 and 2 MPI ranks (needs glassgrad[mpi]); run on request only: it starts jobs
    "ddp": lambda ctx, configs: ddp.ddp_suite(ctx, configs[-1]),
}
DEFAULT_SUITES = ["ops", "kernels", "train", "generate"]


def run_benchmarks(
    suite_names: list[str],
    configs: list[BenchConfig] | None = None,
    quick: bool = False,
    reps: int | None = None,
    threads: int | None = None,
    use_torch: bool = True,
    log: Callable[[str], None] = print,
    reexec_from: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run `suite_names` and return the results (the structure --json writes).

    configs: the training configs; ops and generate use the last one (default: tiny, mid, small;
    quick: tiny). reps: timed repetitions per variant (default 7, quick 3). threads: BLAS, Numba
    and torch threads (default: leave each library's own default). use_torch=False skips the
    PyTorch columns even when torch is installed.
    """
    unknown = [s for s in suite_names if s not in SUITES]
    if unknown:
        raise ValueError(f"benchmarks: unknown suite(s) {unknown}; known: {', '.join(SUITES)}")
    if configs is None:
        configs = [STANDARD["tiny"]] if quick else list(STANDARD.values())
    reps = reps if reps is not None else (3 if quick else 7)
    torch = system.torch_module() if use_torch else None
    system.set_threads(threads)
    started = time.perf_counter()
    log("measuring the sgemm peak")
    sgemm = system.sgemm_peak(n=512 if quick else 2048, reps=5 if quick else 10)
    ctx = suites.Context(reps=reps, quick=quick, torch=torch, sgemm_gflops=sgemm["gflops"], log=log)
    results: dict[str, Any] = {
        "environment": system.environment(reexec_from),
        "quick": quick,
        "reps": reps,
        "torch_used": torch is not None,
        "flops_formula": FLOPS_FORMULA,
        "memory_method": MEMORY_METHOD,
        "sgemm": sgemm,
        "suites": {},
    }
    for name in suite_names:
        log(f"suite {name}")
        suite_start = time.perf_counter()
        results["suites"][name] = SUITES[name](ctx, configs)
        log(f"suite {name}: {time.perf_counter() - suite_start:.1f} s")
    records = [r for rs in results["suites"].values() for r in rs]
    results["targets"] = suites.summarize_targets(records)
    results["total_s"] = time.perf_counter() - started
    results["environment"]["load_average_1min_at_end"] = system.load_average()
    return results
