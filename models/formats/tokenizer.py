"""Tokenizers: one token per character (CharTokenizer) or byte-level BPE (BPETokenizer).

Tokens are indices, not meanings (notes 2.1): id 17 and id 18 are no closer in sense than 17 and 90.
A character vocabulary keeps the demo small and every token visible; the price is long sequences.
BPE (docs/tokenizer.md) starts from the 256 byte values and adds one token per learned merge of
the most frequent adjacent pair, so frequent words become single tokens and any text, in any
script, still has an encoding. BPETokenizer learns GPT-2's kind, reads GPT-2's vocab.json +
merges.txt, and reads Hugging Face's tokenizer.json for the byte-level BPE models since (Llama 3,
Qwen2, SmolLM2: their own split patterns, added tokens such as <|im_start|>), with the chat
template of tokenizer_config.json (models.formats.chat_template); also the SentencePiece-style BPE
over characters of Llama 2, TinyLlama and Mistral, and the tokenizer in a llama.cpp GGUF file's
metadata. Each gives the ids of Hugging Face's `tokenizers` on the same file. A checkpoint
directory holds one of them: the character `tokenizer.json`, GPT-2's two files or Hugging Face's
`tokenizer.json`; save_tokenizer / load_tokenizer pick the right files, so a sampler decodes
exactly the ids the model was trained on.
"""

from __future__ import annotations

import heapq
import json
import unicodedata
from collections import Counter, defaultdict
from collections.abc import Callable, Collection, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import regex

import nn
from models.formats import gguf, hub
from models.formats.errors import FileFormatError
from models.formats.hf import inside


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


# The merge loop above rescans the piece after each merge: quadratic in its length, fastest for
# the short pieces a split pattern makes. Without one (Llama 2's older files: the whole text is
# one piece), a piece longer than this goes to _merge_by_heap.
_LONG_PIECE = 64


def _merge_by_heap(parts: list[str], ranks: dict[tuple[str, str], int]) -> list[str]:
    """The same merges in O(n log n), as Hugging Face's Word.merge_all: a heap of (rank,
    position) over the adjacent pairs, the symbols a linked list; an entry whose pair changed
    since it was pushed is skipped. Lowest rank first, leftmost first among equals: GPT-2's
    order, as the loop merges every occurrence of one pair left to right before the next."""
    n = len(parts)
    symbols: list[str | None] = list(parts)
    after, before = list(range(1, n + 1)), list(range(-1, n - 1))  # n / -1: no neighbour
    heap = [(ranks[pair], i) for i, pair in enumerate(pairwise(parts)) if pair in ranks]
    heapq.heapify(heap)
    while heap:
        rank, i = heapq.heappop(heap)
        j = after[i]
        if symbols[i] is None or j == n or ranks.get((symbols[i], symbols[j])) != rank:
            continue  # stale: one side was merged away since this entry was pushed
        symbols[i], symbols[j] = symbols[i] + symbols[j], None
        after[i] = after[j]
        if after[i] < n:
            before[after[i]] = i
        for left in (before[i], i):  # the two new pairs around the merged symbol
            right = after[left] if left >= 0 else n
            if left >= 0 and right < n and (symbols[left], symbols[right]) in ranks:
                heapq.heappush(heap, (ranks[symbols[left], symbols[right]], left))
    return [symbol for symbol in symbols if symbol is not None]


@dataclass(frozen=True)
class AddedToken:
    """A token matched whole in the text before pre-tokenization, never split or merged.

    GPT-2 has one, <|endoftext|>; Hugging Face's files list more (Qwen2's <|im_start|>, Llama 3's
    <|eot_id|>, ...). `special` ones are dropped by decode(skip_special_tokens=True); `normalized`
    ones are looked for in the normalized text (after NFC), the others in the text as given.
    """

    content: str
    id: int
    special: bool = True
    normalized: bool = False


@dataclass(frozen=True)
class Metaspace:
    """SentencePiece's spaces, the pre-tokenizer of Llama 2, TinyLlama and Mistral's files: each
    space is written `replacement` ('▁'), one '▁' goes before the text unless it starts with one
    (prepend_scheme 'always'; 'first': only at the start of the whole text, not after an added
    token; 'never'), and with split each '▁' starts a new piece (else the text is one piece)."""

    prepend_scheme: str = "always"
    split: bool = False
    replacement: str = "▁"


