"""python -m models.learn: learn autodiff by rebuilding it (docs/learn.md).

    python -m models.learn start DIR [--lang zh|en]   # write the workspace
    python -m models.learn check DIR [N | all]         # grade exercise N (11: the capstone)
    python -m models.learn hint DIR N                  # the next hint (three per exercise)
    python -m models.learn solution N [--dir DIR]      # after a pass or the last hint
    python -m models.learn status DIR

The language defaults to the locale's (zh for a Chinese locale, else en); `start --lang` stores it
in the workspace, and --lang on any command overrides it.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from models.learn.capstone import CapstoneFailed, run_pieces
from models.learn.checks import Failed
from models.learn.exercises import BY_NUMBER, CAPSTONE, EXERCISES
from models.learn.grader import Report, grade, load
from models.learn.text import LANGS, default_lang, say
from models.learn.workspace import PROGRESS, load_progress, save_progress, start


def check_capstone(
    workspace: Path, lang: str, show: Callable[[str], None] = lambda line: None, **gpt: Any
) -> Report:
    """The capstone on the workspace's pieces; `show` gets the GPT's table as it runs; `gpt`:
    run_pieces's settings and steps (the tests' smaller GPT), by default the demo's 200 steps."""
    title = say("capstone", lang)
    reports = [grade(workspace, e.number, lang) for e in EXERCISES]
    missing = [r.number for r in reports if not r.passed]
    if missing:
        lines = [say("fail", lang, n=CAPSTONE, title=title)]
        lines.append("  " + say("capstone_needs", lang, missing=", ".join(map(str, missing))))
        return Report(CAPSTONE, False, lines, ["needs"])
    functions = {}
    for e in EXERCISES:
        functions.update(load(workspace, e, lang))
    try:
        lines = run_pieces(functions, lang, progress=show, **gpt)
    except CapstoneFailed as failure:
        lines = [say("fail", lang, n=CAPSTONE, title=title), "  " + failure.line]
        return Report(CAPSTONE, False, lines, [failure.diagnosis])
    return Report(CAPSTONE, True, [say("pass", lang, n=CAPSTONE, title=title)] + lines)


def check(
    workspace: Path,
    which: str,
    lang: str,
    show: Callable[[str], None] = lambda line: None,
    **gpt: Any,
) -> list[Report]:
    """Grade `which` (a number or all); `show` gets each report's lines as soon as it is done
    (and the capstone's table while it runs)."""
    numbers = [e.number for e in EXERCISES] + [CAPSTONE] if which == "all" else [int(which)]
    reports = []
    for n in numbers:
        try:
            if n == CAPSTONE:
                report = check_capstone(workspace, lang, show, **gpt)
            else:
                report = grade(workspace, n, lang)
        except Failed as failure:  # a file that cannot be loaded
            report = Report(n, False, [failure.line], [failure.diagnosis or "load"])
        reports.append(report)
        _record(workspace, report)
        for line in report.lines:
            show(line)
    return reports


def _record(workspace: Path, report: Report) -> None:
    progress = load_progress(workspace)
    passed = set(progress["passed"])
    passed.discard(report.number)
    if report.passed:
        passed.add(report.number)
    progress["passed"] = sorted(passed)
    save_progress(workspace, progress)


def hint(workspace: Path, n: int, lang: str) -> list[str]:
    progress = load_progress(workspace)
    read = progress["hints"].get(str(n), 0)
    level = min(read + 1, 3)
    progress["hints"][str(n)] = level
    save_progress(workspace, progress)
    lines = [say("hint", lang, n=n, level=level), BY_NUMBER[n].hints[lang][level - 1]]
    if level == 3:
        lines.append(say("no_more_hints", lang, n=n, dir=workspace))
    return lines


def solution(n: int, lang: str, workspace: Path | None) -> list[str]:
    """The reference solution and glassgrad's own code, once exercise n is passed or its last
    hint read (in the given workspace, or in any when none is given)."""
    if workspace is not None:
        progress = load_progress(workspace)
        if n not in progress["passed"] and progress["hints"].get(str(n), 0) < 3:
            return [say("solution_locked", lang, n=n)]
    exercise = BY_NUMBER[n]
    lines = [say("solution_reference", lang), inspect.getsource(exercise.part("solution"))]
    for where in exercise.engine:
        module_name, qualname = where.split(":")
        obj = importlib.import_module(module_name)
        for part in qualname.split("."):
            obj = getattr(obj, part)
        lines += [say("solution_engine", lang, where=where), inspect.getsource(obj)]
    return lines


