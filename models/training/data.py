"""Training text: the default corpus, the train/val split, and batches that depend only on the step.

The default corpus is real text that every Python installation has, with no download: a fixed list
of the standard library's own source files (code, comments and docstrings), read from this
interpreter's stdlib directory. `--data FILE` replaces it with any UTF-8 text file. The text is
split before it is tokenized: a BPE vocabulary learns from the training part alone, and character
and BPE runs validate on the same text.

A batch depends only on (seed, step): the same seed gives the same batches, a run resumed at step k
sees exactly the batches the uninterrupted run saw, and data-parallel ranks can each take their
share of one global batch without talking to each other.
"""

from __future__ import annotations

import contextlib
import sysconfig
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from models.formats.tokenizer import BPETokenizer, CharTokenizer, Tokenizer

# Pure-Python modules present in every CPython since 3.10, in a fixed order: the same interpreter
# always yields the same corpus (about 1 MB of text). shlex.py is left out: its table of 60
# accented letters would add 60 tokens that the rest of the text never uses.
DEFAULT_MODULES: tuple[str, ...] = (
    "abc.py",
    "bisect.py",
    "heapq.py",
    "queue.py",
    "string.py",
    "textwrap.py",
    "fnmatch.py",
    "glob.py",
    "contextlib.py",
    "functools.py",
    "fractions.py",
    "random.py",
    "statistics.py",
    "pprint.py",
    "calendar.py",
    "weakref.py",
    "tempfile.py",
    "shutil.py",
    "pathlib.py",
    "collections/__init__.py",
    "dataclasses.py",
    "enum.py",
    "json/decoder.py",
    "json/encoder.py",
    "difflib.py",
    "threading.py",
    "argparse.py",
)

# Too little text and the model only memorises it; the stdlib selection is far above this.
_MIN_DEFAULT_CHARS = 200_000


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def load_default_corpus() -> str:
    """The default corpus: DEFAULT_MODULES of this interpreter's stdlib, joined by blank lines."""
    root = stdlib_dir()
    texts = []
    for name in DEFAULT_MODULES:
        path = root / name
        if path.is_file():  # a trimmed distribution may lack one; the rest is still plenty
            texts.append(path.read_text(encoding="utf-8"))
    text = "\n\n".join(texts)
    if len(text) < _MIN_DEFAULT_CHARS:
        raise FileNotFoundError(
            f"default corpus: found only {len(texts)} of {len(DEFAULT_MODULES)} standard library "
            f"files under {root} ({len(text)} characters); pass --data FILE with a UTF-8 text file"
        )
    return text


