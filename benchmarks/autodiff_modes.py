"""Forward mode and activation checkpointing, measured on a GPT (docs/benchmarks.md).

    python -m benchmarks.autodiff_modes hvp --config small          # forward over reverse vs
                                                                    # reverse over reverse
    python -m benchmarks.autodiff_modes jvp --config small          # the JVP rules vs the
                                                                    # transpose trick
    python -m benchmarks.autodiff_modes checkpoint --config small   # a training step with and
                                                                    # without checkpointed blocks

Each variant runs in a fresh process of its own (`--procs` processes per variant, alternating
A B A B ...); each process times a warm-up call, one call for its peak memory (the resident
memory the call adds, benchmarks.timing.peak_memory_mb) and `--reps` timed calls, and reports its
median. The table gives the median over the processes of: the time per call; the process's
resident peak during a call (model, optimizer state, a compiled step's arena and what the call
adds); what the call added; and the process's overall peak RSS, which also holds the first call
(a compiled step's trace runs eagerly and keeps the traced tensors).

- hvp: H v of the mean cross-entropy with respect to all parameters, for a random v:
  `autograd.hvp` (forward over reverse: tangents through one forward and one backward) against
  `higher_order.hvp_by_double_backward` (the gradient of <grad L, v>: a recorded backward, then a
  backward through it).
- jvp: J v of the logits with respect to the residual stream entering the first block (the
  blocks, the final LayerNorm and the head as a function of a (B, T, C) input; parameters fixed):
  `autograd.jvp` (the rules, one forward pass) against `higher_order.jvp_by_transpose` (two
  reverse passes), and the plain forward for scale.
- checkpoint: zero_grad, forward, loss, backward, AdamW, eager and compiled (fusion on, one
  shard: a checkpointed step is not sharded, so neither is its reference), with
  GPTConfig.gradient_checkpointing off and on.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

import numpy as np

VARIANTS = {
    "hvp": ["forward_over_reverse", "reverse_over_reverse"],
    "jvp": ["rules", "transpose_trick", "forward_only"],
    "checkpoint": ["eager", "eager_checkpointed", "compiled", "compiled_checkpointed"],
}


# `--config smollm2-135m`: SmolLM2-135M's Llama shape (benchmarks.llm) at T 256, batch 2
SMOLLM2_TRAIN = "V49152/T256/L30/H9/C576/B2"


def _model(config_text: str, checkpointing: bool = False) -> tuple[Any, Any, np.ndarray, Any]:
    from benchmarks.configs import parse_config
    from benchmarks.llm import SMOLLM2_135M
    from models.architectures.gpt import GPT
    from models.architectures.llama import Llama, llama_config

    if config_text == "smollm2-135m":
        bench = parse_config(SMOLLM2_TRAIN)
        config = llama_config(**{**SMOLLM2_135M, "block_size": bench.block_size})
        config.gradient_checkpointing = checkpointing
        model = Llama(config, rng=np.random.default_rng(0))
    else:
        bench = parse_config(config_text)
        config = bench.gpt_config()
        config.gradient_checkpointing = checkpointing
        model = GPT(config, rng=np.random.default_rng(0))
    rng = np.random.default_rng(1)
    shape = (bench.batch_size, bench.block_size)
    return (
        model,
        bench,
        rng.integers(0, bench.vocab_size, shape),
        rng.integers(0, bench.vocab_size, shape),
    )


def _calls(kind: str, variant: str, config_text: str) -> tuple[Any, dict[str, Any]]:
    """The zero-argument call that `variant` times, and facts to report beside it."""
    import autograd
    import nn
    from autograd.higher_order import hvp_by_double_backward, jvp_by_transpose
    from benchmarks.configs import training_step

    model, bench, x, y = _model(config_text, checkpointing=variant.endswith("checkpointed"))
    params = list(model.parameters())
    facts: dict[str, Any] = {"parameters": sum(p.size for p in params)}
    if kind == "hvp":
        rng = np.random.default_rng(2)
        v = [rng.standard_normal(p.shape).astype(p.dtype) for p in params]

        def loss(*_: Any) -> Any:
            return model(x, y)[1]

        hvp = autograd.hvp if variant == "forward_over_reverse" else hvp_by_double_backward
        return (lambda: hvp(loss, params, v)), facts
    if kind == "jvp":
        for p in params:
            p.requires_grad = False  # J v with respect to the input only
        t = model.transformer

        def body(h: Any) -> Any:
            for block in t.h:
                h = block(h)
            return nn.linear(t.ln_f(h), t.wte.weight.T)

        with autograd.no_grad():
            h0 = (t.wte(x) + t.wpe(np.arange(bench.block_size))).data
        v = np.random.default_rng(2).standard_normal(h0.shape).astype(h0.dtype)
        if variant == "forward_only":
            return (lambda: body(autograd.Tensor(h0))), facts
        jvp = autograd.jvp if variant == "rules" else jvp_by_transpose
        return (lambda: jvp(body, (h0,), (v,))), facts
    optimizer = nn.optim.AdamW(params, lr=1e-4)

    step = training_step(model, optimizer)

    if variant.startswith("compiled"):
        compiled = autograd.compile(step, shards=1)

        def call() -> Any:
            out = compiled(x, y)
            plan = compiled.plan_for(x, y)
            facts["arena_mib"] = round(plan.arena.nbytes / 2**20, 1)
            facts["arena_peak_live_mib"] = round(plan.arena.peak_live / 2**20, 1)
            return out

        return call, facts
    return (lambda: step(x, y)), facts


def worker(kind: str, variant: str, config_text: str, reps: int) -> dict[str, Any]:
    """One process's figures for one variant (printed as one JSON line)."""
    from benchmarks.system import blas_info, set_threads
    from benchmarks.timing import _status_kb, peak_memory_mb

    set_threads(None)  # (starts Numba's threads before anything spins them)
    call, facts = _calls(kind, variant, config_text)
    start = time.perf_counter()
    call()
    warmup_s = time.perf_counter() - start
    peak_mb = peak_memory_mb(call)  # (resets the peak counter before the call)
    call_peak_mib = (_status_kb("VmHWM") or 0) / 1024
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    blas = [f"{b['internal_api']} {b['architecture']} x{b['num_threads']}" for b in blas_info()]
    return {
        "variant": variant,
        "median_ms": 1e3 * statistics.median(times),
        "min_ms": 1e3 * min(times),
        "warmup_s": warmup_s,
        "peak_added_mib": peak_mb,
        "call_peak_rss_mib": call_peak_mib,  # the process's resident peak during that call
        "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "blas": ", ".join(blas),
        **facts,
    }


