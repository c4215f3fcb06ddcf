"""The learner's workspace: one file per exercise, a README with the path through them, and the
progress (.learn.json: the language, the exercises passed, the hints read)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from models.learn.exercises import EXERCISES, Exercise

PROGRESS = ".learn.json"

README_TEXT = {
    "en": """# Learn autodiff by rebuilding it

Each file below holds functions to write: glassgrad's own versions are taken out of the engine
and yours are plugged in their place when you run

    python -m models.learn check {dir} N      # one exercise (N = 1..{last}), or `all`
    python -m models.learn hint {dir} N       # three hints: the notes' formula, shapes, pseudo-code
    python -m models.learn solution {dir} N   # after a pass or the last hint
    python -m models.learn status {dir}

`check` runs the engine on your code (forward against numpy, gradients against central
differences, no input changed in place) and, when something is wrong, names the failing case and
the classic mistake it recognises. Arrays are float64 numpy arrays; row vectors (x @ W, W of shape
(in, out)). The path follows the notes (ch. 7-10):

{table}

{capstone}. Capstone: `check {dir} {capstone}` runs every piece of yours at once: the notes' ch. 11
worked example (L 2.541928 -> 1.761382 after one step) and the demo GPT (`python -m
models.train`'s defaults) trained for its first 200 steps beside glassgrad's own, every loss
equal to 1e-9 (two to three minutes on a small machine; it prints a table as it runs).
""",
    "zh": """# 通过重建来学习自动微分

下面每个文件里有要写的函数：glassgrad 自己的版本被从引擎中取出，运行以下命令时换上你的版本：

    python -m models.learn check {dir} N      # 一个练习（N = 1..{last}），或 `all`
    python -m models.learn hint {dir} N       # 三级提示：笔记的公式、形状、伪代码
    python -m models.learn solution {dir} N   # 通过或读完最后一条提示之后
    python -m models.learn status {dir}

`check` 让引擎运行你的代码（前向与 numpy 比较，梯度与中心差分比较，不得原地修改输入），出错时
指出未通过的用例，以及它认出的典型错误。数组是 float64 的 numpy 数组；行向量（x @ W，W 的形状
为 (in, out)）。顺序沿着笔记（第 7-10 章）：

{table}

{capstone}. 综合练习：`check {dir} {capstone}` 同时运行你的所有部件：笔记第 11 章的例子（一步之后
L 2.541928 -> 1.761382），以及演示 GPT（`python -m models.train` 的默认设置）与 glassgrad 自己的
并排训练前 200 步，每一步的损失都必须相差不超过 1e-9（在小机器上约两到三分钟；运行时打印一张表）。
""",
}


def stub(exercise: Exercise, lang: str) -> str:
    """The exercise file as `start` writes it: the folder's stub.py with the statement as its
    docstring."""
    if lang == "zh":
        header = f"练习 {exercise.number}：{exercise.title[lang]}（笔记 {exercise.sections}）"
    else:
        header = f"Exercise {exercise.number}: {exercise.title[lang]} (notes {exercise.sections})"
    body = _wrap(exercise.statement[lang])
    stub_py = (exercise.folder / "stub.py").read_text(encoding="utf-8")
    code = stub_py.split('"""', 2)[2]  # what follows its docstring
    return f'"""{header}\n\n{body}\n"""{code}'


_TOKEN = re.compile(r"[\u2e80-\uffff]|[^\s\u2e80-\uffff]+|\s+")  # a CJK character, a word, spaces


def _wrap(text: str, width: int = 96) -> str:
    """Lines of at most `width` columns (a CJK character counts two); a line breaks between
    words or between CJK characters, never inside a word or a formula's token."""
    lines, line = [], ""
    for token in _TOKEN.findall(text):
        columns = sum(2 if ord(ch) >= 0x2E80 else 1 for ch in line + token)
        if columns > width and line.strip():
            lines.append(line.rstrip())
            line = "" if token.isspace() else token
        else:
            line += token
    lines.append(line.rstrip())
    return "\n".join(lines)


def start(directory: Path, lang: str) -> list[Path]:
    """Write the workspace (never over an existing file: the learner's work is kept); returns
    the files that already existed."""
    directory.mkdir(parents=True, exist_ok=True)
    kept = []
    for exercise in EXERCISES:
        path = directory / exercise.file
        if path.exists():
            kept.append(path)
        else:
            path.write_text(stub(exercise, lang), encoding="utf-8")
    line = {
        "en": "{n}. `{file}`: {title} (notes {sections})",
        "zh": "{n}. `{file}`：{title}（笔记 {sections}）",
    }[lang]
    table = "\n".join(
        line.format(n=e.number, file=e.file, title=e.title[lang], sections=e.sections)
        for e in EXERCISES
    )
    readme = README_TEXT[lang].format(
        dir=directory, last=len(EXERCISES), table=table, capstone=len(EXERCISES) + 1
    )
    (directory / "README.md").write_text(readme, encoding="utf-8")
    progress = load_progress(directory) if (directory / PROGRESS).exists() else {}
    progress.setdefault("passed", [])
    progress.setdefault("hints", {})
    progress["lang"] = lang
    save_progress(directory, progress)
    return kept


def load_progress(directory: Path) -> dict:
    return json.loads((directory / PROGRESS).read_text(encoding="utf-8"))


def save_progress(directory: Path, progress: dict) -> None:
    text = json.dumps(progress, indent=1, ensure_ascii=False, sort_keys=True)
    (directory / PROGRESS).write_text(text + "\n", encoding="utf-8")
