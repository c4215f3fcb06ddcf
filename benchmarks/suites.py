"""The suites: ops, kernels, train and generate (tokenizer: benchmarks.tokenizer, ddp:
benchmarks.ddp). Each returns a list of records.

A record is {"suite", "name", "params", "variants": {variant: stats}, "ratios": {...}}: stats come
from timing.measure (warmup_s, median_ms, min_ms, max_ms, reps, peak_mb) plus suite figures
(tokens_per_s, gflops, frac_of_sgemm_peak). Variants:

- "numba": glassgrad with the Numba kernels (the default backend),
- "numpy": glassgrad with the numpy reference kernels (always measured where kernels are used),
- "torch": PyTorch eager CPU on the same shapes and threads (when torch is installed).

Ratios: "speedup_vs_numpy" = numpy time / numba time (> 1: the kernels help) and "vs_torch" =
numba time / torch time (the headline: <= 1 means glassgrad is as fast as PyTorch or faster).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import nn
from autograd import Tensor, kernels, no_grad
from autograd import functional as F
from benchmarks import timing, tokenizer
from benchmarks.configs import STANDARD, BenchConfig, train_flops
from models.architectures.gpt import GPT

DTYPE = np.float32


@dataclass
class Context:
    """What every suite needs: repetitions, whether torch runs, the measured sgemm peak."""

    reps: int
    quick: bool
    torch: Any  # the torch module, or None
    sgemm_gflops: float
    log: Callable[[str], None] = print
    threads: int | None = None  # the --threads of the run (train workers get the same)
    use_torch: bool = True


def _record(suite: str, name: str, params: dict, variants: dict[str, dict]) -> dict[str, Any]:
    ratios = {}
    if "numba" in variants and "numpy" in variants:
        ratios["speedup_vs_numpy"] = variants["numpy"]["median_ms"] / variants["numba"]["median_ms"]
    if "numba" in variants and "torch" in variants:
        ratios["vs_torch"] = variants["numba"]["median_ms"] / variants["torch"]["median_ms"]
    return {"suite": suite, "name": name, "params": params, "variants": variants, "ratios": ratios}


def _with_backend(backend: str, fn: Callable[[], Any]) -> Callable[[], Any]:
    def run() -> Any:
        with kernels.use_backend(backend):
            return fn()

    return run


def _rand(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape, dtype=DTYPE)


# --- ops: each autograd op forward + backward at Transformer shapes ----------------------------


def _op_cases(c: BenchConfig, rng: np.random.Generator) -> list[tuple[str, tuple, bool, Callable]]:
    """(name, shape, uses_kernels, build) where build(lib) returns (inputs, forward) for lib
    "glassgrad" or "torch"; forward(*inputs) -> output whose backward takes a same-shape grad."""
    B, T, C, H, V = c.batch_size, c.block_size, c.n_embd, c.n_head, c.vocab_size
    D = C // H
    x, w, b = _rand(rng, B, T, C), _rand(rng, C, 4 * C) * 0.02, _rand(rng, 4 * C)
    h4 = _rand(rng, B, T, 4 * C)
    scores = _rand(rng, B, H, T, T)
    q, k, v = (_rand(rng, B, H, T, D) for _ in range(3))
    logits, targets = _rand(rng, B, T, V), rng.integers(0, V, size=(B, T))
    table, ids = _rand(rng, V, C), rng.integers(0, V, size=(B, T))
    ln_w, ln_b = np.ones(C, DTYPE), np.zeros(C, DTYPE)

    def ops(lib):
        if lib == "glassgrad":
            return {
                "linear": (lambda a, m, bias: nn.linear(a, m, bias), (x, w, b)),
                "gelu": (lambda a: F.gelu(a), (h4,)),
                "layer_norm": (lambda a, g, s: F.layer_norm(a, g, s), (x, ln_w, ln_b)),
                "softmax": (lambda a: F.softmax(a), (scores,)),
                "attention": (
                    lambda a, kk, vv: F.scaled_dot_product_attention(a, kk, vv),
                    (q, k, v),
                ),
                "cross_entropy": (lambda a: F.cross_entropy(a, targets), (logits,)),
                "embedding": (lambda t: F.embedding(t, ids), (table,)),
                "add (residual)": (lambda a, a2: a + a2, (x, x.copy())),
            }
        tf = lib.nn.functional
        ids_t, targets_t = lib.from_numpy(ids), lib.from_numpy(targets)
        return {
            "linear": (lambda a, m, bias: a @ m + bias, (x, w, b)),
            "gelu": (lambda a: tf.gelu(a, approximate="tanh"), (h4,)),
            "layer_norm": (lambda a, g, s: tf.layer_norm(a, (C,), g, s, 1e-5), (x, ln_w, ln_b)),
            "softmax": (lambda a: tf.softmax(a, dim=-1), (scores,)),
            "attention": (
                lambda a, kk, vv: tf.scaled_dot_product_attention(a, kk, vv, is_causal=True),
                (q, k, v),
            ),
            "cross_entropy": (
                lambda a: tf.cross_entropy(a.view(-1, V), targets_t.view(-1)),
                (logits,),
            ),
            "embedding": (lambda t: tf.embedding(ids_t, t), (table,)),
            "add (residual)": (lambda a, a2: a + a2, (x, x.copy())),
        }

    return ops


_KERNEL_OPS = {kernel.op for kernel in kernels.KERNELS.values()}  # ops with a numpy variant


def _gg_step(fn: Callable, arrays: tuple) -> Callable[[], None]:
    inputs = [Tensor(a, requires_grad=True, dtype=a.dtype) for a in arrays]
    grad: list[np.ndarray] = []

    def step() -> None:
        out = fn(*inputs)
        if not grad:  # the same upstream gradient every time, fixed on the first call
            grad.append(np.random.default_rng(1).standard_normal(out.shape).astype(DTYPE))
        out.backward(grad[0])
        for t in inputs:
            t.grad = None

    return step


def _torch_step(torch: Any, fn: Callable, arrays: tuple) -> Callable[[], None]:
    inputs = [torch.from_numpy(a.copy()).requires_grad_(True) for a in arrays]
    grad: list[Any] = []

    def step() -> None:
        out = fn(*inputs)
        if not grad:
            g = np.random.default_rng(1).standard_normal(tuple(out.shape)).astype(DTYPE)
            grad.append(torch.from_numpy(g))
        out.backward(grad[0])
        for t in inputs:
            t.grad = None

    return step


def ops_suite(ctx: Context, config: BenchConfig) -> list[dict[str, Any]]:
    """Every Transformer op, forward + backward, at the shapes of `config`."""
    rng = np.random.default_rng(0)
    table = _op_cases(config, rng)
    gg = table("glassgrad")
    th = table(ctx.torch) if ctx.torch is not None else {}
    records = []
    for name, (fn, arrays) in gg.items():
        ctx.log(f"  ops: {name}")
        variants = {"numba": _with_backend("numba", _gg_step(fn, arrays))}
        if name in _KERNEL_OPS:
            variants["numpy"] = _with_backend("numpy", _gg_step(fn, arrays))
        if name in th:
            variants["torch"] = _torch_step(ctx.torch, *th[name])
        stats = timing.measure(variants, ctx.reps)
        params = {"config": config.name, "shapes": [list(a.shape) for a in arrays]}
        records.append(_record("ops", name, params, stats))
    return records


# --- kernels: every Numba kernel against its numpy reference (issue-4 shapes) ------------------


def _kernel_cases(ctx: Context, rng: np.random.Generator) -> list[tuple[str, dict, Callable]]:
    """(name, params, make) with make(backend) -> a zero-argument callable running the kernel;
    backend is "numba", "numpy" or "torch" (None where torch has no equivalent)."""
    small = STANDARD["tiny"] if ctx.quick else STANDARD["small"]
    if ctx.quick:
        attn_shape, sm_shape, vocab_big = (2, 2, 64, 16), (256, 256), 2048
    else:
        attn_shape, sm_shape, vocab_big = (4, 6, 256, 64), (4096, 4096), 50257
    rows, C = small.batch_size * small.block_size, small.n_embd
    K = kernels
    torch = ctx.torch

    q, k, v, go = (_rand(rng, *attn_shape) for _ in range(4))
    o, lse = K.get_kernel("attention_forward", "numpy")(q, k, v, True)
    sm_x, sm_g = _rand(rng, *sm_shape), _rand(rng, *sm_shape)
    ln_x, ln_g = _rand(rng, rows, C), _rand(rng, rows, C)
    ln_w, ln_b = np.ones(C, DTYPE), np.zeros(C, DTYPE)
    ce_small = (_rand(rng, rows, small.vocab_size), rng.integers(0, small.vocab_size, rows))
    ce_rows = 64 if ctx.quick else 256
    ce_big = (_rand(rng, ce_rows, vocab_big), rng.integers(0, vocab_big, ce_rows))

    def kernel(name, backend, *args):
        fn = K.get_kernel(name, backend)
        return lambda: fn(*args)

    def torch_fwd_bwd(fn, arrays, grad=None):
        if torch is None:
            return None
        inputs = [torch.from_numpy(a.copy()).requires_grad_(True) for a in arrays]
        g = None if grad is None else torch.from_numpy(grad)

        def run():
            out = fn(*inputs)
            out.backward(g)
            for t in inputs:
                t.grad = None

        return run

    tf = torch.nn.functional if torch is not None else None

    def fwd_bwd(fwd_name, bwd_name, fwd_args, bwd_args_of):
        def make(backend):
            fwd, bwd = K.get_kernel(fwd_name, backend), K.get_kernel(bwd_name, backend)

            def run():
                out = fwd(*fwd_args)
                bwd(*bwd_args_of(out))

            return run

        return make

    cases = [
        (
            "attention fwd+bwd",
            {"shape (B,H,T,D)": list(attn_shape), "causal": True},
            fwd_bwd(
                "attention_forward",
                "attention_backward",
                (q, k, v, True),
                lambda out: (q, k, v, out[0], out[1], go, True),
            ),
            lambda: torch_fwd_bwd(
                lambda a, b, c: tf.scaled_dot_product_attention(a, b, c, is_causal=True),
                (q, k, v),
                go,
            ),
        ),
        (
            "softmax fwd+bwd",
            {"shape": list(sm_shape)},
            fwd_bwd("softmax_forward", "softmax_backward", (sm_x,), lambda y: (y, sm_g)),
            lambda: torch_fwd_bwd(lambda a: tf.softmax(a, dim=-1), (sm_x,), sm_g),
        ),
        (
            "layer_norm fwd+bwd",
            {"shape": [rows, C], "config": small.name},
            fwd_bwd(
                "layer_norm_forward",
                "layer_norm_backward",
                (ln_x, ln_w, ln_b, 1e-5),
                lambda out: (ln_g, ln_x, ln_w, out[1], out[2]),
            ),
            lambda: torch_fwd_bwd(
                lambda a, w, b: tf.layer_norm(a, (C,), w, b, 1e-5), (ln_x, ln_w, ln_b), ln_g
            ),
        ),
    ]
    for label, (logits, targets) in (("GPT vocab", ce_small), ("large vocab", ce_big)):
        t_targets = None if torch is None else torch.from_numpy(targets)
        cases.append(
            (
                f"cross_entropy fused ({label})",
                {"shape": list(logits.shape)},
                lambda backend, logits=logits, targets=targets: kernel(
                    "cross_entropy_forward", backend, logits, targets, -100, True
                ),
                lambda logits=logits, t_targets=t_targets: torch_fwd_bwd(
                    lambda a: tf.cross_entropy(a, t_targets), (logits,)
                ),
            )
        )
    # every kernel of the table alone, at the rows and width of `small` (a few in quick mode)
    singles = list(K.KERNELS.items())
    for name, spec in singles[:1] if ctx.quick else singles:
        args = spec.example(rng, DTYPE, rows, C)
        shape = [list(np.shape(a)) for a in args if isinstance(a, np.ndarray)]
        cases.append(
            (name, {"shapes": shape}, lambda b, name=name, args=args: kernel(name, b, *args), None)
        )
    return cases


def kernels_suite(ctx: Context) -> list[dict[str, Any]]:
    """Numba vs numpy for every kernel; the issue-4 fwd+bwd pairs also against torch.

    Each single-kernel record also carries "first_call": compile and cached-load seconds (quick mode
    probes only the first kernel, to stay fast)."""
    records = []
    first_call = {}
    if timing.variant_filter is None:  # not in the PyTorch process: it times only torch
        ctx.log("  kernels: compile and cached-load times (two fresh processes)")
        names = list(kernels.KERNELS)
        first_call = compile_times(names[:1] if ctx.quick else names)
    for name, params, make, make_torch in _kernel_cases(ctx, np.random.default_rng(0)):
        ctx.log(f"  kernels: {name}")
        variants = {"numba": make("numba"), "numpy": make("numpy")}
        torch_run = make_torch() if make_torch is not None else None
        if torch_run is not None:
            variants["torch"] = torch_run
        record = _record("kernels", name, params, timing.measure(variants, ctx.reps))
        if name in first_call:
            record["first_call"] = first_call[name]
        records.append(record)
    return records


def compile_times(names: list[str]) -> dict[str, dict[str, float]]:
    """{kernel: {"compile_s", "cached_load_s"}}: benchmarks.compile_probe run in two fresh
    processes sharing a new, empty Numba cache directory (compile, then load from the cache)."""
    root = str(Path(__file__).resolve().parent.parent)
    runs = []
    with tempfile.TemporaryDirectory(prefix="glassgrad-numba-cache-") as cache_dir:
        env = {**os.environ, "NUMBA_CACHE_DIR": cache_dir}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (root, env.get("PYTHONPATH"))))
        for _ in range(2):
            done = subprocess.run(
                [sys.executable, "-m", "benchmarks.compile_probe", *names],
                env=env,
                cwd=root,
                capture_output=True,
                text=True,
                check=False,
            )
            if done.returncode != 0:
                raise RuntimeError(f"benchmarks: the compile probe failed:\n{done.stderr}")
            runs.append(json.loads(done.stdout))
    return {n: {"compile_s": runs[0][n], "cached_load_s": runs[1][n]} for n in names}


# --- train: one full step (forward, loss, backward, AdamW step, zero_grad) ---------------------


def _batch(config: BenchConfig) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    data = rng.integers(0, config.vocab_size, size=(config.batch_size, config.block_size + 1))
    return data[:, :-1], data[:, 1:]


def bench_model(config: BenchConfig) -> GPT:
    """The GPT every framework starts from: rng 0, float32 (whatever the default dtype)."""
    model = GPT(config.gpt_config(), rng=np.random.default_rng(0))
    for p in model.parameters():
        p.data = p.data.astype(DTYPE)
    return model


# Variant name -> train_worker framework. "glassgrad" is the headline (autograd.compile, as
# models.train runs it); each runs in fresh processes of its own, alternating, `rounds` times.
FAIR_VARIANTS = {
    "glassgrad": "glassgrad",
    "glassgrad eager": "glassgrad-eager",
    "glassgrad, torch imported first": "glassgrad-torch-first",
    "torch": "torch",
    "torch.compile": "torch.compile",
    "jax": "jax",
}
_NEEDS = {"glassgrad, torch imported first": "torch", "torch": "torch", "torch.compile": "torch"}
_NEEDS["jax"] = "jax"


def fair_variants(use_torch: bool, quick: bool) -> list[str]:
    """The variants this machine can run (torch / jax are optional; quick skips the compilers)."""
    names = []
    for name in FAIR_VARIANTS:
        need = _NEEDS.get(name)
        if need == "torch" and not use_torch:
            continue
        if need is not None and importlib.util.find_spec(need) is None:
            continue
        if quick and name in ("torch.compile", "jax"):
            continue
        names.append(name)
    return names


def _worker(framework: str, config: BenchConfig, threads: int | None, steps: int) -> dict:
    root = str(Path(__file__).resolve().parent.parent)
    command = [sys.executable, "-m", "benchmarks.train_worker", "--framework", framework]
    command += ["--config", config.name if config.name in STANDARD else config.describe()]
    command += ["--steps", str(steps)] + ([f"--threads={threads}"] if threads else [])
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, (root, os.environ.get("PYTHONPATH")))),
    }
    done = subprocess.run(command, env=env, cwd=root, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"benchmarks: {framework} worker failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _fair_stats(runs: list[dict]) -> dict[str, Any]:
    """Pooled median of every timed step; min / max of the rounds' medians; memory per round."""
    pooled = [t for r in runs for t in r["step_ms"]]
    rounds = [float(np.median(r["step_ms"])) for r in runs]
    return {
        "median_ms": float(np.median(pooled)),
        "min_ms": min(rounds),
        "max_ms": max(rounds),
        "round_medians_ms": rounds,
        "reps": len(pooled),
        "warmup_s": float(np.median([r["first_step_s"] for r in runs])),
        # resident memory the model, its state and the step added above the imports (peak)
        "peak_mb": float(np.median([r["peak_rss_mb"] - r["baseline_rss_mb"] for r in runs])),
        "process_peak_rss_mb": float(np.median([r["peak_rss_mb"] for r in runs])),
        "loss0": runs[0]["loss0"],
        "trace_plan_s": runs[0].get("trace_plan_s"),
        "load_average": [r["load_average"] for r in runs],
    }


