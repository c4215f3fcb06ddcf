"""`python -m benchmarks.ddp`: training tokens/s at 1 and 2 MPI ranks and the scaling efficiency.

    python -m benchmarks.ddp                          # the demo model, 5 alternating repetitions
    python -m benchmarks.ddp --config mid --reps 3 --ranks 1 2 4 --json ddp.json

Each measurement is one `mpiexec -n N python -m benchmarks.ddp --worker ...` job: every rank runs
full data-parallel training steps (models.training.step.EagerTrainStep with
models.ddp.DataParallel: forward, backward, one Allreduce, clipping, AdamW) on its share of the
same global batch, with 1 BLAS and 1 Numba thread, so N ranks use N cores. After untimed warm-up
steps (Numba cache loading, first-touch allocations) the ranks meet at a barrier and rank 0 times
the next steps to the closing barrier.
Jobs alternate between the rank counts (1, 2, 1, 2, ...) so that load from other processes on a
shared machine hits all alike; the figures are medians over the repetitions.

scaling efficiency = tokens/s with N ranks / (N * tokens/s with 1 rank): 1.0 is perfect scaling.

benchmarks.runner can run this as a suite: ddp_suite(ctx, config) returns one record.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from statistics import median
from typing import Any

import numpy as np

from benchmarks.configs import BenchConfig, parse_config

# The demo model of `python -m models.train` (its character vocabulary has about 100 symbols).
DEMO = BenchConfig("demo", 100, 64, 4, 4, 128, 16)
# One thread per rank for every pool that would otherwise take all cores.
ONE_THREAD_ENV = {
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "NUMBA_NUM_THREADS": "1",
}
ROOT = Path(__file__).resolve().parents[1]
JOB_TIMEOUT_S = 600


def _worker(config: BenchConfig, steps: int, warmup: int) -> None:
    """One rank of a measurement job; rank 0 prints the result as one JSON line."""
    import nn
    from models import ddp
    from models.gpt import GPT
    from models.training.step import EagerTrainStep

    comm = ddp._mpi().COMM_WORLD
    rank, world = comm.Get_rank(), comm.Get_size()
    with ddp.abort_on_error(comm):
        model = GPT(config.gpt_config(), rng=np.random.default_rng(0))
        for p in model.parameters():  # benchmark float32 whatever the default dtype
            p.data = p.data.astype(np.float32)
        optimizer = nn.optim.AdamW(model.parameters(), lr=1e-4)
        replicas = ddp.DataParallel(comm)
        replicas.start(model, optimizer, {"batch_size": config.batch_size, "dropout": 0.0}, 0)
        reducer = replicas.reducer
        data = np.random.default_rng(0).integers(
            0, config.vocab_size, size=(config.batch_size, config.block_size + 1)
        )
        batch = data[rank::world, :-1], data[rank::world, 1:]

        def loss_fn(x: np.ndarray, y: np.ndarray) -> Any:
            return model(x, y)[1]

        train_step = EagerTrainStep(loss_fn, optimizer, 1.0, replicas=replicas)
        for _ in range(warmup):
            train_step(batch, 1e-4)
        comm.Barrier()
        began = time.perf_counter()
        for _ in range(steps):
            train_step(batch, 1e-4)
        comm.Barrier()
        seconds = time.perf_counter() - began
        # The Allreduce alone (pack, sum, unpack), for the cost model in docs/ddp.md.
        comm.Barrier()
        began = time.perf_counter()
        for _ in range(steps):
            reducer(0.0)
        allreduce_s = (time.perf_counter() - began) / steps
    if rank == 0:
        tokens = steps * config.batch_size * config.block_size
        result = {
            "ranks": world,
            "steps": steps,
            "seconds": seconds,
            "ms_per_step": seconds / steps * 1e3,
            "tokens_per_s": tokens / seconds,
            "allreduce_bytes": reducer.nbytes,
            "allreduce_ms": allreduce_s * 1e3,
            "n_params": sum(p.data.size for p in model.parameters()),
        }
        print("RESULT " + json.dumps(result), flush=True)


def run_job(config: BenchConfig, ranks: int, steps: int, warmup: int) -> dict[str, Any]:
    """One `mpiexec -n ranks` measurement job; its rank 0 result."""
    from models.ddp import mpiexec_command

    command = [
        *mpiexec_command(ranks),
        sys.executable,
        "-m",
        "benchmarks.ddp",
        "--worker",
        "--config",
        config.describe(),
        "--steps",
        str(steps),
        "--warmup",
        str(warmup),
    ]
    env = {**os.environ, **ONE_THREAD_ENV, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=JOB_TIMEOUT_S
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or len(lines) != 1:
        raise RuntimeError(
            f"benchmarks.ddp: `{' '.join(command)}` failed (exit {proc.returncode}):\n"
            f"{proc.stdout}{proc.stderr}"
        )
    return json.loads(lines[0].removeprefix("RESULT "))


def measure(
    config: BenchConfig,
    ranks: tuple[int, ...] = (1, 2),
    reps: int = 5,
    steps: int = 20,
    warmup: int = 3,
    log: Any = print,
) -> dict[str, Any]:
    """tokens/s per rank count (median of `reps` alternating jobs) and the scaling efficiency
    against 1 rank. ranks must include 1."""
    if 1 not in ranks:
        raise ValueError(f"benchmarks.ddp: ranks must include 1 (the baseline), got {ranks}")
    runs: dict[int, list[dict[str, Any]]] = {n: [] for n in ranks}
    for rep in range(reps):
        for n in ranks:
            result = run_job(config, n, steps, warmup)
            runs[n].append(result)
            log(
                f"  ddp {config.name} rep {rep + 1}/{reps}: {n} rank(s) "
                f"{result['tokens_per_s']:,.0f} tokens/s"
            )
    per_ranks = {}
    for n, results in runs.items():
        tps = [r["tokens_per_s"] for r in results]
        ms = [r["ms_per_step"] for r in results]
        per_ranks[str(n)] = {
            "tokens_per_s": median(tps),
            "tokens_per_s_all": tps,
            "median_ms": median(ms),
            "allreduce_ms": median(r["allreduce_ms"] for r in results),
            "min_ms": min(ms),
            "max_ms": max(ms),
            "reps": len(results),
        }
    base = per_ranks["1"]["tokens_per_s"]
    for n, stats in per_ranks.items():
        stats["scaling_efficiency"] = stats["tokens_per_s"] / (int(n) * base)
    first = runs[ranks[0]][0]
    return {
        "config": config.describe(),
        "n_params": first["n_params"],
        "allreduce_bytes": first["allreduce_bytes"],
        "tokens_per_step": config.batch_size * config.block_size,
        "steps_per_job": steps,
        "warmup_steps": warmup,
        "threads_per_rank": 1,
        "cpu_count": os.cpu_count(),
        "load_average_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "ranks": per_ranks,
    }


def ddp_suite(ctx: Any, config: BenchConfig) -> list[dict[str, Any]]:
    """The runner's "ddp" suite: one record for `config` at 1 and 2 ranks (ctx: its Context).

    Variants are "1 rank" and "2 ranks" (median_ms per step, tokens_per_s); ratios has the
    scaling efficiency of 2 ranks. Without MPI (the optional extra) it logs why and returns [].
    """
    from models.ddp import find_mpiexec

    if importlib.util.find_spec("mpi4py") is None or find_mpiexec() is None:
        ctx.log('  ddp: skipped, MPI is not installed (pip install "glassgrad[mpi]")')
        return []
    steps = 5 if ctx.quick else 20
    result = measure(config, (1, 2), reps=ctx.reps, steps=steps, warmup=2, log=ctx.log)
    variants = {
        ("1 rank" if n == "1" else f"{n} ranks"): stats for n, stats in result["ranks"].items()
    }
    params = {k: v for k, v in result.items() if k != "ranks"}
    return [
        {
            "suite": "ddp",
            "name": config.name,
            "params": params,
            "variants": variants,
            "ratios": {"scaling_efficiency": result["ranks"]["2"]["scaling_efficiency"]},
        }
    ]


def text_report(result: dict[str, Any]) -> str:
    """A small table: ranks, ms/step, tokens/s, scaling efficiency."""
    lines = [
        f"data-parallel training, {result['config']} ({result['n_params']:,} parameters, float32; "
        f"Allreduce {result['allreduce_bytes'] / 1e6:.2f} MB per step), 1 BLAS + 1 Numba thread "
        f"per rank, {result['cpu_count']} CPUs, medians of {result['ranks']['1']['reps']} "
        "alternating jobs",
        "",
        "| ranks | ms/step (min-max) | Allreduce alone, ms | tokens/s | scaling efficiency |",
        "|---:|---:|---:|---:|---:|",
    ]
    for n, s in result["ranks"].items():
        lines.append(
            f"| {n} | {s['median_ms']:.1f} ({s['min_ms']:.1f}-{s['max_ms']:.1f}) | "
            f"{s['allreduce_ms']:.2f} | {s['tokens_per_s']:,.0f} | "
            f"{s['scaling_efficiency']:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.ddp",
        description="Training tokens/s at 1 and 2 (or more) MPI ranks, and scaling efficiency.",
    )
    parser.add_argument(
        "--config",
        default=None,
        help="demo (default: the models.train demo shape), tiny, mid, small or "
        "V../T../L../H../C../B..",
    )
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2], help="rank counts")
    parser.add_argument("--reps", type=int, default=5, help="alternating jobs per rank count")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per job")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per job")
    parser.add_argument("--json", metavar="FILE", help="write the result as JSON")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        config = DEMO if args.config in (None, "demo") else parse_config(args.config)
        if args.worker:
            _worker(config, args.steps, args.warmup)
            return 0
        result = measure(
            config,
            tuple(args.ranks),
            args.reps,
            args.steps,
            args.warmup,
            log=lambda msg: print(msg, file=sys.stderr),
        )
    except (ValueError, FileNotFoundError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(text_report(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
