"""A fine-tuning step of a small open model: glassgrad's compiled step against PyTorch eager.

    python -m benchmarks.finetune --hf-python /path/to/python-with-torch-and-transformers
    python -m benchmarks.finetune --rounds 3 --threads 2 --batch 4 --seq 256 --steps 3

The model has SmolLM2-135M's shape (V 49152, C 576, 30 layers, 9 heads, 3 K/V heads, FFN 1536,
tied head, RoPE theta 100000) with random weights: glassgrad writes it once as a Hugging Face
directory (float32) and both frameworks load that directory. One training step on a batch of
--batch x --seq random tokens: forward, mean cross-entropy, backward, AdamW (lr 1e-4), gradients
cleared, in two modes:

    full   every parameter trained
    lora   LoRA rank 8, alpha 16 on q_proj, k_proj, v_proj, o_proj; everything else frozen
           (glassgrad: nn.apply_lora; torch: the same detour written by hand below, B zero)

glassgrad runs autograd.compile's step (default fusion), PyTorch its eager step (transformers'
LlamaForCausalLM, no torch.compile). Each framework and mode runs in a fresh process of its own,
the processes alternated, --rounds of each; the table quotes medians of the step times after
--warmup untimed steps (glassgrad's first is the trace, its second the first replay) and the peak
resident memory of each process (VmHWM: the load, the warm-up and the steps). Needs torch and
transformers in --hf-python (never a test dependency). --floor adds the step's products
floor (benchmarks.products: the same matrix products alone, numpy's BLAS, sharded over the
threads and whole-batch on them) and glassgrad's step against the faster of the two. Run
timings under the bench lock: `flock /tmp/glassgrad-bench.lock python -m benchmarks.finetune ...`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
LORA_RANK, LORA_ALPHA, LR = 8, 16.0, 1e-4


def write_model(directory: Path) -> None:
    """The random SmolLM2-135M-shaped model as a Hugging Face directory (float32)."""
    import numpy as np

    from benchmarks.llm import SMOLLM2_135M  # here: the torch worker's script side has no glassgrad
    from models.architectures.llama import Llama, llama_config

    Llama(llama_config(**SMOLLM2_135M), rng=np.random.default_rng(0)).save_pretrained(directory)


def _peak_rss_mb() -> float:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _batch(batch: int, seq: int, vocab_size: int) -> tuple:
    import numpy as np

    data = np.random.default_rng(1).integers(0, vocab_size, (batch, seq + 1))
    return data[:, :-1].copy(), data[:, 1:].copy()


def _time_steps(step, steps: int, warmup_steps: int) -> tuple[float, list[float], list[float]]:
    """(first loss, warm-up step times, timed step times): the same for both frameworks."""
    warmup, losses = [], []
    for _ in range(max(warmup_steps, 1)):
        start = time.perf_counter()
        losses.append(step())
        warmup.append(time.perf_counter() - start)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return losses[0], warmup, times


def worker_glassgrad(
    directory: str, mode: str, batch: int, seq: int, steps: int, warmup_steps: int
) -> dict:
    from threadpoolctl import threadpool_info

    import autograd
    import models
    import nn
    from benchmarks.configs import training_step

    # lora-q8_0: the Linear weights kept in Q8_0 blocks, frozen (QLoRA; glassgrad only)
    model = models.from_pretrained(directory, quantize="q8_0" if mode == "lora-q8_0" else None)
    if mode.startswith("lora"):
        nn.apply_lora(model, ",".join(LORA_TARGETS), rank=LORA_RANK, alpha=LORA_ALPHA)
    trainable, total = model.parameter_counts()
    quantized = (nn.QuantizedLinear, nn.QuantizedEmbedding)
    blocks = {id(m.weight): m.weight.nbytes for m in model.modules() if isinstance(m, quantized)}
    frozen = sum(p.data.nbytes for p in model.parameters() if not p.requires_grad)
    optimizer = nn.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR)

    step = training_step(model, optimizer)

    compiled = autograd.compile(step)
    x, y = _batch(batch, seq, model.config.vocab_size)
    loss0, warmup, times = _time_steps(lambda: float(compiled(x, y).data), steps, warmup_steps)
    blas = [f"{i['internal_api']} {i.get('architecture')}" for i in threadpool_info()]
    plan = compiled.plan_for(x, y)
    return dict(
        step_s=statistics.median(times),
        times=times,
        warmup_s=warmup,
        loss0=loss0,
        trainable=trainable,
        total=total,
        sharded=not getattr(plan, "unsharded", ""),
        blas=blas,
        frozen_mb=(frozen + sum(blocks.values())) / 2**20,
    )


def worker_torch(
    directory: str, mode: str, batch: int, seq: int, steps: int, warmup_steps: int
) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    class TorchLoRA(torch.nn.Module):
        """y = base(x) + (alpha / r) (x A) B, A (in, r) uniform(+-1/sqrt(in)), B (r, out) zero."""

        def __init__(self, base: torch.nn.Linear) -> None:
            super().__init__()
            self.base = base
            bound = 1.0 / base.in_features**0.5
            a = torch.empty(base.in_features, LORA_RANK).uniform_(-bound, bound)
            self.A = torch.nn.Parameter(a)
            self.B = torch.nn.Parameter(torch.zeros(LORA_RANK, base.out_features))
            self.scale = LORA_ALPHA / LORA_RANK

        def forward(self, x):
            return self.base(x) + (x @ self.A) @ (self.B * self.scale)

    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    model.train()
    if mode == "lora":
        model.requires_grad_(False)
        for layer in model.model.layers:
            for name in LORA_TARGETS:
                setattr(layer.self_attn, name, TorchLoRA(getattr(layer.self_attn, name)))
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=LR)
    x, y = (torch.from_numpy(a) for a in _batch(batch, seq, model.config.vocab_size))

    def step() -> float:
        optimizer.zero_grad(set_to_none=True)
        logits = model(input_ids=x).logits
        flat = logits.reshape(-1, logits.shape[-1])
        loss = torch.nn.functional.cross_entropy(flat, y.reshape(-1))
        loss.backward()
        optimizer.step()
        return float(loss)

    loss0, warmup, times = _time_steps(step, steps, warmup_steps)
    total = sum(p.numel() for p in model.parameters())
    return dict(
        step_s=statistics.median(times),
        times=times,
        warmup_s=warmup,
        loss0=loss0,
        trainable=sum(p.numel() for p in params),
        total=total,
        blas=[torch.__version__, torch.backends.cpu.get_cpu_capability()],
    )


def _run_worker(kind: str, mode: str, args: argparse.Namespace, directory: Path) -> dict:
    from benchmarks.timing import run_worker  # here: the script side has no glassgrad

    # The torch worker runs this file as a script: its Python need not have glassgrad's packages.
    ours = [sys.executable, "-m", "benchmarks.finetune"]
    start = [args.hf_python, __file__] if kind == "torch" else ours
    command = [*start, "--worker", kind, "--mode", mode, "--dir", str(directory)]
    command += ["--batch", str(args.batch), "--seq", str(args.seq), "--steps", str(args.steps)]
    command += ["--warmup", str(args.warmup)]
    command += ["--threads", str(args.threads)]
    return run_worker(command, args.threads, f"{kind} {mode}")


def _products_floor(mode: str, args: argparse.Namespace) -> dict[str, float]:
    """Seconds of the step's matrix products alone with numpy's BLAS (benchmarks.products):
    {"sharded": each of --threads shards' products on a thread of its own, at once; "whole":
    the whole batch's with the BLAS on --threads threads; "own": sharded, with each layer's
    products on arrays of their own, as the step's are (the others repeat a product on the same
    arrays, from the caches)}, each in a fresh process."""
    import subprocess

    config = "smollm2-135m-lora" if mode == "lora" else "smollm2-135m"
    floor = {}
    for how, extra in (("sharded", []), ("whole", ["--whole"]), ("own", ["--own"])):
        cmd = [sys.executable, "-m", "benchmarks.products", "--worker", "numpy", "--step"]
        cmd += ["--config", config, "--shards", str(args.threads), "--reps", "5", *extra]
        done = subprocess.run(cmd, capture_output=True, text=True, check=True)
        floor[how] = json.loads(done.stdout)
    return floor


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.finetune", description=__doc__.splitlines()[0]
    )
    p.add_argument("--batch", type=int, default=4, help="rows per step (default 4)")
    p.add_argument("--seq", type=int, default=256, help="tokens per row (default 256)")
    p.add_argument("--steps", type=int, default=3, help="timed steps after the warm-up steps")
    p.add_argument(
        "--warmup",
        type=int,
        default=2,
        help="untimed steps first (default 2: glassgrad's trace and its first replay, where "
        "Numba compiles what eager did not call and the arena's pages are first touched)",
    )
    p.add_argument("--threads", type=int, default=2, help="threads of each framework")
    p.add_argument("--rounds", type=int, default=3, help="fresh processes of each framework")
    p.add_argument("--modes", default="full,lora", help="full, lora or both (default)")
    p.add_argument("--hf-python", default=sys.executable, help="a Python with torch+transformers")
    p.add_argument(
        "--floor",
        action="store_true",
        help="also time the step's products alone (benchmarks.products), once per round and mode",
    )
    p.add_argument("--dir", help="the model directory (default: written to a temporary one)")
    p.add_argument("--worker", choices=("glassgrad", "torch"), help=argparse.SUPPRESS)
    p.add_argument("--mode", choices=("full", "lora", "lora-q8_0"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        if args.worker == "torch":
            import torch

            torch.set_num_threads(args.threads)
        run = worker_torch if args.worker == "torch" else worker_glassgrad
        result = run(args.dir, args.mode, args.batch, args.seq, args.steps, args.warmup)
        print(json.dumps({**result, "peak_rss_mb": _peak_rss_mb()}))
        return 0
    modes = [m for m in args.modes.split(",") if m]
    from benchmarks import system  # here: the torch worker's script side has no glassgrad
    from benchmarks.llm import python_has

    if not python_has(args.hf_python, "torch, transformers"):
        p.error(f"--hf-python {args.hf_python} cannot import torch and transformers")

    peak = system.sgemm_peak(n=2048, reps=10)["gflops"]  # this run's ceiling, for the ratios
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(args.dir) if args.dir else Path(tmp) / "smollm2-135m-random"
        if not (directory / "config.json").is_file():
            write_model(directory)
        results: dict[tuple[str, str], list[dict]] = {}
        for round_ in range(args.rounds):
            for mode in modes:
                kinds = ("glassgrad", "torch") if round_ % 2 == 0 else ("torch", "glassgrad")
                for kind in kinds:
                    result = _run_worker(kind, mode, args, directory)
                    results.setdefault((kind, mode), []).append(result)
                    print(kind, mode, json.dumps(result), file=sys.stderr)
                if args.floor:
                    floor = _products_floor(mode, args)
                    results.setdefault(("floor", mode), []).append(floor)
                    print("products floor", mode, json.dumps(floor), file=sys.stderr)
    print(
        f"SmolLM2-135M shape, random weights, float32, batch {args.batch} x {args.seq} tokens, "
        f"AdamW, {args.threads} threads, medians of {args.rounds} fresh processes each "
        f"({args.steps} timed steps after {args.warmup} warm-up steps in each); sgemm peak of "
        "this run "
        f"{peak:.1f} GFLOP/s\n"
    )
    print(
        "| mode | trainable / total | glassgrad step (s) | torch step (s) | glassgrad / torch "
        "| peak RSS glassgrad / torch (MiB) |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for mode in modes:
        g, t = results[("glassgrad", mode)], results[("torch", mode)]
        gs, ts = (statistics.median(r["step_s"] for r in runs) for runs in (g, t))
        gm, tm = (statistics.median(r["peak_rss_mb"] for r in runs) for runs in (g, t))
        print(
            f"| {mode} | {g[0]['trainable']:,} / {g[0]['total']:,} | {gs:.2f} | {ts:.2f} | "
            f"{gs / ts:.2f} | {gm:.0f} / {tm:.0f} |"
        )
    if args.floor:  # the floor: the faster of the two ways to run the products
        print(
            "\n| mode | products sharded / whole batch (s) | glassgrad / floor "
            "| products sharded, each layer's own arrays (s) | glassgrad / that |"
        )
        print("| --- | --- | --- | --- | --- |")
        for mode in modes:
            runs = results[("floor", mode)]
            sharded, whole, own = (
                statistics.median(r[h] for r in runs) for h in ("sharded", "whole", "own")
            )
            gs = statistics.median(r["step_s"] for r in results[("glassgrad", mode)])
            print(
                f"| {mode} | {sharded:.2f} / {whole:.2f} | {gs / min(sharded, whole):.2f} "
                f"| {own:.2f} | {gs / own:.2f} |"
            )
    g0 = results[("glassgrad", modes[0])][0]
    t0 = results[("torch", modes[0])][0]
    print(
        f"\nstep-0 loss glassgrad {g0['loss0']:.4f}, torch {t0['loss0']:.4f}; "
        f"glassgrad BLAS {g0['blas']}, sharded {g0['sharded']}; torch {t0['blas']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
