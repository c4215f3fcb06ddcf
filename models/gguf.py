"""GGUF files (llama.cpp's format), read through the `gguf` package, llama.cpp's own reader.

One home for reading GGUF: the metadata as a dict of plain Python values (read_metadata), the
tensors' infos, and each tensor dequantized to a requested dtype with gguf.quants.dequantize,
the same code transformers uses. `gguf` is an optional dependency (`pip install glassgrad[gguf]`);
it is imported only when a GGUF file is read.

>>> meta = read_metadata("model.gguf")  # doctest: +SKIP
>>> meta["general.architecture"], len(meta["tokenizer.ggml.tokens"])  # doctest: +SKIP
('llama', 49152)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from models.errors import FileFormatError


def _gguf() -> Any:
    """The `gguf` package, or an ImportError that says how to get it."""
    try:
        import gguf
    except ImportError:
        raise ImportError(
            "reading a GGUF file needs the gguf package (llama.cpp's reader): "
            "pip install 'glassgrad[gguf]' (or pip install gguf)"
        ) from None
    return gguf


def open_reader(path: str | Path) -> Any:
    """A gguf.GGUFReader over the file (memory-mapped: tensors are read only when used). A file
    the reader refuses (bad magic, unknown version, truncated) is a FileFormatError."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist")
    gguf = _gguf()
    try:
        return gguf.GGUFReader(path)
    except (ValueError, KeyError, IndexError, OverflowError) as exc:
        # the reader reports a broken header as one of these; numpy's memmap over a short file
        # gives ValueError too
        raise FileFormatError(
            path, None, f"not a GGUF file the gguf package can read ({exc})"
        ) from None


def read_metadata(source: str | Path | Any) -> dict[str, Any]:
    """Every key-value pair of a GGUF file's header, in file order, as plain Python values: str,
    int, float, bool, or a list of them (tokenizer.ggml.tokens is a list of str). `source` is a
    path or an open reader (open_reader). The reader's pseudo-keys for the header's own counts
    (GGUF.version, GGUF.tensor_count, GGUF.kv_count) are left out."""
    reader = source if hasattr(source, "fields") else open_reader(source)
    # ReaderField.contents() turns the reader's numpy parts into Python values (numpy scalars
    # become int/float/bool via tolist, strings are decoded as UTF-8)
    return {
        key: field.contents() for key, field in reader.fields.items() if not key.startswith("GGUF.")
    }
