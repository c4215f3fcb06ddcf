"""The character tokenizer, the default corpus, the split and the (seed, step) batches."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from models.formats.tokenizer import CharTokenizer
from models.training.data import (
    DEFAULT_MODULES,
    eval_batches,
    get_batch,
    load_default_corpus,
    load_text,
    prepare_corpus,
    split_ids,
    unigram_baseline,
)

ALPHABET = "abc xyz\n\tλ€"


@settings(deadline=None)
@given(text=st.text(alphabet=ALPHABET, min_size=0, max_size=60))
def test_encode_decode_round_trip(text):
    tok = CharTokenizer(ALPHABET)
    ids = tok.encode(text)
    assert ids.dtype == np.int64 and ids.shape == (len(text),)
    assert tok.decode(ids) == text


def test_ids_are_positions_in_the_sorted_alphabet():
    tok = CharTokenizer.from_text("banana")
    assert tok.chars == ["a", "b", "n"] and tok.vocab_size == 3
    assert tok.encode("nab").tolist() == [2, 0, 1]


def test_tokenizer_errors():
    tok = CharTokenizer.from_text("abc")
    with pytest.raises(ValueError, match="not in the 3-character vocabulary: 'dz'"):
        tok.encode("adz")
    with pytest.raises(ValueError, match=r"ids must lie in \[0, 3\)"):
        tok.decode([0, 3])
    with pytest.raises(ValueError, match="1-D integer sequence"):
        tok.decode(np.array([0.0, 1.0]))
    with pytest.raises(ValueError, match="repeated"):
        CharTokenizer("aba")
    with pytest.raises(ValueError, match="single characters"):
        CharTokenizer(["ab"])
    with pytest.raises(ValueError, match="empty"):
        CharTokenizer.from_text("")


def test_tokenizer_save_load(tmp_path):
    tok = CharTokenizer.from_text("héllo wörld\n")
    tok.save(tmp_path / "tokenizer.json")
    loaded = CharTokenizer.load(tmp_path / "tokenizer.json")
    assert loaded.chars == tok.chars
    with pytest.raises(ValueError, match="expected"):
        CharTokenizer.from_dict({"type": "bpe"})


# --- the corpus -----------------------------------------------------------------------------


def test_default_corpus_is_real_deterministic_stdlib_text():
    text = load_default_corpus()
    assert text == load_default_corpus()
    assert len(text) > 500_000
    assert "def " in text and "import " in text and "return" in text
    assert len(DEFAULT_MODULES) == len(set(DEFAULT_MODULES))


def test_prepare_corpus_splits_contiguously(tmp_path):
    path = tmp_path / "t.txt"
    text = "".join(chr(97 + i % 26) for i in range(1000))
    path.write_text(text, encoding="utf-8")
    corpus = prepare_corpus(path, val_fraction=0.1)
    assert len(corpus.train) == 900 and len(corpus.val) == 100
    assert corpus.tokenizer.decode(corpus.train) + corpus.tokenizer.decode(corpus.val) == text
    assert corpus.source == str(path)


def test_load_text_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file"):
        load_text(tmp_path / "missing.txt")
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(ValueError, match="is empty"):
        load_text(tmp_path / "empty.txt")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    with pytest.raises(ValueError, match="is not UTF-8 text"):
        load_text(tmp_path / "latin1.txt")
    with pytest.raises(ValueError, match="too few"):
        split_ids(np.arange(5), 0.1)


# --- batches --------------------------------------------------------------------------------


IDS = np.arange(500) % 37


def test_batch_targets_are_inputs_shifted_by_one():
    x, y = get_batch(IDS, batch_size=6, block_size=10, seed=0, step=3)
    assert x.shape == y.shape == (6, 10)
    np.testing.assert_array_equal(x[:, 1:], y[:, :-1])
    for row_x, row_y in zip(x, y, strict=True):
        start = int(
            np.flatnonzero(
                np.all(np.lib.stride_tricks.sliding_window_view(IDS, 10) == row_x, axis=1)
            )[0]
        )
        np.testing.assert_array_equal(row_y, IDS[start + 1 : start + 11])


def test_batches_are_a_pure_function_of_seed_and_step():
    a = get_batch(IDS, 8, 10, seed=1, step=5)
    b = get_batch(IDS, 8, 10, seed=1, step=5)
    np.testing.assert_array_equal(a[0], b[0])
    assert not np.array_equal(a[0], get_batch(IDS, 8, 10, seed=1, step=6)[0])
    assert not np.array_equal(a[0], get_batch(IDS, 8, 10, seed=2, step=5)[0])


def test_ranks_shard_one_global_batch():
    full_x, full_y = get_batch(IDS, 8, 10, seed=3, step=7)
    parts = [get_batch(IDS, 8, 10, seed=3, step=7, rank=r, world_size=4) for r in range(4)]
    for r, (x, y) in enumerate(parts):
        np.testing.assert_array_equal(x, full_x[r::4])
        np.testing.assert_array_equal(y, full_y[r::4])
    with pytest.raises(ValueError, match="not divisible by world_size"):
        get_batch(IDS, 6, 10, seed=3, step=7, world_size=4)


def test_eval_batches_are_fixed_and_differ_from_training_batches():
    first = eval_batches(IDS, 4, 10, num_batches=3, seed=0)
    second = eval_batches(IDS, 4, 10, num_batches=3, seed=0)
    assert len(first) == 3
    for (a, _), (b, _) in zip(first, second, strict=True):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(first[0][0], get_batch(IDS, 4, 10, seed=0, step=0)[0])


def test_text_shorter_than_a_window_is_an_error():
    with pytest.raises(ValueError, match="needs block_size \\+ 1 = 11"):
        get_batch(np.arange(10), 2, 10, seed=0, step=0)


def test_unigram_baseline_by_hand():
    train = np.array([0, 0, 0, 1])
    val = np.array([0, 1])
    # add-one counts: 4 and 2 of 6 -> p = 2/3, 1/3
    expected = -(np.log(2 / 3) + np.log(1 / 3)) / 2
    assert unigram_baseline(train, val, 2) == pytest.approx(expected)