class BPETokenizer:
    """Byte-level BPE: learn GPT-2's kind with train, or load GPT-2's or Hugging Face's files.

    Tokens are strings over GPT-2's byte alphabet (bytes_to_unicode): 'Ġthe' is the bytes of
    " the". vocab maps token -> id; merges lists the learned pairs, earliest (most frequent when
    learned) first. Added tokens (<|endoftext|> in GPT-2) have ids of their own and are never
    made by merges; encode emits them only where allowed_special asks for them.

    What a tokenizer.json adds (from_pretrained reads it): `pre_tokenizer`, the split patterns
    applied in turn (GPT-2's one by default; Llama 3 and Qwen2 have their own), the `normalizer`
    steps (NFC), `ignore_merges` (a piece that is a whole token is that token, as in Llama 3),
    and the ids a post-processor puts around the text (`bos` / `eos`, for add_special_tokens).

    Or, with byte_level=False, SentencePiece-style BPE over characters (Llama 2, TinyLlama,
    Mistral): tokens are text with '▁' for a space, spaces are handled by `metaspace` (or by
    the older files' normalizer steps ("Prepend", "▁") and ("Replace", " ", "▁")); a character
    the vocabulary lacks is its UTF-8 bytes as <0x..> tokens (byte_fallback), else unk_token.
    Decoding writes '▁' as a space, turns <0x..> tokens into bytes (decode_byte_tokens) and
    strips `strip` leading spaces of the text, as the file's decoder does.

    >>> tok = BPETokenizer.train("low lower lowest " * 20, vocab_size=262)
    >>> tok.merges  # ties: (l, o) before (o, w) at 60 pairs; (s, t) first at 20, as 's' < 'Ġ'
    [('l', 'o'), ('lo', 'w'), ('Ġ', 'low'), ('Ġlow', 'e'), ('s', 't')]
    >>> tok.encode(" lowest"), tok.eot_id
    ([259, 260], 261)
    >>> tok.decode([259, 260])
    ' lowest'
    """

    kind = "bpe"

    def __init__(
        self,
        vocab: dict[str, int],
        merges: Iterable[tuple[str, str]],
        *,
        added_tokens: Iterable[AddedToken] | None = None,
        pre_tokenizer: Iterable[str] = (GPT2_PATTERN,),
        normalizer: Iterable[tuple[str, ...]] = (),
        ignore_merges: bool = False,
        unk_token: str | None = None,
        fuse_unk: bool = False,
        bos: Iterable[int] = (),
        eos: Iterable[int] = (),
        byte_level: bool = True,
        metaspace: Metaspace | None = None,
        byte_fallback: bool = False,
        decode_byte_tokens: bool = True,
        strip: int = 0,
    ) -> None:
        """From a vocabulary and a merge list (train and from_pretrained make these; the
        latter checks each merge against the vocabulary, with where it came from). Without
        added_tokens, <|endoftext|> is the one added token if the vocabulary has it (GPT-2).

        The vocabulary need not hold all 256 byte tokens (a trainer keeps the bytes its corpus
        had; 0xC0, 0xC1 and 0xF5-0xFF never occur in UTF-8). A byte it lacks becomes unk_token
        (one for a run of them if fuse_unk), or, without one, is dropped, and the bytes on
        either side may merge across it: what Hugging Face's `tokenizers` does."""
        if added_tokens is None:
            added_tokens = [AddedToken(t, vocab[t]) for t in (END_OF_TEXT,) if t in vocab]
        self.added_tokens: dict[str, AddedToken] = {t.content: t for t in added_tokens}
        if unk_token is not None and unk_token not in vocab:
            raise ValueError(f"the unk token {unk_token!r} is not in the vocabulary")
        self.unk_token, self.fuse_unk = unk_token, fuse_unk
        # no symbol is ever unknown (byte-level, all 256 bytes); characters may always be
        self._complete = byte_level and all(t in vocab for t in _BYTE_TOKENS)
        bad = {t: i for t, i in vocab.items() if type(i) is not int or i < 0}
        if bad:
            raise ValueError(f"ids must be non-negative integers: {list(bad.items())[:5]}")
        self.normalizer: tuple[tuple[str, ...], ...] = tuple(tuple(n) for n in normalizer)
        unknown = [n for n in self.normalizer if n[0] not in _NORMALIZERS]
        if unknown:
            raise ValueError(f"unsupported normalizer step(s) {unknown} (of {list(_NORMALIZERS)})")
        if metaspace is not None and metaspace.prepend_scheme not in ("always", "first", "never"):
            raise ValueError(f"unsupported prepend_scheme {metaspace.prepend_scheme!r}")
        self.vocab: dict[str, int] = dict(vocab)
        self.merges: list[tuple[str, str]] = [tuple(m) for m in merges]
        self.pre_tokenizer: tuple[str, ...] = tuple(pre_tokenizer)
        self.ignore_merges = ignore_merges
        self.bos, self.eos = list(bos), list(eos)
        self.byte_level, self.metaspace, self.byte_fallback = byte_level, metaspace, byte_fallback
        self.decode_byte_tokens, self.strip = decode_byte_tokens, strip
        self._ranks = {pair: rank for rank, pair in enumerate(self.merges)}
        self._patterns = [regex.compile(p) for p in self.pre_tokenizer]
        self._bytes: dict[int, bytes] = {}  # id -> the bytes it decodes to
        self._byte_ids: set[int] = set()  # <0x..> tokens, decoded as runs of bytes
        for token, i in self.vocab.items():
            if i in self._bytes:
                raise ValueError(f"id {i} is given to two tokens, one of them {token!r}")
            if (
                byte_level
                and token not in self.added_tokens
                and any(c not in _CHAR_BYTE for c in token)
            ):
                raise ValueError(f"token {token!r} (id {i}) is not over GPT-2's byte alphabet")
            self._bytes[i] = self._token_bytes(token)
            if not byte_level and decode_byte_tokens and _BYTE_TOKEN.fullmatch(token):
                self._byte_ids.add(i)
        for added in self.added_tokens.values():  # beside the vocabulary, or in it (SmolLM2)
            written = self._token_bytes(added.content)
            if self._bytes.setdefault(added.id, written) != written:
                raise ValueError(
                    f"added token {added.content!r} has id {added.id}, which is another token's"
                )
        self._vocab_size = max(self._bytes) + 1
        self._cache: dict[str, list[int]] = {}  # pre-tokenized piece -> its ids
        # What tokenizer_config.json gives the chat template: its text and the special tokens'
        # names it may use (bos_token, eos_token, ...); from_pretrained fills them in.
        self.chat_template: str | None = None
        self.template_tokens: dict[str, str] = {}
        self.chat_template_source: tuple[str, str | None] = ("chat template", None)  # file, field
        self._hf_files: dict[str, str] = {}  # Hugging Face's files as read: name -> text

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
        added = self.added_tokens.get(END_OF_TEXT)
        return added.id if added else None

    @property
    def special_tokens(self) -> dict[str, int]:
        """The added tokens marked special (skip_special_tokens drops them): name -> id."""
        return {t.content: t.id for t in self.added_tokens.values() if t.special}

    def encode(
        self,
        text: str,
        allowed_special: Collection[str] | str = (),
        add_special_tokens: bool = False,
    ) -> list[int]:
        """Token ids of text.

        Added-token text such as "<|endoftext|>" is ordinary text by default (encoded as the
        bytes it is made of, like tiktoken's encode_ordinary), so text from a file or a user can
        never inject a control token. Name the tokens to recognise in allowed_special (a
        collection of names, or "all"): encode("a<|endoftext|>b", allowed_special="all") gives
        the ids of "a", the one id of <|endoftext|>, then those of "b". Hugging Face's
        `tokenizers` recognises every added token: its encode(text, add_special_tokens=False)
        is encode(text, allowed_special="all") here. add_special_tokens=True puts the ids of the
        file's post-processor around the text (Llama 3's <|begin_of_text|> before it).
        """
        if allowed_special == "all":
            allowed = set(self.added_tokens)
        else:
            allowed = (
                {allowed_special} if isinstance(allowed_special, str) else set(allowed_special)
            )
        unknown = allowed - set(self.added_tokens)
        if unknown:
            names = sorted(self.added_tokens)
            more = f" and {len(names) - 8} more" if len(names) > 8 else ""
            raise ValueError(
                f"BPETokenizer.encode: unknown special token(s) {sorted(unknown)}; this "
                f"vocabulary has {names[:8]}{more}"
            )
        raw = [t for t in allowed if not self.added_tokens[t].normalized]
        normalized = [t for t in allowed if self.added_tokens[t].normalized]
        ids = list(self.bos) if add_special_tokens else []
        # Hugging Face's order: the added tokens found in the text as given, the normalizer on
        # the rest, then the added tokens that are looked for in normalized text.
        at_start = True  # the part begins the text (Metaspace's prepend_scheme 'first')
        for part, is_added in _split_on(raw, text):
            if is_added:
                ids.append(self.added_tokens[part].id)
            else:
                for piece, is_added in _split_on(normalized, self._normalize(part)):
                    if is_added:
                        ids.append(self.added_tokens[piece].id)
                    else:
                        ids += self._encode_ordinary(piece, at_start)
                    at_start = False
            at_start = False
        return ids + list(self.eos) if add_special_tokens else ids

    def _normalize(self, text: str) -> str:
        for step in self.normalizer:
            text = _NORMALIZERS[step[0]](text, *step[1:])
        return text

    def _encode_ordinary(self, text: str, at_start: bool = True) -> list[int]:
        ids: list[int] = []
        cache = self._cache
        pieces = self._pre_tokenize(text) if self.byte_level else self._metaspace(text, at_start)
        for piece in pieces:
            piece_ids = cache.get(piece)
            if piece_ids is None:  # text repeats its words: each is merged once
                piece_ids = cache[piece] = [self.vocab[t] for t in self._bpe(piece)]
            ids += piece_ids
        return ids

    def _pre_tokenize(self, text: str) -> list[str]:
        """Cut text by each pattern in turn: every match is a piece, and so is each stretch
        between two matches (Hugging Face's "Isolated" split; GPT-2's pattern leaves none)."""
        pieces = [text] if text else []
        for pattern in self._patterns:
            pieces = [cut for piece in pieces for cut in _isolated(pattern, piece)]
        return pieces

    def _metaspace(self, text: str, at_start: bool) -> list[str]:
        """SentencePiece's pieces: spaces as '▁', the prefix, the split (Metaspace)."""
        meta = self.metaspace
        if meta is None or not text:
            return [text] if text else []
        text = text.replace(" ", meta.replacement)
        prepend = meta.prepend_scheme == "always" or (meta.prepend_scheme == "first" and at_start)
        if prepend and not text.startswith(meta.replacement):
            text = meta.replacement + text
        if not meta.split:
            return [text]
        return [p for p in regex.split(f"(?={regex.escape(meta.replacement)})", text) if p]

    def _bpe(self, piece: str) -> list[str]:
        """GPT-2's merge loop: apply the earliest-learned merge present, until none applies."""
        parts = [_BYTE_CHAR[b] for b in piece.encode("utf-8")] if self.byte_level else list(piece)
        if self.ignore_merges and "".join(parts) in self.vocab:
            return ["".join(parts)]  # Llama 3: a piece that is a token is taken whole
        if not self._complete:
            parts = self._known(parts)
        if len(parts) > _LONG_PIECE:  # a whole text, in SentencePiece's older files
            return _merge_by_heap(parts, self._ranks)
        ranks, never = self._ranks, len(self._ranks)
        while len(parts) > 1:
            pair = min(pairwise(parts), key=lambda p: ranks.get(p, never))
            if pair not in ranks:
                break
            parts = _merge(parts, *pair)
        return parts

    def _known(self, symbols: list[str]) -> list[str]:
        """symbols with each one the vocabulary lacks replaced, as Hugging Face's BPE.merge_word
        does: by its UTF-8 bytes as <0x..> tokens (byte_fallback, when the vocabulary has them
        all), else by the unk token (a run of them by one if fuse_unk), else dropped. As there,
        the unk token waits for the next known symbol: byte tokens between two unknown ones go
        before it, and fuse_unk fuses across them ('🙂q🙂' is <0x71> <unk>)."""
        out: list[str] = []
        vocab, unk = self.vocab, self.unk_token
        waiting = False  # an unk token not written yet
        for symbol in symbols:
            if symbol in vocab:
                if waiting:
                    out.append(unk)
                    waiting = False
                out.append(symbol)
                continue
            if self.byte_fallback:
                byte_tokens = [f"<0x{b:02X}>" for b in symbol.encode("utf-8")]
                if all(t in vocab for t in byte_tokens):
                    out += byte_tokens
                    continue
            if unk is not None:
                if waiting and not self.fuse_unk:
                    out.append(unk)
                waiting = True
        if waiting:
            out.append(unk)
        return out

    def decode(self, ids: Any, skip_special_tokens: bool = False) -> str:
        """The text of a sequence of ids. Bytes that do not form UTF-8 (a sequence cut inside a
        character) become U+FFFD, as in GPT-2; an id outside the vocabulary is an error.
        skip_special_tokens drops the added tokens marked special, as Hugging Face's does."""
        if self.byte_level:
            return self.decode_bytes(ids, skip_special_tokens).decode("utf-8", errors="replace")
        # Hugging Face's ByteFallback decoder: a run of <0x..> tokens that is not UTF-8 is one
        # U+FFFD per token; then the decoder's Strip takes leading spaces off the whole text.
        parts, run = [], []
        for i in [*self._check_ids(ids, skip_special_tokens), None]:
            if i in self._byte_ids:
                run.append(self._bytes[i])
                continue
            if run:
                try:
                    parts.append(b"".join(run).decode("utf-8"))
                except UnicodeDecodeError:
                    parts.append("\ufffd" * len(run))
                run = []
            if i is not None:
                parts.append(self._bytes[i].decode("utf-8", errors="replace"))
        text = "".join(parts)
        stripped = len(text) - len(text.lstrip(" "))
        return text[min(stripped, self.strip) :]

    def decode_bytes(self, ids: Any, skip_special_tokens: bool = False) -> bytes:
        """The bytes of a sequence of ids, before UTF-8 decoding. A streamer that prints tokens
        as they are sampled feeds these to an incremental UTF-8 decoder, so that a character
        cut across tokens (an emoji is often two to four) is printed once, whole."""
        return b"".join([self._bytes[i] for i in self._check_ids(ids, skip_special_tokens)])

    def _check_ids(self, ids: Any, skip_special_tokens: bool) -> list[int]:
        """ids as a list of ints, each in the vocabulary, less the special ones if asked."""
        ids = np.asarray(ids)
        if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
            raise ValueError(
                f"BPETokenizer.decode: expected a 1-D integer sequence, got shape {ids.shape} "
                f"dtype {ids.dtype}"
            )
        ids = ids.tolist()
        unknown = [i for i in ids if i not in self._bytes]
        if unknown:
            raise ValueError(
                f"BPETokenizer.decode: id {unknown[0]} is not in the vocabulary "
                f"({len(self._bytes)} tokens, ids below {self.vocab_size})"
            )
        if skip_special_tokens:
            skip = set(self.special_tokens.values())
            ids = [i for i in ids if i not in skip]
        return ids

    def _token_bytes(self, token: str) -> bytes:
        """The bytes a token decodes to: byte-level, through GPT-2's byte alphabet (_token_bytes);
        SentencePiece-style, its text with '▁' as a space, or the byte of a <0x..> token."""
        if self.byte_level:
            return _token_bytes(token)
        if self.decode_byte_tokens and _BYTE_TOKEN.fullmatch(token):
            return bytes([int(token[3:5], 16)])
        replacement = self.metaspace.replacement if self.metaspace else "▁"
        return token.replace(replacement, " ").encode("utf-8")

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = False,
        tokenize: bool = True,
        chat_template: str | None = None,
        **variables: Any,
    ) -> list[int] | str:
        """A conversation as the model was trained to read it, rendered as Hugging Face does.

        messages: [{"role": "system" | "user" | "assistant", "content": str}, ...].
        add_generation_prompt ends the text with the header of the assistant's turn, so that the
        model writes the reply next. The template is tokenizer_config.json's (or chat_template);
        it sees messages, add_generation_prompt, the special tokens' names (bos_token,
        eos_token, ...) and any further keyword (tools=[...], date_string="26 Jul 2024").
        Returns the ids (the text encoded with every added token recognised and nothing put
        around it: the template writes its own <|begin_of_text|>), or the text if not tokenize.
        """
        template = chat_template or self.chat_template
        if template is None:
            raise ValueError(
                "BPETokenizer.apply_chat_template: this tokenizer has no chat template (none in "
                "tokenizer_config.json or chat_template.jinja); pass chat_template="
            )
        # here, not at the top: jinja2 (~2 MB, ~14 ms) is loaded only by a process that chats
        from models.formats.chat_template import render_chat_template

        text = render_chat_template(
            template,
            messages,
            add_generation_prompt=add_generation_prompt,
            template_source=None if chat_template else self.chat_template_source,
            **{**self.template_tokens, **variables},
        )
        return self.encode(text, allowed_special="all") if tokenize else text

    # --- files: GPT-2's vocab.json + merges.txt, or Hugging Face's tokenizer.json ---------------

    @property
    def file_names(self) -> list[str]:
        """The files save writes: GPT-2's two, or the Hugging Face files it was read from."""
        return list(self._hf_files) or ["vocab.json", "merges.txt"]

    def save(self, directory: str | Path) -> None:
        """Write the tokenizer's files (file_names) into directory.

        A tokenizer learned here or read from GPT-2's files: vocab.json (token -> id, in id
        order) and merges.txt (a '#version: 0.2' line, then one 'left right' pair per line,
        earliest first), GPT-2's and Hugging Face's format. One read from Hugging Face's
        tokenizer.json: that file and tokenizer_config.json (and chat_template.jinja) as read.
        """
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        if self._hf_files:
            for name, text in self._hf_files.items():
                nn.save_text_atomic(directory / name, text)
            return
        vocab = dict(sorted(self.vocab.items(), key=lambda item: item[1]))
        nn.save_text_atomic(
            directory / "vocab.json", json.dumps(vocab, indent=2, ensure_ascii=False) + "\n"
        )
        lines = [MERGES_HEADER] + [f"{a} {b}" for a, b in self.merges]
        nn.save_text_atomic(directory / "merges.txt", "\n".join(lines) + "\n")

    @classmethod
    def from_pretrained(cls, directory: str | Path, revision: str | None = None) -> BPETokenizer:
        """Load a tokenizer directory: Hugging Face's tokenizer.json (+ tokenizer_config.json,
        for the chat template) if it has one, else GPT-2's vocab.json + merges.txt (a directory
        written by save, or GPT-2's own: a download of gpt2 has all three, which agree). Or a
        llama.cpp .gguf file: the tokenizer and chat template of its metadata. A hub name
        ("org/name", at `revision`) that is not a local path is fetched (models.formats.hub)."""
        directory = _tokenizer_path(directory, revision)
        if directory.suffix == ".gguf" and not directory.is_dir():
            return _read_gguf_tokenizer(directory)
        data = _read_tokenizer_json(directory)
        if data is not None and not isinstance(data, dict):
            path = directory / "tokenizer.json"
            raise FileFormatError(path, None, "must hold a JSON object", type(data).__name__)
        if _is_hf(data):
            return _read_hf_tokenizer(directory, data)
        vocab_path, merges_path = directory / "vocab.json", directory / "merges.txt"
        missing = [p.name for p in (vocab_path, merges_path) if not p.is_file()]
        if len(missing) == 2:
            raise FileNotFoundError(
                f"BPETokenizer.from_pretrained: {directory} has no tokenizer.json (Hugging "
                "Face's) and no vocab.json + merges.txt (GPT-2's)"
            )
        if missing:
            raise FileNotFoundError(
                f"BPETokenizer.from_pretrained: {directory} has no {missing[0]}"
            )
        vocab = _read_vocab(vocab_path)
        merges = _read_merges(merges_path, vocab)
        try:
            return cls(vocab, merges)
        except ValueError as exc:
            raise FileFormatError(vocab_path, None, str(exc)) from None

    def __repr__(self) -> str:
        return (
            f"BPETokenizer(vocab_size={self.vocab_size}, merges={len(self.merges)}, "
            f"added_tokens={len(self.added_tokens)})"
        )


