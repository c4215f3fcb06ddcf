"""GPT-2 byte-level BPE: training, encoding, GPT-2's file format, and the train/sample CLIs with it.

tests/fixtures/bpe holds a small tokenizer written by the trainer:

    python -c "from pathlib import Path; from models.formats.tokenizer import BPETokenizer as B; \
B.train(Path('tests/fixtures/bpe/train.txt').read_text(), 350).save('tests/fixtures/bpe')"

Nothing here downloads anything: GPT-2's own files are imitated line for line (first merges, ids,
JSON layout) by gpt2_directory below.
"""

import doctest
import json
import math
from collections import Counter
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import models.formats.tokenizer
from models import evaluate, sample, train
from models.architectures.gpt import GPT, GPTConfig
from models.formats.tokenizer import (
    _PIECES,
    END_OF_TEXT,
    BPETokenizer,
    CharTokenizer,
    bytes_to_unicode,
    load_tokenizer,
    save_tokenizer,
)
from models.training.data import prepare_corpus

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "bpe"
FIXTURE_VOCAB_SIZE = 350
TEXT = 'The tokenizer\'s merges: "  the" in 2048 tests, café 🙂\n    return ids<|endoftext|>'
# The fixture's ids of TEXT (special text as ordinary text, the default); regenerate only on
# purpose, together with the fixture files.
TEXT_IDS = [
    297, 295, 72, 89, 265, 6, 82, 324, 25, 269, 220, 263, 1, 321, 220, 17, 15, 19, 23, 256, 259,
    347, 11, 220, 66, 64, 69, 127, 102, 220, 303, 247, 224, 292, 319, 315, 294, 27, 91, 264, 67,
    339, 346, 91, 29,
]  # fmt: skip


@pytest.fixture(scope="module")
def fixture_tok():
    return BPETokenizer.from_pretrained(FIXTURE)


def test_module_doctest():
    assert doctest.testmod(models.formats.tokenizer).failed == 0


# --- GPT-2's byte alphabet and files ----------------------------------------------------------


def test_bytes_to_unicode_is_gpt2s_map():
    table = bytes_to_unicode()
    assert sorted(table) == list(range(256)) and len(set(table.values())) == 256
    assert all(c.isprintable() and not c.isspace() for c in table.values())
    assert table[ord(" ")] == "Ġ" and table[ord("\n")] == "Ċ" and table[ord("A")] == "A"
    ids = {c: i for i, c in enumerate(table.values())}
    # GPT-2's ids of "!", "\n" and " " (its tokens 0, 198 and 220).
    assert (ids["!"], ids["Ċ"], ids["Ġ"]) == (0, 198, 220)


# GPT-2's first 29 merges, as in its merges.txt (and Hugging Face's copy of it).
GPT2_FIRST_MERGES = """Ġ t
Ġ a
h e
i n
r e
o n
Ġt he
e r
Ġ s
a t
Ġ w
Ġ o
e n
Ġ c
i t
i s
a n
o r
e s
Ġ b
e d
Ġ f
in g
Ġ p
o u
Ġa n
a l
a r
Ġt o
"""


