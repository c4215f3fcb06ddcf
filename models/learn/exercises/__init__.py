"""The track: one folder per exercise, in the notes' order (exNN_<slug>/, found by its name), and
the capstone after them.

An exercise's folder holds all of it:
    en.md, zh.md    its title, statement and ladder of three hints (the notes' formula, the shape
                    argument, pseudo-code) in English and Chinese
    stub.py         the learner's starting file, the functions to write (signatures and shapes);
                    `start` writes it with the statement in place of its docstring
    solution.py     the reference solution (`solution N` prints it)
    cases.py        the probes (the learner's functions called directly on fixed inputs), the
                    engine cases check_op runs with them plugged in, any check of its own
    diagnoses.py    the classic mistakes it recognises, each written as the wrong function
    plug.py         how each function takes the place of glassgrad's own in the engine
    __init__.py     the notes' sections and glassgrad's own code that does the same job
What every exercise shares: grading (models/learn/grader.py, models/learn/checks.py), plugging
(models/learn/plug.py), the workspace and the CLI.
"""

from __future__ import annotations

import ast
import importlib
import re
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from models.learn.text import LANGS

FOLDER = re.compile(r"ex(\d\d)_(\w+)")  # the folder's name is the workspace file's: exNN_<slug>


@dataclass(frozen=True)
class Exercise:
    number: int
    slug: str
    folder: Path
    sections: str  # the notes' sections
    title: dict[str, str]
    statement: dict[str, str]
    hints: dict[str, tuple[str, str, str]]
    functions: tuple[str, ...]  # what the learner writes: the stub's functions, in its order
    engine: tuple[str, ...]  # glassgrad's own code: "module:qualname"

    @property
    def module(self) -> str:
        return self.folder.name

    @property
    def file(self) -> str:
        return self.module + ".py"

    def part(self, name: str) -> ModuleType:
        """One of the folder's modules: solution, cases, diagnoses or plug."""
        return importlib.import_module(f"{__name__}.{self.module}.{name}")


def _text(path: Path) -> tuple[str, str, tuple[str, ...]]:
    """en.md or zh.md: `# title`, the statement, then a `## ` heading before each hint."""
    title, _, rest = path.read_text(encoding="utf-8").partition("\n")
    statement, *hints = re.split(r"^## .*$", rest, flags=re.M)
    return title.removeprefix("# "), statement.strip("\n"), tuple(h.strip("\n") for h in hints)


def _exercise(folder: Path) -> Exercise:
    number, slug = FOLDER.fullmatch(folder.name).groups()
    card = importlib.import_module(f"{__name__}.{folder.name}")
    texts = {lang: _text(folder / f"{lang}.md") for lang in LANGS}
    stub = ast.parse((folder / "stub.py").read_text(encoding="utf-8"))
    return Exercise(
        number=int(number),
        slug=slug,
        folder=folder,
        sections=card.SECTIONS,
        title={lang: texts[lang][0] for lang in LANGS},
        statement={lang: texts[lang][1] for lang in LANGS},
        hints={lang: texts[lang][2] for lang in LANGS},
        functions=tuple(node.name for node in stub.body if isinstance(node, ast.FunctionDef)),
        engine=card.ENGINE,
    )


EXERCISES: tuple[Exercise, ...] = tuple(
    _exercise(folder)
    for folder in sorted(Path(__file__).parent.iterdir())
    if FOLDER.fullmatch(folder.name)
)
if [e.number for e in EXERCISES] != list(range(1, len(EXERCISES) + 1)):
    raise RuntimeError(
        f"the exercise folders are not numbered 1..N: {[e.module for e in EXERCISES]}"
    )

BY_NUMBER = {e.number: e for e in EXERCISES}
CAPSTONE = len(EXERCISES) + 1  # `check DIR 11` (or `capstone`): every piece at once
