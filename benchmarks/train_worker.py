"""One framework's training step, timed in a fresh process, as a user would run it.

    python -m benchmarks.train_worker --framework torch --config mid --threads 2   # prints JSON

The fair train suite (benchmarks/suites.py) starts this once per framework and round, so nothing
else is timed in the process: no warm heap from another variant, no second OpenMP runtime. Every
framework starts from the same weights (a glassgrad GPT built with rng 0) and the same batch, and
runs the same step: forward, mean cross-entropy, backward, AdamW (lr 1e-4, weight decay 0.01 on
every parameter), gradients cleared. Printed: the step times after the warm-up, the step-0 loss,
the warm-up (first call: tracing, JIT compilation) and the resident memory (VmRSS / VmHWM).

Frameworks: glassgrad (autograd.compile, default fusion), glassgrad-eager,
glassgrad-torch-first (compiled, with torch imported before glassgrad), torch (eager),
torch.compile, jax (jax.jit of the whole step).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

FRAMEWORKS = (
    "glassgrad",
    "glassgrad-eager",
    "glassgrad-torch-first",
    "torch",
    "torch.compile",
    "jax",
)
LR, WEIGHT_DECAY = 1e-4, 0.01


def rss_mb(field: str = "VmRSS") -> float:
    """This process's resident memory (VmRSS) or its high-water mark (VmHWM), MiB (Linux)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def _glassgrad_step(config: Any, threads: int | None, compiled: bool) -> tuple[Callable, Any]:

    import autograd
    import nn
    from benchmarks import system
    from benchmarks.configs import training_step
    from benchmarks.suites import _batch, bench_model

    system.set_threads(threads)
    model = bench_model(config)
    optimizer = nn.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    x, y = _batch(config)

    step = training_step(model, optimizer)

    run = autograd.compile(step) if compiled else step

    def once() -> float:
        return float(run(x, y).item())

    once.plan = lambda: run.plan_for(x, y) if compiled else None
    return once, model


def _torch_step(config: Any, threads: int | None, compiled: bool) -> tuple[Callable, Any]:
    import torch

    from benchmarks.suites import _batch, bench_model
    from benchmarks.torch_ref import from_glassgrad

    if threads is not None:
        torch.set_num_threads(threads)
    tmodel = from_glassgrad(bench_model(config))
    optimizer = torch.optim.AdamW(tmodel.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    x, y = (torch.from_numpy(a) for a in _batch(config))

    def step(x: Any, y: Any) -> Any:
        _, loss = tmodel(x, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    run = torch.compile(step) if compiled else step
    return (lambda: float(run(x, y))), tmodel


def _jax_step(config: Any, threads: int | None) -> tuple[Callable, Any]:
    from benchmarks import jax_ref
    from benchmarks.suites import _batch, bench_model

    model = bench_model(config)
    step = jax_ref.train_step(model, _batch(config), lr=LR, weight_decay=WEIGHT_DECAY)
    return step, model


def _set_blas_threads(threads: int | None) -> None:
    if threads is not None:
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=threads)


def _import_framework(framework: str) -> None:
    """Import what the framework needs before the baseline RSS is read, so that the memory
    figure is the model's, the optimizer's and the step's, not the libraries' (torch's are
    several hundred MiB)."""
    if framework.startswith("glassgrad"):
        import autograd.functional  # noqa: F401
        import autograd.kernels
        import models.architectures.gpt  # noqa: F401

        # Numba's compiler starts here, with the imports (as torch's libraries load with its
        # import), not inside the first step's trace + plan figure
        autograd.kernels.load_numba()
        import nn  # noqa: F401
    elif framework.startswith("torch"):
        import benchmarks.torch_ref  # noqa: F401  (imports torch)
    elif framework == "jax":
        import benchmarks.jax_ref  # noqa: F401  (imports jax)


def run(framework: str, config_name: str, threads: int | None, steps: int, warmup: int) -> dict:
    """Build the framework's step, run warm-up + timed steps; the figures as a dict."""
    import_start = time.perf_counter()
    if framework == "glassgrad-torch-first":
        import torch  # noqa: F401  (first, as in a notebook that uses both)
    if framework == "jax" and threads is not None:
        # XLA's CPU client reads its thread pool size from here, once, when jax starts.
        flags = f"--xla_cpu_multi_thread_eigen=true intra_op_parallelism_threads={threads}"
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flags).strip()
    from benchmarks.configs import parse_config

    config = parse_config(config_name)
    _set_blas_threads(threads)
    _import_framework(framework)
    baseline_mb = rss_mb()  # the interpreter, numpy and the framework's own imports
    if framework.startswith("glassgrad"):
        step, _ = _glassgrad_step(config, threads, compiled=framework != "glassgrad-eager")
    elif framework in ("torch", "torch.compile"):
        step, _ = _torch_step(config, threads, compiled=framework == "torch.compile")
    elif framework == "jax":
        step, _ = _jax_step(config, threads)
    else:
        raise SystemExit(f"train_worker: unknown framework {framework!r}; known: {FRAMEWORKS}")
    start = time.perf_counter()
    loss0 = step()
    first_s = time.perf_counter() - start
    for _ in range(warmup - 1):
        step()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    plan = getattr(step, "plan", lambda: None)()
    return {
        "trace_plan_s": None if plan is None else plan.trace_s + plan.plan_s,
        "framework": framework,
        "config": config_name,
        "loss0": loss0,
        "first_step_s": first_s,
        "step_ms": [t * 1e3 for t in times],
        "baseline_rss_mb": baseline_mb,
        "peak_rss_mb": rss_mb("VmHWM"),
        "import_and_setup_s": time.perf_counter() - import_start - sum(times) - first_s,
        "load_average": os.getloadavg()[0],
    }


def main(argv: list[str] | None = None) -> int:
    first_paragraph = " ".join(__doc__.split("\n\n")[0].split())
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.train_worker", description=first_paragraph
    )
    p.add_argument("--framework", choices=FRAMEWORKS, required=True)
    p.add_argument("--config", default="tiny")
    p.add_argument("--threads", type=int)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    args = p.parse_args(argv)
    result = run(args.framework, args.config, args.threads, args.steps, max(args.warmup, 1))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