def gpt2_directory(path: Path) -> Path:
    """GPT-2's vocab.json + merges.txt cut after 29 merges, in the exact format of the real ones:
    the JSON on one line with \\u escapes, the byte tokens first, <|endoftext|> at 50256."""
    path.mkdir(parents=True, exist_ok=True)
    vocab = {c: i for i, c in enumerate(bytes_to_unicode().values())}
    for line in GPT2_FIRST_MERGES.splitlines():
        a, b = line.split(" ")
        vocab[a + b] = len(vocab)
    vocab[END_OF_TEXT] = 50256
    (path / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (path / "merges.txt").write_text("#version: 0.2\n" + GPT2_FIRST_MERGES, encoding="utf-8")
    return path


def test_gpt2_files_load_and_give_gpt2s_ids(tmp_path):
    tok = BPETokenizer.from_pretrained(gpt2_directory(tmp_path))
    assert "\\u0120t" in (tmp_path / "vocab.json").read_text()  # escaped, as GPT-2's file
    assert tok.vocab_size == 50257 and tok.eot_id == 50256 and len(tok.merges) == 29
    # GPT-2's own ids: " the" 262, "er" 263, "ing" 278, " to" 284, " a" 257, "\n" 198.
    assert tok.encode(" the") == [262] and tok.encode("ing") == [278]
    assert tok.encode(" to a\n") == [284, 257, 198]
    assert tok.encode("her") == [258, 81]  # "he" (rank 2) beats "er" (rank 7): he + r
    assert tok.encode("<|endoftext|>", allowed_special="all") == [50256]
    assert tok.decode([262, 50256]) == " the<|endoftext|>"
    with pytest.raises(ValueError, match="id 1000 is not in the vocabulary"):
        tok.decode([262, 1000])  # a gap between the merges and 50256


# --- round trip, training, determinism --------------------------------------------------------


@settings(max_examples=200)
@given(text=st.text())
@example(text="")
@example(text="   \t\t\n\n  \n    x  ")
@example(text="don't we'll they're I'M it's 'S")
@example(text="3.14159 + 2048 = 1234567890 ٣٤")
@example(text="🙂🚀👍🏽 family: 👨‍👩‍👧")
@example(text="日本語のテキストと한국어")
@example(text="a<|endoftext|>b <|endoftext|")
def test_round_trip(fixture_tok, text):
    ids = fixture_tok.encode(text)
    assert all(isinstance(i, int) for i in ids)
    assert fixture_tok.decode(ids) == text
    assert fixture_tok.decode(fixture_tok.encode(text, allowed_special="all")) == text
    assert fixture_tok.eot_id not in ids  # special text is ordinary text unless allowed


def naive_train(text, n_merges):
    """The textbook loop: recount every pair of every piece before each merge, same tie rule."""
    words = {}
    for document in text.split(END_OF_TEXT):
        for piece, n in Counter(_PIECES.findall(document)).items():
            key = tuple(bytes_to_unicode()[b] for b in piece.encode("utf-8"))
            words[key] = words.get(key, 0) + n
    merges = []
    while len(merges) < n_merges:
        counts = Counter()
        for word, n in words.items():
            for pair in pairwise(word):
                counts[pair] += n
        if not counts:
            break
        best = min(counts, key=lambda pair: (-counts[pair], pair))
        merges.append(best)
        words = {
            tuple(models.formats.tokenizer._merge(list(w), *best)): n for w, n in words.items()
        }
    return merges, words


# Few letters, many repeats: ties, overlapping pairs (a a a) and long runs everywhere.
small_texts = st.text(alphabet="ab \n'1é🙂", max_size=80) | st.text(max_size=40)


@settings(max_examples=200)
@given(text=small_texts, n_merges=st.integers(0, 40))
@example(text="aaaaaaa aaa aa a aaaaa", n_merges=10)
@example(text="ab ba aba bab abab", n_merges=10)
def test_incremental_training_equals_recounting(text, n_merges):
    tok = BPETokenizer.train(text, 257 + n_merges)
    merges, words = naive_train(text, n_merges)
    assert tok.merges == merges
    # One new token per merge, ids in order, <|endoftext|> last (no merge made a token twice).
    assert tok.vocab_size == len(tok.vocab) == 257 + len(merges) and tok.eot_id == len(merges) + 256
    assert all(tok.vocab[a + b] == 256 + r for r, (a, b) in enumerate(merges))
    # GPT-2's encoding loop (lowest rank first, cached) reproduces the trainer's segmentation.
    for word in words:
        piece = bytes(bytes_to_unicode_inverse[c] for c in "".join(word)).decode("utf-8")
        assert tok.encode(piece) == [tok.vocab[t] for t in word]


bytes_to_unicode_inverse = {c: b for b, c in bytes_to_unicode().items()}


def gpt2_loop(parts, ranks):
    """GPT-2's encoder.py: merge every occurrence of the lowest-ranked pair present, again."""
    while len(parts) > 1:
        pair = min(pairwise(parts), key=lambda p: ranks.get(p, math.inf))
        if pair not in ranks:
            return parts
        parts = models.formats.tokenizer._merge(parts, *pair)
    return parts


@settings(max_examples=200)
@given(text=small_texts, n_merges=st.integers(0, 40), piece=st.text(alphabet="ab 'é", max_size=300))
@example(text="aaaaaaa aaa aa a aaaaa", n_merges=10, piece="a" * 100)
def test_merging_long_pieces_by_heap_equals_gpt2s_loop(text, n_merges, piece):
    """A piece longer than _LONG_PIECE (a whole text, in Llama 2's older files) is merged with
    a heap, in O(n log n): the same tokens as GPT-2's loop, ties and overlaps (a a a) included."""
    tok = BPETokenizer.train(text, 257 + n_merges)
    parts = [bytes_to_unicode()[b] for b in piece.encode()]
    assert models.formats.tokenizer._merge_by_heap(parts, tok._ranks) == gpt2_loop(
        parts, tok._ranks
    )


def test_tie_rule_and_early_stop():
    # Each of ab, cd, ef occurs twice: the strings decide, (a, b) < (c, d) < (e, f).
    tok = BPETokenizer.train("ef cd ab ef cd ab", vocab_size=300)
    assert tok.merges[:3] == [("a", "b"), ("c", "d"), ("e", "f")]
    # The text runs out of pairs long before 300: a smaller vocabulary, <|endoftext|> last.
    assert tok.vocab_size == 257 + len(tok.merges) < 300 and tok.eot_id == tok.vocab_size - 1


def test_training_twice_gives_identical_merges():
    text = (FIXTURE / "train.txt").read_text(encoding="utf-8")
    first, second = (BPETokenizer.train(text, 500) for _ in range(2))
    assert first.merges == second.merges and first.vocab == second.vocab


def test_trainer_reproduces_the_committed_fixture(tmp_path):
    text = (FIXTURE / "train.txt").read_text(encoding="utf-8")
    BPETokenizer.train(text, FIXTURE_VOCAB_SIZE).save(tmp_path)
    for name in ("vocab.json", "merges.txt"):
        assert (tmp_path / name).read_bytes() == (FIXTURE / name).read_bytes(), name


def test_fixture_encodes_fixed_text_to_committed_ids(fixture_tok):
    assert fixture_tok.encode(TEXT) == TEXT_IDS
    assert fixture_tok.decode(TEXT_IDS) == TEXT
    lines = (FIXTURE / "merges.txt").read_text(encoding="utf-8").splitlines()
    assert lines[0] == "#version: 0.2" and lines[1] == "Ġ t" and len(lines) == 1 + 93


def test_cache_is_filled_and_used(fixture_tok):
    tok = BPETokenizer(fixture_tok.vocab, fixture_tok.merges)
    ids = tok.encode(" the the the")
    assert tok._cache == {" the": [ids[0]]} and ids == [ids[0]] * 3
    tok._cache[" the"] = [7]  # a planted entry shows that the second call reads the cache
    assert tok.encode(" the") == [7]


@settings(max_examples=30)
@given(text=st.text(min_size=1, max_size=200), vocab_size=st.integers(257, 320))
def test_save_then_from_pretrained_gives_the_same_ids(tmp_path_factory, text, vocab_size):
    tok = BPETokenizer.train(text, vocab_size)
    directory = tmp_path_factory.mktemp("bpe")
    tok.save(directory)
    loaded = BPETokenizer.from_pretrained(directory)
    assert loaded.merges == tok.merges and loaded.vocab == tok.vocab
    assert loaded.encode(text) == tok.encode(text)
    assert (directory / "merges.txt").read_text(encoding="utf-8").startswith("#version: 0.2\n")


# --- the special token ------------------------------------------------------------------------


def test_end_of_text_is_special_only_where_allowed(fixture_tok):
    eot = fixture_tok.eot_id
    assert eot == FIXTURE_VOCAB_SIZE - 1
    text = "one<|endoftext|>two"
    ordinary = fixture_tok.encode(text)
    assert eot not in ordinary and fixture_tok.decode(ordinary) == text
    for allowed in ("all", {END_OF_TEXT}, END_OF_TEXT):
        ids = fixture_tok.encode(text, allowed_special=allowed)
        assert ids == fixture_tok.encode("one") + [eot] + fixture_tok.encode("two")
    with pytest.raises(ValueError, match=r"unknown special token\(s\) \['<\|fim\|>'\]"):
        fixture_tok.encode(text, allowed_special={"<|fim|>"})


def test_training_never_merges_across_end_of_text():
    tok = BPETokenizer.train(END_OF_TEXT.join(["ab"] * 60), vocab_size=400)
    assert not any("|" in a + b or "<" in a + b for a, b in tok.merges)
    assert tok.merges == [("a", "b")]


# --- bad input --------------------------------------------------------------------------------


def test_missing_files_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"has no tokenizer.json \(Hugging Face.s\) and no"):
        BPETokenizer.from_pretrained(tmp_path)
    gpt2_directory(tmp_path)
    (tmp_path / "merges.txt").unlink()
    with pytest.raises(FileNotFoundError, match=r"has no merges.txt$"):
        BPETokenizer.from_pretrained(tmp_path)


