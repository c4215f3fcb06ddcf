"""An encoder-only Transformer (notes 8.7) trained by masked-character prediction.

    python -m models.encoder

The demo corpus (models.training.data: the Python stdlib's source) is cut into windows; in each, 15
% of the characters are replaced by a MASK token and the model predicts them from the rest, read
both ways (nn.EncoderBlock: no causal mask, so the characters after a gap count as much as those
before it). A decoder-only GPT could only use the left side. The score is the fraction of masked
characters of the validation text predicted exactly, beside the unigram baseline: always
guessing the training text's most frequent character.

The model is models/architectures/encoder.py. The training is the one loop of models/training/
(MaskedCharacters, models/training/tasks/masked.py, plugs in the masked batches, the evaluation
and the model's files; MaskedConfig holds its settings): checkpoints and loss.png in --out
(runs/encoder), --resume, Ctrl-C, the compiled step, --ddp.
"""

from __future__ import annotations

import sys

from models.training.loop import Trainer
from models.training.tasks.masked import MaskedCharacters

TRAINER = Trainer(MaskedCharacters())


def main(argv: list[str] | None = None) -> int:
    return TRAINER.main(argv)


if __name__ == "__main__":
    sys.exit(main())
