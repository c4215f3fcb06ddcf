"""The tokenizer suite (`python -m benchmarks --suite tokenizer`): byte-level BPE, pure Python.

On the demo corpus (models.training.data's default text, ~0.93 MB): learning 1,000 merges, and
encoding the whole corpus with a cold cache (a fresh tokenizer per call, so every distinct piece is
merged) and with a warm one (each piece is a dictionary lookup). Quick mode: the first 100 kB, 100
merges.
"""

from __future__ import annotations

from typing import Any

from benchmarks import timing
from models.formats.tokenizer import BPETokenizer
from models.training.data import load_default_corpus

TRAIN_LIMIT_S = 60.0  # the targets, for the full corpus and 1,000 merges
ENCODE_LIMIT_S = 5.0


def tokenizer_suite(ctx: Any) -> list[dict[str, Any]]:
    """Three records: train, encode (cold cache), encode (warm cache); variant "python"."""
    text = load_default_corpus()
    merges = 1000
    if ctx.quick:
        text, merges = text[:100_000], 100
    n_bytes = len(text.encode("utf-8"))
    corpus = {"corpus_chars": len(text), "corpus_bytes": n_bytes}
    ctx.log(f"  tokenizer: {merges} merges on {n_bytes:,} bytes")
    train = timing.measure({"python": lambda: BPETokenizer.train(text, 257 + merges)}, ctx.reps)
    tok = BPETokenizer.train(text, 257 + merges)
    n_tokens = len(tok.encode(text))
    cold = timing.measure(
        {"python": lambda: BPETokenizer(tok.vocab, tok.merges).encode(text)}, ctx.reps
    )
    warm = timing.measure({"python": lambda: tok.encode(text)}, ctx.reps)
    for stats in (cold["python"], warm["python"]):
        stats["mb_per_s"] = n_bytes / 1e6 / (stats["median_ms"] / 1e3)
    encoded = {**corpus, "vocab_size": tok.vocab_size, "tokens": n_tokens}
    encoded["bytes_per_token"] = n_bytes / n_tokens
    return [
        _record(f"train {merges} merges", {**corpus, "vocab_size": tok.vocab_size}, train),
        _record("encode corpus (cold cache)", encoded, cold),
        _record("encode corpus (warm cache)", encoded, warm),
    ]


def _record(name: str, params: dict, variants: dict) -> dict[str, Any]:
    return {
        "suite": "tokenizer",
        "name": name,
        "params": params,
        "variants": variants,
        "ratios": {},
    }