@pytest.mark.parametrize(
    ("merges", "message"),
    [
        ("Ġ t\nh e\n", r"merges.txt: line 1: expected the header '#version: 0.2', got 'Ġ t'"),
        ("#version: 0.2\nĠ t\nh e x\n", r"merges.txt: line 3: expected 'left right', got 'h e x'"),
        ("#version: 0.2\nĠ t\n\nh e\n", r"merges.txt: line 3: expected 'left right', got ''"),
        ("#version: 0.2\nĠ t\nq z\n", r"merges.txt: line 3 \('q z'\): 'qz' is not in vocab.json"),
        ("#version: 0.2\nĠ t\nĠ t\n", r"merges.txt: line 3 \('Ġ t'\): repeats line 2"),
    ],
)
def test_malformed_merges_name_file_and_line(tmp_path, merges, message):
    gpt2_directory(tmp_path)
    (tmp_path / "merges.txt").write_text(merges, encoding="utf-8")
    with pytest.raises(ValueError, match=message):
        BPETokenizer.from_pretrained(tmp_path)


def test_malformed_vocab_names_file_and_line(tmp_path):
    gpt2_directory(tmp_path)
    (tmp_path / "vocab.json").write_text('{\n  "!": 0,\n  "a" 1\n}', encoding="utf-8")
    with pytest.raises(ValueError, match=r"vocab.json: line 3: not valid JSON"):
        BPETokenizer.from_pretrained(tmp_path)
    (tmp_path / "vocab.json").write_text("[1, 2]", encoding="utf-8")
    with pytest.raises(ValueError, match=r"vocab.json: expected a JSON object"):
        BPETokenizer.from_pretrained(tmp_path)
    vocab = {c: i for i, c in enumerate(bytes_to_unicode().values()) if c != "Ġ"}
    (tmp_path / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (tmp_path / "merges.txt").write_text("#version: 0.2\n", encoding="utf-8")
    lacks_space = BPETokenizer.from_pretrained(tmp_path)  # as Hugging Face's: the byte is dropped
    assert lacks_space.decode(lacks_space.encode("a b")) == "ab"
    vocab["Ġ"] = 0
    (tmp_path / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    with pytest.raises(ValueError, match=r"vocab.json: id 0 is given to two tokens"):
        BPETokenizer.from_pretrained(tmp_path)


def test_decode_and_train_errors(fixture_tok):
    for bad in (-1, FIXTURE_VOCAB_SIZE, 10**9):
        with pytest.raises(ValueError, match=rf"id {bad} is not in the vocabulary"):
            fixture_tok.decode([0, bad])
    with pytest.raises(ValueError, match="1-D integer sequence"):
        fixture_tok.decode(np.array([1.0]))
    assert fixture_tok.decode([]) == "" and fixture_tok.encode("") == []
    with pytest.raises(ValueError, match="vocab_size must be an int >= 257"):
        BPETokenizer.train("text", 256)


# --- checkpoints, corpus, CLIs ----------------------------------------------------------------


def test_a_checkpoint_directory_holds_one_tokenizer(tmp_path, fixture_tok):
    save_tokenizer(CharTokenizer.from_text("abc"), tmp_path)
    save_tokenizer(fixture_tok, tmp_path)
    assert not (tmp_path / "tokenizer.json").exists()
    assert load_tokenizer(tmp_path).merges == fixture_tok.merges
    save_tokenizer(CharTokenizer.from_text("abc"), tmp_path)
    assert not (tmp_path / "vocab.json").exists() and not (tmp_path / "merges.txt").exists()
    assert isinstance(load_tokenizer(tmp_path), CharTokenizer)
    # A GPT-2 download also holds Hugging Face's tokenizer.json, with the same vocabulary and
    # merges: read first (it also names the added tokens), it gives the same ids.
    gpt2 = gpt2_directory(tmp_path / "gpt2")
    from_gpt2_files = load_tokenizer(gpt2)
    vocab = json.loads((gpt2 / "vocab.json").read_text(encoding="utf-8"))
    merges = (gpt2 / "merges.txt").read_text(encoding="utf-8").splitlines()[1:]
    hf = {  # GPT-2's tokenizer.json, as Hugging Face's gpt2 download has it
        "version": "1.0",
        "added_tokens": [
            {"id": 50256, "content": END_OF_TEXT, "single_word": False, "lstrip": False,
             "rstrip": False, "normalized": True, "special": True}
        ],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                          "use_regex": True},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False,
                           "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": "", "end_of_word_suffix": "", "fuse_unk": False,
                  "vocab": vocab, "merges": merges},
    }  # fmt: skip
    (gpt2 / "tokenizer.json").write_text(json.dumps(hf), encoding="utf-8")
    from_tokenizer_json = load_tokenizer(gpt2)
    assert from_tokenizer_json._hf_files and not from_gpt2_files._hf_files  # each file was read
    text = TEXT + " the string<|endoftext|>"
    for allowed in ((), "all"):
        ids = from_tokenizer_json.encode(text, allowed_special=allowed)
        assert ids == from_gpt2_files.encode(text, allowed_special=allowed)
    assert from_tokenizer_json.eot_id == 50256
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="holds no tokenizer"):
        load_tokenizer(tmp_path / "empty")
    for load in (load_tokenizer, BPETokenizer.from_pretrained):
        with pytest.raises(FileNotFoundError, match="missing does not exist"):
            load(tmp_path / "missing")


