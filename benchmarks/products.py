"""The products of one training step, alone: how long numpy's BLAS and PyTorch's take for them.

    python -m benchmarks.products --config small --shards 2      # prints a markdown table
    python -m benchmarks.products --config small --floor         # the floor against the steps
    python -m benchmarks.products --config smollm2-135m-lora     # benchmarks.finetune's step

A training step is mostly matrix products (Linear forward and backward, attention's batched
q k^T and P v and their backward, over the causal row blocks the fused attention keeps). This
times exactly the products one shard of the compiled step runs (autograd/compile/shard.py:
B / shards rows per thread, BLAS on one thread), each shape as np.matmul with numpy's BLAS on
one thread and as torch.matmul on one thread, each library in a fresh process of its own. The
sum over the step is the floor of a sharded step: its shards run side by side, so the step
cannot take less than one shard's products.

--floor measures that floor as a step meets it: every shard's products at once, one thread each
(as the sharded replay runs them), and the whole batch's products with the library on all the
threads (as PyTorch runs them), with numpy's BLAS and with PyTorch's MKL, against glassgrad's
compiled step and PyTorch's eager step (benchmarks.train_worker), each in a fresh process,
alternated over --rounds rounds.

--config smollm2-135m / smollm2-135m-lora: benchmarks.finetune's step (SmolLM2-135M's shape, B 4
x T 256, full or LoRA); `benchmarks.finetune --floor` puts its floor beside the two steps.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

from autograd import functional as F
from benchmarks.configs import parse_config
from benchmarks.finetune import LORA_RANK, LORA_TARGETS
from benchmarks.llm import SMOLLM2_135M


@dataclass(frozen=True)
class LlamaStep:
    """benchmarks.finetune's step: SmolLM2-135M's shape, batch x block tokens, full or LoRA."""

    name: str
    lora: bool
    batch_size: int = 4
    block_size: int = 256
    vocab_size: int = SMOLLM2_135M["vocab_size"]
    n_layer: int = SMOLLM2_135M["n_layer"]
    n_head: int = SMOLLM2_135M["n_head"]
    n_kv_head: int = SMOLLM2_135M["n_kv_head"]
    n_embd: int = SMOLLM2_135M["n_embd"]
    ffn_hidden: int = SMOLLM2_135M["ffn_hidden"]

    def describe(self) -> str:
        return (f"SmolLM2-135M shape, {'LoRA r ' + str(LORA_RANK) if self.lora else 'full'}, "
                f"B{self.batch_size} x T{self.block_size}")  # fmt: skip


LLAMA_STEPS = {"smollm2-135m": LlamaStep("smollm2-135m", lora=False),
               "smollm2-135m-lora": LlamaStep("smollm2-135m-lora", lora=True)}  # fmt: skip


def config_named(name: str) -> Any:
    """A GPT BenchConfig (benchmarks.configs.parse_config) or one of LLAMA_STEPS."""
    return LLAMA_STEPS[name] if name in LLAMA_STEPS else parse_config(name)


def step_products(config: Any, shards: int) -> list[tuple[str, int, tuple, tuple, bool, bool]]:
    """(what, count per step, a shape, b shape, transpose a, transpose b) of one shard's step."""
    if isinstance(config, LlamaStep):
        return _llama_products(config, shards)
    m = config.batch_size // shards * config.block_size
    c, v, t = config.n_embd, config.vocab_size, config.block_size
    heads = config.batch_size // shards * config.n_head
    d = c // config.n_head
    out = []
    layer = [
        ("c_attn", c, 3 * c),
        ("attn c_proj", c, c),
        ("c_fc", c, 4 * c),
        ("mlp c_proj", 4 * c, c),
    ]
    for name, k, n in [*layer, ("lm head", c, v)]:
        count = config.n_layer if name != "lm head" else 1
        out.append((f"{name} forward x W", count, (m, k), (k, n), False, False))
        out.append((f"{name} dX = g W^T", count, (m, n), (k, n), False, True))
        out.append((f"{name} dW = x^T g", count, (m, k), (m, n), True, False))
    return out + _attention_products(config.n_layer, heads, t, d)


