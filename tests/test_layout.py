"""The layers import one way (autograd < nn < models < benchmarks, docs/design.md): nothing
imports a layer above its own, at the top of a file or inside a function."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ["autograd", "nn", "models", "benchmarks"]


def imported_packages(path: Path) -> list[tuple[int, str]]:
    """(line, top-level package) of every import in a file, lazy ones included."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module.split(".")[0]))
    return found


@pytest.mark.parametrize("layer", LAYERS[:-1])
def test_no_layer_imports_a_layer_above_it(layer):
    above = set(LAYERS[LAYERS.index(layer) + 1 :])
    upward = [
        f"{path.relative_to(ROOT)}:{line} imports {package}"
        for path in sorted((ROOT / layer).rglob("*.py"))
        for line, package in imported_packages(path)
        if package in above
    ]
    assert not upward, "\n".join(upward)


def test_the_check_sees_a_lazy_import(tmp_path):
    # the test of the test: an import inside a function is found as well
    source = tmp_path / "lazy.py"
    source.write_text("def f():\n    from nn.optim import Adam\n    import models.gpt\n")
    assert imported_packages(source) == [(2, "nn"), (3, "models")]
