"""A character-level tokenizer: one token per Unicode character of the training text.

Tokens are indices, not meanings (notes 2.1): id 17 and id 18 are no closer in sense than 17 and 90.
A character vocabulary keeps the demo small and every token visible; the price is long sequences.
The tokenizer is saved beside the checkpoint as `tokenizer.json`, so a sampler decodes exactly the
ids the model was trained on.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

import nn


class CharTokenizer:
    """Maps each character of a fixed alphabet to its index in that alphabet.

    >>> tok = CharTokenizer.from_text("hello")
    >>> tok.encode("hole").tolist()
    [1, 3, 2, 0]
    >>> tok.decode([1, 0, 2, 2, 3])
    'hello'
    """

    kind = "char"

    def __init__(self, chars: Iterable[str]) -> None:
        chars = list(chars)
        bad = [c for c in chars if not isinstance(c, str) or len(c) != 1]
        if bad:
            raise ValueError(
                f"CharTokenizer: vocabulary entries must be single characters: {bad!r}"
            )
        if len(set(chars)) != len(chars):
            raise ValueError("CharTokenizer: vocabulary has repeated characters")
        if not chars:
            raise ValueError("CharTokenizer: empty vocabulary")
        self.chars: list[str] = chars
        self._index = {c: i for i, c in enumerate(chars)}

    @classmethod
    def from_text(cls, text: str) -> CharTokenizer:
        """The alphabet of `text`, sorted by code point (so the same text gives the same ids)."""
        if not text:
            raise ValueError("CharTokenizer.from_text: the text is empty")
        return cls(sorted(set(text)))

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> np.ndarray:
        """Token ids of `text` as an int64 array; characters outside the alphabet are an error."""
        index = self._index
        try:
            return np.fromiter((index[c] for c in text), dtype=np.int64, count=len(text))
        except KeyError:
            unknown = sorted({c for c in text if c not in index})
            raise ValueError(
                f"CharTokenizer.encode: {len(unknown)} character(s) not in the "
                f"{self.vocab_size}-character vocabulary: {''.join(unknown)[:40]!r}"
            ) from None

    def decode(self, ids: Any) -> str:
        """The text of a sequence of ids (any int iterable or 1-D array)."""
        ids = np.asarray(ids)
        if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
            raise ValueError(
                f"CharTokenizer.decode: expected a 1-D integer sequence, got shape {ids.shape} "
                f"dtype {ids.dtype}"
            )
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            raise ValueError(
                f"CharTokenizer.decode: ids must lie in [0, {self.vocab_size}), got range "
                f"[{ids.min()}, {ids.max()}]"
            )
        return "".join(self.chars[i] for i in ids.tolist())

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.kind, "chars": "".join(self.chars)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CharTokenizer:
        if data.get("type") != cls.kind or not isinstance(data.get("chars"), str):
            raise ValueError(
                f"CharTokenizer.from_dict: expected {{'type': 'char', 'chars': str}}, "
                f"got keys {sorted(data)} with type {data.get('type')!r}"
            )
        return cls(data["chars"])

    def save(self, path: str | Path) -> None:
        """Write tokenizer.json atomically (a crash never leaves half a file)."""
        nn.save_json_atomic(path, self.to_dict())

    @classmethod
    def load(cls, path: str | Path) -> CharTokenizer:
        with open(path, encoding="utf-8") as f:
            return cls.from_dict(json.load(f))

    def __repr__(self) -> str:
        return f"CharTokenizer(vocab_size={self.vocab_size})"