def _token_bytes(token: str) -> bytes:
    """The bytes a token stands for: each character through GPT-2's byte alphabet, or, for an
    added token with a character outside it, its UTF-8 (Hugging Face's ByteLevel decoder)."""
    if all(c in _CHAR_BYTE for c in token):
        return bytes(_CHAR_BYTE[c] for c in token)
    return token.encode("utf-8")


_BYTE_TOKEN = regex.compile(r"<0x[0-9A-Fa-f]{2}>")  # byte_fallback's tokens: <0x00> ... <0xFF>

# Hugging Face's normalizers that glassgrad runs: name -> (text, *arguments) -> text
_NORMALIZERS: dict[str, Callable[..., str]] = {
    "NFC": lambda text: unicodedata.normalize("NFC", text),
    "Prepend": lambda text, prefix: prefix + text if text else text,
    "Replace": lambda text, old, new: text.replace(old, new),
}


def _split_on(names: Collection[str], text: str) -> list[tuple[str, bool]]:
    """text cut at each occurrence of the added tokens `names`: (part, is it one of them).
    The longest name wins where several start at one place (Hugging Face's leftmost-longest)."""
    if not names:
        return [(text, False)]
    alternatives = "|".join(regex.escape(t) for t in sorted(names, key=len, reverse=True))
    parts = regex.split(f"({alternatives})", text)  # the capturing group keeps the names
    return [(part, i % 2 == 1) for i, part in enumerate(parts) if part or i % 2]


