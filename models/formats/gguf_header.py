"""A GGUF file's header read by hand: its metadata as plain Python values and its tensors'
records, the data memory-mapped (llama.cpp's gguf.md: the layout below, little-endian).

    magic "GGUF", version u32 (2 or 3), tensor count u64, metadata count u64
    metadata:  key (string), value type u32, value          string = length u64, UTF-8 bytes
    tensors:   name (string), n_dims u32, dims u64 x n_dims (ne0 first), type u32, offset u64
    padding to general.alignment (default 32), then the tensors' data at their offsets

The gguf package's GGUFReader reads the same header, but keeps every value as numpy arrays of
its own: two per string, so SmolLM2-135M's 49152 tokens and 48900 merges cost ~170 MB and ~1 s
when a model is loaded (peak resident memory 325 MB before any weight, against 157 MB for the
imports). Here each value becomes one Python object at once (~8 MB). A tensor record has the
fields of gguf's ReaderTensor that the loader reads (name, tensor_type, shape, n_elements,
n_bytes, data_offset, data: the same numpy view of the memory map); its tensor_type is a
GGMLType of the table below (ggml.h's enum ggml_type), so reading a header needs no package.

Every length, count and offset is checked against the file's size before it is used: a
truncated or corrupted file is a FileFormatError naming the file and the key (or tensor), never
an allocation the size of a corrupted count.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from models.formats.errors import FileFormatError

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32

# GGUFValueType: code -> (struct format, size) of the scalar types; 8 is a string, 9 an array
SCALARS = {
    0: ("B", 1), 1: ("b", 1), 2: ("H", 2), 3: ("h", 2), 4: ("I", 4), 5: ("i", 4),
    6: ("f", 4), 7: ("?", 1), 10: ("Q", 8), 11: ("q", 8), 12: ("d", 8),
}  # fmt: skip
STRING, ARRAY = 8, 9
_LENGTH = struct.Struct("<Q")  # a string's length, before its UTF-8 bytes
# numpy dtypes of the scalar types, for whole arrays of them at once
SCALAR_DTYPES = {
    0: "u1", 1: "i1", 2: "u2", 3: "i2", 4: "u4", 5: "i4", 6: "f4", 7: "?", 10: "u8",
    11: "i8", 12: "f8",
}  # fmt: skip


class GGMLType(NamedTuple):
    """A tensor type (ggml.h's enum ggml_type, gguf's GGMLQuantizationType): its code in the
    file, its name, and the values and bytes of one block (1 and the value's size when plain)."""

    code: int
    name: str
    block_size: int
    type_size: int


# every type of ggml.h (gguf 0.19's GGML_QUANT_SIZES; tests/test_gguf.py holds them equal)
GGML_TYPES = {t.code: t for t in (GGMLType(*fields) for fields in (
    (0, "F32", 1, 4), (1, "F16", 1, 2), (2, "Q4_0", 32, 18), (3, "Q4_1", 32, 20),
    (6, "Q5_0", 32, 22), (7, "Q5_1", 32, 24), (8, "Q8_0", 32, 34), (9, "Q8_1", 32, 40),
    (10, "Q2_K", 256, 84), (11, "Q3_K", 256, 110), (12, "Q4_K", 256, 144),
    (13, "Q5_K", 256, 176), (14, "Q6_K", 256, 210), (15, "Q8_K", 256, 292),
    (16, "IQ2_XXS", 256, 66), (17, "IQ2_XS", 256, 74), (18, "IQ3_XXS", 256, 98),
    (19, "IQ1_S", 256, 50), (20, "IQ4_NL", 32, 18), (21, "IQ3_S", 256, 110),
    (22, "IQ2_S", 256, 82), (23, "IQ4_XS", 256, 136), (24, "I8", 1, 1), (25, "I16", 1, 2),
    (26, "I32", 1, 4), (27, "I64", 1, 8), (28, "F64", 1, 8), (29, "IQ1_M", 256, 56),
    (30, "BF16", 1, 2), (34, "TQ1_0", 256, 54), (35, "TQ2_0", 256, 66), (39, "MXFP4", 32, 17),
    (40, "NVFP4", 64, 36), (41, "Q1_0", 128, 18),
))}  # fmt: skip
# tensor types stored as plain numbers (gguf's reader views them so); the rest are blocks (bytes)
PLAIN_TENSORS = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I8": np.int8,
                 "I16": np.int16, "I32": np.int32, "I64": np.int64}  # fmt: skip