def train_suite(ctx: Context, configs: list[BenchConfig]) -> list[dict[str, Any]]:
    """ms per training step, by framework, each in fresh processes (benchmarks/train_worker.py).

    Rounds alternate the frameworks (A B C A B C ...), so a burst of load hits all alike. Also
    kept, labelled "in-process": the eager step timed here, in this process (a warm heap).
    """
    records = []
    names = fair_variants(ctx.use_torch, ctx.quick)
    rounds, steps = (1, 3) if ctx.quick else (3, 10)
    for config in configs:
        ctx.log(f"  train: {config.name} ({config.describe()}), {rounds} rounds of {names}")
        runs: dict[str, list[dict]] = {name: [] for name in names}
        for _ in range(rounds):
            for name in names:
                runs[name].append(_worker(FAIR_VARIANTS[name], config, ctx.threads, steps))
        stats = {name: _fair_stats(rs) for name, rs in runs.items()}
        model = bench_model(config)
        optimizer = nn.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
        step = _gg_train_step(model, optimizer, *_batch(config))
        # the old figure, kept labelled: the eager step timed in this process (a warm heap)
        in_process = timing.measure({"glassgrad eager, in-process": step}, ctx.reps)
        stats.update(in_process)
        n_params = sum(p.data.size for p in model.parameters())
        n_no_wpe = n_params - model.transformer.wpe.weight.data.size
        flops = train_flops(config, n_no_wpe)
        tokens = config.batch_size * config.block_size
        for s in stats.values():
            seconds = s["median_ms"] / 1e3
            s["tokens_per_s"] = tokens / seconds
            s["gflops"] = flops / seconds / 1e9
            s["frac_of_sgemm_peak"] = s["gflops"] / ctx.sgemm_gflops
        params = {
            "config": config.describe(),
            "n_params": n_params,
            "n_params_without_wpe": n_no_wpe,
            "tokens_per_step": tokens,
            "flops_per_step": flops,
            "rounds": rounds,
            "steps_per_round": steps,
        }
        ratios = {
            f"{name} / torch": stats[name]["median_ms"] / stats["torch"]["median_ms"]
            for name in stats
            if "torch" in stats and name != "torch"
        }
        if "torch" in stats:
            ratios["vs_torch"] = ratios["glassgrad / torch"]
        first = "glassgrad, torch imported first"
        if first in stats:
            ratios[f"{first} / glassgrad"] = (
                stats[first]["median_ms"] / stats["glassgrad"]["median_ms"]
            )
        records.append(
            {
                "suite": "train",
                "name": config.name,
                "params": params,
                "variants": stats,
                "ratios": ratios,
            }
        )
    return records


