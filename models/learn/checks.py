"""What an exercise's cases.py and diagnoses.py are written with: a failure (Failed), an engine
case (Case), the probes' inputs (Probes) and the comparison every check uses (close)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

TOLERANCE = 1e-9  # a probe's |got - expected| <= TOLERANCE * (1 + |expected|)


class Failed(Exception):
    """One reason the exercise does not pass: a printed line and its diagnosis key, if any."""

    def __init__(self, line: str, diagnosis: str | None = None, text: str | None = None):
        super().__init__(line)
        self.line, self.diagnosis, self.text = line, diagnosis, text


@dataclass(frozen=True)
class Case:
    """check_op's case: the op run on the learner's code against a numpy reference."""

    label: str
    op: Callable
    reference: Callable | None
    arrays: list
    differentiable: list | None = None


class Probes:
    """The probes' inputs: one generator (seed 7) that every exercise's probes draw from in track
    order, after the arrays drawn here first (the order they were always drawn in, so that a
    failure shows the same numbers)."""

    def __init__(self) -> None:
        self.r = rng(7)
        self.logits = self.r.standard_normal((3, 5)) * 2  # softmax's and log-softmax's
        self.logits[0, 3] = -np.inf  # a masked entry
        self.attention = (  # q, k, v
            self.r.standard_normal((1, 2, 4, 3)),
            self.r.standard_normal((1, 2, 4, 3)),
            self.r.standard_normal((1, 2, 4, 2)),
        )
        self.cross_entropy_logits = self.r.standard_normal((4, 5))


def rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def close(a, b) -> bool:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return a.shape == b.shape and bool(np.all(np.abs(a - b) <= TOLERANCE * (1 + np.abs(b)) + 1e-12))


def short(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def copied(args: tuple) -> tuple:
    """The arguments with every array copied: what a function may not change is kept apart."""
    return tuple(a.copy() if isinstance(a, np.ndarray) else a for a in args)