class TensorRecord(NamedTuple):
    """A tensor as the header describes it, its data a view of the file (gguf's ReaderTensor's
    fields): shape is GGUF's dims (ne0 first), data numpy-shaped (dims reversed; block types as
    bytes per row)."""

    name: str
    tensor_type: GGMLType
    shape: np.ndarray
    n_elements: int
    n_bytes: int
    data_offset: int
    data: np.ndarray


class GGUFHeader:
    """GGUFHeader(path): `metadata` (key -> str, int, float, bool or a list of them, in file
    order), `tensors` (TensorRecords in file order), `version`, `alignment`, `data_offset` and
    `data` (the np.memmap of the whole file, which the tensors' data views)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.data = np.memmap(self.path, mode="r") if self.path.stat().st_size else None
        self._bytes = memoryview(self.data) if self.data is not None else memoryview(b"")
        self._offset = 0
        self._key: str | None = None  # what is being read, for the errors
        if bytes(self._bytes[:4]) != MAGIC:
            raise FileFormatError(self.path, None, "not a GGUF file (it does not begin with GGUF)")
        self._offset = 4
        self.version = self._scalar(4, "the version")
        if self.version not in VERSIONS:
            raise FileFormatError(self.path, None, f"GGUF version {self.version} (readable: 2, 3)")
        n_tensors = self._count(self._scalar(10, "the tensor count"), 8 + 4 + 4 + 8, "tensors")
        n_keys = self._count(self._scalar(10, "the metadata count"), 8 + 4, "metadata keys")
        self.metadata: dict[str, Any] = {}
        for _ in range(n_keys):
            self._key = None
            key = self._string("a metadata key")
            self._key = key
            if key in self.metadata:
                raise FileFormatError(self.path, key, "appears twice in the metadata")
            self.metadata[key] = self._value(self._scalar(4, "its type"))
        self._key = None
        records = [self._tensor_record() for _ in range(n_tensors)]
        self.alignment = self.metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if (
            not isinstance(self.alignment, int)
            or isinstance(self.alignment, bool)
            or self.alignment <= 0
            or self.alignment & (self.alignment - 1)
        ):
            raise FileFormatError(
                self.path, "general.alignment", "must be a power of two", self.alignment
            )
        self.data_offset = -(-self._offset // self.alignment) * self.alignment
        self.tensors = [self._tensor(*record) for record in records]

    # --- reading, every size checked against what is left of the file ----------------------------
    def _fail(self, message: str) -> FileFormatError:
        """An error naming the metadata key or tensor being read (None: the header's counts)."""
        return FileFormatError(self.path, self._key, message)

    def _read_bytes(self, size: int, what: str) -> memoryview:
        end = self._offset + size
        if end > len(self._bytes):
            raise self._fail(f"{what} runs past the end of the file ({len(self._bytes)} bytes)")
        out = self._bytes[self._offset : end]
        self._offset = end
        return out

    def _scalar(self, code: int, what: str) -> Any:
        fmt, size = SCALARS[code]
        return struct.unpack("<" + fmt, self._read_bytes(size, what))[0]

    def _count(self, count: int, least_bytes: int, what: str) -> int:
        """A count of items of at least least_bytes each, refused if the file cannot hold them."""
        if count * least_bytes > len(self._bytes) - self._offset:
            raise self._fail(f"{count} {what}: more than the file's {len(self._bytes)} bytes hold")
        return count

    def _string(self, what: str) -> str:
        length = self._scalar(10, what)
        raw = self._read_bytes(self._count(length, 1, "string bytes"), what)
        try:
            return str(raw, "utf-8")
        except UnicodeDecodeError as exc:
            raise self._fail(f"{what} is not UTF-8 ({exc})") from None

    def _strings(self, count: int, what: str) -> list[str]:
        """`count` strings in a row, each read and checked as _string reads one, in one loop with
        the offset in a local (a vocabulary is ~100k of them: 0.15 s through _string)."""
        data, offset, size, out = self._bytes, self._offset, len(self._bytes), []
        for _ in range(count):
            self._offset = offset  # where an error is raised from
            if offset + 8 > size:
                raise self._fail(f"{what} runs past the end of the file ({size} bytes)")
            (length,) = _LENGTH.unpack_from(data, offset)
            offset += 8
            if length > size - offset:
                raise self._fail(f"{length} string bytes: more than the file's {size} bytes hold")
            try:
                out.append(str(data[offset : offset + length], "utf-8"))
            except UnicodeDecodeError as exc:
                raise self._fail(f"{what} is not UTF-8 ({exc})") from None
            offset += length
        self._offset = offset
        return out

    def _value(self, code: int) -> Any:
        if code in SCALARS:
            return self._scalar(code, "its value")
        if code == STRING:
            return self._string("its value")
        if code != ARRAY:
            raise self._fail(f"has an unknown value type {code}")
        item = self._scalar(4, "its array's type")
        if item in SCALARS:
            size = SCALARS[item][1]
            count = self._count(self._scalar(10, "its array's length"), size, "array items")
            raw = self._read_bytes(count * size, "its array")
            return np.frombuffer(raw, "<" + SCALAR_DTYPES[item], count).tolist()
        if item == STRING:
            count = self._count(self._scalar(10, "its array's length"), 8, "array items")
            return self._strings(count, "an item of its array")
        raise self._fail(f"is an array of value type {item} (arrays of arrays are not read)")

    def _tensor_record(self) -> tuple[str, tuple[int, ...], int, int]:
        name = self._string("a tensor's name")
        self._key = name
        n_dims = self._scalar(4, "its dims count")
        if not 1 <= n_dims <= 4:
            raise self._fail(f"has {n_dims} dims (GGUF allows 1 to 4)")
        dims = tuple(self._scalar(10, "its dims") for _ in range(n_dims))
        code = self._scalar(4, "its type")
        offset = self._scalar(10, "its offset")
        self._key = None
        return name, dims, code, offset

    def _tensor(self, name: str, dims: tuple[int, ...], code: int, offset: int) -> TensorRecord:
        tensor_type = GGML_TYPES.get(code)
        if tensor_type is None:
            raise FileFormatError(self.path, name, "has an unknown tensor type", code)
        block, type_size = tensor_type.block_size, tensor_type.type_size
        n_elements = int(np.prod(dims, dtype=object))
        if dims[0] % block:
            raise FileFormatError(
                self.path, name, f"rows of {dims[0]} values are not whole {block}-value blocks"
            )
        n_bytes = n_elements * type_size // block
        start = self.data_offset + offset
        if offset % self.alignment or start + n_bytes > len(self._bytes):
            raise FileFormatError(
                self.path,
                name,
                f"lies outside the file's data ({n_bytes} bytes at offset {offset}; the file "
                f"has {len(self._bytes)} bytes, its data aligned to {self.alignment})",
            )
        shape = tuple(reversed(dims))
        plain = PLAIN_TENSORS.get(tensor_type.name)
        if plain is None:  # blocks: bytes per row
            shape = (*shape[:-1], shape[-1] // block * type_size)
        dtype = np.uint8 if plain is None else plain
        data = np.frombuffer(self.data, dtype, int(np.prod(shape)), start).reshape(shape)
        return TensorRecord(
            name, tensor_type, np.array(dims, np.uint64), n_elements, n_bytes, start, data
        )
