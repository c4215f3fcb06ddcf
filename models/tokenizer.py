"""Tokenizers: one token per character (CharTokenizer) or GPT-2's byte-level BPE (BPETokenizer).

Tokens are indices, not meanings (notes 2.1): id 17 and id 18 are no closer in sense than 17 and 90.
A character vocabulary keeps the demo small and every token visible; the price is long sequences.
BPE (docs/tokenizer.md) starts from the 256 byte values and adds one token per learned merge of
the most frequent adjacent pair, so frequent words become single tokens and any text, in any
script, still has an encoding. A checkpoint directory holds one of the two: `tokenizer.json`
(characters) or GPT-2's `vocab.json` + `merges.txt` (BPE); save_tokenizer / load_tokenizer pick
the right files, so a sampler decodes exactly the ids the model was trained on.
"""

from __future__ import annotations

import heapq
import json
from collections import Counter, defaultdict
from collections.abc import Collection, Iterable
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import regex

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


# --- byte-level BPE, as GPT-2 ---------------------------------------------------------------------

# GPT-2's pre-tokenizer: a contraction, a run of letters or of digits or of other symbols (each
# with at most one leading space), or whitespace. Merges stay inside a piece: "the(" is "the" + "(",
# and " the" is one piece wherever it occurs. `regex`, not `re`: \p{L} / \p{N} are Unicode classes.
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
_PIECES = regex.compile(GPT2_PATTERN)
END_OF_TEXT = "<|endoftext|>"
MERGES_HEADER = "#version: 0.2"


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's map from the 256 byte values to printable characters, in GPT-2's id order.

    vocab.json and merges.txt store tokens as text, and a byte such as space or newline would be
    unreadable there (or split a merges line). So the 188 printable Latin-1 bytes stand for
    themselves, and the other 68 (controls, space, ...) for chr(256), chr(257), ... in byte
    order: space is 'Ġ', newline 'Ċ'. The dict's order is the byte tokens' ids: '!' is 0.
    """
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    others = [b for b in range(256) if b not in printable]
    chars = [chr(b) for b in printable] + [chr(256 + n) for n in range(len(others))]
    return dict(zip(printable + others, chars, strict=True))


_BYTE_CHAR = bytes_to_unicode()
_BYTE_TOKENS = tuple(_BYTE_CHAR.values())  # id order
_CHAR_BYTE = {c: b for b, c in _BYTE_CHAR.items()}


def _merge(parts: list[str], a: str, b: str) -> list[str]:
    """parts with each adjacent (a, b) replaced by a + b, scanning left to right (GPT-2's rule:
    in a a a, the pair (a, a) merges at the left and leaves aa a)."""
    out, i, n = [], 0, len(parts)
    while i < n:
        if i + 1 < n and parts[i] == a and parts[i + 1] == b:
            out.append(a + b)
            i += 2
        else:
            out.append(parts[i])
            i += 1
    return out


class BPETokenizer:
    """GPT-2's byte-level BPE: learn it with train, or load GPT-2's files with from_pretrained.

    Tokens are strings over GPT-2's byte alphabet (bytes_to_unicode): 'Ġthe' is the bytes of
    " the". vocab maps token -> id; merges lists the learned pairs, earliest (most frequent when
    learned) first. <|endoftext|> has an id of its own and is never made by merges (no piece of
    GPT2_PATTERN can hold it); encode emits it only where allowed_special asks for it.

    >>> tok = BPETokenizer.train("low lower lowest " * 20, vocab_size=262)
    >>> tok.merges  # ties: (l, o) before (o, w) at 60 pairs; (s, t) first at 20, as 's' < 'Ġ'
    [('l', 'o'), ('lo', 'w'), ('Ġ', 'low'), ('Ġlow', 'e'), ('s', 't')]
    >>> tok.encode(" lowest"), tok.eot_id
    ([259, 260], 261)
    >>> tok.decode([259, 260])
    ' lowest'
    """

    kind = "bpe"

    def __init__(self, vocab: dict[str, int], merges: Iterable[tuple[str, str]]) -> None:
        """From a vocabulary and a merge list (train and from_pretrained make these; the
        latter checks each merge against the vocabulary, with the line it came from)."""
        missing = [t for t in _BYTE_TOKENS if t not in vocab]
        if missing:
            raise ValueError(f"the vocabulary lacks {len(missing)} byte token(s): {missing[:8]}")
        bad = {t: i for t, i in vocab.items() if type(i) is not int or i < 0}
        if bad:
            raise ValueError(f"ids must be non-negative integers: {list(bad.items())[:5]}")
        self.vocab: dict[str, int] = dict(vocab)
        self.merges: list[tuple[str, str]] = [tuple(m) for m in merges]
        self._ranks = {pair: rank for rank, pair in enumerate(self.merges)}
        self._bytes: dict[int, bytes] = {}  # id -> the bytes it decodes to
        for token, i in self.vocab.items():
            if i in self._bytes:
                raise ValueError(f"id {i} is given to two tokens, one of them {token!r}")
            if any(c not in _CHAR_BYTE for c in token):
                raise ValueError(f"token {token!r} (id {i}) is not over GPT-2's byte alphabet")
            self._bytes[i] = bytes(_CHAR_BYTE[c] for c in token)
        self.special_tokens = {t: self.vocab[t] for t in (END_OF_TEXT,) if t in self.vocab}
        self._vocab_size = max(self._bytes) + 1
        self._cache: dict[str, list[int]] = {}  # pre-tokenized piece -> its ids

    # --- learning -------------------------------------------------------------------------------

    @classmethod
    def train(cls, text: str, vocab_size: int) -> BPETokenizer:
        """Learn vocab_size - 257 merges from text: ids 0-255 are the bytes (in GPT-2's order),
        256 + r is merge r, and the last id is <|endoftext|> (as GPT-2's 50256).

        Each step merges the most frequent adjacent pair, counted over the pre-tokenized pieces
        of text (<|endoftext|> in text separates documents and is never merged). Ties go to the
        pair whose (left, right) strings, as written in merges.txt, sort first. A text that runs
        out of pairs stops early, with a smaller vocabulary.

        Pair counts are kept up to date instead of recounted: each piece is counted once (with
        its number of occurrences), a merge revisits only the pieces that hold the pair, and a
        heap of (-count, left, right) finds the next best pair; entries left stale by a falling
        count are refreshed when they surface.
        """
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 257:
            raise ValueError(
                f"BPETokenizer.train: vocab_size must be an int >= 257 (256 bytes + "
                f"<|endoftext|>), got {vocab_size!r}"
            )
        pieces = Counter()
        for document in text.split(END_OF_TEXT):
            pieces.update(_PIECES.findall(document))
        words = [[_BYTE_CHAR[b] for b in piece.encode("utf-8")] for piece in pieces]
        freqs = list(pieces.values())
        counts: Counter[tuple[str, str]] = Counter()
        where: defaultdict[tuple[str, str], set[int]] = defaultdict(set)  # pair -> words
        for w, (word, freq) in enumerate(zip(words, freqs, strict=True)):
            for pair in pairwise(word):
                counts[pair] += freq
                where[pair].add(w)
        heap = [(-count, a, b) for (a, b), count in counts.items()]
        heapq.heapify(heap)
        merges: list[tuple[str, str]] = []
        while heap and len(merges) < vocab_size - 257:
            negative, a, b = heapq.heappop(heap)
            count = counts.get((a, b), 0)
            if count != -negative:  # stale: the count fell since this entry was pushed
                if count:
                    heapq.heappush(heap, (-count, a, b))
                continue
            merges.append((a, b))
            change: Counter[tuple[str, str]] = Counter()
            for w in where.pop((a, b)):
                word = words[w]
                merged = _merge(word, a, b)
                if len(merged) == len(word):
                    continue  # the pair left this word in an earlier merge
                for pair in pairwise(word):
                    change[pair] -= freqs[w]
                for pair in pairwise(merged):
                    change[pair] += freqs[w]
                    where[pair].add(w)
                words[w] = merged
            for pair, delta in change.items():
                counts[pair] += delta
                if not counts[pair]:
                    del counts[pair]
                elif delta > 0:  # only pairs with the new token grow: push their new count
                    heapq.heappush(heap, (-counts[pair], *pair))
        vocab = {token: i for i, token in enumerate(_BYTE_TOKENS)}
        for a, b in merges:
            vocab[a + b] = len(vocab)
        vocab[END_OF_TEXT] = len(vocab)
        return cls(vocab, merges)

    # --- text <-> ids ---------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        """One more than the largest id (the rows a GPT's embedding needs)."""
        return self._vocab_size

    @property
    def eot_id(self) -> int | None:
        """The id of <|endoftext|> (50256 in GPT-2), or None if the vocabulary has none."""
        return self.special_tokens.get(END_OF_TEXT)

    def encode(self, text: str, allowed_special: Collection[str] | str = ()) -> list[int]:
        """Token ids of text.

        Special-token text such as "<|endoftext|>" is ordinary text by default (encoded as the
        bytes it is made of, like tiktoken's encode_ordinary), so text from a file or a user can
        never inject a control token. Name the tokens to recognise in allowed_special (a
        collection of names, or "all"): encode("a<|endoftext|>b", allowed_special="all") gives
        the ids of "a", the one id of <|endoftext|>, then those of "b".
        """
        if allowed_special == "all":
            allowed = set(self.special_tokens)
        else:
            allowed = (
                {allowed_special} if isinstance(allowed_special, str) else set(allowed_special)
            )
        unknown = allowed - set(self.special_tokens)
        if unknown:
            raise ValueError(
                f"BPETokenizer.encode: unknown special token(s) {sorted(unknown)}; this "
                f"vocabulary has {sorted(self.special_tokens)}"
            )
        if not allowed:
            return self._encode_ordinary(text)
        # A capturing split keeps the specials: odd positions hold them.
        names = "|".join(regex.escape(t) for t in sorted(allowed, key=len, reverse=True))
        ids: list[int] = []
        for i, part in enumerate(regex.split(f"({names})", text)):
            ids += [self.special_tokens[part]] if i % 2 else self._encode_ordinary(part)
        return ids

    def _encode_ordinary(self, text: str) -> list[int]:
        ids: list[int] = []
        cache = self._cache
        for piece in _PIECES.findall(text):
            piece_ids = cache.get(piece)
            if piece_ids is None:  # text repeats its words: each is merged once
                piece_ids = cache[piece] = [self.vocab[t] for t in self._bpe(piece)]
            ids += piece_ids
        return ids

    def _bpe(self, piece: str) -> list[str]:
        """GPT-2's merge loop: apply the earliest-learned merge present, until none applies."""
        parts = [_BYTE_CHAR[b] for b in piece.encode("utf-8")]
        ranks, never = self._ranks, len(self._ranks)
        while len(parts) > 1:
            pair = min(pairwise(parts), key=lambda p: ranks.get(p, never))
            if pair not in ranks:
                break
            parts = _merge(parts, *pair)
        return parts

    def decode(self, ids: Any) -> str:
        """The text of a sequence of ids. Bytes that do not form UTF-8 (a sequence cut inside a
        character) become U+FFFD, as in GPT-2; an id outside the vocabulary is an error."""
        ids = np.asarray(ids)
        if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
            raise ValueError(
                f"BPETokenizer.decode: expected a 1-D integer sequence, got shape {ids.shape} "
                f"dtype {ids.dtype}"
            )
        try:
            data = b"".join([self._bytes[i] for i in ids.tolist()])
        except KeyError as exc:
            raise ValueError(
                f"BPETokenizer.decode: id {exc.args[0]} is not in the vocabulary "
                f"({len(self.vocab)} tokens, ids below {self.vocab_size})"
            ) from None
        return data.decode("utf-8", errors="replace")

    # --- GPT-2's files --------------------------------------------------------------------------

    def save(self, directory: str | Path) -> None:
        """Write vocab.json (token -> id, in id order) and merges.txt (a '#version: 0.2' line,
        then one 'left right' pair per line, earliest first): GPT-2's and Hugging Face's format."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        vocab = dict(sorted(self.vocab.items(), key=lambda item: item[1]))
        nn.save_text_atomic(
            directory / "vocab.json", json.dumps(vocab, indent=2, ensure_ascii=False) + "\n"
        )
        lines = [MERGES_HEADER] + [f"{a} {b}" for a, b in self.merges]
        nn.save_text_atomic(directory / "merges.txt", "\n".join(lines) + "\n")

    @classmethod
    def from_pretrained(cls, directory: str | Path) -> BPETokenizer:
        """Load vocab.json + merges.txt from a directory: one written by save, or GPT-2's own
        (a Hugging Face download of gpt2 has both beside config.json and model.safetensors)."""
        directory = Path(directory)
        vocab_path, merges_path = directory / "vocab.json", directory / "merges.txt"
        missing = [p.name for p in (vocab_path, merges_path) if not p.is_file()]
        if missing:
            raise FileNotFoundError(
                f"BPETokenizer.from_pretrained: {directory} has no {' and no '.join(missing)}"
            )
        vocab = _read_vocab(vocab_path)
        merges = _read_merges(merges_path, vocab)
        try:
            return cls(vocab, merges)
        except ValueError as exc:
            raise ValueError(f"{vocab_path}: {exc}") from None

    def __repr__(self) -> str:
        return f"BPETokenizer(vocab_size={self.vocab_size}, merges={len(self.merges)})"


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def _read_vocab(path: Path) -> dict[str, int]:
    try:
        vocab = json.loads(_read_text(path))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} line {exc.lineno}: not valid JSON ({exc.msg})") from None
    if not isinstance(vocab, dict):
        raise ValueError(f"{path}: expected a JSON object of token -> id")
    return vocab


def _read_merges(path: Path, vocab: dict[str, int]) -> list[tuple[str, str]]:
    """The merges of a merges.txt, each line checked against the vocabulary."""
    lines = _read_text(path).split("\n")
    if not lines[0].startswith("#version"):
        raise ValueError(f"{path} line 1: expected the header {MERGES_HEADER!r}, got {lines[0]!r}")
    if lines[-1] == "":
        lines.pop()  # the newline that ends the last line
    merges: dict[tuple[str, str], int] = {}  # pair -> line number
    for number, line in enumerate(lines[1:], start=2):
        pair = tuple(line.removesuffix("\r").split(" "))
        if len(pair) != 2 or not all(pair):
            raise ValueError(f"{path} line {number}: expected 'left right', got {line!r}")
        where = f"{path} line {number} ({line!r})"
        for token in (*pair, pair[0] + pair[1]):
            if token not in vocab:
                raise ValueError(f"{where}: {token!r} is not in vocab.json")
        if pair in merges:
            raise ValueError(f"{where}: repeats line {merges[pair]}")
        merges[pair] = number
    return list(merges)


# --- checkpoints ----------------------------------------------------------------------------------

Tokenizer = CharTokenizer | BPETokenizer
_FILES = {"char": ("tokenizer.json",), "bpe": ("vocab.json", "merges.txt")}


def save_tokenizer(tokenizer: Tokenizer, directory: str | Path) -> None:
    """Write the tokenizer's files into a checkpoint directory, and remove the other kind's: a
    run written over an older one must not leave a second tokenizer beside the new model."""
    directory = Path(directory)
    if isinstance(tokenizer, BPETokenizer):
        tokenizer.save(directory)
    else:
        tokenizer.save(directory / "tokenizer.json")
    for kind, names in _FILES.items():
        if kind != tokenizer.kind:
            for name in names:
                (directory / name).unlink(missing_ok=True)


def load_tokenizer(directory: str | Path) -> Tokenizer:
    """The tokenizer of a checkpoint or GPT-2 directory: vocab.json + merges.txt if present (a
    GPT-2 download also has a tokenizer.json of Hugging Face's, not ours), else tokenizer.json."""
    directory = Path(directory)
    if (directory / "vocab.json").is_file() or (directory / "merges.txt").is_file():
        return BPETokenizer.from_pretrained(directory)
    if (directory / "tokenizer.json").is_file():
        return CharTokenizer.load(directory / "tokenizer.json")
    raise FileNotFoundError(
        f"{directory} holds no tokenizer: neither vocab.json + merges.txt (BPE) nor "
        "tokenizer.json (characters)"
    )
