"""Where glassgrad's packages were imported from: a guard against name clashes.

glassgrad installs four top-level packages with generic names (the agreed layout): `autograd` is
also HIPS autograd's distribution, and `models` or `nn` folders are common in users' projects.
Whichever comes first on sys.path wins, and a foreign one fails later in baffling ways. Each of
glassgrad's packages calls `check_packages` at import and turns that into one clear error.
"""

from __future__ import annotations

import importlib
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # holds autograd/, nn/, ...


def check_packages(*names: str) -> None:
    """Raise ImportError if any of glassgrad's packages `names` was imported from elsewhere."""
    for name in names:
        module = sys.modules.get(name) or importlib.import_module(name)
        origin = getattr(module, "__file__", None)
        if origin is None or os.path.dirname(os.path.dirname(os.path.abspath(origin))) != ROOT:
            raise ImportError(
                f"glassgrad: 'import {name}' found {origin or 'a namespace package'}, not "
                f"glassgrad's package in {ROOT}: another package or a folder named {name!r} "
                "comes first on sys.path. Rename that folder, run from another directory, or "
                f"uninstall the other distribution (pip uninstall {name}); see the README, Install"
            )