def _isolated(pattern: regex.Pattern, text: str) -> list[str]:
    """Each match of pattern in text, and each non-empty stretch between matches, in order."""
    if not pattern.groups:  # findall is faster, and enough when the matches tile the text
        pieces = pattern.findall(text)
        if sum(map(len, pieces)) == len(text):
            return pieces
    pieces, end = [], 0
    for match in pattern.finditer(text):
        if match.start() > end:
            pieces.append(text[end : match.start()])
        if match.end() > match.start():
            pieces.append(match.group())
        end = match.end()
    if end < len(text):
        pieces.append(text[end:])
    return pieces


def _read_text(path: Path) -> str:
    inside(path.parent, path, path, None)  # a link out of the directory is not followed
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        problem = f"not UTF-8 text ({exc.reason} at byte {exc.start})"
        raise FileFormatError(path, None, problem) from None


def _read_json(path: Path) -> Any:
    try:
        return json.loads(_read_text(path))
    except json.JSONDecodeError as exc:
        raise FileFormatError(path, f"line {exc.lineno}", f"not valid JSON ({exc.msg})") from None


def _read_vocab(path: Path) -> dict[str, int]:
    vocab = _read_json(path)
    if not isinstance(vocab, dict):
        raise FileFormatError(path, None, "expected a JSON object of token -> id")
    return vocab