def _attention_products(layers: int, heads: int, t: int, d: int) -> list[tuple]:
    """The fused attention's products over its causal row blocks, forward and backward."""
    out = []
    for r0, r1 in F._row_blocks(t, causal=True):  # as the fused attention skips the future
        rows, where = r1 - r0, f" rows {r0}:{r1}" if (r0, r1) != (0, t) else ""
        qk = (heads, rows, d), (heads, r1, d), False, True
        pv = (heads, rows, r1), (heads, r1, d), False, False
        ptg = (heads, t - r0, rows), (heads, t - r0, d), True, False
        out.append((f"attention q k^T, dP = g v^T{where}", 2 * layers, *qk))
        out.append((f"attention P v, dS k{where}", 2 * layers, *pv))
        out.append((f"attention P^T g, dS^T q{where}", 2 * layers, *ptg))
    return out


def _llama_products(s: LlamaStep, shards: int) -> list[tuple]:
    """One shard's products of the Llama step: the seven projections of each layer, the tied
    head, the attention (grouped K/V heads cost what H heads do). LoRA: no weight gradients but
    the adapters' (rank r detours on LORA_TARGETS), and layer 0's q/k/v need no input gradient
    (the embedding and the norm before them are frozen)."""
    m, L, r = s.batch_size // shards * s.block_size, s.n_layer, LORA_RANK
    c, d, f = s.n_embd, s.n_embd // s.n_head, s.ffn_hidden
    q, kv = s.n_head * d, s.n_kv_head * d
    layer = [("q_proj", c, q), ("k_proj", c, kv), ("v_proj", c, kv), ("o_proj", q, c),
             ("gate_proj", c, f), ("up_proj", c, f), ("down_proj", f, c)]  # fmt: skip
    out = []
    for name, k, n in layer:
        dx = L - 1 if s.lora and name in ("q_proj", "k_proj", "v_proj") else L
        out.append((f"{name} forward x W", L, (m, k), (k, n), False, False))
        out.append((f"{name} dX = g W^T", dx, (m, n), (k, n), False, True))
        if not s.lora:
            out.append((f"{name} dW = x^T g", L, (m, k), (m, n), True, False))
        elif name in LORA_TARGETS:
            out.append((f"{name} LoRA h = x A", L, (m, k), (k, r), False, False))
            out.append((f"{name} LoRA h B", L, (m, r), (r, n), False, False))
            out.append((f"{name} LoRA dB = h^T g", L, (m, r), (m, n), True, False))
            out.append((f"{name} LoRA dh = g B^T", L, (m, n), (r, n), False, True))
            out.append((f"{name} LoRA dA = x^T dh", L, (m, k), (m, r), True, False))
            out.append((f"{name} LoRA dX += dh A^T", dx, (m, r), (k, r), False, True))
    v = s.vocab_size
    out.append(("lm head forward x W", 1, (m, c), (c, v), False, False))
    out.append(("lm head dX = g W^T", 1, (m, v), (c, v), False, True))
    if not s.lora:
        out.append(("lm head dW = x^T g", 1, (m, c), (m, v), True, False))
    heads = s.batch_size // shards * s.n_head
    return out + _attention_products(L, heads, s.block_size, d)


def product_flops(a_shape: tuple, b_shape: tuple, ta: bool, tb: bool) -> float:
    """2 * batch * rows * inner * cols of op(a) @ op(b), op a transpose of the last two axes."""
    inner = a_shape[-2] if ta else a_shape[-1]
    rows = a_shape[-1] if ta else a_shape[-2]
    cols = b_shape[-2] if tb else b_shape[-1]
    batch = a_shape[0] if len(a_shape) == 3 else 1
    return 2.0 * batch * rows * inner * cols


