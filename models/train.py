"""Train the GPT on text: `python -m models.train` (the README's main job).

By default a character-level GPT learns the Python standard library's own source (no download) in a
few minutes on two CPU cores, then prints a sample; `--tokenizer bpe --vocab-size N` trains on GPT-2
style byte-level BPE tokens learned from the training split instead; `--init-from DIR --sft FILE`
fine-tunes a trained model on conversations. The tasks are models/training/tasks/ (language.py,
chat.py), their settings LanguageConfig; the loop itself (steps, evaluation, checkpoints,
--resume, Ctrl-C, the compiled step, --ddp) is models/training/, shared with the encoder and the
encoder-decoder (`mpiexec -n N python -m models.train --ddp` runs it on MPI ranks, models/ddp.py).
"""

from __future__ import annotations

import sys

from models.training.loop import Trainer
from models.training.task import Task
from models.training.tasks.chat import ChatFineTuning
from models.training.tasks.language import LanguageConfig, LanguageModelling

LANGUAGE, CHAT = LanguageModelling(), ChatFineTuning()


def choose(config: LanguageConfig) -> Task:
    """--sft: chat fine-tuning; else language modelling on the corpus."""
    return CHAT if config.sft is not None else LANGUAGE


TRAINER = Trainer(LANGUAGE, choose)


def main(argv: list[str] | None = None) -> int:
    """Console entry point (glassgrad-train)."""
    return TRAINER.main(argv)


if __name__ == "__main__":
    sys.exit(main())
