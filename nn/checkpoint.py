"""Checkpoints as safetensors files plus a small JSON file: data only, no pickle anywhere.

The safetensors format, written here by hand:
    8 bytes     N, the header length (unsigned little-endian)
    N bytes     a JSON object {name: {"dtype": "F32", "shape": [...], "data_offsets": [b, e]},
                "__metadata__": {str: str}} (padded with spaces to a multiple of 8)
    the rest    the tensors' raw little-endian bytes; [b, e) is relative to this buffer
Loading parses JSON and copies bytes into arrays, so it can never run code. Saving is atomic: the
file is written under a temporary name in the same directory, flushed to disk, and renamed over
the old one; on any error the temporary file is removed and the previous file is untouched.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

_DTYPES = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}
_NAMES = {dtype: name for name, dtype in _DTYPES.items()}
_MAX_HEADER = 100 * 1024 * 1024  # the reference implementation's limit; guards foreign files


FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")  # what a floating-point parameter may be stored as


class CheckpointError(ValueError):
    """A checkpoint file is truncated, foreign (not safetensors) or inconsistent:
    `<path>: <problem>`; .path and .problem keep the parts (the loaders re-raise them as
    models.FileFormatError)."""

    def __init__(self, path: str | os.PathLike, problem: str) -> None:
        self.path, self.problem, self.field = str(path), problem, None
        super().__init__(f"{path}: {problem}")


# --- atomic writes ------------------------------------------------------------------------------


def _write_atomic(path: str | os.PathLike, write: Callable[[Any], None]) -> None:
    """Call write(file) on a temporary file beside `path`, then rename it to `path` (atomic)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())  # the bytes are on disk before the rename makes them visible
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    """Persist the rename itself (POSIX); a no-op where directories cannot be opened."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def save_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write text to path as UTF-8, atomically (temporary file + rename)."""
    _write_atomic(path, lambda f: f.write(text.encode("utf-8")))


def save_json_atomic(path: str | os.PathLike, obj: Any) -> None:
    """Write obj as JSON to path atomically (temporary file + rename)."""
    save_text_atomic(path, json.dumps(obj, indent=2, sort_keys=True, allow_nan=False) + "\n")


# --- safetensors --------------------------------------------------------------------------------


def save_safetensors(
    path: str | os.PathLike,
    arrays: dict[str, np.ndarray],
    metadata: dict[str, str] | None = None,
) -> None:
    """Write arrays (name -> numpy array) and optional string metadata as a safetensors file."""
    header: dict[str, Any] = {}
    if metadata:
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise TypeError("save_safetensors: metadata must map str to str")
        header["__metadata__"] = dict(metadata)
    prepared = []
    offset = 0
    for name, value in arrays.items():
        if not isinstance(name, str) or name == "__metadata__":
            raise ValueError(f"save_safetensors: invalid tensor name {name!r}")
        array = np.asarray(value)
        dtype = array.dtype.newbyteorder("<") if array.dtype.itemsize > 1 else array.dtype
        if dtype not in _NAMES:
            raise TypeError(
                f"save_safetensors: {name!r} has dtype {array.dtype}; supported: "
                f"{', '.join(str(d) for d in _NAMES)}"
            )
        array = array.astype(dtype, order="C", copy=False)  # keeps 0-d arrays 0-d
        header[name] = {
            "dtype": _NAMES[dtype],
            "shape": list(array.shape),
            "data_offsets": [offset, offset + array.nbytes],
        }
        offset += array.nbytes
        prepared.append(array)
    encoded = json.dumps(header, separators=(",", ":")).encode("utf-8")
    encoded += b" " * (-len(encoded) % 8)  # align the data buffer to 8 bytes

    def write(f: Any) -> None:
        f.write(len(encoded).to_bytes(8, "little"))
        f.write(encoded)
        for array in prepared:
            f.write(memoryview(array.reshape(-1)).cast("B"))

    _write_atomic(path, write)