def _read_merges(path: Path, vocab: dict[str, int]) -> list[tuple[str, str]]:
    """The merges of a merges.txt, each line checked against the vocabulary."""
    lines = _read_text(path).split("\n")
    if not lines[0].startswith("#version"):
        raise FileFormatError(path, "line 1", f"expected the header {MERGES_HEADER!r}", lines[0])
    if lines[-1] == "":
        lines.pop()  # the newline that ends the last line
    merges: dict[tuple[str, str], int] = {}  # pair -> line number
    for number, line in enumerate(lines[1:], start=2):
        pair = tuple(line.removesuffix("\r").split(" "))
        if len(pair) != 2 or not all(pair):
            raise FileFormatError(path, f"line {number}", "expected 'left right'", line)
        where = f"line {number} ({line!r})"
        for token in (*pair, pair[0] + pair[1]):
            if token not in vocab:
                raise FileFormatError(path, where, f"{token!r} is not in vocab.json")
        if pair in merges:
            raise FileFormatError(path, where, f"repeats line {merges[pair]}")
        merges[pair] = number
    return list(merges)


# --- Hugging Face's tokenizer.json ----------------------------------------------------------------
# One JSON file for the whole pipeline: added tokens, normalizer, pre-tokenizer, the BPE model
# (vocab + merges), post-processor, decoder. Read here: the byte-level BPE pipelines of GPT-2,
# Llama 3, Qwen2 and SmolLM2; any other setting is refused by name rather than run differently.

_SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                        "cls_token", "mask_token")  # fmt: skip


def _read_tokenizer_json(directory: Path) -> Any:
    """directory/tokenizer.json parsed, or None if there is none: Hugging Face's (a dict with a
    "model") or the character tokenizer's."""
    path = directory / "tokenizer.json"
    return _read_json(path) if path.is_file() else None


def _is_hf(data: Any) -> bool:
    return isinstance(data, dict) and "model" in data


def _read_hf_tokenizer(directory: Path, data: dict[str, Any]) -> BPETokenizer:
    """A BPETokenizer from directory/tokenizer.json (parsed: data), with tokenizer_config.json's
    chat template and special-token names (or chat_template.jinja's template, kept apart in
    newer downloads)."""
    path = directory / "tokenizer.json"
    tok = _hf_tokenizer(path, data)
    tok._hf_files["tokenizer.json"] = _read_text(path)
    config_path = directory / "tokenizer_config.json"
    if config_path.is_file():
        tok._hf_files[config_path.name] = _read_text(config_path)
        _configure(tok, _read_json(config_path), config_path)
    jinja_path = directory / "chat_template.jinja"
    if jinja_path.is_file():  # newer files keep the template apart; it wins, as in transformers
        tok.chat_template = tok._hf_files[jinja_path.name] = _read_text(jinja_path)
        tok.chat_template_source = (str(jinja_path), None)
    return tok


def _configure(
    tok: BPETokenizer, config: Any, path: Path, template_field: str = "chat_template"
) -> None:
    """The chat template of a tokenizer_config.json (path; a string, or named templates
    [{"name": ..., "template": ...}] of which "default" is used) and its special tokens' names
    (bos_token: a string, or {"content": ...}), each checked: else a FileFormatError."""
    if not isinstance(config, dict):
        raise FileFormatError(path, None, "must hold a JSON object", type(config).__name__)
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates
        named = {}
        for i, entry in enumerate(template):
            if not (
                isinstance(entry, dict)
                and isinstance(entry.get("name"), str)
                and isinstance(entry.get("template"), str)
            ):
                expected = 'must be {"name": str, "template": str}'
                raise FileFormatError(path, f"{template_field}[{i}]", expected, entry)
            named[entry["name"]] = entry["template"]
        template = named.get("default")
    elif template is not None and not isinstance(template, str):
        problem = "must be a string (a Jinja template)"
        raise FileFormatError(path, template_field, problem, template)
    tok.chat_template, tok.chat_template_source = template, (str(path), template_field)
    for name in _SPECIAL_TOKEN_NAMES:
        value = config.get(name)
        value = value.get("content") if isinstance(value, dict) else value
        if value is not None and not isinstance(value, str):
            raise FileFormatError(path, name, 'must be a string or {"content": str}', config[name])
        if value is not None:
            tok.template_tokens[name] = value


def _hf_tokenizer(path: Path, data: dict[str, Any]) -> BPETokenizer:
    """A BPETokenizer from the parsed tokenizer.json `data` (path: where it came from)."""

    def refuse(field: str, value: Any, supported: str) -> FileFormatError:
        return FileFormatError(
            path, None, f"{field} = {json.dumps(value)[:120]} is not supported ({supported})"
        )

    _check_tokenizer_json(data, path)
    model = data["model"]
    if model.get("type") != "BPE":
        raise refuse("model.type", model.get("type"), "'BPE' only")
    for field, allowed in [
        ("dropout", (None, 0, 0.0)),
        ("continuing_subword_prefix", (None, "")),
        ("end_of_word_suffix", (None, "")),
    ]:
        if model.get(field) not in allowed:
            raise refuse(f"model.{field}", model[field], f"only {allowed[0]!r}")
    vocab = model.get("vocab")
    if not isinstance(vocab, dict):
        raise FileFormatError(path, None, "model.vocab must be an object of token -> id")
    merges = []
    for i, merge in enumerate(model.get("merges", [])):
        pair = tuple(merge.split(" ")) if isinstance(merge, str) else tuple(merge)
        if len(pair) != 2 or not all(isinstance(p, str) and p for p in pair):
            problem = f"model.merges[{i}] = {merge!r} is not a pair of tokens"
            raise FileFormatError(path, None, problem)
        for token in (*pair, pair[0] + pair[1]):
            if token not in vocab:
                problem = f"model.merges[{i}] {merge!r}: {token!r} is not in the vocab"
                raise FileFormatError(path, None, problem)
        merges.append(pair)
    added = []
    for i, entry in enumerate(data.get("added_tokens") or []):
        if not isinstance(entry.get("content"), str) or type(entry.get("id")) is not int:
            problem = f"added_tokens[{i}] needs a string content and an int id"
            raise FileFormatError(path, None, problem)
        for flag in ("single_word", "lstrip", "rstrip"):
            if entry.get(flag):
                raise refuse(f"added_tokens[{i}].{flag} ({entry['content']!r})", True, "false only")
        special = bool(entry.get("special"))
        added.append(
            AddedToken(entry["content"], entry["id"], special, entry.get("normalized", not special))
        )
    with _malformed(path, "normalizer"):
        normalizer = _hf_normalizer(data.get("normalizer"), refuse)
    # Byte-level (a ByteLevel decoder) or SentencePiece-style (over characters)
    with _malformed(path, "pre_tokenizer"):
        if (data.get("decoder") or {}).get("type") == "ByteLevel":
            pipeline = {"pre_tokenizer": _hf_pre_tokenizer(data.get("pre_tokenizer"), refuse)}
        else:
            pipeline = _hf_sentencepiece(data.get("pre_tokenizer"), data.get("decoder"), refuse)
    with _malformed(path, "post_processor"):
        bos, eos = _hf_post_processor(data.get("post_processor"), refuse)
    try:
        tok = BPETokenizer(
            vocab,
            merges,
            added_tokens=added,
            normalizer=normalizer,
            ignore_merges=bool(model.get("ignore_merges")),
            unk_token=model.get("unk_token"),
            fuse_unk=bool(model.get("fuse_unk")),
            byte_fallback=bool(model.get("byte_fallback")),
            bos=bos,
            eos=eos,
            **pipeline,
        )
    except ValueError as exc:
        raise FileFormatError(path, None, str(exc)) from None
    return tok


