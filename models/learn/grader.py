"""Grading a workspace: the learner's functions, plugged into the engine, checked by the public
checker (autograd.testing.check_op), and compared directly with the reference on probe inputs so
that a wrong answer gets a diagnosis of the classic mistake behind it.

An exercise passes when every probe equals the reference solution and every engine case passes
check_op (forward vs numpy, gradient vs central differences, the VJP discipline) with the
learner's code in place of glassgrad's own. What is particular to an exercise (its probes, its
cases, the mistakes it recognises) is in its folder (models/learn/exercises/); this is the
grading they share.
"""

from __future__ import annotations

import importlib.util
import inspect
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import autograd
from autograd.testing import check_op
from models.learn.checks import Case, Failed, Probes, close, copied, rng, short
from models.learn.exercises import BY_NUMBER, EXERCISES, Exercise
from models.learn.plug import plugged
from models.learn.text import say


@dataclass
class Report:
    number: int
    passed: bool
    lines: list[str] = field(default_factory=list)
    diagnoses: list[str] = field(default_factory=list)  # the diagnosis keys (for the tests)


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
        raise Failed(say("import_error", lang, file=exercise.file, error=short(exc))) from exc
    finally:
        sys.path.remove(str(workspace))
    functions = {}
    for name in exercise.functions:
        if not callable(getattr(module, name, None)):
            raise Failed(say("missing_function", lang, file=exercise.file, name=name))
        functions[name] = getattr(module, name)
    return functions


def reference(exercise: Exercise) -> dict[str, Callable]:
    module = exercise.part("solution")
    return {name: getattr(module, name) for name in exercise.functions}


# --- probes: the learner's function called directly, compared with the reference ----------------


def _merged(part: str, table: str) -> dict:
    """One of the exercises' tables (cases.py's or diagnoses.py's), all exercises' entries by
    function name."""
    merged = {}
    for e in EXERCISES:
        merged.update(getattr(e.part(part), table, {}))
    return merged


PARTS = _merged("cases", "PARTS")  # the named parts of a result: (da, db), (p, m, v)
# Classic mistakes, in four tables: MISTAKES, each written as the wrong function it amounts to
# (a learner's output equal to one of them on the probes gets that diagnosis); FACTORS, a constant
# factor that is a quantity of the case (a missing 1/N or 1/sqrt(d), named with its N or d);
# RAISES, a function that raises, explained; SHAPES below, a wrong shape that holds the right
# numbers. The first three are each exercise's (its diagnoses.py). A sign flipped, another
# constant factor and a transposed result are recognised without a list.
MISTAKES = _merged("diagnoses", "MISTAKES")
FACTORS = _merged("diagnoses", "FACTORS")
RAISES = _merged("diagnoses", "RAISES")
# Changing an input in place: what the piece is, for the message (a VJP unless it says otherwise).
IN_PLACE_RULE = _merged("diagnoses", "IN_PLACE_RULE")

# A result of the wrong shape explained by the right values in another shape: (diagnosis, test).
SHAPES: list[tuple[str, Callable]] = [
    # the right numbers with the summed size-1 axes dropped (a sum without keepdims)
    ("d_keepdims_dropped", lambda got, e: got.size == e.size and close(got.reshape(e.shape), e)),
    # the broadcast dimensions still there: summing them back gives the right result
    ("d_not_summed", lambda got, e: close(_unbroadcast_or_none(got, e.shape), e)),
]


def _unbroadcast_or_none(got, shape):
    try:
        return autograd.unbroadcast(got, shape)
    except (ValueError, IndexError):
        return None


def _probes() -> dict[str, list[tuple]]:
    """Every exercise's probes (function name -> argument tuples), drawn in track order."""
    inputs = Probes()
    probes = {}
    for e in EXERCISES:
        probes.update(e.part("cases").probes(inputs))
    return probes


def _parts(name: str, out) -> list:
    names = PARTS.get(name, ("result",))
    values = list(out) if len(names) > 1 else [out]
    if len(values) != len(names):
        raise TypeError(f"{name} must return {len(names)} arrays ({', '.join(names)})")
    return [np.asarray(v, dtype=np.float64) for v in values]


def _describe_args(args) -> str:
    shown = [f"{a.shape}" if isinstance(a, np.ndarray) else repr(a) for a in args]
    return "(" + ", ".join(shown) + ")"


def probe(name: str, learner: Callable, ref: Callable, args: tuple, lang: str) -> None:
    """Raise Failed unless learner(*args) equals ref(*args), with a diagnosis where one fits."""
    given = copied(args)
    try:
        got = learner(*given)
    except NotImplementedError as exc:
        raise Failed(say("stub", lang, name=name), "stub") from exc
    except Exception as exc:
        line = say("raised", lang, name=name, error=short(exc))
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
    expected = _parts(name, ref(*copied(args)))
    try:
        got = _parts(name, got)
    except (TypeError, ValueError) as exc:
        raise Failed(say("raised", lang, name=name, error=short(exc)), "raised") from exc
    labels = PARTS.get(name, ("result",))
    for index, (part, g, e) in enumerate(zip(labels, got, expected, strict=True)):
        if close(g, e):
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
                mistaken = _parts(name, wrong(*copied(args)))[index]
        except Exception:  # a mistake that cannot even run on these arguments is not this one
            continue
        if close(got, mistaken):
            return key, {}
    if got.shape != expected.shape:
        return next((key for key, explains in SHAPES if explains(got, expected)), None), {}
    c = _factor(got, expected)
    if not (np.isfinite(c) and close(got, c * expected)):
        transposed = got.ndim >= 2 and close(np.swapaxes(got, -1, -2), expected)
        return ("d_transposed" if transposed else None), {}
    if abs(c + 1) < 1e-9:
        return "d_sign", {}
    for key, quantity in FACTORS.get(name, []):
        factor, value = quantity(*args)
        if abs(c - factor) <= 1e-9 * factor:
            return key, {"value": value}
    return "d_factor", {"factor": c}


def run_case(case: Case, lang: str) -> None:
    try:
        check_op(case.op, case.reference, case.arrays, case.differentiable, forward_rtol=1e-9)
    except NotImplementedError as exc:
        raise Failed(
            say("case", lang, case=case.label, shapes=_shapes(case)) + "\n  " + short(exc), "stub"
        ) from exc
    except Exception as exc:
        line = say("case", lang, case=case.label, shapes=_shapes(case)) + "\n  " + short(exc)
        raise Failed(line, "engine") from exc


def _shapes(case: Case) -> str:
    return ", ".join(str(np.shape(a)) for a in case.arrays)


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
                names = ", ".join(earlier.functions)
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
    cases = exercise.part("cases")
    if hasattr(cases, "check"):  # the exercise's own check (the loop's graphs, AdamW's steps)
        cases.check(functions, lang)
    with plugged(functions):
        for case in cases.cases(rng(exercise.number)):
            run_case(case, lang)
