"""The products of one training step, alone: how long numpy's BLAS and PyTorch's take for them.

    python -m benchmarks.products --config small --shards 2      # prints a markdown table

A training step is mostly matrix products (Linear forward and backward, attention's batched
q k^T and P v and their backward). This times exactly the products one shard of the compiled
step runs (autograd/shard.py: B / shards rows per thread, BLAS on one thread), each shape as
np.matmul with numpy's BLAS on one thread and as torch.matmul on one thread, each library in a
fresh process of its own. The sum over the step is the floor of a sharded step: its shards run
side by side, so the step cannot take less than one shard's products.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from typing import Any

from benchmarks.configs import parse_config


def step_products(config: Any, shards: int) -> list[tuple[str, int, tuple, tuple, bool, bool]]:
    """(what, count per step, a shape, b shape, transpose a, transpose b) of one shard's step."""
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
    L = config.n_layer
    out.append(("attention q k^T, dP = g v^T", 2 * L, (heads, t, d), (heads, t, d), False, True))
    out.append(("attention P v, dS k", 2 * L, (heads, t, t), (heads, t, d), False, False))
    out.append(("attention P^T g, dS^T q", 2 * L, (heads, t, t), (heads, t, d), True, False))
    return out


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
    import numpy as np

    config = parse_config(config_name)
    rng = np.random.default_rng(0)
    results = {}
    if library == "torch":
        import torch

        torch.set_num_threads(1)
    else:
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=1, user_api="blas")
    for what, _, a_shape, b_shape, ta, tb in step_products(config, shards):
        a = rng.standard_normal(a_shape, dtype=np.float32)
        b = rng.standard_normal(b_shape, dtype=np.float32)
        if library == "torch":
            a, b = torch.from_numpy(a), torch.from_numpy(b)
            a, b = (a.transpose(-1, -2) if ta else a), (b.transpose(-1, -2) if tb else b)
            out = torch.empty(a.shape[:-1] + b.shape[-1:])
            results[what] = _time(lambda a=a, b=b, out=out: torch.matmul(a, b, out=out), reps)
        else:
            a, b = (a.swapaxes(-1, -2) if ta else a), (b.swapaxes(-1, -2) if tb else b)
            out = np.empty(a.shape[:-1] + b.shape[-1:], np.float32)
            results[what] = _time(lambda a=a, b=b, out=out: np.matmul(a, b, out=out), reps)
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="small")
    p.add_argument("--shards", type=int, default=2)
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--worker", choices=["numpy", "torch"], help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(measure(args.worker, args.config, args.shards, args.reps)))
        return 0
    runs = {}
    for library in ("numpy", "torch"):
        cmd = [sys.executable, "-m", "benchmarks.products", "--worker", library]
        cmd += ["--config", args.config, "--shards", str(args.shards), "--reps", str(args.reps)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        runs[library] = json.loads(done.stdout) if done.returncode == 0 else None
    config = parse_config(args.config)
    print(
        f"One shard's products, {args.config} ({config.describe()}), {args.shards} shards, 1 thread"
    )
    print("\n| product | per step | numpy BLAS ms | torch ms | numpy GFLOP/s | torch GFLOP/s |")
    print("|---|---:|---:|---:|---:|---:|")
    totals = {"numpy": 0.0, "torch": 0.0}
    for what, count, a_shape, b_shape, ta, tb in step_products(config, args.shards):
        inner = a_shape[-2] if ta else a_shape[-1]
        rows = a_shape[-1] if ta else a_shape[-2]
        cols = b_shape[-2] if tb else b_shape[-1]
        batch = a_shape[0] if len(a_shape) == 3 else 1
        flops = 2.0 * batch * rows * inner * cols
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