def load_text(path: str | Path) -> str:
    """A UTF-8 text file, with a clear error for missing, empty or non-UTF-8 files."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(f"no such file: {path}") from None
    except IsADirectoryError:
        raise IsADirectoryError(f"{path} is a directory, not a text file") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    if not text:
        raise ValueError(f"{path} is empty")
    return text


@dataclass
class Corpus:
    """A text's token ids split into train and validation parts, and the tokenizer used.

    val_bytes: the UTF-8 size of the validation text, for losses in bits per byte
    (models.evaluate), which compare across tokenizers where nats per token do not."""

    tokenizer: Tokenizer
    train: np.ndarray
    val: np.ndarray
    source: str
    val_bytes: int


@contextlib.contextmanager
def refused_data(command: str, data: str | None) -> Iterator[None]:
    """A command line's text that cannot be read or is too short for it (OSError, ValueError:
    missing, empty, not UTF-8, shorter than a window) as one line naming --data (SystemExit)."""
    try:
        yield
    except (OSError, ValueError) as exc:
        source = "the demo corpus" if data is None else f"--data {data}"
        raise SystemExit(f"{command}: {source}: {exc}") from None


def split_ids(ids: Sequence, val_fraction: float) -> tuple[Sequence, Sequence]:
    """The last `val_fraction` of the ids (or of the characters of a str) is validation text:
    contiguous, never seen in training."""
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"split_ids: val_fraction must be in (0, 1), got {val_fraction}")
    n_val = int(round(len(ids) * val_fraction))
    if n_val < 2 or len(ids) - n_val < 2:
        what = "characters" if isinstance(ids, str) else "tokens"
        raise ValueError(
            f"split_ids: {len(ids)} {what} are too few for a train/val split at {val_fraction}"
        )
    return ids[:-n_val], ids[-n_val:]


def prepare_corpus(
    path: str | Path | None = None,
    val_fraction: float = 0.1,
    tokenizer: Tokenizer | None = None,
    bpe_vocab_size: int | None = None,
) -> Corpus:
    """Load the text (default corpus when path is None), split it, tokenize both parts.

    Without a tokenizer: with bpe_vocab_size, BPE learned from the training part only (the
    validation text stays unseen); otherwise a character vocabulary of the whole text (so
    validation never meets an unknown character). When resuming, pass the checkpoint's tokenizer.
    """
    text = load_default_corpus() if path is None else load_text(path)
    source = "python stdlib sources" if path is None else str(path)
    train_text, val_text = split_ids(text, val_fraction)
    if tokenizer is None and bpe_vocab_size is not None:
        tokenizer = BPETokenizer.train(train_text, bpe_vocab_size)
    tokenizer = tokenizer or CharTokenizer.from_text(text)
    train, val = (np.asarray(tokenizer.encode(t), dtype=np.int64) for t in (train_text, val_text))
    return Corpus(tokenizer, train, val, source, val_bytes=len(val_text.encode("utf-8")))


def _check_length(ids: np.ndarray, block_size: int, what: str) -> None:
    if len(ids) <= block_size:
        raise ValueError(
            f"{what}: the text has {len(ids)} tokens but a training window needs block_size + 1 = "
            f"{block_size + 1}; use a longer text or a smaller --block-size"
        )


def _windows(
    ids: np.ndarray, batch_size: int, block_size: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    starts = rng.integers(0, len(ids) - block_size, size=batch_size)
    rows = starts[:, None] + np.arange(block_size)
    return ids[rows], ids[rows + 1]


def get_batch(
    ids: np.ndarray,
    batch_size: int,
    block_size: int,
    seed: int,
    step: int,
    rank: int = 0,
    world_size: int = 1,
) -> tuple[np.ndarray, np.ndarray]:
    """Inputs x and next-token targets y, both (batch_size // world_size, block_size) int64.

    The global batch of `batch_size` random windows is a function of (seed, step) alone; rank r of
    `world_size` takes rows r, r + world_size, ... of it.
    """
    _check_length(ids, block_size, "get_batch")
    if batch_size % world_size:
        raise ValueError(
            f"get_batch: batch_size {batch_size} is not divisible by world_size {world_size}"
        )
    x, y = _windows(ids, batch_size, block_size, np.random.default_rng([seed, 0, step]))
    return x[rank::world_size], y[rank::world_size]


def eval_batches(
    ids: np.ndarray, batch_size: int, block_size: int, num_batches: int, seed: int
) -> list[tuple[np.ndarray, np.ndarray]]:
    """A fixed set of windows for estimating a loss: the same at every evaluation, so that the
    points of a loss curve are comparable."""
    _check_length(ids, block_size, "eval_batches")
    # Seed stream [seed, 1, i]: disjoint from the training batches' [seed, 0, step].
    return [
        _windows(ids, batch_size, block_size, np.random.default_rng([seed, 1, i]))
        for i in range(num_batches)
    ]


def unigram_baseline(train: np.ndarray, val: np.ndarray, vocab_size: int) -> float:
    """Cross-entropy (nats/token) of val under train's token frequencies (add-one smoothed).

    The loss of a model that ignores context entirely: a trained GPT must land well below it.
    """
    counts = np.bincount(train, minlength=vocab_size).astype(np.float64) + 1.0
    log_p = np.log(counts / counts.sum())
    return float(-log_p[val].mean())
