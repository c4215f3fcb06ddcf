"""The loss of a trained GPT over its whole validation split, in bits per byte: `models.evaluate`.

    python -m models.evaluate --model runs/demo

Nats per token do not compare across tokenizers: a BPE token stands for about three bytes of this
corpus, a character for one, so a BPE model's loss per token is larger for the same skill. Per
byte of text they compare. Summing the cross-entropy over every token of the validation split
gives the total information the model needs to encode that text, in nats, and

    bits per byte = total nats / (ln 2 * UTF-8 bytes of the validation text)

(ln 2 turns nats into bits). Both tokenizers see the same validation text (models.training.data
splits the text before tokenizing), so the two figures are the same quantity.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

from autograd import no_grad
from models.architectures.gpt import GPT
from models.formats.tokenizer import load_tokenizer
from models.training.checkpoints import read_train_state
from models.training.data import prepare_corpus


def total_nats(model: GPT, ids: np.ndarray, batch_size: int = 32) -> float:
    """Summed cross-entropy of predicting ids[1:], each from the ids before it in consecutive
    windows of block_size: every token is predicted once, with 0 to block_size - 1 of context."""
    block = model.config.block_size
    n_windows = (len(ids) - 1) // block
    x = ids[: n_windows * block].reshape(n_windows, block)
    y = ids[1 : n_windows * block + 1].reshape(n_windows, block)
    batches = [
        (x[i : i + batch_size], y[i : i + batch_size]) for i in range(0, n_windows, batch_size)
    ]
    if (len(ids) - 1) % block:  # the short last window
        batches.append((ids[n_windows * block : -1][None], ids[n_windows * block + 1 :][None]))
    was_training = model.training
    model.eval()
    try:
        with no_grad():
            # The model's loss is a mean over the batch's targets: times their number, a sum.
            return sum(model(xb, yb)[1].item() * yb.size for xb, yb in batches)
    finally:
        model.train(was_training)


def bits_per_byte(nats: float, n_bytes: int) -> float:
    return nats / (math.log(2) * n_bytes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m models.evaluate",
        description="Validation loss of a models.train checkpoint, in nats/token and bits/byte.",
    )
    parser.add_argument(
        "--model",
        "--ckpt",
        dest="ckpt",
        default="runs/demo",
        help="a models.train checkpoint directory (default runs/demo)",
    )
    parser.add_argument("--batch-size", type=int, default=32, help="windows per forward pass")
    args = parser.parse_args(argv)
    ckpt = Path(args.ckpt)
    # its --data: the same text and split
    settings = read_train_state("train", ckpt, asking="evaluate: --model")["settings"]
    model, tokenizer = GPT.from_pretrained(ckpt), load_tokenizer(ckpt)
    corpus = prepare_corpus(settings["data"], tokenizer=tokenizer)
    # The last training token as context for the first validation token: all of them are scored.
    nats = total_nats(model, np.concatenate([corpus.train[-1:], corpus.val]), args.batch_size)
    n_tokens, n_bytes = len(corpus.val), corpus.val_bytes
    print(
        f"{ckpt}: {tokenizer!r}; validation split {n_tokens:,} tokens, {n_bytes:,} bytes "
        f"({n_bytes / n_tokens:.2f} bytes/token); loss {nats / n_tokens:.4f} nats/token = "
        f"{bits_per_byte(nats, n_bytes):.4f} bits/byte"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
