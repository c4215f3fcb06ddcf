"""Grading a workspace: the learner's functions, plugged into the engine, checked by the public
checker (autograd.testing.check_op), and compared directly with the reference on probe inputs so
that a wrong answer gets a diagnosis of the classic mistake behind it.

An exercise passes when every probe equals the reference solution and every engine case passes
check_op (forward vs numpy, gradient vs central differences, the VJP discipline) with the
learner's code in place of glassgrad's own.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import math
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import autograd
import autograd.functional as F
import autograd.ops as ops
import nn
from autograd import Tensor
from autograd.testing import check_op
from autograd.testing.references import (
    np_attention,
    np_cross_entropy,
    np_layer_norm,
    np_log_softmax,
    np_softmax,
)
from models.learn.exercises import BY_NUMBER, Exercise
from models.learn.plug import plugged
from models.learn.text import say

TOLERANCE = 1e-9  # a probe's |got - expected| <= TOLERANCE * (1 + |expected|)


@dataclass
class Report:
    number: int
    passed: bool
    lines: list[str] = field(default_factory=list)
    diagnoses: list[str] = field(default_factory=list)  # the diagnosis keys (for the tests)


class Failed(Exception):
    """One reason the exercise does not pass: a printed line and its diagnosis key, if any."""

    def __init__(self, line: str, diagnosis: str | None = None, text: str | None = None):
        super().__init__(line)
        self.line, self.diagnosis, self.text = line, diagnosis, text


# --- loading the learner's functions -----------------------------------------------------------


def load(workspace: Path, exercise: Exercise, lang: str) -> dict[str, Callable]:
    """The exercise's functions from the workspace file, freshly imported. The workspace is on
    sys.path while it loads, so a file may import an earlier one (`from ex05_softmax import`)."""
    path = workspace / exercise.file
    if not path.exists():
        raise Failed(say("missing_file", lang, file=exercise.file))
    for name in [m for m in sys.modules if m.startswith("ex") and m[2:4].isdigit()]:
        del sys.modules[name]  # the learner's modules as they are now on disk
    sys.path.insert(0, str(workspace))
    try:
        spec = importlib.util.spec_from_file_location(exercise.module, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except Exception as exc:  # the learner's syntax or import error, reported, never raised
        raise Failed(say("import_error", lang, file=exercise.file, error=_short(exc))) from exc
    finally:
        sys.path.remove(str(workspace))
    functions = {}
    for f in exercise.functions:
        if not callable(getattr(module, f.name, None)):
            raise Failed(say("missing_function", lang, file=exercise.file, name=f.name))
        functions[f.name] = getattr(module, f.name)
    return functions


def reference(exercise: Exercise) -> dict[str, Callable]:
    module = importlib.import_module(f"models.learn.solutions.{exercise.module}")
    return {f.name: getattr(module, f.name) for f in exercise.functions}


def _short(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


# --- probes: the learner's function called directly, compared with the reference ----------------

PARTS = {
    "matmul_backward": ("da", "db"),
    "div_backward": ("da", "db"),
    "layer_norm_backward": ("dx", "dw", "db"),
    "attention_backward": ("dq", "dk", "dv"),
    "adamw_step": ("p", "m", "v"),
}


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def _softmax_rows(x):
    return np_softmax(x, -1)


def _causal(tq, tk):
    return np.tril(np.ones((tq, tk), bool), tk - tq)


def _probes() -> dict[str, list[tuple]]:
    r = _rng(7)
    logits = r.standard_normal((3, 5)) * 2
    logits[0, 3] = -np.inf  # a masked entry
    ties = np.array([[1.0, 3.0, 3.0, 3.0], [2.0, 0.0, 2.0, -1.0]])
    q, k, v = (
        r.standard_normal((1, 2, 4, 3)),
        r.standard_normal((1, 2, 4, 3)),
        r.standard_normal((1, 2, 4, 2)),
    )
    ids = np.array([[0, 2, 0], [3, 0, 2]])  # 0 and 2 repeat
    targets = np.array([1, -100, 4, 0])
    ce_logits = r.standard_normal((4, 5))
    return {
        "unbroadcast": [
            (r.standard_normal((2, 3)), (3,)),
            (r.standard_normal((4, 2, 3)), (2, 1)),
            (r.standard_normal((2, 3)), (2, 3)),
            (r.standard_normal((3, 2)), ()),
        ],
        "matmul_backward": [
            (r.standard_normal((3, 3)), r.standard_normal((3, 3)), r.standard_normal((3, 3))),
            (r.standard_normal((2, 4)), r.standard_normal((4, 3)), r.standard_normal((2, 3))),
        ],
        "div_backward": [
            (r.uniform(-2, 2, (2, 3)), r.uniform(0.5, 2, (2, 3)), r.standard_normal((2, 3)))
        ],
        "tanh_backward": [(np.tanh(r.standard_normal((2, 3))), r.standard_normal((2, 3)))],
        "sum_backward": [
            (r.standard_normal((2,)), (2, 3), (1,), False),
            (r.standard_normal((1, 3)), (2, 3), (0,), True),
            (np.array(1.5), (2, 3), (0, 1), False),
        ],
        "max_backward": [
            (ties, r.standard_normal(2), (1,), False),
            (ties, r.standard_normal((1, 4)), (0,), True),
        ],
        "softmax_backward": [(_softmax_rows(logits), r.standard_normal((3, 5)))],
        "log_softmax_backward": [(np_log_softmax(logits, -1), r.standard_normal((3, 5)))],
        "cross_entropy_backward": [(ce_logits, targets, -100)],
        "layer_norm_backward": [
            (r.standard_normal((2, 3, 4)), r.standard_normal(4), r.standard_normal((2, 3, 4)), 1e-5)
        ],
        "embedding_backward": [(ids, r.standard_normal((2, 3, 2)), 5)],
        "gather_backward": [
            (np.array([[0, 2, 0, 0], [1, 1, 2, 0]]), r.standard_normal((2, 4)), (2, 3), 1),
            (np.array([[1, 1, 0]]), r.standard_normal((1, 3)), (2, 3), 0),
        ],
        "attention_backward": [(q, k, v, r.standard_normal((1, 2, 4, 2)), _causal(4, 4))],
        "adamw_step": [
            (
                r.standard_normal((2, 3)),
                r.standard_normal((2, 3)),
                r.standard_normal((2, 3)) * 0.1,
                r.uniform(0, 0.1, (2, 3)),
                3,
                0.1,
                (0.9, 0.999),
                1e-3,  # large enough that where eps is added shows
                0.1,
            )
        ],
    }


# Classic mistakes, one home each, in four tables: MISTAKES, each written as the wrong function it
# amounts to (a learner's output equal to one of them on the probes gets that diagnosis); FACTORS,
# a constant factor that is a quantity of the case (a missing 1/N or 1/sqrt(d), named with its N
# or d); SHAPES, a wrong shape that holds the right numbers; RAISES, a function that raises,
# explained (its code works once the reduced axes are put back for it; .T on 4-D arrays). A sign
# flipped, another constant factor and a transposed result are recognised without a list.
def _adam(
    p,
    g,
    m,
    v,
    t,
    lr,
    betas,
    eps,
    wd,
    correct=True,
    l2=False,
    decay_lr=True,
    inside=False,
    after=False,
):
    b1, b2 = betas
    if l2:
        g = g + wd * p
    elif not after:
        p = p * (1 - (lr * wd if decay_lr else wd))
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    m_hat, v_hat = (m / (1 - b1**t), v / (1 - b2**t)) if correct else (m, v)
    denom = np.sqrt(v_hat + eps) if inside else np.sqrt(v_hat) + eps
    p = p - lr * m_hat / denom
    return (p * (1 - lr * wd) if after else p), m, v


def _unbroadcast_left_aligned(grad, shape):
    # shapes lined up from the left: the trailing axes taken for the ones broadcasting added
    out = grad.sum(axis=tuple(range(len(shape), grad.ndim)))
    stretched = tuple(i for i, n in enumerate(shape) if n == 1 and out.shape[i] != 1)
    return out.sum(axis=stretched, keepdims=True)


def _attention_mask_times_zero(q, k, v, g, allowed):
    # scores multiplied by the mask: a forbidden score is 0, which softmax still weighs (e^0 = 1)
    d = q.shape[-1]
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(d) * allowed
    a = np_softmax(s, -1)
    da = g @ np.swapaxes(v, -1, -2)
    ds = a * (da - (a * da).sum(axis=-1, keepdims=True)) / math.sqrt(d)
    return ds @ k, np.swapaxes(ds, -1, -2) @ q, np.swapaxes(a, -1, -2) @ g


def _gather_last_axis(index, g, shape, axis):
    from models.learn.solutions.ex08_embedding import gather_backward

    return gather_backward(index, g, shape, len(shape) - 1)


def _ce_whole_array(logits, targets, ignore_index=-100):
    kept = targets != ignore_index
    p = np.exp(logits - logits.max())
    p /= p.sum()
    p[np.flatnonzero(kept), targets[kept]] -= 1
    return p * (kept / max(int(kept.sum()), 1))[:, None]


def _ln(x, w, g, eps, xhat_term=True, mean_term=True, eps_inside=True):
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    rstd = 1 / np.sqrt(var + eps) if eps_inside else 1 / (np.sqrt(var) + eps)
    xhat = (x - mean) * rstd
    u = g * w
    dx = u - u.mean(axis=-1, keepdims=True) if mean_term else u
    if xhat_term:
        dx = dx - xhat * (u * xhat).mean(axis=-1, keepdims=True)
    rows = g.reshape(-1, g.shape[-1]), xhat.reshape(-1, x.shape[-1])
    return rstd * dx, (rows[0] * rows[1]).sum(axis=0), rows[0].sum(axis=0)


def _attention_unmasked(q, k, v, g, allowed):
    from models.learn.solutions.ex09_attention import attention_backward

    return attention_backward(q, k, v, g, np.ones_like(allowed))


def _attention_dk_untransposed(q, k, v, g, allowed):
    from models.learn.solutions.ex09_attention import attention_backward

    dq, _, dv = attention_backward(q, k, v, g, allowed)
    scale = 1 / math.sqrt(q.shape[-1])
    s = np.where(allowed, q @ np.swapaxes(k, -1, -2) * scale, -np.inf)
    a = np_softmax(s, -1)
    da = g @ np.swapaxes(v, -1, -2)
    ds = a * (da - (a * da).sum(axis=-1, keepdims=True)) * scale
    return dq, ds @ q, dv


def _embedding_assigned(idx, g, vocab_size):
    dE = np.zeros((vocab_size, g.shape[-1]))
    dE[idx.reshape(-1)] += g.reshape(-1, g.shape[-1])
    return dE


def _gather_put(index, g, shape, axis):
    dx = np.zeros(shape)
    np.put_along_axis(dx, index, g, axis=axis)
    return dx


def _max_each_tie(a, g, axes, keepdims):
    from models.learn.solutions.ex03_elementwise import sum_backward

    winners = a == a.max(axis=axes, keepdims=True)
    return winners * sum_backward(g, a.shape, axes, keepdims)


def _max_first_tie(a, g, axes, keepdims):
    from models.learn.solutions.ex03_elementwise import sum_backward

    (axis,) = axes
    first = np.zeros(a.shape, bool)
    np.put_along_axis(first, np.expand_dims(a.argmax(axis=axis), axis), True, axis=axis)
    return first * sum_backward(g, a.shape, axes, keepdims)


def _ce_mean_over_all(logits, targets, ignore_index=-100):
    kept = targets != ignore_index
    p = _softmax_rows(logits)
    p[np.flatnonzero(kept), targets[kept]] -= 1
    return p * kept[:, None] / len(targets)


def _ce_ignored_rows_kept(logits, targets, ignore_index=-100):
    kept = targets != ignore_index
    p = _softmax_rows(logits)
    p[np.flatnonzero(kept), targets[kept]] -= 1
    return p / max(int(kept.sum()), 1)


def _ln_constant_statistics(x, w, g, eps):
    from models.learn.solutions.ex07_layer_norm import layer_norm_backward

    rstd = 1 / np.sqrt(x.var(axis=-1, keepdims=True) + eps)
    _, dw, db = layer_norm_backward(x, w, g, eps)
    return g * w * rstd, dw, db


MISTAKES: dict[str, list[tuple[str, Callable]]] = {
    "unbroadcast": [("d_unbroadcast_wrong_axes", _unbroadcast_left_aligned)],
    "matmul_backward": [
        ("d_transposed", lambda a, b, g: (g @ b, a @ g)),
        ("d_swapped", lambda a, b, g: (a.T @ g, g @ b.T)),
    ],
    "tanh_backward": [("d_tanh_twice", lambda y, g: g * (1 - np.tanh(y) ** 2))],
    "max_backward": [
        ("d_ties_not_split", _max_each_tie),
        ("d_ties_first_only", _max_first_tie),
    ],
    "softmax_backward": [
        ("d_softmax_no_diagonal", lambda a, g: -a * (a * g).sum(axis=-1, keepdims=True)),
        ("d_softmax_only_diagonal", lambda a, g: a * g),
        ("d_softmax_wrong_axis", lambda a, g: a * (g - (a * g).sum(axis=0, keepdims=True))),
        ("d_softmax_whole_array", lambda a, g: a * (g - (a * g).sum())),
    ],
    "log_softmax_backward": [
        ("d_log_softmax_no_sum", lambda y, g: g - np.exp(y) * g),
        ("d_softmax_whole_array", lambda y, g: g - np.exp(y) * g.sum()),
    ],
    "cross_entropy_backward": [
        ("d_ignored_rows", _ce_ignored_rows_kept),
        ("d_mean_over_all_rows", _ce_mean_over_all),
        ("d_softmax_whole_array", _ce_whole_array),
    ],
    "layer_norm_backward": [
        ("d_constant_statistics", _ln_constant_statistics),
        ("d_ln_no_xhat_term", lambda *a: _ln(*a, xhat_term=False)),
        ("d_ln_no_mean_term", lambda *a: _ln(*a, mean_term=False)),
        ("d_ln_eps_outside_sqrt", lambda *a: _ln(*a, eps_inside=False)),
    ],
    "embedding_backward": [("d_not_accumulated", _embedding_assigned)],
    "gather_backward": [
        ("d_not_accumulated", _gather_put),
        ("d_gather_axis", _gather_last_axis),
    ],
    "attention_backward": [
        ("d_mask_gradient", _attention_unmasked),
        ("d_mask_times_zero", _attention_mask_times_zero),
        ("d_transposed", _attention_dk_untransposed),
    ],
    "adamw_step": [
        ("d_no_bias_correction", lambda *a: _adam(*a, correct=False)),
        ("d_l2_decay", lambda *a: _adam(*a, l2=True)),
        ("d_decay_without_lr", lambda *a: _adam(*a, decay_lr=False)),
        ("d_eps_inside_sqrt", lambda *a: _adam(*a, inside=True)),
        ("d_decay_after_step", lambda *a: _adam(*a, after=True)),
    ],
}

# A result off by a constant factor that is a quantity of the case: (diagnosis, the factor and
# the quantity it names). A missing 1/N multiplies by N, a missing 1/sqrt(d) by sqrt(d).
FACTORS: dict[str, list[tuple[str, Callable]]] = {
    "cross_entropy_backward": [
        (
            "d_missing_mean",
            lambda logits, targets, ignore=-100: [int((targets != ignore).sum())] * 2,
        ),
    ],
    "attention_backward": [
        ("d_missing_scale", lambda q, *_: (math.sqrt(q.shape[-1]), q.shape[-1])),
    ],
}

# A result of the wrong shape explained by the right values in another shape: (diagnosis, test).
SHAPES: list[tuple[str, Callable]] = [
    # the right numbers with the summed size-1 axes dropped (a sum without keepdims)
    ("d_keepdims_dropped", lambda got, e: got.size == e.size and _close(got.reshape(e.shape), e)),
    # the broadcast dimensions still there: summing them back gives the right result
    ("d_not_summed", lambda got, e: _close(_unbroadcast_or_none(got, e.shape), e)),
]


def _unbroadcast_or_none(got, shape):
    try:
        return autograd.unbroadcast(got, shape)
    except (ValueError, IndexError):
        return None


def _with_reduced_axes_kept(args: tuple, g_at: int, shape: tuple) -> tuple:
    """A reduction VJP's args (..., axes, keepdims) with g (at g_at) given its reduced axes back
    as size-1 axes, and keepdims=True: what it gets once the axes are put back."""
    args = list(args)
    axes = args[-2]
    args[g_at] = args[g_at].reshape(tuple(1 if d in axes else n for d, n in enumerate(shape)))
    args[-1] = True
    return tuple(args)


def _reduction_axes_not_put_back(learner, ref, args, g_at: int, shape_of: Callable) -> bool:
    """It raised, yet with the reduced axes put back for it, it gives the right answer."""
    if args[-1]:  # keepdims: nothing to put back
        return False
    fixed = _with_reduced_axes_kept(args, g_at, shape_of(args))
    try:
        return _close(learner(*_copy(fixed)), ref(*_copy(args)))
    except Exception:
        return False


def _uses_dot_t(learner, ref, args) -> bool:
    """It raised on 4-D arrays and its code uses .T (which reverses every axis of a 4-D array)."""
    try:
        source = inspect.getsource(learner)
    except (OSError, TypeError):
        return False
    return bool(re.search(r"\.T\b", source)) and any(np.ndim(a) > 2 for a in args)


# A function that raises, explained: (diagnosis, test(learner, reference, args) -> bool).
RAISES: dict[str, list[tuple[str, Callable]]] = {
    "sum_backward": [
        (
            "d_reduced_axes_not_put_back",
            lambda f, r, a: _reduction_axes_not_put_back(f, r, a, 0, lambda args: args[1]),
        )
    ],
    "max_backward": [
        (
            "d_reduced_axes_not_put_back",
            lambda f, r, a: _reduction_axes_not_put_back(f, r, a, 1, lambda args: args[0].shape),
        )
    ],
    "attention_backward": [("d_dot_t_on_4d", _uses_dot_t)],
}

# Changing an input in place: what the piece is, for the message.
IN_PLACE_RULE = {"adamw_step": "rule_step"}  # every other piece is a VJP: "rule_vjp"


def _close(a, b) -> bool:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return a.shape == b.shape and bool(np.all(np.abs(a - b) <= TOLERANCE * (1 + np.abs(b)) + 1e-12))


def _parts(name: str, out) -> list:
    names = PARTS.get(name, ("result",))
    values = list(out) if len(names) > 1 else [out]
    if len(values) != len(names):
        raise TypeError(f"{name} must return {len(names)} arrays ({', '.join(names)})")
    return [np.asarray(v, dtype=np.float64) for v in values]


def _describe_args(args) -> str:
    shown = [f"{a.shape}" if isinstance(a, np.ndarray) else repr(a) for a in args]
    return "(" + ", ".join(shown) + ")"


def _copy(args):
    return tuple(a.copy() if isinstance(a, np.ndarray) else a for a in args)


def probe(name: str, learner: Callable, ref: Callable, args: tuple, lang: str) -> None:
    """Raise Failed unless learner(*args) equals ref(*args), with a diagnosis where one fits."""
    given = _copy(args)
    try:
        got = learner(*given)
    except NotImplementedError as exc:
        raise Failed(say("stub", lang, name=name), "stub") from exc
    except Exception as exc:
        line = say("raised", lang, name=name, error=_short(exc))
        for key, explains in RAISES.get(name, []):
            with np.errstate(all="ignore"):
                if explains(learner, ref, args):
                    raise Failed(line, key, say(key, lang)) from exc
        raise Failed(line, "raised") from exc
    for i, (before, after) in enumerate(zip(args, given, strict=True)):
        if isinstance(before, np.ndarray) and not np.array_equal(before, after, equal_nan=True):
            rule = say(IN_PLACE_RULE.get(name, "rule_vjp"), lang)
            arg = _parameter(learner, i)
            raise Failed(
                say("changed_input", lang, name=name, n=i + 1, arg=arg, rule=rule), "changed_input"
            )
    if got is None:
        raise Failed(say("returned_none", lang, name=name), "returned_none")
    expected = _parts(name, ref(*_copy(args)))
    try:
        got = _parts(name, got)
    except (TypeError, ValueError) as exc:
        raise Failed(say("raised", lang, name=name, error=_short(exc)), "raised") from exc
    labels = PARTS.get(name, ("result",))
    for index, (part, g, e) in enumerate(zip(labels, got, expected, strict=True)):
        if _close(g, e):
            continue
        part = {"en": "the result", "zh": "结果"}[lang] if part == "result" else part
        where = _describe_args(args)
        key, values = _diagnose(name, index, g, e, args)
        if g.shape != e.shape:
            line = say(
                "shape", lang, name=name, args=where, part=part, got=g.shape, expected=e.shape
            )
            raise Failed(line, key or "shape", say(key, lang, part=part, **values) if key else None)
        diff = np.abs(g - e)
        diff = np.where(np.isnan(diff), np.inf, diff)
        worst = np.unravel_index(np.argmax(diff), e.shape) if e.ndim else ()
        line = say(
            "probe",
            lang,
            name=name,
            args=where,
            part=part,
            index=list(int(i) for i in worst),
            expected=float(e[worst]),
            got=float(g[worst]),
        )
        raise Failed(line, key, say(key, lang, part=part, **values) if key else None)


def _parameter(function: Callable, i: int) -> str:
    try:
        return list(inspect.signature(function).parameters)[i]
    except (TypeError, ValueError, IndexError):
        return "?"


def _factor(got, expected) -> float:
    denom = float(np.sum(expected * expected))
    return float(np.sum(got * expected)) / denom if denom else math.nan


def _diagnose(name, index, got, expected, args) -> tuple[str | None, dict]:
    """The classic mistake that explains `got` (part `index` of `name`'s result) where
    `expected` was due: the diagnosis key and the values its message names."""
    for key, wrong in MISTAKES.get(name, []):
        try:
            with np.errstate(all="ignore"):
                mistaken = _parts(name, wrong(*_copy(args)))[index]
        except Exception:  # a mistake that cannot even run on these arguments is not this one
            continue
        if _close(got, mistaken):
            return key, {}
    if got.shape != expected.shape:
        return next((key for key, explains in SHAPES if explains(got, expected)), None), {}
    c = _factor(got, expected)
    if not (np.isfinite(c) and _close(got, c * expected)):
        transposed = got.ndim >= 2 and _close(np.swapaxes(got, -1, -2), expected)
        return ("d_transposed" if transposed else None), {}
    if abs(c + 1) < 1e-9:
        return "d_sign", {}
    for key, quantity in FACTORS.get(name, []):
        factor, value = quantity(*args)
        if abs(c - factor) <= 1e-9 * factor:
            return key, {"value": value}
    return "d_factor", {"factor": c}


# --- the engine cases: check_op with the learner's code plugged in ------------------------------


@dataclass(frozen=True)
class Case:
    label: str
    op: Callable
    reference: Callable | None
    arrays: list
    differentiable: list | None = None


def _cases(number: int) -> list[Case]:
    r = _rng(number)
    n = r.standard_normal
    if number == 1:
        return [
            Case("a + b", lambda a, b: a + b, np.add, [n((2, 3)), n(3)]),
            Case("a * b", lambda a, b: a * b, np.multiply, [n((2, 1)), n((1, 3))]),
            Case("a - b", lambda a, b: a - b, np.subtract, [n((4, 1, 3)), n((2, 3))]),
            Case("a + b", lambda a, b: a + b, np.add, [n(()), n((2, 2))]),
        ]
    if number == 2:
        return [
            Case("a @ b", lambda a, b: a @ b, np.matmul, [n((3, 4)), n((4, 2))]),
            Case("a @ b", lambda a, b: a @ b, np.matmul, [n((3, 3)), n((3, 3))]),
            Case(
                "F.linear(x, w, b)",
                F.linear,
                lambda x, w, b: x @ w + b,
                [n((2, 3, 4)), n((4, 5)), n(5)],
            ),
        ]
    if number == 3:
        # Two-way ties: there the even split is what central differences see (a three-way tie,
        # where they see 1/2 and not 1/3, is checked by the probes against the reference).
        ties = np.array([[1.0, 3.0, 3.0], [2.0, 0.5, 2.0]])
        return [
            Case("a / b", lambda a, b: a / b, np.divide, [n((2, 3)), r.uniform(0.5, 2, 3)]),
            Case("tanh(x)", lambda x: x.tanh(), np.tanh, [n((2, 3)) * 2]),
            Case("x.sum(axis=1)", lambda x: x.sum(axis=1), lambda a: a.sum(axis=1), [n((2, 3))]),
            Case(
                "x.sum(axis=-1, keepdims=True)",
                lambda x: x.sum(axis=-1, keepdims=True),
                lambda a: a.sum(axis=-1, keepdims=True),
                [n((2, 3, 2))],
            ),
            Case("x.max(axis=1)", lambda x: x.max(axis=1), lambda a: a.max(axis=1), [ties]),
            Case("x.max()", lambda x: x.max(), np.max, [n((2, 3))]),
        ]
    if number == 4:

        def diamond(x, w):
            h = (x @ w).tanh()
            return h * h + h.sum(axis=-1, keepdims=True) * x.sum()

        def np_diamond(x, w):
            h = np.tanh(x @ w)
            return h * h + h.sum(axis=-1, keepdims=True) * x.sum()

        def chain(x):
            a = x * 2.0
            b = a * a
            return (a + b) * b

        def np_chain(x):
            a = x * 2.0
            return (a + a * a) * (a * a)

        return [
            Case(
                "h * h + h.sum() * x.sum(), h = tanh(x @ w)",
                diamond,
                np_diamond,
                [n((2, 3)), n((3, 3))],
            ),
            Case("(a + a²) a², a = 2x", chain, np_chain, [n((3,))]),
            Case(
                "F.layer_norm(x, w, b).sum() twice",
                lambda x, w, b: F.layer_norm(x, w, b) + F.layer_norm(x, w, b),
                lambda x, w, b: 2 * np_layer_norm(x, w, b),
                [n((2, 4)), n(4), n(4)],
            ),
        ]
    if number == 5:
        x = n((3, 5)) * 3
        x[1, [0, 2]] = -np.inf
        return [
            Case("F.softmax(x, -1)", lambda t: F.softmax(t, -1), lambda a: np_softmax(a, -1), [x]),
            Case(
                "F.softmax(x, 0)",
                lambda t: F.softmax(t, 0),
                lambda a: np_softmax(a, 0),
                [n((4, 2))],
            ),
        ]
    if number == 6:
        targets = np.array([[1, -100, 3], [0, 2, 2]])
        x = n((2, 4)) * 3
        x[0, 1] = -np.inf
        return [
            Case(
                "F.log_softmax(x, -1)",
                lambda t: F.log_softmax(t, -1),
                lambda a: np_log_softmax(a, -1),
                [x],
            ),
            Case(
                "F.cross_entropy(logits, targets)",
                lambda t: F.cross_entropy(t, targets),
                lambda a: np_cross_entropy(a, targets),
                [n((2, 3, 4))],
            ),
        ]
    if number == 7:
        return [
            Case("F.layer_norm(x, w, b)", F.layer_norm, np_layer_norm, [n((3, 4)), n(4), n(4)]),
            Case(
                "F.layer_norm(x, w, b)", F.layer_norm, np_layer_norm, [n((2, 2, 5)) * 3, n(5), n(5)]
            ),
        ]
    if number == 8:
        ids = np.array([[1, 1, 3], [0, 1, 3]])
        index = np.array([[2, 0, 2, 2], [1, 1, 0, 1], [0, 0, 0, 2]])  # repeats along each row
        return [
            Case(
                "F.embedding(E, ids)", lambda w: F.embedding(w, ids), lambda w: w[ids], [n((4, 3))]
            ),
            Case(
                "F.gather(x, index, axis=1)",
                lambda x: F.gather(x, index, 1),
                lambda a: np.take_along_axis(a, index, 1),
                [n((3, 3))],
            ),
            Case(
                "F.gather(x, index, axis=-2)",
                lambda x: F.gather(x, index[:2], -2),
                lambda a: np.take_along_axis(a, index[:2], -2),
                [n((3, 4))],
            ),
        ]
    if number == 9:
        allowed = r.random((3, 5)) < 0.6
        allowed[:, 0] = True
        return [
            Case(
                "F.scaled_dot_product_attention(q, k, v, causal=True)",
                lambda q, k, v: F.scaled_dot_product_attention(q, k, v, causal=True),
                lambda q, k, v: np_attention(q, k, v, True),
                [n((1, 2, 4, 3)), n((1, 2, 4, 3)), n((1, 2, 4, 3))],
            ),
            Case(
                "F.scaled_dot_product_attention(q, k, v, causal=True), Tq < Tk, Dv != D",
                lambda q, k, v: F.scaled_dot_product_attention(q, k, v, causal=True),
                lambda q, k, v: np_attention(q, k, v, True),
                [n((2, 1, 3, 2)), n((2, 1, 5, 2)), n((2, 1, 5, 3))],
            ),
            Case(
                "F.scaled_dot_product_attention(q, k, v, causal=False, mask=allowed)",
                lambda q, k, v: F.scaled_dot_product_attention(q, k, v, causal=False, mask=allowed),
                lambda q, k, v: np_attention(q, k, v, False, allowed),
                [n((1, 1, 3, 2)), n((1, 1, 5, 2)), n((1, 1, 5, 2))],
            ),
        ]
    return []


def run_case(case: Case, lang: str) -> None:
    try:
        check_op(case.op, case.reference, case.arrays, case.differentiable, forward_rtol=1e-9)
    except NotImplementedError as exc:
        raise Failed(
            say("case", lang, case=case.label, shapes=_shapes(case)) + "\n  " + _short(exc), "stub"
        ) from exc
    except Exception as exc:
        line = say("case", lang, case=case.label, shapes=_shapes(case)) + "\n  " + _short(exc)
        raise Failed(line, "engine") from exc


def _shapes(case: Case) -> str:
    return ", ".join(str(np.shape(a)) for a in case.arrays)


# --- the backward loop (exercise 4): graphs whose answers tell the classic mistakes apart -------


def _loop_probes(lang: str) -> None:
    calls: dict[int, int] = {}
    counted = (ops.Mul, ops.Add)
    originals = {cls: cls.__dict__["backward"] for cls in counted}

    def counting(original):
        def backward(self, g):
            calls[id(self)] = calls.get(id(self), 0) + 1
            return original(self, g)

        return backward

    def x_grad(build, passes=1) -> np.ndarray:
        x = Tensor(np.array([1.0, 2.0]), requires_grad=True, dtype=np.float64)
        for _ in range(passes):
            build(x).sum().backward()
        return x.grad

    def check(name, build, expected, key, passes=1):
        calls.clear()
        try:
            got = x_grad(build, passes)
        except NotImplementedError as exc:
            raise Failed(say("stub", lang, name="run_backward"), "stub") from exc
        except Exception as exc:
            error = _short(exc)
            raise Failed(say("raised", lang, name="run_backward", error=error), "raised") from exc
        shown = None if got is None else got.tolist()
        line = say("loop_probe", lang, probe=name, expected=expected, got=shown)
        if got is None or not np.allclose(got, expected):
            if key == "d_loop_not_accumulated" and got is not None:
                half = np.allclose(got, np.array(expected) / 2)  # one branch of two kept
                key = "d_loop_not_accumulated" if half else "d_loop_order"
            elif key == "d_loop_not_accumulated":
                key = "d_loop_order"  # nothing arrived: the loop ran ops before their gradient
            raise Failed(line, key, say(key, lang))
        if any(count > 1 for count in calls.values()):
            raise Failed(line, "d_loop_twice", say("d_loop_twice", lang))

    for cls in counted:
        cls.backward = counting(originals[cls])
    try:
        check(
            "y = 3x; z = y + y",
            lambda x: (lambda y: y + y)(x * 3.0),
            [6.0, 6.0],
            "d_loop_not_accumulated",
        )

        def order(x):
            a = x * 2.0
            b = a * 3.0
            return a + b  # a reaches the output directly and through b: dL/da = 1 + 3

        check("a = 2x; b = 3a; z = a + b", order, [8.0, 8.0], "d_loop_order")

        def deep(x):  # a used by a chain of three more ops: every path must arrive first
            a = x * 1.0
            b = a * 2.0
            c = b * 1.0
            return (a + c) * 1.0

        check("a = x; c = 2a; z = a + c", deep, [3.0, 3.0], "d_loop_order")
        check(
            "(2x).sum() then (2x).sum() again",
            lambda x: x * 2.0,
            [4.0, 4.0],
            "d_leaf_overwritten",
            passes=2,
        )
    finally:
        for cls in counted:
            cls.backward = originals[cls]


# --- AdamW (exercise 10): the optimizer's trajectory against glassgrad's own --------------------


def _adamw_trajectory(steps: int = 5) -> list[np.ndarray]:
    r = _rng(10)
    params = [nn.Parameter(r.standard_normal((3, 2))), nn.Parameter(r.standard_normal(4))]
    for p in params:
        p.data = p.data.astype(np.float64)
    opt = nn.optim.AdamW(params, lr=0.05, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.2)
    out = []
    for _ in range(steps):
        for p in params:
            p.grad = r.standard_normal(p.shape)
        opt.step()
        out.extend(p.data.copy() for p in params)
    return out


def _adamw_case(functions, lang) -> None:
    expected = _adamw_trajectory()
    with plugged(functions):
        try:
            got = _adamw_trajectory()
        except NotImplementedError as exc:
            raise Failed(say("stub", lang, name="adamw_step"), "stub") from exc
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        if not _close(g, e):
            label = f"nn.optim.AdamW, step {i // 2 + 1}, parameter {i % 2} {e.shape}"
            raise Failed(say("case", lang, case=label, shapes="(3, 2), (4,)"), "engine")


# --- grading one exercise ----------------------------------------------------------------------


def grade(workspace: Path, number: int, lang: str) -> Report:
    exercise = BY_NUMBER[number]
    title = exercise.title[lang]
    imported: list[Exercise] = []
    try:
        functions = load(workspace, exercise, lang)
        imported = [e for e in BY_NUMBER.values() if e.number != number and e.module in sys.modules]
        _grade_functions(exercise, functions, lang)
    except Failed as failure:
        lines = [say("fail", lang, n=number, title=title), "  " + failure.line]
        if failure.text:
            lines.append("  " + say("diagnosis", lang, text=failure.text))
        diagnoses = [failure.diagnosis] if failure.diagnosis else []
        # a wrong piece from an earlier file breaks this one (a stub breaks nothing yet)
        for earlier in imported if failure.diagnosis != "stub" else []:
            if not grade(workspace, earlier.number, lang).passed:
                names = ", ".join(f.name for f in earlier.functions)
                values = {"n": earlier.number, "title": earlier.title[lang], "file": earlier.file}
                lines.append(
                    "  " + say("earlier_exercise", lang, names=names, dir=workspace, **values)
                )
                diagnoses = ["earlier_exercise"]
        return Report(number, False, lines, diagnoses)
    return Report(number, True, [say("pass", lang, n=number, title=title)])


def _grade_functions(exercise: Exercise, functions: dict[str, Callable], lang: str) -> None:
    autograd.set_default_dtype(np.float64)
    refs = reference(exercise)
    probes = _probes()
    for name, fn in functions.items():
        for args in probes.get(name, []):
            probe(name, fn, refs[name], args, lang)
    if exercise.number == 4:
        with plugged(functions):
            _loop_probes(lang)
    if exercise.number == 10:
        _adamw_case(functions, lang)
    with plugged(functions):
        for case in _cases(exercise.number):
            run_case(case, lang)