def test_bpe_corpus_learns_from_the_training_split_only(tmp_path):
    path = tmp_path / "t.txt"
    text = "ab " * 270 + "zq " * 30  # the last 10 % (90 of 900 characters) is all zq
    path.write_text(text, encoding="utf-8")
    corpus = prepare_corpus(path, bpe_vocab_size=300)
    assert not any("z" in a + b or "q" in a + b for a, b in corpus.tokenizer.merges)
    decoded = corpus.tokenizer.decode(corpus.train) + corpus.tokenizer.decode(corpus.val)
    assert decoded == text and corpus.val_bytes == 90
    assert corpus.train.dtype == np.int64


def test_total_nats_scores_every_token_once():
    # Zero weights: uniform predictions, ln(V) nats for each of the 100 predicted tokens,
    # whether they fall in full windows (block 16) or in the short last one.
    model = GPT(GPTConfig(vocab_size=50, block_size=16, n_layer=1, n_head=2, n_embd=8))
    for p in model.parameters():
        p.data[...] = 0.0
    ids = np.arange(101) % 50
    assert evaluate.total_nats(model, ids, batch_size=3) == pytest.approx(100 * math.log(50))
    assert evaluate.bits_per_byte(100 * math.log(2), 50) == pytest.approx(2.0)


@pytest.fixture
def data_file(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("def add(a, b):\n    return a + b\n\n" * 120, encoding="utf-8")
    return path


def test_train_cli_with_bpe_saves_it_and_sample_uses_it(data_file, tmp_path, capsys):
    out = tmp_path / "bpe"
    argv = ["--data", str(data_file), "--out", str(out), "--tokenizer", "bpe"]
    argv += ["--vocab-size", "300", "--steps", "4", "--batch-size", "4", "--block-size", "8"]
    argv += ["--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--eval-every", "2"]
    argv += ["--eval-batches", "1", "--sample-tokens", "10", "--quiet"]
    assert train.main(argv) == 0
    assert "--- sample" in capsys.readouterr().out
    assert not (out / "tokenizer.json").exists()
    tok = BPETokenizer.from_pretrained(out)
    assert GPT.from_pretrained(out).config.vocab_size == tok.vocab_size <= 300
    text = data_file.read_text(encoding="utf-8")
    assert tok.merges == BPETokenizer.train(text[: -round(len(text) * 0.1)], 300).merges

    assert sample.main(["--ckpt", str(out), "--prompt", "def ", "--max-new-tokens", "5"]) == 0
    assert capsys.readouterr().out.startswith("def ")
    assert evaluate.main(["--model", str(out)]) == 0
    assert "bits/byte" in capsys.readouterr().out
    with pytest.raises(SystemExit, match=r"^evaluate: --model: no checkpoint in .*nothing"):
        evaluate.main(["--ckpt", str(tmp_path / "nothing")])
    assert train.main(["--out", str(out), "--resume", "--steps", "6", "--quiet"]) == 0
    with pytest.raises(SystemExit, match="cannot change --vocab-size 400"):
        train.main(["--out", str(out), "--resume", "--vocab-size", "400", "--quiet"])
    with pytest.raises(SystemExit, match="--vocab-size needs --tokenizer bpe"):
        train.main(["--data", str(data_file), "--out", str(tmp_path / "c"), "--vocab-size", "300"])


def test_benchmark_suite_reports_train_and_encode_times(tmp_path, capsys):
    from benchmarks.__main__ import main as bench

    path = tmp_path / "tok.json"
    argv = ["--suite", "tokenizer", "--quick", "--quiet", "--no-torch", "--json", str(path)]
    assert bench(argv) == 0
    assert "Tokenizer: byte-level BPE" in capsys.readouterr().out
    records = json.loads(path.read_text())["suites"]["tokenizer"]
    assert [r["name"] for r in records] == [
        "train 100 merges",
        "encode corpus (cold cache)",
        "encode corpus (warm cache)",
    ]
    assert records[1]["params"]["tokens"] > 0 and records[1]["variants"]["python"]["mb_per_s"] > 0