def status(workspace: Path, lang: str) -> list[str]:
    progress = load_progress(workspace)
    lines = []
    for e in EXERCISES:
        mark = "[x]" if e.number in progress["passed"] else "[ ]"
        read = progress["hints"].get(str(e.number), 0)
        extra = say("status_hints", lang, count=read) if read else ""
        lines.append(
            say(
                "status_line",
                lang,
                mark=mark,
                n=e.number,
                title=e.title[lang],
                sections=e.sections,
                extra=extra,
            )
        )
    mark = "[x]" if CAPSTONE in progress["passed"] else "[ ]"
    chapter = {"en": " (notes ch. 11)", "zh": "（笔记第 11 章）"}[lang]
    lines.append(f"{mark} {CAPSTONE:>2}. {say('capstone', lang)}{chapter}")
    lines.append(say("status_summary", lang, passed=len(progress["passed"]), total=CAPSTONE))
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m models.learn", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--lang", choices=LANGS, help="zh or en (default: the workspace's, else the locale's)"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("start")
    p.add_argument("dir", type=Path)
    p.add_argument("--lang", choices=LANGS, dest="start_lang")
    p = sub.add_parser("check")
    p.add_argument("dir", type=Path)
    p.add_argument("which", nargs="?", default="all", help="an exercise number, or all")
    p = sub.add_parser("hint")
    p.add_argument("dir", type=Path)
    p.add_argument("n", type=int)
    solution_parser = sub.add_parser("solution")  # `solution DIR N` as hint's, or `solution N`
    solution_parser.add_argument(
        "place", nargs="+", metavar="[DIR] N", help="the workspace, then the exercise"
    )
    solution_parser.add_argument(
        "--dir", type=Path, default=Path("."), help="the workspace (default: here)"
    )
    p = sub.add_parser("status")
    p.add_argument("dir", type=Path)
    args = parser.parse_args(argv)
    if args.command == "solution":
        if len(args.place) > 2 or not args.place[-1].isdigit():
            solution_parser.error(f"solution [DIR] N: the exercise's number last, got {args.place}")
        args.n = int(args.place[-1])
        args.dir = Path(args.place[0]) if len(args.place) == 2 else args.dir

    if args.command == "start":
        lang = args.start_lang or args.lang or default_lang()
        kept = start(args.dir, lang)
        for path in kept:
            print(say("exists", lang, path=path))
        print(say("started", lang, count=len(EXERCISES) - len(kept), dir=args.dir))
        return 0
    workspace = getattr(args, "dir", None)
    lang = args.lang
    if workspace is not None:
        if not (workspace / PROGRESS).exists():
            print(say("not_a_workspace", lang or default_lang(), dir=workspace), file=sys.stderr)
            return 2
        lang = lang or load_progress(workspace).get("lang")
    lang = lang or default_lang()
    number = getattr(args, "n", None) or (
        None if getattr(args, "which", "all") == "all" else args.which
    )
    if number is not None and (
        not str(number).isdigit() or int(number) not in range(1, CAPSTONE + 1)
    ):
        print(
            say("unknown_exercise", lang, n=number, last=len(EXERCISES), capstone=CAPSTONE),
            file=sys.stderr,
        )
        return 2
    if args.command == "check":
        reports = check(workspace, args.which, lang, show=lambda line: print(line, flush=True))
        return 0 if all(r.passed for r in reports) else 1
    if args.command in ("hint", "solution") and args.n == CAPSTONE:  # it has no code of its own
        print(say("capstone_no_hint", lang), file=sys.stderr)
        return 2
    if args.command == "hint":
        lines = hint(workspace, args.n, lang)
    elif args.command == "solution":
        lines = solution(args.n, lang, workspace)
    else:
        lines = status(workspace, lang)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