@contextmanager
def _malformed(path: Path, field: str) -> Iterator[None]:
    """A part of tokenizer.json whose shape the reader's own checks did not foresee (a missing
    key, a list for an object) is refused as malformed, naming the file and the part."""
    try:
        yield
    except (KeyError, IndexError, TypeError, AttributeError) as exc:
        problem = f"is malformed ({type(exc).__name__}: {exc})"
        raise FileFormatError(path, field, problem) from None


def _check_tokenizer_json(data: dict[str, Any], path: Path) -> None:
    """tokenizer.json's structure, checked before anything is built from it: each part the
    type Hugging Face's tokenizers requires, with what it refuses refused here too (merges that
    are not a list, an added token with empty content or a negative id, an invalid regex)."""

    def bad(field: str, problem: str, value: Any) -> FileFormatError:
        return FileFormatError(path, field, problem, value)

    model = data.get("model")
    if not isinstance(model, dict):
        raise bad("model", "must be an object", model)
    vocab = model.get("vocab")
    for token, i in vocab.items() if isinstance(vocab, dict) else ():
        if type(i) is int and i >= 2**32:  # (the tokenizer refuses other non-ids itself)
            raise bad(f"model.vocab[{token!r}]", "must be an id below 2**32", i)
    merges = model.get("merges", [])
    if not isinstance(merges, list):
        raise bad("model.merges", "must be a list", merges)
    for i, merge in enumerate(merges):
        if not isinstance(merge, (str, list)):
            raise bad(f"model.merges[{i}]", 'must be "left right" or [left, right]', merge)
    for key in ("ignore_merges", "fuse_unk"):
        if model.get(key) is not None and type(model[key]) is not bool:
            raise bad(f"model.{key}", "must be true or false", model[key])
    if model.get("unk_token") is not None and not isinstance(model["unk_token"], str):
        raise bad("model.unk_token", "must be a string", model["unk_token"])
    added = data.get("added_tokens") or []
    if not isinstance(added, list):
        raise bad("added_tokens", "must be a list", added)
    for i, entry in enumerate(added):
        if not isinstance(entry, dict):
            raise bad(f"added_tokens[{i}]", "must be an object", entry)
        if entry.get("content") == "":
            raise bad(f"added_tokens[{i}].content", "must not be empty", "")
        if type(entry.get("id")) is int and not 0 <= entry["id"] < 2**32:
            raise bad(f"added_tokens[{i}].id", "must be an id in [0, 2**32)", entry["id"])
        for flag in ("special", "normalized", "single_word", "lstrip", "rstrip"):
            if entry.get(flag) is not None and type(entry[flag]) is not bool:
                raise bad(f"added_tokens[{i}].{flag}", "must be true or false", entry[flag])
    for key in ("normalizer", "pre_tokenizer", "decoder"):
        if data.get(key) is not None and not isinstance(data[key], dict):
            raise bad(key, "must be an object or null", data[key])
    normalizer = data.get("normalizer") or {}
    steps = normalizer.get("normalizers", [normalizer])
    if not isinstance(steps, list) or not all(isinstance(n, dict) for n in steps):
        raise bad("normalizer.normalizers", "must be a list of objects", steps)
    spec = data.get("pre_tokenizer")
    sequence = isinstance(spec, dict) and spec.get("type") == "Sequence"
    steps = spec.get("pretokenizers", []) if sequence else [spec]
    if not isinstance(steps, list):
        raise bad("pre_tokenizer.pretokenizers", "must be a list", steps)
    for i, step in enumerate(steps):
        if not isinstance(step, dict) or step.get("type") != "Split":
            continue  # (the reader refuses what it does not know by name)
        pattern = step.get("pattern")
        where = f"pre_tokenizer.pretokenizers[{i}].pattern"
        if not isinstance(pattern, dict) or not any(
            isinstance(pattern.get(k), str) for k in ("Regex", "String")
        ):
            raise bad(where, 'must be {"Regex": str} or {"String": str}', pattern)
        if isinstance(pattern.get("Regex"), str):
            try:
                regex.compile(pattern["Regex"])
            except regex.error as exc:
                problem = f"is not a valid regex ({exc})"
                raise bad(f"{where}.Regex", problem, pattern["Regex"]) from None


def _hf_normalizer(spec: Any, refuse: Callable[..., ValueError]) -> list[tuple[str, ...]]:
    """A normalizer's steps: NFC, and the Prepend + Replace of older SentencePiece-style files
    (Llama 2, Mistral v0.1: Prepend '▁', Replace ' ' with '▁')."""
    if spec is None:
        return []
    steps = spec.get("normalizers", []) if spec.get("type") == "Sequence" else [spec]
    out: list[tuple[str, ...]] = []
    for step in steps:
        kind = step.get("type") if isinstance(step, dict) else None
        if kind == "NFC":
            out.append(("NFC",))
        elif kind == "Prepend" and isinstance(step.get("prepend"), str):
            out.append(("Prepend", step["prepend"]))
        elif kind == "Replace" and isinstance(step.get("pattern", {}).get("String"), str):
            out.append(("Replace", step["pattern"]["String"], step["content"]))
        else:
            raise refuse("normalizer", spec, "NFC, Prepend, Replace of a String")
    return out