def _gg_train_step(model: GPT, optimizer: Any, x: np.ndarray, y: np.ndarray) -> Callable:
    def step() -> None:
        _, loss = model(x, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    return step


# --- generate: one decode step with and without the KV cache, by context length ---------------


def generate_suite(ctx: Context, config: BenchConfig, contexts: list[int]) -> list[dict[str, Any]]:
    """Time of the decode step that produces token t+1 from a context of t tokens (batch 1).

    cached: the cache holds t-1 positions and the step runs the newest token through it (the
    cache length is reset before each repetition, so every repetition is the same step);
    uncached: the step re-runs the whole t-token context (what generate(use_cache=False) does).
    tokens/s = 1 / step time.
    """
    model = bench_model(config)
    model.eval()
    ids = np.random.default_rng(0).integers(0, config.vocab_size, size=(1, max(contexts)))
    torch_model = None
    if ctx.torch is not None:
        from benchmarks.torch_ref import from_glassgrad

        torch_model = from_glassgrad(model)
    records = []
    for t in contexts:
        ctx.log(f"  generate: {config.name}, context {t}")
        variants: dict[str, Callable[[], Any]] = {}
        for backend in ("numba", "numpy"):
            variants[f"{backend} cached"] = _gg_cached_step(model, ids, t, backend)
            variants[f"{backend} uncached"] = _with_backend(
                backend, lambda t=t: _no_grad_call(model, ids[:, :t])
            )
        if torch_model is not None:
            variants["torch cached"] = _torch_cached_step(ctx.torch, torch_model, ids, t, config)
            tids = ctx.torch.from_numpy(ids[:, :t])

            def torch_uncached(tids=tids):
                with ctx.torch.no_grad():
                    torch_model(tids)

            variants["torch uncached"] = torch_uncached
        stats = timing.measure(variants, ctx.reps)
        for s in stats.values():
            s["tokens_per_s"] = 1e3 / s["median_ms"]
        record = {
            "suite": "generate",
            "name": f"{config.name} T={t}",
            "params": {"config": config.describe(), "context": t, "batch": 1},
            "variants": stats,
            "ratios": {
                "cache_speedup": stats["numba uncached"]["median_ms"]
                / stats["numba cached"]["median_ms"],
                "speedup_vs_numpy": stats["numpy cached"]["median_ms"]
                / stats["numba cached"]["median_ms"],
            },
        }
        if torch_model is not None:
            record["ratios"]["vs_torch"] = (
                stats["numba cached"]["median_ms"] / stats["torch cached"]["median_ms"]
            )
        records.append(record)
    return records


def _no_grad_call(model: GPT, ids: np.ndarray, **kwargs: Any) -> Any:
    with no_grad():
        return model(ids, **kwargs)


def _gg_cached_step(model: GPT, ids: np.ndarray, t: int, backend: str) -> Callable[[], None]:
    caches = model.new_kv_caches(1)
    if t > 1:
        with kernels.use_backend(backend):
            _no_grad_call(model, ids[:, : t - 1], kv_caches=caches)
    last = ids[:, t - 1 : t]

    def step() -> None:
        for cache in caches:
            cache.length = t - 1  # forget the token the previous repetition appended
        with kernels.use_backend(backend):
            _no_grad_call(model, last, kv_caches=caches)

    return step


def _torch_cached_step(torch: Any, tmodel: Any, ids: np.ndarray, t: int, config: BenchConfig):
    from benchmarks.torch_ref import new_caches

    caches = new_caches(tmodel, 1, config.block_size)
    with torch.no_grad():
        if t > 1:
            tmodel(torch.from_numpy(ids[:, : t - 1]), caches=caches)
    last = torch.from_numpy(ids[:, t - 1 : t])

    def step() -> None:
        with torch.no_grad():
            tmodel(last, caches=caches, past=t - 1)

    return step


def decode_contexts(config: BenchConfig, quick: bool) -> list[int]:
    """Context lengths 32, 64, 128, 256 (quick: 8, 16, ...) that fit the config's block_size."""
    start = 8 if quick else 32
    count = 3 if quick else 4
    lengths = [start * 2**i for i in range(count)]
    fitting = [t for t in lengths if t <= config.block_size]
    return fitting or [config.block_size]


def summarize_targets(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The issue's targets, each with the measured value and whether it is met (None: not run)."""
    by = {(r["suite"], r["name"]): r for r in records}
    checks = []

    def add(target: str, value: float | None, ok: bool | None) -> None:
        checks.append({"target": target, "value": value, "met": ok})

    for name in ("tiny", "mid", "small"):
        r = by.get(("train", name))
        ratio = r["ratios"].get("vs_torch") if r else None
        met = None if ratio is None else ratio <= 0.8
        add(f"train {name}: glassgrad / torch eager <= 0.8 (fresh processes)", ratio, met)
    for name in ("tiny", "mid", "small"):
        r = by.get(("train", name))
        v = r["variants"] if r else {}
        if "glassgrad" in v and "torch" in v:
            ratio = v["glassgrad"]["peak_mb"] / v["torch"]["peak_mb"]
            add(f"train {name}: peak RSS glassgrad / torch < 1", ratio, ratio < 1.0)
    r = by.get(("train", "small"))
    frac = r["variants"]["glassgrad"]["frac_of_sgemm_peak"] if r else None
    add("train small: GFLOP/s >= 70 % of sgemm peak", frac, None if frac is None else frac >= 0.7)
    trace = r["variants"]["glassgrad"].get("trace_plan_s") if r else None
    add("train small: trace + plan < 2 s", trace, None if trace is None else trace < 2.0)
    for name in ("tiny", "mid", "small"):
        r = by.get(("train", name))
        ratio = r["ratios"].get("glassgrad, torch imported first / glassgrad") if r else None
        if ratio is not None:
            add(f"train {name}: torch imported first / alone <= 1.1", ratio, ratio <= 1.1)
    gen = [r for r in records if r["suite"] == "generate"]
    by_t = {r["params"]["context"]: r for r in gen}
    if gen:
        lo, hi = min(by_t), max(by_t)
        growth = (
            by_t[hi]["variants"]["numba cached"]["median_ms"]
            / by_t[lo]["variants"]["numba cached"]["median_ms"]
        )
        add(f"decode cached: step time T={hi} / T={lo} <= 1.5", growth, growth <= 1.5)
        speedup = by_t[hi]["ratios"]["cache_speedup"]
        add(f"decode T={hi}: cached >= 5x faster than uncached", speedup, speedup >= 5.0)
    kern = {r["name"]: r for r in records if r["suite"] == "kernels"}
    for name, need in (
        ("attention fwd+bwd", 3.0),
        ("layer_norm fwd+bwd", 2.0),
        ("cross_entropy fused (GPT vocab)", 2.0),
        ("cross_entropy fused (large vocab)", 2.0),
    ):
        if name in kern:
            s = kern[name]["ratios"]["speedup_vs_numpy"]
            add(f"kernel {name}: numba >= {need:g}x numpy", s, s >= need)
    for name in ("attention fwd+bwd", "softmax fwd+bwd"):
        ratio = kern[name]["ratios"].get("vs_torch") if name in kern else None
        add(f"kernel {name}: no slower than torch", ratio, None if ratio is None else ratio <= 1.0)
    tok = {r["name"]: r["variants"]["python"] for r in records if r["suite"] == "tokenizer"}
    if "train 1000 merges" in tok:  # the full corpus (not --quick)
        for name, limit in (
            ("train 1000 merges", tokenizer.TRAIN_LIMIT_S),
            ("encode corpus (cold cache)", tokenizer.ENCODE_LIMIT_S),
        ):
            seconds = tok[name]["median_ms"] / 1e3
            add(f"tokenizer {name} on the demo corpus: < {limit:g} s", seconds, seconds < limit)
    return checks
