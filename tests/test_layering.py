"""No import cycle among glassgrad's modules, so each one can be read before the ones that use it.

tests/test_layout.py checks that the packages import one way (autograd < nn < models < benchmarks);
this checks that no module reaches itself through its imports, inside a package or across them.
An import inside a function counts too: a lazy import is still a dependency a reader has to hold in
mind. A package's __init__ importing its own submodules is not an edge: it only gathers them.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("autograd", "nn", "models", "benchmarks")


def modules(root: Path, packages=PACKAGES) -> dict[str, Path]:
    """Dotted name -> file of every module under the packages (a package is its __init__.py)."""
    found = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imported_modules(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The known modules a module imports (`from a.b import c` names a.b, or a.b.c if a module)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: `from ..x import y` inside package a.b.c means a.b.x
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            targets.update([base] + [f"{base}.{alias.name}" for alias in node.names])
    resolved = set()
    for target in targets:
        while target and target not in known:  # a.b.Tensor -> a.b
            target = target.rpartition(".")[0]
        if target and target != name and not target.startswith(name + "."):
            resolved.add(target)
    return resolved


def import_graph(root: Path, packages=PACKAGES) -> dict[str, set[str]]:
    known = modules(root, packages)
    return {name: imported_modules(name, path, known) for name, path in known.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as [a, b, ..., a], or None (depth-first search with an explicit stack)."""
    done, on_path = set(), []
    for start in sorted(graph):
        if start in done:
            continue
        stack = [(start, iter(sorted(graph[start])))]
        on_path.append(start)
        while stack:
            node, targets = stack[-1]
            target = next(targets, None)
            if target is None:
                stack.pop()
                on_path.pop()
                done.add(node)
            elif target in on_path:
                return on_path[on_path.index(target) :] + [target]
            elif target not in done:
                stack.append((target, iter(sorted(graph[target]))))
                on_path.append(target)
    return None


def test_no_import_cycle():
    graph = import_graph(ROOT)
    assert len(graph) > 50  # the walk found the packages
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_check_finds_a_cycle_through_a_lazy_relative_import(tmp_path):
    # the test of the test: pkg.a imports pkg.b at the top, pkg.b imports pkg.a inside a function
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("from pkg import a\n")
    (tmp_path / "pkg" / "a.py").write_text("from pkg.b import helper\n")
    (tmp_path / "pkg" / "b.py").write_text("def helper():\n    from .a import x\n")
    graph = import_graph(tmp_path, ["pkg"])
    assert graph == {"pkg": set(), "pkg.a": {"pkg.b"}, "pkg.b": {"pkg.a"}}
    assert find_cycle(graph) == ["pkg.a", "pkg.b", "pkg.a"]
    (tmp_path / "pkg" / "b.py").write_text("def helper():\n    import pkg\n")  # __init__ gathers
    assert find_cycle(import_graph(tmp_path, ["pkg"])) is None