def _hf_sentencepiece(
    pre_tokenizer: Any, decoder: Any, refuse: Callable[..., ValueError]
) -> dict[str, Any]:
    """The settings of a SentencePiece-style pipeline: no pre-tokenizer (the older files, whose
    normalizer writes the '▁') or a Metaspace one, and a decoder that is Metaspace or a
    Sequence of Replace('▁', ' '), ByteFallback, Fuse and Strip(' ', n, 0) steps."""
    kind = (decoder or {}).get("type")
    if kind == "Metaspace":  # no ByteFallback: a <0x..> token decodes to its own text
        scheme = decoder.get("prepend_scheme") or (
            "always" if decoder.get("add_prefix_space", True) else "never"
        )
        byte_tokens, strip = False, int(scheme != "never")
    else:
        steps = decoder.get("decoders", []) if kind == "Sequence" else [None]
        names = [step.get("type") if isinstance(step, dict) else None for step in steps]
        byte_tokens, strip = "ByteFallback" in names, 0
        for step, name in zip(steps, names, strict=True):
            if name == "Replace" and step.get("pattern") == {"String": "▁"}:
                if step.get("content") == " ":
                    continue
            elif name == "Strip" and step.get("content") == " " and not step.get("stop"):
                strip = int(step.get("start", 0))
                continue
            elif name in ("ByteFallback", "Fuse"):
                continue
            supported = "ByteLevel, Metaspace, or Replace('▁', ' '), ByteFallback, Fuse, Strip"
            raise refuse("decoder", decoder, supported)
    return {
        "byte_level": False,
        "metaspace": _hf_metaspace(pre_tokenizer, refuse),
        "pre_tokenizer": (),
        "decode_byte_tokens": byte_tokens,
        "strip": strip,
    }


def _hf_metaspace(spec: Any, refuse: Callable[..., ValueError]) -> Metaspace | None:
    """A SentencePiece-style file's pre-tokenizer: none, or Metaspace."""
    if spec is None:
        return None
    if spec.get("type") != "Metaspace":
        raise refuse("pre_tokenizer", spec, "Metaspace or none with this decoder")
    scheme = spec.get("prepend_scheme")
    if scheme is None:  # files from before prepend_scheme
        scheme = "always" if spec.get("add_prefix_space", True) else "never"
    return Metaspace(scheme, bool(spec.get("split", True)), spec.get("replacement", "▁"))


def _hf_pre_tokenizer(spec: Any, refuse: Callable[..., ValueError]) -> list[str]:
    """The split patterns of a pre_tokenizer, applied in turn: its Split and Digits steps, then
    a ByteLevel step, which must come last (it maps bytes to characters; with use_regex it
    first splits by GPT-2's pattern)."""
    single = not (isinstance(spec, dict) and spec.get("type") == "Sequence")
    steps = [spec] if single else spec.get("pretokenizers", [])
    patterns = []
    for i, step in enumerate(steps):
        kind = step.get("type") if isinstance(step, dict) else None
        if kind == "ByteLevel" and i == len(steps) - 1:
            if step.get("add_prefix_space"):
                raise refuse("pre_tokenizer ByteLevel.add_prefix_space", True, "false only")
            return patterns + [GPT2_PATTERN] if step.get("use_regex", True) else patterns
        if kind == "Split" and step.get("behavior") == "Isolated" and not step.get("invert"):
            pattern = step.get("pattern", {})
            patterns.append(
                pattern["Regex"] if "Regex" in pattern else regex.escape(pattern["String"])
            )
        elif kind == "Digits":  # each digit alone, or each run of digits
            patterns.append(r"\p{N}" if step.get("individual_digits") else r"\p{N}+")
        else:
            break
    raise refuse("pre_tokenizer", spec, "Split (Isolated) and Digits steps, then ByteLevel last")


def _hf_post_processor(spec: Any, refuse: Callable[..., ValueError]) -> tuple[list[int], list[int]]:
    """The ids a post_processor puts before and after one text (for add_special_tokens)."""
    if spec is None:
        return [], []
    if not isinstance(spec, dict):
        raise refuse("post_processor", spec, "an object")
    if spec.get("type") == "ByteLevel":  # ByteLevel only moves offsets
        return [], []
    if spec.get("type") == "Sequence":
        bos, eos = [], []
        for step in spec.get("processors", []):
            before, after = _hf_post_processor(step, refuse)
            bos, eos = bos + before, eos + after
        return bos, eos
    if spec.get("type") == "TemplateProcessing":
        single = spec.get("single", [])
        where = [i for i, item in enumerate(single) if "Sequence" in item]
        if len(where) != 1:
            raise refuse("post_processor.single", single, "one $A")
        ids = [
            spec["special_tokens"][item["SpecialToken"]["id"]]["ids"]
            if "SpecialToken" in item
            else []
            for item in single
        ]
        return sum(ids[: where[0]], []), sum(ids[where[0] + 1 :], [])
    raise refuse("post_processor.type", spec.get("type"), "ByteLevel, TemplateProcessing, Sequence")


# --- llama.cpp's GGUF files -----------------------------------------------------------------------
# A GGUF file describes its tokenizer in metadata (tokenizer.ggml.*): the tokens, their types, the
# merges, the special ids, and a pre-tokenizer by name, whose split patterns are llama.cpp's own
# (src/llama-vocab.cpp, llm_tokenizer_bpe). Read here: the byte-level BPE ("gpt2") files, turned
# into the tokenizer.json Hugging Face would write for them, so one reader parses both and save()
# writes files that transformers and from_pretrained read back.

# llama.cpp's GPT-2 pattern lacks the final |\s+ of GPT-2's, a difference that never shows: its
# splitter keeps the text between matches as pieces, as Hugging Face's "Isolated" split does.
_LLAMA_CPP_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA_CPP_LLAMA3 = (  # Llama 3's (?i:'s|...) spelled out, as llama.cpp has it
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|"
    r"\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_LLAMA_CPP_QWEN2 = _LLAMA_CPP_LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")

