"""Hugging Face model directories: config.json, and the weights in model.safetensors or in shards
listed by model.safetensors.index.json ({"weight_map": {tensor name: shard file}}).

Tensors are read one at a time (nn.iter_safetensors), so loading never holds a second full copy
of the weights; BF16 and F16 become the model's dtype as they are read. Errors name the file and
the field. The families (models.gpt, models.llama) map names and layouts; this file only moves
bytes and JSON.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

import nn

WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text("utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"{path} does not exist") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object")
    return data


def read_config(path: str | Path) -> tuple[Path, dict[str, Any]]:
    """(directory, config.json as a dict) of a model directory, or of the .safetensors file inside
    one. generation_config.json's eos_token_id, where present, is added to the config's."""
    path = Path(path)
    directory = path if path.is_dir() else path.parent
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist")
    config = _read_json(directory / "config.json")
    generation = directory / "generation_config.json"
    if generation.is_file():
        extra = _read_json(generation).get("eos_token_id")
        if extra is not None:
            config["eos_token_id"] = sorted(set(ids(config.get("eos_token_id")) + ids(extra)))
    return directory, config


def ids(value: Any) -> list[int]:
    """An id or a list of ids (HF writes both) as a list; None as []."""
    if value is None:
        return []
    return [int(v) for v in (value if isinstance(value, list) else [value])]


def field(config: dict[str, Any], key: str, source: str, default: Any = ...) -> Any:
    """config[key], or a clear error naming the file and the field."""
    if key in config and config[key] is not None:
        return config[key]
    if default is ...:
        raise ValueError(f"{source}: the field {key!r} is missing")
    return default


def weight_files(directory: Path, path: Path) -> list[Path]:
    """The safetensors files holding the weights: `path` itself if it is one, else the shards of
    model.safetensors.index.json, else model.safetensors."""
    if path.is_file():
        return [path]
    index = directory / INDEX
    if index.is_file():
        weight_map = _read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ValueError(f"{index}: the field 'weight_map' is missing or empty")
        shards = [directory / name for name in dict.fromkeys(weight_map.values())]
        for shard in shards:
            if not shard.is_file():
                raise FileNotFoundError(f"{index} lists the shard {shard.name}, which is missing")
        return shards
    if (directory / WEIGHTS).is_file():
        return [directory / WEIGHTS]
    raise FileNotFoundError(f"{directory} holds neither {WEIGHTS} nor {INDEX}")


def iter_tensors(directory: Path, path: str | Path) -> Iterator[tuple[str, str, np.ndarray]]:
    """(file, tensor name, array) for every tensor of the model's weight files, one at a time."""
    for file in weight_files(directory, Path(path)):
        for name, array in nn.iter_safetensors(file):
            yield str(file), name, array


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
