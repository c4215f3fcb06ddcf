"""Run the selected suites under one set of conditions and collect one results dict."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from benchmarks import ddp, suites, system, timing, tokenizer
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
    # BPE training and encoding on the demo corpus; on request only (no model, no torch column)
    "tokenizer": lambda ctx, configs: tokenizer.tokenizer_suite(ctx),
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
    torch_only: bool = False,
) -> dict[str, Any]:
    """Run `suite_names` and return the results (the structure --json writes).

    configs: the training configs; ops and generate use the last one (default: tiny, mid, small;
    quick: tiny). reps: timed repetitions per variant (default 7, quick 3). threads: BLAS, Numba
    and torch threads (default: leave each library's own default). use_torch=False skips the
    PyTorch columns even when torch is installed.

    PyTorch runs in a second process (torch_only=True there), never beside the Numba kernels:
    both bring an OpenMP runtime under the same name (libgomp.so.1), and in one process the
    second one loaded binds to the first one's, with its thread settings. Measured on the 2-core
    machine: a (1024, 384) Numba LayerNorm took 2.5 ms instead of 0.18 ms with torch imported
    first, and torch's attention fwd+bwd took 36 ms instead of 12 ms with Numba's runtime first.
    """
    unknown = [s for s in suite_names if s not in SUITES]
    if unknown:
        raise ValueError(f"benchmarks: unknown suite(s) {unknown}; known: {', '.join(SUITES)}")
    if configs is None:
        configs = [STANDARD["tiny"]] if quick else list(STANDARD.values())
    reps = reps if reps is not None else (3 if quick else 7)
    torch = system.torch_module() if torch_only else None
    timing.variant_filter = (lambda name: "torch" in name) if torch_only else None
    system.set_threads(threads)
    started = time.perf_counter()
    log("measuring the sgemm peak")
    sgemm = system.sgemm_peak(n=512 if quick else 2048, reps=5 if quick else 10)
    ctx = suites.Context(
        reps=reps,
        quick=quick,
        torch=torch,
        sgemm_gflops=sgemm["gflops"],
        log=log,
        threads=threads,
        use_torch=use_torch,
    )
    results: dict[str, Any] = {
        "environment": system.environment(reexec_from),
        "quick": quick,
        "reps": reps,
        "torch_used": False,
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
    if names_for_torch(suite_names) and use_torch and not torch_only and system.torch_installed():
        log("PyTorch variants, in a separate process")
        names = [n for n in names_for_torch(suite_names) if n != "tokenizer"]
        merge_torch(results, _torch_process(names, configs, quick, reps, threads))
    records = [r for rs in results["suites"].values() for r in rs]
    if any("torch" in r["variants"] for r in results["suites"].get("train", [])):
        results["torch_used"] = True
    results["targets"] = suites.summarize_targets(records)
    results["total_s"] = time.perf_counter() - started
    results["environment"]["load_average_1min_at_end"] = system.load_average()
    return results


def names_for_torch(suite_names: list[str]) -> list[str]:
    """The suites whose PyTorch variants the torch process times: ddp has none, and train starts
    its own fresh torch processes (suites.train_suite)."""
    return [n for n in suite_names if n not in ("ddp", "train")]


def _torch_process(
    suite_names: list[str],
    configs: list[BenchConfig],
    quick: bool,
    reps: int,
    threads: int | None,
) -> dict[str, Any]:
    """The same suites, timing only the PyTorch variants, in a fresh process (see above)."""
    with tempfile.TemporaryDirectory() as directory:
        out = os.path.join(directory, "torch.json")
        command = [sys.executable, "-m", "benchmarks", "--torch-only", "--quiet", "--json", out]
        command += [f"--suite={name}" for name in suite_names]
        command += [f"--config={c.name if c.name in STANDARD else c.describe()}" for c in configs]
        command += [f"--reps={reps}"] + (["--quick"] if quick else [])
        command += [f"--threads={threads}"] if threads is not None else []
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        with open(out, encoding="utf-8") as f:
            return json.load(f)


def merge_torch(results: dict[str, Any], torch_results: dict[str, Any]) -> None:
    """Put the torch process's variants beside ours and compute the glassgrad/torch ratios."""
    for suite, records in results["suites"].items():
        for mine, theirs in zip(records, torch_results["suites"].get(suite, []), strict=False):
            if mine["name"] != theirs["name"]:
                raise RuntimeError(f"benchmarks: torch process disagrees on {suite} records")
            for name, stats in theirs["variants"].items():
                if "torch" in name:
                    mine["variants"][name] = stats
            v = mine["variants"]
            for ours, torchs in (("numba", "torch"), ("numba cached", "torch cached")):
                if ours in v and torchs in v and not math.isnan(v[torchs]["median_ms"]):
                    mine["ratios"]["vs_torch"] = v[ours]["median_ms"] / v[torchs]["median_ms"]
    results["torch_used"] = True
    threads = torch_results["environment"]["threads"]
    results["environment"]["threads"]["torch"] = threads.get("torch")
    results["environment"]["torch_process"] = "separate (OpenMP runtimes clash in one process)"
