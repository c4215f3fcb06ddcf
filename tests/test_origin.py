"""Name clashes are reported at import: a foreign `autograd` (HIPS autograd's name) or a user's
folder called `models` first on sys.path gives one clear error instead of a baffling one later."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = str(Path(__file__).resolve().parent.parent)


def _import_with(tmp_path: Path, package: str, statement: str) -> subprocess.CompletedProcess:
    (tmp_path / package).mkdir()
    (tmp_path / package / "__init__.py").write_text("VERSION = 'someone else'\n")
    return subprocess.run(
        [sys.executable, "-c", statement],
        cwd=tmp_path,  # the current directory comes first on sys.path, as for a user's script
        env={"PYTHONPATH": ROOT, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_foreign_autograd_is_named(tmp_path):
    result = _import_with(tmp_path, "autograd", "import nn")
    assert result.returncode != 0
    assert "ImportError: glassgrad: 'import autograd' did not find glassgrad's engine" in (
        result.stderr
    )
    assert "pip uninstall autograd" in result.stderr


def test_a_shadowing_models_folder_is_named(tmp_path):
    result = _import_with(tmp_path, "models", "import benchmarks")
    assert result.returncode != 0
    assert "glassgrad: 'import models' found" in result.stderr
    assert str(tmp_path / "models") in result.stderr


def test_glassgrad_imports_cleanly_from_elsewhere(tmp_path):
    result = _import_with(tmp_path, "unrelated", "import autograd, nn, models, benchmarks")
    assert result.returncode == 0, result.stderr
