"""Hugging Face model directories: config.json, and the weights in model.safetensors or in shards
listed by model.safetensors.index.json ({"weight_map": {tensor name: shard file}}).

Tensors are read one at a time (nn.iter_safetensors), so loading never holds a second full copy
of the weights; BF16 and F16 become the model's dtype as they are read. Errors name the file and
the field. The families map names and layouts (HF_NAMES in models/architectures/gpt.py and
models/architectures/llama.py, read by models.architectures.decoder's loader and saver); this file
only moves bytes and JSON.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

import nn
from models.formats.errors import FileFormatError, _short

WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"


def _read_json(path: Path, directory: Path | None = None) -> dict[str, Any]:
    """A JSON object from path (a file inside directory, when given); anything else is a
    FileFormatError naming the file."""
    if directory is not None:
        inside(directory, path, path, None)
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"{path} does not exist") from None
    except UnicodeDecodeError as exc:
        problem = f"not UTF-8 text ({exc.reason} at byte {exc.start})"
        raise FileFormatError(path, None, problem) from None
    except json.JSONDecodeError as exc:
        problem = f"not valid JSON (line {exc.lineno}: {exc.msg})"
        raise FileFormatError(path, None, problem) from None
    except OSError as exc:
        raise FileFormatError(path, None, f"cannot be read ({exc.strerror})") from None
    if not isinstance(data, dict):
        raise FileFormatError(path, None, "must hold a JSON object", type(data).__name__)
    return data


def inside(directory: Path, path: Path, source: Path, field: str | None) -> Path:
    """path, refused (naming source and field) when it resolves outside directory: a symlink
    out, `..`. The one way out allowed is Hugging Face's cache, whose snapshots/<revision>/
    files link to the repository's blobs/."""
    resolved, home = path.resolve(), directory.resolve()
    if resolved.is_relative_to(home):
        return path
    if home.parent.name == "snapshots" and resolved.is_relative_to(home.parent.parent / "blobs"):
        return path
    raise FileFormatError(source, field, f"leads outside {directory} (to {resolved})", path.name)


def read_config(path: str | Path) -> tuple[Path, dict[str, Any]]:
    """(directory, config.json as a dict) of a model directory, or of the .safetensors file inside
    one. generation_config.json's eos_token_id, where present, is added to the config's."""
    path = Path(path)
    directory = path if path.is_dir() else path.parent
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist")
    config = _read_json(directory / "config.json", directory)
    generation = directory / "generation_config.json"
    if generation.is_file():
        extra = Fields(_read_json(generation, directory), generation).token_ids("eos_token_id")
        if extra:
            own = Fields(config, directory / "config.json").token_ids("eos_token_id")
            config["eos_token_id"] = sorted(set(own + extra))
    return directory, config


class Fields:
    """The one reader of a config.json's fields: each value checked for its type and range as
    it is read (an int is an int: no bool(), no int() of floats or strings), and refused with a
    FileFormatError naming the file and the field as the file writes it."""

    def __init__(self, config: dict[str, Any], source: str | Path, prefix: str = "") -> None:
        self.config, self.source, self.prefix = config, source, prefix

    def error(self, key: str, problem: str, value: Any = ...) -> FileFormatError:
        if value is ...:
            value = self.config.get(key)
        return FileFormatError(self.source, self.prefix + key, problem, value)

    def _get(self, key: str, default: Any) -> Any:
        value = self.config.get(key)
        if value is None:
            if default is ...:
                raise FileFormatError(self.source, self.prefix + key, "is missing")
            return default
        return value

    def integer(self, key: str, default: Any = ..., minimum: int = 1) -> Any:
        value = self._get(key, default)
        if value is not default and (type(value) is not int or value < minimum):
            kind = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
            raise self.error(key, f"must be {kind}")
        return value

    def number(self, key: str, default: Any = ...) -> Any:
        """A positive finite number (int or float)."""
        value = self._get(key, default)
        if value is not default and (
            type(value) not in (int, float) or not math.isfinite(value) or value <= 0
        ):
            raise self.error(key, "must be a positive number")
        return value if value is default else float(value)

    def boolean(self, key: str, default: bool) -> bool:
        value = self._get(key, default)
        if type(value) is not bool:
            raise self.error(key, "must be true or false")
        return value

    def choice(self, key: str, allowed: tuple[str, ...], default: Any = ...) -> Any:
        value = self._get(key, default)
        if value is not default and (type(value) is not str or value not in allowed):
            raise FileFormatError(
                self.source,
                self.prefix + key,
                f"{_short(value)} is not supported (supported: {', '.join(allowed)})",
            )
        return value

    def mapping(self, key: str) -> Fields | None:
        """A nested object (rope_scaling) as Fields of its own; None if absent or null."""
        value = self.config.get(key)
        if value is None:
            return None
        if not isinstance(value, dict):
            raise self.error(key, "must be an object")
        return Fields(value, self.source, f"{self.prefix}{key}.")

    def token_ids(self, key: str, vocab_size: int | None = None) -> list[int]:
        """An id or a list of ids (HF writes both); absent or null: []."""
        value = self.config.get(key)
        values = [] if value is None else value if isinstance(value, list) else [value]
        limit = f" and below vocab_size {vocab_size}" if vocab_size else ""
        for v in values:
            if type(v) is not int or v < 0 or (vocab_size and v >= vocab_size):
                raise self.error(
                    key, f"must be a token id or a list of them (integers >= 0{limit})"
                )
        return list(values)


