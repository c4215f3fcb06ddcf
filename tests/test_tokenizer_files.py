"""Tokenizers as real files are: vocabularies with holes, read by BPETokenizer.

The references were made once by tests/fixtures/tokenizers/make_fixtures.py with Hugging Face's
`tokenizers` (ids of encode(text, add_special_tokens=False), decode with and without
skip_special_tokens), on the texts of the byte-level fixtures (tests/fixtures/hf) and a few that
reach the bytes a vocabulary lacks; nothing here imports `tokenizers`.
"""

import json
from pathlib import Path

import pytest

from models.tokenizer import BPETokenizer, bytes_to_unicode

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "tokenizers"
REFERENCE = json.loads((FIXTURES / "reference.json").read_text(encoding="utf-8"))
TEXTS = REFERENCE["texts"]
NAMES = ["bytelevel_holes", "bytelevel_unk", "bytelevel_unk_fused"]


@pytest.fixture(scope="module")
def tokenizers():
    return {name: BPETokenizer.from_pretrained(FIXTURES / name) for name in NAMES}


@pytest.mark.parametrize("name", NAMES)
def test_ids_and_text_equal_hugging_faces(tokenizers, name):
    """Every text: the ids, and decode with and without skip_special_tokens."""
    tok = tokenizers[name]
    cases = REFERENCE[name]
    assert len(cases) == len(TEXTS) > 80
    wrong = [
        text
        for text, (ids, decoded, decoded_skip) in zip(TEXTS, cases, strict=True)
        if tok.encode(text, allowed_special="all") != ids
        or tok.decode(ids) != decoded
        or tok.decode(ids, skip_special_tokens=True) != decoded_skip
    ]
    assert not wrong


def test_a_lacking_byte_is_dropped_or_unk_and_merges_cross_it(tokenizers):
    """What `tokenizers` does with a byte the vocabulary lacks (the fixtures' holes: \\x04, "q",
    and F0, the first byte of every emoji): without an unk token it drops it, and the symbols on
    either side merge as if it had never been there; with one, each lacking byte is <unk>, and
    with fuse_unk a run of them is one <unk>."""
    holes, unk, fused = (tokenizers[name] for name in NAMES)
    symbols = bytes_to_unicode()
    lacking = [b for b in range(256) if symbols[b] not in holes.vocab]
    assert len(lacking) == 25 and ord("q") in lacking and 0x04 in lacking
    assert holes.encode("q") == [] and holes.decode(holes.encode("aq")) == "a"
    assert holes.encode("maqsk") == holes.encode("mask") == [holes.vocab["mask"]]
    u = unk.vocab["<unk>"]
    assert unk.encode("qq") == [u, u] and fused.encode("qq") == [u]
    assert fused.encode("maqqsk") == [fused.vocab["ma"], u, fused.vocab["s"], fused.vocab["k"]]
    emoji = holes.encode("🙂")  # F0 9F 99 82: the last three bytes stay
    assert holes.decode_bytes(emoji) == "🙂".encode()[1:]
