"""A small open model as a user runs it: prefill and decode, glassgrad against HF transformers.

    python -m benchmarks.llm                      # SmolLM2-135M's shape, 2 threads, 3 rounds
    python -m benchmarks.llm --rounds 5 --threads 2 --prompt 128 --new 128

The model has SmolLM2-135M's shape (V 49152, C 576, 30 layers, 9 heads, 3 K/V heads, FFN 1536,
tied head, RoPE theta 100000) with random weights: glassgrad writes it once as a Hugging Face
directory (float32) and both frameworks load that directory. Batch 1, a prompt of --prompt
tokens, then --new greedy tokens, each framework's own generate with its KV cache:

    prefill  = the time of generate(prompt, 1 new token)
    decode   = new / (time of generate(prompt, 1 + new) - prefill)     tokens per second

Each framework runs in a fresh process of its own (torch and Numba must not share one; see
benchmarks.runner), the processes alternated, --rounds of each; the table quotes medians and the
peak resident memory of each process (ru_maxrss, which counts the load and the run). Needs
`transformers` and `torch` for the HF column (never a test dependency). Run timings under the
bench lock: `flock /tmp/glassgrad-bench.lock python -m benchmarks.llm`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROMPT_IDS = 256  # prompt ids are drawn below 256, inside --tiny's vocabulary too
SMOLLM2_135M = dict(  # models.llama.llama_config's sizes of SmolLM2-135M
    vocab_size=49152,
    block_size=8192,
    n_layer=30,
    n_head=9,
    n_kv_head=3,
    n_embd=576,
    ffn_hidden=1536,
    rope_theta=100000.0,
    tie_word_embeddings=True,
)


# The same model scaled down, for the test of this benchmark (--tiny).
TINY = dict(SMOLLM2_135M, vocab_size=256, n_layer=2, n_embd=36, ffn_hidden=48)


def write_model(directory: Path, sizes: dict) -> None:
    """A random model of these sizes as a Hugging Face directory (float32)."""
    import numpy as np

    from models.llama import Llama, llama_config

    Llama(llama_config(**sizes), rng=np.random.default_rng(0)).save_pretrained(directory)


def has_hf(python: str) -> bool:
    """Can `python` import torch and transformers (the HF column)?"""
    probe = [python, "-c", "import torch, transformers"]
    return subprocess.run(probe, capture_output=True, check=False).returncode == 0


def _tokens_per_s(new: int, total: float, prefill: float) -> float:
    if total <= prefill:
        raise RuntimeError(
            f"generating {new} more tokens took no longer than the prefill ({total:.4f} s vs "
            f"{prefill:.4f} s): the noise exceeds the decode time; ask for more --new tokens"
        )
    return new / (total - prefill)


def _peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def worker_glassgrad(directory: str, prompt_len: int, new: int, reps: int) -> dict:
    import numpy as np
    from threadpoolctl import threadpool_info

    import models

    model = models.from_pretrained(directory)
    prompt = np.random.default_rng(1).integers(0, PROMPT_IDS, (1, prompt_len))

    def generate(n: int) -> float:
        start = time.perf_counter()
        model.generate(prompt, n, temperature=0, eos_id=[])
        return time.perf_counter() - start

    generate(2)  # warm-up: Numba's kernels compile on first use
    prefill = statistics.median(generate(1) for _ in range(reps))
    total = statistics.median(generate(1 + new) for _ in range(reps))
    blas = [f"{i['internal_api']} {i.get('architecture')}" for i in threadpool_info()]
    return dict(prefill_s=prefill, decode_tps=_tokens_per_s(new, total, prefill), blas=blas)


def worker_hf(directory: str, prompt_len: int, new: int, reps: int) -> dict:
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    model.eval()
    rng = np.random.default_rng(1)
    prompt = torch.tensor(rng.integers(0, PROMPT_IDS, (1, prompt_len)))

    def generate(n: int) -> float:
        start = time.perf_counter()
        with torch.no_grad():
            model.generate(
                prompt,
                max_new_tokens=n,
                min_new_tokens=n,
                do_sample=False,
                use_cache=True,
                attention_mask=torch.ones_like(prompt),
                pad_token_id=0,
            )
        return time.perf_counter() - start

    generate(2)
    prefill = statistics.median(generate(1) for _ in range(reps))
    total = statistics.median(generate(1 + new) for _ in range(reps))
    return dict(
        prefill_s=prefill,
        decode_tps=_tokens_per_s(new, total, prefill),
        blas=[torch.__version__, torch.backends.cpu.get_cpu_capability()],
    )


def _run_worker(kind: str, args: argparse.Namespace, directory: Path) -> dict:
    from benchmarks.timing import run_worker  # here: the script side has no glassgrad

    # The HF worker runs this file as a script: its Python need not have glassgrad's packages.
    start = [args.hf_python, __file__] if kind == "hf" else [sys.executable, "-m", "benchmarks.llm"]
    command = [*start, "--worker", kind, "--dir", str(directory)]
    command += ["--prompt", str(args.prompt), "--new", str(args.new), "--reps", str(args.reps)]
    command += ["--threads", str(args.threads)]
    return run_worker(command, args.threads, kind)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.llm", description=__doc__.splitlines()[0]
    )
    p.add_argument("--prompt", type=int, default=128, help="prompt tokens (default 128)")
    p.add_argument("--new", type=int, default=128, help="new tokens (default 128)")
    p.add_argument("--threads", type=int, default=2, help="threads of each framework")
    p.add_argument("--rounds", type=int, default=3, help="fresh processes of each framework")
    p.add_argument("--reps", type=int, default=3, help="timed repetitions inside a process")
    p.add_argument("--hf-python", default=sys.executable, help="a Python with torch+transformers")
    p.add_argument("--dir", help="the model directory (default: written to a temporary one)")
    p.add_argument("--tiny", action="store_true", help="a tiny model of the same kind (tests)")
    p.add_argument("--worker", choices=("glassgrad", "hf"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        if args.worker == "hf":
            import torch

            torch.set_num_threads(args.threads)
        run = worker_hf if args.worker == "hf" else worker_glassgrad
        result = run(args.dir, args.prompt, args.new, args.reps)
        print(json.dumps({**result, "peak_rss_mb": _peak_rss_mb()}))
        return 0
    kinds = ["glassgrad", "hf"] if has_hf(args.hf_python) else ["glassgrad"]
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(args.dir) if args.dir else Path(tmp) / "model"
        if not (directory / "config.json").is_file():
            write_model(directory, TINY if args.tiny else SMOLLM2_135M)
        results: dict[str, list[dict]] = {kind: [] for kind in kinds}
        for round_ in range(args.rounds):
            for kind in kinds if round_ % 2 == 0 else kinds[::-1]:
                results[kind].append(_run_worker(kind, args, directory))
                print(kind, json.dumps(results[kind][-1]), file=sys.stderr)
    shape = "a tiny model" if args.tiny else "SmolLM2-135M's shape"
    print(
        f"{shape}, random weights, batch 1, {args.prompt}-token prompt, {args.new} new tokens "
        f"(greedy, KV cache), {args.threads} threads, medians of {args.rounds} fresh processes "
        "each\n"
    )
    print("| framework | prefill (s) | decode (tokens/s) | peak RSS (MB) |")
    print("| --- | --- | --- | --- |")
    keys = ("prefill_s", "decode_tps", "peak_rss_mb")
    for kind, runs in results.items():
        med = {key: statistics.median(r[key] for r in runs) for key in keys}
        name = "glassgrad" if kind == "glassgrad" else "HF transformers (PyTorch CPU)"
        figures = f"{med['prefill_s']:.3f} | {med['decode_tps']:.1f} | {med['peak_rss_mb']:.0f}"
        print(f"| {name} | {figures} |")
    print()
    for kind, runs in results.items():
        print(f"{kind}: {', '.join(runs[0]['blas'])}")
    if "hf" not in results:
        print(f"(no HF column: {args.hf_python} cannot import torch and transformers)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
