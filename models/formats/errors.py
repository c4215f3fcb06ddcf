"""The one error a loader raises for a file it cannot use (config.json, an index, a shard,
tokenizer.json, tokenizer_config.json, a GGUF file): a ValueError that names the file and the
field as the file writes it, so the user knows which line to fix.

>>> raise FileFormatError("m/config.json", "hidden_size", "must be an integer", "96")
Traceback (most recent call last):
    ...
models.formats.errors.FileFormatError: m/config.json: hidden_size: must be an integer, got '96'
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

_NO_VALUE = object()


class FileFormatError(ValueError):
    """`<path>: <field>: <what is wrong>[, got <value>]`; .path, .field, .value keep the parts."""

    def __init__(
        self, path: str | Path, field: str | None, problem: str, value: Any = _NO_VALUE
    ) -> None:
        self.path, self.field = str(path), field
        self.value = None if value is _NO_VALUE else value
        where = f"{path}: {field}: " if field else f"{path}: "
        got = "" if value is _NO_VALUE else f", got {_short(value)}"
        super().__init__(f"{where}{problem}{got}")


def _short(value: Any, limit: int = 120) -> str:
    """repr(value), cut to limit characters (a stranger's file may hold a huge value)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
