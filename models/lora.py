"""Merge a LoRA adapter into its base model: one checkpoint that any loader of the base reads.

    python -m models.lora merge --base DIR --adapter DIR --out DIR

--base: what models.train can start from, a model directory (config.json + model.safetensors,
with its tokenizer files) or a .gguf file (its tokenizer written as Hugging Face's files);
--adapter: what a LoRA run saved (adapter_model.safetensors + adapter_config.json,
nn.save_adapter). The adapter's update is folded into each wrapped weight, W + (alpha / r) A B
(nn/lora.py), and --out gets the base's files with the merged weights: the
same logits as base + adapter, with no adapter left to apply.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import models
import nn
from models.formats.tokenizer import BPETokenizer

# files of a model directory that are not copied: the weights (written merged) and, in a training
# run's directory, its state (the rest, e.g. the tokenizer, is copied as it is)
NOT_COPIED = (
    "model.safetensors",
    "model.safetensors.index.json",
    "config.json",
    "optimizer.safetensors",
    "train_state.json",
    "loss.png",
)


def merged_model(
    base: str | Path, adapter: str | Path, dtype: str = "float32"
) -> tuple[nn.Module, list[str]]:
    """(the base model with the adapter folded into its weights, the merged modules' names)."""
    model = models.from_pretrained(base, dtype=dtype)
    nn.load_adapter(adapter, model)
    return model, nn.unload_lora(model)


def merge(
    base: str | Path, adapter: str | Path, out: str | Path, dtype: str = "float32"
) -> list[str]:
    """Write base + adapter, merged in `dtype`, to `out`; return the merged modules' names."""
    base, out = Path(base), Path(out)
    if out.resolve() == base.resolve():
        raise ValueError("models.lora merge: --out must not be the --base directory")
    model, names = merged_model(base, adapter, dtype)
    out.mkdir(parents=True, exist_ok=True)
    if base.is_file():  # a .gguf file: its tokenizer and chat template as Hugging Face's files
        BPETokenizer.from_pretrained(base).save(out)
    else:
        for path in base.iterdir():
            shard = path.name.startswith("model-") and path.suffix == ".safetensors"
            if path.is_file() and path.name not in NOT_COPIED and not shard:
                shutil.copy2(path, out / path.name)
    model.save_pretrained(out)
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m models.lora", description=__doc__.split("\n")[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    merge_parser = commands.add_parser("merge", help="fold an adapter into its base model")
    merge_parser.add_argument("--base", required=True, help="the base model's directory")
    merge_parser.add_argument("--adapter", required=True, help="the adapter's directory")
    merge_parser.add_argument("--out", required=True, help="where to write the merged model")
    merge_parser.add_argument(
        "--dtype", default="float32", choices=["float32", "float64"], help="of the merged weights"
    )
    args = parser.parse_args(argv)
    try:
        names = merge(args.base, args.adapter, args.out, args.dtype)
    except (OSError, KeyError, ValueError) as exc:  # a missing or malformed model or adapter
        print(f"error: {exc.args[0] if isinstance(exc, KeyError) else exc}", file=sys.stderr)
        return 2
    kinds = sorted({name.rsplit(".", 1)[-1] for name in names})  # q_proj, v_proj, ...
    print(f"merged {len(names)} adapters ({', '.join(kinds)}) into {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
