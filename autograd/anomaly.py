"""Anomaly mode: check every forward output and backward gradient for NaN/Inf, and name the op
and the user's line that created it (an observer of the engine, autograd/hooks.py)."""

from __future__ import annotations

import os
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from autograd import hooks
from autograd.tensor import Function, Tensor, describe

_ENGINE_DIR = os.path.dirname(os.path.abspath(__file__))


class AnomalyError(FloatingPointError):
    """A NaN or Inf appeared in a forward output or a backward gradient under detect_anomaly()."""


class AnomalyObserver(hooks.Observer):
    def forward(self, fn: Function, out: np.ndarray, arrays: Sequence[Any]) -> None:
        fn.created_at = traceback.extract_stack()[:-3]  # without the engine's own frames
        _check_finite(out, f"forward output of {fn.name}", fn, arrays)

    def backward_step(self, step, fn, output, grad, input_grads) -> None:
        for g in input_grads:
            if g is not None:  # a Tensor under create_graph
                g = g.data if isinstance(g, Tensor) else g
                _check_finite(g, f"gradient produced by {fn.name}.backward", fn, [grad])


@contextmanager
def detect_anomaly() -> Iterator[None]:
    """Check every forward output and backward gradient for NaN/Inf; name the op that made it.

    Each op created inside the block also remembers where in user code it was created, so the
    error points at the line to look at. Off by default; when off it costs nothing per op.
    """
    observer = AnomalyObserver()
    hooks.ACTIVE.append(observer)
    try:
        yield
    finally:
        hooks.ACTIVE.remove(observer)


def _check_finite(array: np.ndarray, what: str, fn: Function, arrays: Sequence[Any]) -> None:
    if np.issubdtype(array.dtype, np.floating) and not np.isfinite(array).all():
        bad = "NaN" if np.isnan(array).any() else "Inf"
        # The innermost frame outside the engine is the user's line that created the op.
        user_frames = [f for f in getattr(fn, "created_at", ()) if _ENGINE_DIR not in f.filename]
        origin = ""
        if user_frames:
            frame = user_frames[-1]
            origin = f"\n  op created at {frame.filename}:{frame.lineno}: {frame.line}"
        raise AnomalyError(
            f"detect_anomaly: {bad} in {what} (op {fn.name}, inputs: {describe(arrays)}, "
            f"output shape {array.shape}){origin}"
        )