def load_safetensors(path: str | os.PathLike) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Read a safetensors file -> (name -> array, metadata). BF16 tensors come back as float32.

    Raises CheckpointError for a truncated, foreign or inconsistent file.
    """
    metadata: dict[str, str] = {}
    arrays = dict(iter_safetensors(path, metadata))
    return arrays, metadata


@dataclass
class SafetensorsHeader:
    """A safetensors file's header, checked against the file: name -> (dtype, shape, (begin,
    end)) in file order, the string metadata, and where the data begins."""

    path: Path
    tensors: dict[str, tuple[str, tuple[int, ...], tuple[int, int]]]
    metadata: dict[str, str]
    data_start: int


def read_safetensors_header(path: str | os.PathLike) -> SafetensorsHeader:
    """The header of a safetensors file, every entry checked (dtype, shape, offsets that tile
    the data exactly as the file is long) before any tensor is read: a header can claim no
    byte the file does not hold."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise CheckpointError(path, f"{size} bytes is too short to be a safetensors file")
        n = int.from_bytes(prefix, "little")
        if n > _MAX_HEADER or 8 + n > size:
            raise CheckpointError(
                path,
                f"not a safetensors file, or truncated (header length {n} bytes, file {size} "
                "bytes)",
            )
        raw = f.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(path, f"the header is not valid JSON ({exc})") from None
    if not isinstance(header, dict):
        raise CheckpointError(path, "the header is not a JSON object")
    found = header.pop("__metadata__", None) or {}
    if not isinstance(found, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in found.items()
    ):
        raise CheckpointError(path, "__metadata__ must map strings to strings")
    entries = sorted(
        ((name, *_check_entry(path, name, info)) for name, info in header.items()),
        key=lambda entry: entry[3][0],
    )
    data_size = size - 8 - n
    expected = 0
    for name, _, _, (begin, end) in entries:
        if begin != expected:
            raise CheckpointError(
                path,
                f"tensor {name!r} starts at byte {begin}, expected {expected} (gaps or overlaps "
                "in data_offsets)",
            )
        expected = end
    if expected != data_size:
        raise CheckpointError(
            path,
            f"the header describes {expected} data bytes but the file holds {data_size} "
            "(truncated or trailing data)",
        )
    tensors = {name: (dtype, shape, offsets) for name, dtype, shape, offsets in entries}
    return SafetensorsHeader(path, tensors, found, 8 + n)


def read_safetensors_tensors(
    header: SafetensorsHeader, names: Iterable[str] | None = None
) -> Iterator[tuple[str, np.ndarray]]:
    """(name, array) for the named tensors of a checked header (default: all), in file order,
    one at a time (a large file is never held twice); BF16 comes back as float32."""
    wanted = set(header.tensors) if names is None else set(names)
    with open(header.path, "rb") as f:
        for name, (dtype, shape, (begin, end)) in header.tensors.items():
            if name not in wanted:
                continue
            array = np.empty(shape, dtype=np.dtype("<u2") if dtype == "BF16" else _DTYPES[dtype])
            f.seek(header.data_start + begin)
            if f.readinto(memoryview(array.reshape(-1)).cast("B")) != end - begin:
                raise CheckpointError(header.path, f"truncated while reading tensor {name!r}")
            if dtype == "BF16":  # bfloat16 is the top half of a float32: shift its bits up
                array = (array.astype(np.uint32) << 16).view(np.float32)
            yield (
                name,
                array if array.dtype.isnative else array.astype(array.dtype.newbyteorder("=")),
            )


def iter_safetensors(
    path: str | os.PathLike, metadata: dict[str, str] | None = None
) -> Iterator[tuple[str, np.ndarray]]:
    """(name, array) for each tensor of a safetensors file, read one at a time (a large file is
    never held twice); BF16 tensors come back as float32. The header is checked whole before the
    first tensor is read; `metadata`, if given, receives the file's string metadata."""
    header = read_safetensors_header(path)
    if metadata is not None:
        metadata.update(header.metadata)
    yield from read_safetensors_tensors(header)


def _check_entry(path: Path, name: str, info: Any) -> tuple[str, tuple[int, ...], tuple[int, int]]:
    """Validate one header entry -> (dtype name, shape, (begin, end))."""
    if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
        raise CheckpointError(path, f"malformed header entry for {name!r}: {info!r}")
    dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    if not isinstance(dtype, str) or (dtype not in _DTYPES and dtype != "BF16"):
        raise CheckpointError(
            path,
            f"tensor {name!r} has unsupported dtype {dtype!r} (supported: BF16, "
            f"{', '.join(_DTYPES)})",
        )
    ints = shape + offsets if isinstance(shape, list) and isinstance(offsets, list) else None
    if ints is None or len(offsets) != 2 or not all(type(x) is int and x >= 0 for x in ints):
        raise CheckpointError(path, f"tensor {name!r} has an invalid shape or data_offsets")
    itemsize = 2 if dtype == "BF16" else _DTYPES[dtype].itemsize
    nbytes = math.prod(shape) * itemsize  # Python ints: a huge shape cannot wrap around to 0
    if offsets[1] - offsets[0] != nbytes:
        raise CheckpointError(
            path,
            f"tensor {name!r} ({dtype} {shape}) needs {nbytes} bytes, data_offsets "
            f"{offsets} give {offsets[1] - offsets[0]}",
        )
    return dtype, tuple(shape), (offsets[0], offsets[1])


