"""The encoder-decoder Transformer (the 2017 paper's architecture, notes 8.7) on digit tasks.

    python -m models.seq2seq --task reverse|sort|add

The model and its vocabulary are models/architectures/seq2seq.py: the encoder reads the source
both ways, the decoder writes the target one token at a time and reads the encoder's output
through cross-attention; generation caches both. The tasks are models/training/tasks/digits.py:
`reverse` and `sort` a string of digits, `add` writes the sum of two numbers, and the final
accuracy is on held-out sources training never draws.

The training is the one loop of models/training/ (DigitTasks plugs in the batches, the
evaluation and the model's files; DigitsConfig holds its settings): checkpoints and loss.png in
--out (runs/seq2seq-TASK), --resume, Ctrl-C, --ddp, the compiled step. train() runs the same loop
without writing files.
"""

from __future__ import annotations

import sys

from models.architectures.seq2seq import Seq2Seq, Seq2SeqConfig
from models.training.loop import Trainer
from models.training.tasks.digits import DigitsConfig, DigitTasks, Task

TRAINER = Trainer(DigitTasks())


def train(
    task: Task,
    steps: int,
    batch_size: int,
    config: Seq2SeqConfig,
    min_len: int,
    max_len: int,
    lr: float,
    warmup: int,
    seed: int,
    quiet: bool = False,
) -> Seq2Seq:
    """A model trained by the loop without writing files (the config's max lengths must be
    those of task and max_len)."""
    settings = {
        **TRAINER.task.defaults({"task": task.name}),
        "task": task.name,
        "out": None,
        "steps": steps,
        "batch_size": batch_size,
        "n_layer": config.n_layer,
        "n_head": config.n_head,
        "n_embd": config.n_embd,
        "dropout": config.dropout,
        "post_ln": not config.pre_ln,
        "positions": config.positions,
        "min_len": min_len,
        "max_len": max_len,
        "lr": lr,
        "min_lr": lr / 10,
        "warmup": warmup,
        "eval_every": steps,
        "seed": seed,
    }
    return TRAINER.fit(DigitsConfig(**settings), quiet=quiet)[0]


def main(argv: list[str] | None = None) -> int:
    return TRAINER.main(argv)


if __name__ == "__main__":
    sys.exit(main())