# tokenizer.ggml.pre -> (the split patterns, applied in turn; ignore_merges; add_bos by default)
GGUF_PRE_TOKENIZERS: dict[str, tuple[tuple[str, ...], bool, bool]] = {
    "default": (
        (r"[\p{P}\$\+<=>\^~\|]+", _LLAMA_CPP_GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"),
        False,
        False,
    ),
    **dict.fromkeys(["gpt-2", "phi-2"], ((_LLAMA_CPP_GPT2,), False, False)),
    **dict.fromkeys(["llama3", "llama-v3", "llama-bpe"], ((_LLAMA_CPP_LLAMA3,), True, True)),
    **dict.fromkeys(["qwen2", "deepseek-r1-qwen"], ((_LLAMA_CPP_QWEN2,), False, False)),
    # SmolLM2's: each digit alone, then GPT-2's pattern (transformers' GGUF reader drops the
    # digits; llama.cpp and SmolLM2's own tokenizer.json keep them)
    **dict.fromkeys(
        ["smollm", "starcoder", "refact", "codeshell"], ((r"\p{N}", _LLAMA_CPP_GPT2), False, False)
    ),
}
# tokenizer.ggml.token_type values (llama.cpp's llama_token_type)
_GGUF_CONTROL, _GGUF_USER_DEFINED = 3, 4


def _read_gguf_tokenizer(path: Path) -> BPETokenizer:
    """A BPETokenizer from a GGUF file's metadata, by way of the tokenizer.json and
    tokenizer_config.json it stands for (what save() then writes)."""
    data, config = _gguf_to_hf(path, gguf.read_metadata(path))
    tok = _hf_tokenizer(path, data)
    _configure(tok, config, path, "tokenizer.chat_template")
    tok._hf_files = {
        "tokenizer.json": json.dumps(data, ensure_ascii=False, indent=2) + "\n",
        "tokenizer_config.json": json.dumps(config, ensure_ascii=False, indent=2) + "\n",
    }
    return tok


def _gguf_to_hf(path: Path, meta: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """GGUF tokenizer metadata -> (tokenizer.json, tokenizer_config.json) as parsed dicts."""
    model = meta.get("tokenizer.ggml.model")
    if model != "gpt2":
        raise FileFormatError(
            path,
            "tokenizer.ggml.model",
            "is not supported: glassgrad reads byte-level BPE ('gpt2') from GGUF files, not "
            "'llama' (SentencePiece with scores) or others; transformers can convert the file "
            "to a directory (AutoTokenizer.from_pretrained(dir, gguf_file=...).save_pretrained)",
            model,
        )
    tokens = meta.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
        raise FileFormatError(path, "tokenizer.ggml.tokens", "must be a list of strings")
    types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    if len(types) != len(tokens):
        raise FileFormatError(
            path, "tokenizer.ggml.token_type", f"must have one entry per token ({len(tokens)})",
            len(types),
        )  # fmt: skip
    pre = meta.get("tokenizer.ggml.pre", "default")  # llama.cpp's default when the key is absent
    if pre not in GGUF_PRE_TOKENIZERS:
        raise FileFormatError(
            path, "tokenizer.ggml.pre",
            f"is a pre-tokenizer glassgrad does not know (it knows {sorted(GGUF_PRE_TOKENIZERS)})",
            pre,
        )  # fmt: skip
    patterns, ignore_merges, add_bos = GGUF_PRE_TOKENIZERS[pre]
    added = [
        {"id": i, "content": token, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": kind == _GGUF_CONTROL}
        for i, (token, kind) in enumerate(zip(tokens, types, strict=True))
        if kind in (_GGUF_CONTROL, _GGUF_USER_DEFINED)
    ]  # fmt: skip
    special = {name: meta.get(f"tokenizer.ggml.{key}_token_id")
               for name, key in [("bos_token", "bos"), ("eos_token", "eos"),
                                 ("unk_token", "unknown"), ("pad_token", "padding")]}  # fmt: skip
    for name, i in special.items():
        if i is not None and not 0 <= i < len(tokens):
            raise FileFormatError(path, f"tokenizer.ggml.{name}_id", "is not a token's id", i)
    add_bos = meta.get("tokenizer.ggml.add_bos_token", add_bos)
    add_eos = meta.get("tokenizer.ggml.add_eos_token", False)
    single = [{"Sequence": {"id": "A", "type_id": 0}}]
    ends: dict[str, Any] = {}
    for flag, name, where in [(add_bos, "bos_token", 0), (add_eos, "eos_token", len(single))]:
        if flag:
            if special[name] is None:
                raise FileFormatError(path, f"tokenizer.ggml.add_{name}", f"is set with no {name}")
            content = tokens[special[name]]
            single.insert(where, {"SpecialToken": {"id": content, "type_id": 0}})
            ends[content] = {"id": content, "ids": [special[name]], "tokens": [content]}
    data = {
        "version": "1.0",
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                *(
                    {
                        "type": "Split",
                        "pattern": {"Regex": p},
                        "behavior": "Isolated",
                        "invert": False,
                    }
                    for p in patterns
                ),
                {
                    "type": "ByteLevel",
                    "add_prefix_space": False,
                    "trim_offsets": False,
                    "use_regex": False,
                },
            ],
        },  # fmt: skip
        "post_processor": {
            "type": "TemplateProcessing",
            "single": single,
            "pair": single,
            "special_tokens": ends,
        },
        "decoder": {
            "type": "ByteLevel",
            "add_prefix_space": False,
            "trim_offsets": False,
            "use_regex": False,
        },  # fmt: skip
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": ignore_merges,
            "vocab": {token: i for i, token in enumerate(tokens)},
            "merges": meta.get("tokenizer.ggml.merges", []),
        },
    }
    config = {
        "add_bos_token": add_bos,
        "add_eos_token": add_eos,
        **{name: tokens[i] for name, i in special.items() if i is not None},
        "chat_template": meta.get("tokenizer.chat_template"),
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    return data, config


# --- checkpoints ----------------------------------------------------------------------------------

Tokenizer = CharTokenizer | BPETokenizer
# Every file a tokenizer may leave in a checkpoint directory (the character tokenizer's and
# Hugging Face's share the name tokenizer.json).
_FILES = ("tokenizer.json", "vocab.json", "merges.txt", "tokenizer_config.json",
          "chat_template.jinja")  # fmt: skip


def save_tokenizer(tokenizer: Tokenizer, directory: str | Path) -> None:
    """Write the tokenizer's files into a checkpoint directory, and remove the other kinds': a
    run written over an older one must not leave a second tokenizer beside the new model."""
    directory = Path(directory)
    if isinstance(tokenizer, BPETokenizer):
        tokenizer.save(directory)
        written = tokenizer.file_names
    else:
        tokenizer.save(directory / "tokenizer.json")
        written = ["tokenizer.json"]
    for name in _FILES:
        if name not in written:
            (directory / name).unlink(missing_ok=True)


def _tokenizer_path(name: str | Path, revision: str | None) -> Path:
    """The local directory or .gguf file of a tokenizer (a hub name fetched: hub.resolve); a
    path that does not exist says so, not that it holds no tokenizer files."""
    path = hub.resolve(name, revision, hub.TOKENIZER_FILES)
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist")
    return path


def load_tokenizer(directory: str | Path) -> Tokenizer:
    """The tokenizer of a checkpoint or model directory: Hugging Face's tokenizer.json if there
    is one, else GPT-2's vocab.json + merges.txt, else the character tokenizer's tokenizer.json.
    Or a .gguf file's, or a hub name's (BPETokenizer.from_pretrained)."""
    directory = _tokenizer_path(directory, None)
    if directory.suffix == ".gguf" and directory.is_file():
        return BPETokenizer.from_pretrained(directory)
    data = _read_tokenizer_json(directory)
    if _is_hf(data):
        return _read_hf_tokenizer(directory, data)
    if (directory / "vocab.json").is_file() or (directory / "merges.txt").is_file():
        return BPETokenizer.from_pretrained(directory)  # which names a missing file
    if data is not None:
        return CharTokenizer.from_dict(data)
    raise FileNotFoundError(
        f"{directory} holds no tokenizer: no tokenizer.json (Hugging Face's or the character "
        "tokenizer's) and no vocab.json + merges.txt (GPT-2's)"
    )