def _time(fn: Any, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    times.sort()
    return times[len(times) // 2]


def measure(library: str, config_name: str, shards: int, reps: int) -> dict[str, float]:
    """{what: median seconds of one product} for `library` ("numpy" or "torch"), one thread."""
    if library == "torch":
        import torch

        torch.set_num_threads(1)
        matmul = torch.matmul
    else:
        import numpy as np
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=1, user_api="blas")
        matmul = np.matmul
    products = _operands(library, config_named(config_name), shards)
    return {what: _time(lambda a=a, b=b, out=out: matmul(a, b, out=out), reps)
            for what, a, b, out, _ in products}  # fmt: skip


def _operands(
    library: str, config: Any, shards: int, own: bool = False
) -> list[tuple[str, Any, Any, Any, int]]:
    """(what, a, b, out, count per step) of every product of one shard's step, for `library`;
    `own`: each of a product's `count` runs a step as an entry of its own (count 1) with arrays
    of its own."""
    import numpy as np

    rng = np.random.default_rng(0)
    out = []
    for what, times, a_shape, b_shape, ta, tb in step_products(config, shards):
        for count in [1] * times if own else [times]:
            out.append(_product(library, rng, what, count, a_shape, b_shape, ta, tb))
    return out


def _product(library: str, rng: Any, what: str, count: int, a_shape: tuple, b_shape: tuple,
             ta: bool, tb: bool) -> tuple[str, Any, Any, Any, int]:  # fmt: skip
    """One entry of _operands: random a and b (transposed views if ta / tb), an output array."""
    import numpy as np

    a = rng.standard_normal(a_shape, dtype=np.float32)
    b = rng.standard_normal(b_shape, dtype=np.float32)
    if library == "torch":
        import torch

        a, b = torch.from_numpy(a), torch.from_numpy(b)
    a, b = (a.swapaxes(-1, -2) if ta else a), (b.swapaxes(-1, -2) if tb else b)
    c = np.empty(tuple(a.shape[:-1]) + tuple(b.shape[-1:]), np.float32)
    return what, a, b, (torch.from_numpy(c) if library == "torch" else c), count


def measure_step(
    library: str, config_name: str, shards: int, reps: int, whole: bool, own: bool = False
) -> float:
    """Median seconds of all the products of one step, each shard's on a thread of its own,
    all shards at once (as the sharded replay runs them), the library on one thread each; or,
    `whole`, the whole batch's products with the library on `shards` threads (as PyTorch runs
    them). By default a product that a step runs once a layer runs that many times on the same
    arrays, which then stay in the caches; `own`: each time on arrays of its own, as the step's
    layers have their own weights and activations (read from memory, not the caches)."""
    import contextlib
    from concurrent.futures import ThreadPoolExecutor

    config = config_named(config_name)
    threads, shards = (shards, 1) if whole else (1, shards)
    if library == "torch":  # only ever in a worker process of its own
        import torch

        torch.set_num_threads(threads)
        matmul, limits = torch.matmul, contextlib.nullcontext()
    else:
        import numpy as np
        from threadpoolctl import threadpool_limits

        matmul, limits = np.matmul, threadpool_limits(limits=threads, user_api="blas")
    work = [_operands(library, config, shards, own) for _ in range(shards)]

    def shard(s: int) -> None:
        for _, a, b, out, count in work[s]:
            for _ in range(count):
                matmul(a, b, out=out)

    with limits, ThreadPoolExecutor(shards - 1 or 1) as pool:

        def step() -> None:
            others = [pool.submit(shard, s) for s in range(1, shards)]
            shard(0)
            for f in others:
                f.result()

        return _time(step, reps)


def _floor(args: argparse.Namespace) -> int:
    """The products floor beside the two steps, fresh processes, alternated."""
    import statistics

    from benchmarks import system

    config = config_named(args.config)
    peak = system.sgemm_peak(n=2048, reps=10)["gflops"]
    names = [f"{library} products, {how}" for library in ("numpy", "torch")
             for how in ("sharded", "whole batch")]  # fmt: skip
    # the GPT steps (benchmarks.train_worker); the Llama steps: benchmarks.finetune --floor
    steps = [] if isinstance(config, LlamaStep) else ["glassgrad", "torch"]
    names += [f"{framework} step" for framework in steps]
    runs: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(args.rounds):
        for library in ("numpy", "torch"):
            for how in ("sharded", "whole batch"):
                cmd = [sys.executable, "-m", "benchmarks.products", "--worker", library, "--step"]
                cmd += ["--config", args.config, "--shards", str(args.shards)]
                cmd += ["--reps", str(args.reps)] + (["--whole"] if how == "whole batch" else [])
                done = subprocess.run(cmd, capture_output=True, text=True, check=True)
                runs[f"{library} products, {how}"].append(json.loads(done.stdout))
        for framework in steps:
            cmd = [sys.executable, "-m", "benchmarks.train_worker", "--framework", framework]
            cmd += ["--config", args.config, "--threads", str(args.shards)]
            done = subprocess.run(cmd, capture_output=True, text=True, check=True)
            runs[f"{framework} step"].append(
                statistics.median(json.loads(done.stdout)["step_ms"]) / 1e3
            )
    med = {name: statistics.median(v) for name, v in runs.items()}
    print(
        f"{args.config} ({config.describe()}), {args.shards} shards / threads, {args.rounds} "
        f"alternating rounds of fresh processes, medians; sgemm peak {peak:.1f} GFLOP/s\n"
    )
    if not steps:
        print("| what | ms |\n|---|---:|")
        for name in names:
            print(f"| {name} | {1e3 * med[name]:.1f} |")
        return 0
    print("| what | ms | / torch step |")
    print("|---|---:|---:|")
    for name in names:
        print(f"| {name} | {1e3 * med[name]:.1f} | {med[name] / med['torch step']:.2f} |")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="small")
    p.add_argument("--shards", type=int, default=2)
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--floor", action="store_true", help="the floor against the two steps")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--worker", choices=["numpy", "torch"], help=argparse.SUPPRESS)
    p.add_argument("--step", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--whole", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--own", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker and args.step:
        print(
            json.dumps(
                measure_step(args.worker, args.config, args.shards, args.reps, args.whole, args.own)
            )
        )
        return 0
    if args.worker:
        print(json.dumps(measure(args.worker, args.config, args.shards, args.reps)))
        return 0
    if args.floor:
        return _floor(args)
    runs = {}
    for library in ("numpy", "torch"):
        cmd = [sys.executable, "-m", "benchmarks.products", "--worker", library]
        cmd += ["--config", args.config, "--shards", str(args.shards), "--reps", str(args.reps)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        runs[library] = json.loads(done.stdout) if done.returncode == 0 else None
    config = config_named(args.config)
    print(
        f"One shard's products, {args.config} ({config.describe()}), {args.shards} shards, 1 thread"
    )
    print("\n| product | per step | numpy BLAS ms | torch ms | numpy GFLOP/s | torch GFLOP/s |")
    print("|---|---:|---:|---:|---:|---:|")
    totals = {"numpy": 0.0, "torch": 0.0}
    for what, count, a_shape, b_shape, ta, tb in step_products(config, args.shards):
        flops = product_flops(a_shape, b_shape, ta, tb)
        cells = []
        for library in ("numpy", "torch"):
            s = runs[library][what] if runs[library] else None
            if s is not None:
                totals[library] += count * s
            cells.append(s)
        ms = [f"{1e3 * s:.3f}" if s else "-" for s in cells]
        rate = [f"{flops / s / 1e9:.0f}" if s else "-" for s in cells]
        print(f"| {what} {a_shape}{'^T' if ta else ''} @ {b_shape}{'^T' if tb else ''} | "
              f"{count} | {ms[0]} | {ms[1]} | {rate[0]} | {rate[1]} |")  # fmt: skip
    print(f"\nproducts of one shard's step: numpy {1e3 * totals['numpy']:.1f} ms, torch "
          f"{1e3 * totals['torch']:.1f} ms")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
