"""A conversation set every machine has: questions about the signatures of the standard library.

The demo corpus (models.training.data.DEFAULT_MODULES) is the source of 27 standard-library modules,
so a model pretrained on it has read `def insort_right(a, x, lo=0, hi=None, *, key=None):`. The
conversations ask for exactly that, in a chat format the pretrained model has never seen:

    user:       What are the parameters of bisect.insort_right?
    assistant:  insort_right(a, x, lo=0, hi=None, *, key=None)

one per public function and public method (without self/cls) of those modules, read with `ast`
from this interpreter's files (no import, no download). Fine-tuning teaches the format and to
recall what pretraining stored; held-out functions measure whether it carries over.
"""

from __future__ import annotations

import ast
import copy
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from models.training.data import DEFAULT_MODULES, stdlib_dir

SYSTEM = "Answer with the function's signature."
MAX_SIGNATURE = 48  # characters: longer ones (argparse's) would dominate a small context


def _module_name(file: str) -> str:
    return file.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


def _signature(node: ast.FunctionDef, method: bool) -> str:
    args = copy.copy(node.args)
    if method and args.posonlyargs:  # drop self / cls (never with a default: defaults align)
        args.posonlyargs = args.posonlyargs[1:]
    elif method and args.args:
        args.args = args.args[1:]
    return f"{node.name}({ast.unparse(args)})"


def signatures(files: tuple[str, ...] = DEFAULT_MODULES) -> list[tuple[str, str]]:
    """(qualified name, signature) of every public function and method in `files`, in order."""
    found = []
    root = stdlib_dir()
    for file in files:
        path = root / file
        if not path.is_file():
            continue
        module = _module_name(file)
        for node in ast.parse(path.read_text("utf-8")).body:
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
                found.append((f"{module}.{node.name}", _signature(node, method=False)))
            elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                for item in node.body:
                    if isinstance(item, ast.FunctionDef) and not item.name.startswith("_"):
                        static = any(
                            isinstance(d, ast.Name) and d.id == "staticmethod"
                            for d in item.decorator_list
                        )
                        name = f"{module}.{node.name}.{item.name}"
                        found.append((name, _signature(item, method=not static)))
    return found


def conversation(name: str, signature: str) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"What are the parameters of {name}?"},
        {"role": "assistant", "content": signature},
    ]


def signature_conversations(
    held_out: float = 0.1, seed: int = 0, max_signature: int = MAX_SIGNATURE
) -> tuple[list[list[dict[str, str]]], list[list[dict[str, str]]]]:
    """(train, held-out) conversations, split by function (a held-out one is never trained);
    signatures of at most max_signature characters."""
    first: dict[str, str] = {}
    for name, signature in signatures():  # a name defined twice (a property's setter): the first
        if len(signature) <= max_signature:
            first.setdefault(name, signature)
    pairs = sorted(first.items())
    order = np.random.default_rng(seed).permutation(len(pairs))
    n_held = max(1, round(held_out * len(pairs)))
    held = [conversation(*pairs[i]) for i in order[:n_held]]
    train = [conversation(*pairs[i]) for i in order[n_held:]]
    return train, held


def write_jsonl(path: str | os.PathLike, conversations: list[list[dict[str, Any]]]) -> None:
    """One {"messages": [...]} per line, as --sft reads it."""
    lines = [json.dumps({"messages": m}, ensure_ascii=False) for m in conversations]
    Path(path).write_text("\n".join(lines) + "\n", "utf-8")