# --- memory: what a config implies, before anything is allocated -------------------------------

LIMIT_VARIABLE = "GLASSGRAD_MAX_LOAD_BYTES"


def available_bytes() -> tuple[int, str]:
    """(bytes a load may take, where that figure comes from): $GLASSGRAD_MAX_LOAD_BYTES if set,
    else /proc/meminfo's MemAvailable, else the physical pages free (os.sysconf)."""
    setting = os.environ.get(LIMIT_VARIABLE)
    if setting:
        try:
            return int(setting), f"${LIMIT_VARIABLE}"
        except ValueError:
            problem = f"${LIMIT_VARIABLE} must be a number of bytes, got {setting!r}"
            raise ValueError(problem) from None
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024, "MemAvailable in /proc/meminfo"
    except OSError:
        pass
    try:
        pages = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        return pages, "the free physical memory"
    except (ValueError, OSError, AttributeError):
        return 2**63, "no limit known"


def check_memory(
    source: str | Path, parameters: int, dtype: np.dtype, max_bytes: int | None
) -> None:
    """Refuse, before allocating, a model whose parameters need more than the memory available
    (or max_bytes), with the figures and how to raise the limit."""
    need = parameters * np.dtype(dtype).itemsize
    limit, origin = (max_bytes, "max_bytes") if max_bytes is not None else available_bytes()
    if need > limit:
        raise FileFormatError(
            source,
            None,
            f"the model has {parameters:,} parameters: {need:,} bytes in {np.dtype(dtype)}, more "
            f"than the {limit:,} bytes available ({origin}); if that is wrong, raise the limit "
            f"with from_pretrained(..., max_bytes=) or ${LIMIT_VARIABLE}",
        )


# --- weights: which files, their headers, then their tensors one at a time ----------------------


def weight_files(directory: Path, path: Path) -> list[Path]:
    """The safetensors files holding the weights: `path` itself if it is one, else
    model.safetensors, else the shards of model.safetensors.index.json (transformers' order: a
    single file wins over an index). Shard names must be plain file names inside directory."""
    if path.is_file():
        return [path]
    single = directory / WEIGHTS
    if single.exists():
        if not single.is_file():
            raise FileFormatError(single, None, "is not a file")
        return [inside(directory, single, single, None)]
    index = directory / INDEX
    if not index.is_file():
        raise FileNotFoundError(f"{directory} holds neither {WEIGHTS} nor {INDEX}")
    weight_map = _read_json(index, directory).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise FileFormatError(index, "weight_map", "must be a non-empty object", weight_map)
    shards: dict[str, Path] = {}
    for tensor, name in weight_map.items():
        where = f"weight_map[{tensor!r}]"
        plain = type(name) is str and name not in ("", ".", "..")
        if not plain or any(sep in name for sep in ("/", "\\", os.sep, os.altsep) if sep):
            raise FileFormatError(index, where, "must be a plain file name in this directory", name)
        if name in shards:
            continue
        shard = inside(directory, directory / name, index, where)
        if not shard.is_file():
            problem = (
                "names a shard that is not a file"
                if shard.exists()
                else "names a shard that is missing"
            )
            raise FileFormatError(index, where, problem, name)
        shards[name] = shard
    return list(shards.values())


def read_header(path: Path) -> nn.SafetensorsHeader:
    """A shard's header (names, dtypes, shapes, where the bytes lie), checked against the file's
    size; nothing else of it is read."""
    try:
        return nn.read_safetensors_header(path)
    except nn.CheckpointError as exc:
        raise FileFormatError(path, exc.field, exc.problem) from None
    except OSError as exc:
        raise FileFormatError(path, None, f"cannot be read ({exc.strerror})") from None


def read_tensors(
    header: nn.SafetensorsHeader, names: list[str]
) -> Iterator[tuple[str, np.ndarray]]:
    """(name, array) for the given tensors of a checked header, one at a time."""
    try:
        yield from nn.read_safetensors_tensors(header, names)
    except nn.CheckpointError as exc:
        raise FileFormatError(header.path, exc.field, exc.problem) from None


def write_directory(
    directory: str | Path,
    config: dict[str, Any],
    tensors: dict[str, np.ndarray],
    metadata: dict[str, str] | None = None,
) -> None:
    """config.json and model.safetensors (one file, "pt" format as HF writes), each atomically."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    nn.save_safetensors(directory / WEIGHTS, tensors, metadata={"format": "pt", **(metadata or {})})
    nn.save_json_atomic(directory / "config.json", config)
