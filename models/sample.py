"""Continue a prompt: `python -m models.sample --model runs/demo --prompt "def "`.

Loads a checkpoint directory written by models.train (config.json + model.safetensors +
tokenizer.json, or vocab.json + merges.txt for BPE), a Hugging Face download of any family
models.from_pretrained reads (GPT-2, Llama, Qwen2, Mistral, SmolLM2, ...), a llama.cpp .gguf file
(model and tokenizer in one) or a hub name (`org/name`, models.formats.hub), and prints the prompt
followed by the generated text (notes 12: one token at a time from the last position's
distribution, with the KV cache unless --no-cache), stopping at the model's end-of-text ids.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

import models
import nn
from autograd.quantized import FORMATS
from models.architectures.decoder import Decoder
from models.formats import hub
from models.formats.tokenizer import Tokenizer, load_tokenizer
from models.lora import merged_model


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m models.sample", description="Generate text from a model directory."
    )
    p.add_argument(
        "--model",
        "--ckpt",
        dest="model",
        default="runs/demo",
        help="a model directory, a .gguf file or a hub name org/name (default runs/demo)",
    )
    p.add_argument("--revision", default=None, help="of a hub name: a branch, tag or commit")
    p.add_argument("--prompt", default="def ", help="text to continue (default 'def ')")
    p.add_argument("--max-new-tokens", type=int, default=500, help="tokens to generate")
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy (default 0.8)")
    p.add_argument("--top-k", type=int, default=None, help="keep only the k most likely tokens")
    p.add_argument("--top-p", type=float, default=None, help="nucleus sampling mass in (0, 1]")
    p.add_argument("--num-samples", type=int, default=1, help="independent samples to print")
    p.add_argument("--seed", type=int, default=None, help="sampling seed (default: random)")
    p.add_argument("--no-cache", action="store_true", help="recompute the prefix every token")
    return p


def load(
    model: str | Path, revision: str | None = None, quantize: str | None = None
) -> tuple[Decoder, Tokenizer]:
    """The model and tokenizer of a checkpoint or model directory, a .gguf file (which holds
    both), a hub name (`org/name` at revision, fetched once into the cache:
    models.formats.hub) or a LoRA run's directory (its base with the adapter folded in).
    quantize: as models.from_pretrained's (docs/quantization.md)."""
    path = hub.resolve(model, revision)  # once, for both
    if (path / nn.lora.ADAPTER_CONFIG).is_file() and not (path / "config.json").is_file():
        return _adapter_run(path, quantize)
    if path.suffix == ".gguf":  # the model first: its read of the file's metadata is kept
        net = models.from_pretrained(path, quantize=quantize)
        return net, load_tokenizer(path)
    tokenizer = load_tokenizer(path)  # first: its error says what a checkpoint directory holds
    return models.from_pretrained(path, quantize=quantize), tokenizer


def _adapter_run(directory: Path, quantize: str | None) -> tuple[Decoder, Tokenizer]:
    """A LoRA run's directory (models.train --lora-rank saves the adapter alone): its base model
    (adapter_config.json's base_model) with the adapter folded into the float weights, as
    `models.lora merge` writes them, then quantized if asked; and the base's tokenizer."""
    base = nn.lora.read_adapter_config(directory).get("base_model")
    if base is None:
        raise FileNotFoundError(
            f"{directory} holds a LoRA adapter that does not name its base model: fold it into "
            f"its base with python -m models.lora merge --base BASE --adapter {directory} --out DIR"
        )
    if quantize == "gguf":
        raise ValueError(
            f"{directory}: quantize='gguf' keeps a file's own blocks, which a LoRA adapter "
            "cannot be folded into: give " + ", ".join(FORMATS)
        )
    net, _ = merged_model(base, directory)
    if quantize is not None:
        tied = net.transformer.wte if net.config.tie_word_embeddings else None
        nn.quantize_linears(net, quantize, tied_embedding=tied)
    return net, load_tokenizer(base)


def main(argv: list[str] | None = None) -> int:
    """Console entry point (glassgrad-sample)."""
    args = build_parser().parse_args(argv)
    try:
        model, tokenizer = load(args.model, args.revision)
        ids = np.asarray(tokenizer.encode(args.prompt), dtype=np.int64)
        if ids.size == 0:
            raise ValueError("--prompt is empty; give at least one character")
        rng = np.random.default_rng(args.seed)
        for i in range(args.num_samples):
            out = model.generate(
                ids[None, :],
                args.max_new_tokens,
                temperature=args.temperature,
                top_k=args.top_k,
                top_p=args.top_p,
                use_cache=not args.no_cache,
                rng=rng,
            )
            if args.num_samples > 1:
                print(f"--- sample {i + 1} ---")
            print(tokenizer.decode(out[0]))
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