def main(argv: list[str] | None = None) -> None:
    first_paragraph = " ".join(__doc__.split("\n\n")[0].split())
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.autodiff_modes", description=first_paragraph
    )
    parser.add_argument("kind", choices=sorted(VARIANTS))
    parser.add_argument(
        "--config",
        default="small",
        help="tiny, mid, small, V../T../L../... (a GPT) or smollm2-135m (Llama, T 256, B 2)",
    )
    parser.add_argument("--procs", type=int, default=3, help="fresh processes per variant")
    parser.add_argument("--reps", type=int, default=3, help="timed calls per process")
    parser.add_argument("--variants", help="comma-separated subset of the kind's variants")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.kind, args.worker, args.config, args.reps)))
        return
    variants = args.variants.split(",") if args.variants else VARIANTS[args.kind]
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    for _ in range(args.procs):
        for v in variants:  # alternating: a burst of load hits every variant alike
            command = [sys.executable, "-m", "benchmarks.autodiff_modes", args.kind]
            command += ["--config", args.config, "--reps", str(args.reps), "--worker", v]
            done = subprocess.run(command, capture_output=True, text=True, check=True)
            runs[v].append(json.loads(done.stdout.strip().splitlines()[-1]))
    first = runs[variants[0]][0]
    print(
        f"{args.kind}, config {args.config} ({first['parameters']:,} parameters), {args.procs} "
        f"processes x {args.reps} calls per variant; BLAS: {first['blas']}"
    )
    print(
        "| variant | median ms (per process) | fastest call ms | peak RSS during a call, MiB | of "
        "which the call added | max RSS incl. warm-up / trace, MiB | extra |"
    )
    print("|---|---|---|---|---|---|---|")
    for v in variants:
        rs = runs[v]
        medians = [r["median_ms"] for r in rs]
        extra = {k: rs[0][k] for k in ("arena_mib", "arena_peak_live_mib") if k in rs[0]}
        print(
            f"| {v} | **{statistics.median(medians):.0f}** "
            f"({', '.join(f'{m:.0f}' for m in medians)}) "
            f"| {min(r.get('min_ms', r['median_ms']) for r in rs):.0f} "
            f"| {statistics.median(r['call_peak_rss_mib'] for r in rs):.0f} "
            f"| {statistics.median(r['peak_added_mib'] for r in rs):.0f} "
            f"| {statistics.median(r['max_rss_mib'] for r in rs):.0f} "
            f"| {', '.join(f'{k} {val}' for k, val in extra.items())} |"
        )


if __name__ == "__main__":
    main()
