"""Train the GPT on text: `python -m models.train` (the README's main job).

By default a character-level GPT learns the Python standard library's own source (no download) in a
few minutes on two CPU cores, then prints a sample; `--tokenizer bpe --vocab-size N` trains on GPT-2
style byte-level BPE tokens learned from the training split instead. The loop itself (settings,
steps, evaluation, checkpoints, --resume, Ctrl-C) is models/loop.py, shared with the MPI ranks of
models/ddp.py; `--ddp` hands the run over to models.ddp (`mpiexec -n N python -m models.train
--ddp`).
"""

from __future__ import annotations

import sys

from models import loop


def main(argv: list[str] | None = None) -> int:
    """Console entry point (glassgrad-train)."""
    args = loop.build_parser().parse_args(argv)
    if args.ddp:
        from models import ddp  # needs mpi4py, only imported when asked for

        return ddp.main(args)
    return loop.run(args)


if __name__ == "__main__":
    sys.exit(main())