# --- model + optimizer checkpoints --------------------------------------------------------------

_FORMAT = "glassgrad-checkpoint"


def save_checkpoint(
    directory: str | os.PathLike,
    model: Any,
    optimizer: Any = None,
    meta: dict[str, Any] | None = None,
) -> None:
    """Save model (and optimizer) state into `directory`.

    Files: model.safetensors (the state_dict), optimizer.safetensors (moment arrays) and
    checkpoint.json (optimizer settings and step counts, the names of the frozen parameters
    (requires_grad=False), plus `meta`: any JSON, e.g. the model config and the training step).
    Each file is replaced atomically; checkpoint.json is written last, and all three carry the
    same random save id, so that load_checkpoint detects a set of files left mixed by a save
    that was cut short.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    stamp = {"checkpoint_id": uuid.uuid4().hex}
    save_safetensors(directory / "model.safetensors", model.state_dict(), stamp)
    info: dict[str, Any] = {"format": _FORMAT, "version": 1, **stamp, "meta": meta or {}}
    info["frozen"] = [name for name, p in model.named_parameters() if not p.requires_grad]
    if optimizer is not None:
        arrays, info["optimizer"] = split_optimizer_state(optimizer.state_dict())
        save_safetensors(directory / "optimizer.safetensors", arrays, stamp)
    save_json_atomic(directory / "checkpoint.json", info)


def load_checkpoint(
    directory: str | os.PathLike, model: Any, optimizer: Any = None, strict: bool = True
) -> dict[str, Any]:
    """Load a checkpoint written by save_checkpoint into model (and optimizer); return its meta.

    The parameters the checkpoint names as frozen are frozen again (requires_grad=False), the
    others it holds require grad."""
    directory = Path(directory)
    try:
        info = json.loads((directory / "checkpoint.json").read_text("utf-8"))
    except json.JSONDecodeError as exc:
        raise CheckpointError(directory / "checkpoint.json", f"not valid JSON ({exc})") from None
    if not isinstance(info, dict) or info.get("format") != _FORMAT:
        raise CheckpointError(directory / "checkpoint.json", f"not a {_FORMAT} file")
    files = {"model.safetensors": load_safetensors(directory / "model.safetensors")}
    if optimizer is not None:
        if "optimizer" not in info:
            raise CheckpointError(directory, "this checkpoint has no optimizer state")
        files["optimizer.safetensors"] = load_safetensors(directory / "optimizer.safetensors")
        opt_state = join_optimizer_state(files["optimizer.safetensors"][0], info["optimizer"])
    for name, (_, metadata) in files.items():
        if metadata.get("checkpoint_id") != info.get("checkpoint_id"):
            raise CheckpointError(
                directory,
                f"{name} does not belong to checkpoint.json (save ids "
                f"{metadata.get('checkpoint_id')} and {info.get('checkpoint_id')}); "
                "a save was cut short",
            )
    arrays = files["model.safetensors"][0]
    model.load_state_dict(arrays, strict=strict)
    frozen = set(info.get("frozen", []))
    for name, p in model.named_parameters():
        if name in arrays:
            p.requires_grad = name not in frozen
    if optimizer is not None:
        optimizer.load_state_dict(opt_state)
    return info["meta"]


def split_optimizer_state(state: dict[str, Any]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Optimizer state_dict -> (arrays named "state.<param>.<name>", the JSON-able rest).

    The arrays go to a safetensors file, the rest (settings, step counts) to JSON;
    join_optimizer_state puts them back together for optimizer.load_state_dict.
    """
    arrays: dict[str, np.ndarray] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for index, entry in state["state"].items():
        for name, value in entry.items():
            if isinstance(value, np.ndarray):
                arrays[f"state.{index}.{name}"] = value
            else:
                scalars.setdefault(str(index), {})[name] = value
    return arrays, {"param_groups": state["param_groups"], "scalars": scalars}


def join_optimizer_state(arrays: dict[str, np.ndarray], rest: dict[str, Any]) -> dict[str, Any]:
    """The inverse of split_optimizer_state."""
    state: dict[int, dict[str, Any]] = {}
    for key, value in arrays.items():
        _, index, name = key.split(".", 2)
        state.setdefault(int(index), {})[name] = value
    for index, entry in rest["scalars"].items():
        state.setdefault(int(index), {}).update(entry)
    return {"state": state, "param_groups": rest["param_groups"]}
