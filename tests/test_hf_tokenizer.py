"""Hugging Face tokenizers: tokenizer.json read by BPETokenizer, chat templates rendered as
transformers renders them.

The references were made once by tests/fixtures/hf/make_fixtures.py with the `tokenizers` and
`transformers` libraries (ids, decoded text, rendered chats); nothing here imports either. The
three tokenizers cover the pipelines of today's small models: Llama 3's (its split regex,
ignore_merges, a BOS post-processor), Qwen2's (single digits in its regex, an NFC normalizer,
added tokens that are not special) and SmolLM2's (a Digits step, then GPT-2's regex; the special
tokens inside the vocabulary at ids 0-2, the template in chat_template.jinja).
"""

import codecs
import json
import shutil
import unicodedata
from datetime import datetime
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from models.formats.chat_template import render_chat_template
from models.formats.errors import FileFormatError
from models.formats.tokenizer import (
    AddedToken,
    BPETokenizer,
    CharTokenizer,
    load_tokenizer,
    save_tokenizer,
)

HF = Path(__file__).resolve().parent / "fixtures" / "hf"
DIRECTORIES = {"llama": HF / "llama", "qwen2": HF / "qwen2", "smollm2": HF / "smollm2_tokenizer"}
TOKENIZER_REFERENCE = json.loads((HF / "tokenizer_reference.json").read_text(encoding="utf-8"))
CHAT_REFERENCE = json.loads((HF / "chat_reference.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def tokenizers():
    return {name: BPETokenizer.from_pretrained(path) for name, path in DIRECTORIES.items()}


def cases():
    return [
        pytest.param(name, case, id=f"{name}-{i}")
        for name in DIRECTORIES
        for i, case in enumerate(TOKENIZER_REFERENCE[name])
    ]


# --- ids --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "case"), cases())
def test_ids_equal_hugging_faces(tokenizers, name, case):
    """CJK, emoji (ZWJ sequences, flags), whitespace runs, added tokens, code, NFC, digits."""
    tok = tokenizers[name]
    text = case["text"]
    assert tok.encode(text, allowed_special="all") == case["ids"]
    assert (
        tok.encode(text, allowed_special="all", add_special_tokens=True)
        == (case["ids_with_special_tokens"])
    )
    assert tok.decode(case["ids"]) == case["decoded"]
    assert tok.decode(case["ids"], skip_special_tokens=True) == case["decoded_skip_special"]


@pytest.mark.parametrize("name", sorted(DIRECTORIES))
def test_ids_equal_hugging_faces_on_random_texts(tokenizers, name):
    """120 random strings each, from characters where regex engines could disagree (Oniguruma in
    `tokenizers`, the `regex` module here): Unicode spaces and controls (\\x1c-\\x1f, \\x85,
    U+2028, U+3000, ...), combining marks, ZWJ, letters and digits of several scripts,
    contractions in both cases, pieces of added tokens."""
    tok = tokenizers[name]
    random_cases = TOKENIZER_REFERENCE[f"{name}_random"]
    assert len(random_cases) == 120
    wrong = [
        case["text"]
        for case in random_cases
        if tok.encode(case["text"], allowed_special="all") != case["ids"]
    ]
    assert not wrong


def test_the_fixtures_exercise_each_setting(tokenizers):
    """Each setting read from the files changes some reference ids (else the test above would
    pass without it)."""
    llama, qwen2, smollm2 = tokenizers["llama"], tokenizers["qwen2"], tokenizers["smollm2"]
    assert llama.ignore_merges and qwen2.normalizer == (("NFC",),) and llama.bos == [501]
    assert len(smollm2.pre_tokenizer) == 2 and smollm2.special_tokens["<|im_start|>"] == 1
    assert qwen2.added_tokens["<tool_call>"].special is False

    def changed(tok, name, **settings):
        copy = BPETokenizer(
            tok.vocab,
            tok.merges,
            added_tokens=tok.added_tokens.values(),
            **{
                "pre_tokenizer": tok.pre_tokenizer,
                "normalizer": tok.normalizer,
                "ignore_merges": tok.ignore_merges,
                **settings,
            },
        )
        return [
            case["text"]
            for case in TOKENIZER_REFERENCE[name]
            if copy.encode(case["text"], allowed_special="all") != case["ids"]
        ]

    assert changed(llama, "llama", ignore_merges=False) == [
        "tokenization tokenization, (tokenization)"
    ]
    assert changed(qwen2, "qwen2", normalizer=()) == ["café naïve Ünïcödé ß e\u0301 \u212b"]
    assert changed(llama, "llama", pre_tokenizer=qwen2.pre_tokenizer)  # \p{N}{1,3} vs \p{N}
    assert changed(smollm2, "smollm2", pre_tokenizer=smollm2.pre_tokenizer[1:])  # no Digits


@pytest.mark.parametrize("name", sorted(DIRECTORIES))
def test_added_token_text_is_ordinary_unless_allowed(tokenizers, name):
    tok = tokenizers[name]
    text = "<|im_start|>user\nHi<|im_end|><|eot_id|><tool_call>"
    ids = tok.encode(text)
    assert not set(ids) & {t.id for t in tok.added_tokens.values()}
    assert tok.decode(ids) == text
    some = sorted(tok.added_tokens)[0]
    assert tok.encode(some, allowed_special={some}) == [tok.added_tokens[some].id]


def test_the_longest_added_token_wins(tokenizers):
    """Hugging Face's matching is leftmost-longest; `tokenizers` 0.23 cut this text into
    ['x', '<a>b', 'c', '<a>b', '<', 'a', '<', 'a'] with these three added tokens."""
    qwen2 = tokenizers["qwen2"]
    extra = [AddedToken(t, 512 + i, special=False) for i, t in enumerate(["<a>", "<a>b", "b<a"])]
    tok = BPETokenizer(
        qwen2.vocab,
        qwen2.merges,
        added_tokens=[*qwen2.added_tokens.values(), *extra],
        pre_tokenizer=qwen2.pre_tokenizer,
    )
    ids = tok.encode("x<a>bc<a>b<a<a", allowed_special="all")
    assert [tok.decode([i]) for i in ids] == ["x", "<a>b", "c", "<a>b", "<", "a", "<", "a"]


def test_streaming_prints_each_character_once_whole(tokenizers):
    """decode_bytes + an incremental UTF-8 decoder: what a chat prints token by token."""
    tok = tokenizers["llama"]
    text = "变换器 🙂👩\u200d💻 ok"
    ids = tok.encode(text)
    assert any("\ufffd" in tok.decode([i]) for i in ids)  # some tokens hold part of a character
    stream = codecs.getincrementaldecoder("utf-8")(errors="replace")
    printed = [stream.decode(tok.decode_bytes([i])) for i in ids]
    assert "".join(printed) == text and "\ufffd" not in "".join(printed)


@settings(max_examples=40, deadline=None)
@given(text=st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40))
def test_decode_inverts_encode(tokenizers, text):
    for name, tok in tokenizers.items():
        ids = tok.encode(text, allowed_special="all")
        expected = unicodedata.normalize("NFC", text) if name == "qwen2" else text
        assert tok.decode(ids) == expected


# --- chat templates ----------------------------------------------------------------------------


def chat_cases():
    return [
        pytest.param(case, id=f"{case['tokenizer']}-{case['template']}-{i}")
        for i, case in enumerate(CHAT_REFERENCE["cases"])
    ]


@pytest.mark.parametrize("case", chat_cases())
def test_chat_templates_render_as_transformers(tokenizers, case):
    tok = tokenizers[case["tokenizer"]]
    other = case["template"] == "with_generation_tag"
    kwargs = dict(
        add_generation_prompt=case["add_generation_prompt"],
        chat_template=CHAT_REFERENCE["with_generation_tag"] if other else None,
        **case["kwargs"],
    )
    if case["error"]:  # the template's raise_exception
        where = "chat template" if other else "tokenizer_config.json: chat_template"
        with pytest.raises(FileFormatError, match=f"{where}: {case['error']}"):
            tok.apply_chat_template(case["messages"], **kwargs)
        return
    assert tok.apply_chat_template(case["messages"], tokenize=False, **kwargs) == case["text"]
    if case["ids"] is not None:
        assert tok.apply_chat_template(case["messages"], **kwargs) == case["ids"]


def test_the_chat_references_cover_what_they_claim():
    cases = CHAT_REFERENCE["cases"]
    prompts = {c["add_generation_prompt"] for c in cases}
    roles = {m["role"] for c in cases for m in c["messages"]}
    assert prompts == {False, True} and roles == {"system", "user", "assistant"}
    assert {c["tokenizer"] for c in cases} == set(DIRECTORIES)
    assert any(c["error"] for c in cases) and any("tools" in c["kwargs"] for c in cases)


def test_llama_template_dates_today_without_date_string(tokenizers):
    messages = [{"role": "user", "content": "Hi"}]
    before = datetime.now().strftime("%d %b %Y")
    text = tokenizers["llama"].apply_chat_template(messages, tokenize=False)
    after = datetime.now().strftime("%d %b %Y")
    assert f"Today Date: {before}\n" in text or f"Today Date: {after}\n" in text


def test_chat_template_errors_are_clear(tokenizers):
    with pytest.raises(ValueError, match="list of dicts"):
        render_chat_template("{{ messages }}", "Hi")
    with pytest.raises(ValueError, match="chat template: line 1: .*endfor"):
        render_chat_template("{% for m in messages %}", [])
    bare = BPETokenizer.train("abc abd", vocab_size=260)
    with pytest.raises(ValueError, match="has no chat template"):
        bare.apply_chat_template([{"role": "user", "content": "x"}])
    with pytest.raises(ValueError, match="access to attribute"):  # sandboxed, as in transformers
        render_chat_template("{{ messages.__class__.__mro__ }}", [])


# --- files --------------------------------------------------------------------------------------


def test_save_and_load_keep_hugging_faces_files(tmp_path, tokenizers):
    for name, tok in tokenizers.items():
        directory = tmp_path / name
        directory.mkdir()
        save_tokenizer(CharTokenizer.from_text("abc"), directory)
        BPETokenizer.train("ab ab", 258).save(directory)  # a stale GPT-2 pair too
        save_tokenizer(tok, directory)
        names = sorted(p.name for p in directory.iterdir())
        assert names == sorted(p.name for p in DIRECTORIES[name].iterdir() if "token" in p.name
                               or p.suffix == ".jinja")  # fmt: skip
        loaded = load_tokenizer(directory)
        text = "<|im_start|>Hello 🙂 变换器 12345<|im_end|>"
        assert loaded.encode(text, allowed_special="all") == tok.encode(text, allowed_special="all")
        assert loaded.chat_template == tok.chat_template is not None
    save_tokenizer(CharTokenizer.from_text("abc"), tmp_path / "llama")
    assert isinstance(load_tokenizer(tmp_path / "llama"), CharTokenizer)
    assert sorted(p.name for p in (tmp_path / "llama").iterdir()) == ["tokenizer.json"]


def edit(tmp_path, change):
    """A copy of the Qwen2 tokenizer directory with change(tokenizer.json data) applied."""
    directory = tmp_path / "tok"
    shutil.copytree(DIRECTORIES["qwen2"], directory)
    path = directory / "tokenizer.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    change(data)
    path.write_text(json.dumps(data), encoding="utf-8")
    return directory


def set_key(*keys, value):
    def change(data):
        for key in keys[:-1]:
            data = data[key]
        data[keys[-1]] = value

    return change


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (set_key("model", "type", value="WordPiece"), r"model.type = \"WordPiece\""),
        (set_key("model", "end_of_word_suffix", value="</w>"), r"model.end_of_word_suffix"),
        (set_key("decoder", value={"type": "Metaspace"}), r"pre_tokenizer = \{\"type\": \"Seq"),
        (set_key("model", "merges", 3, value="q z"), r"model.merges\[3\] 'q z': 'qz' is not in"),
        (set_key("model", "merges", 0, value=["a"]), r"model.merges\[0\] = \['a'\] is not a pair"),
        (set_key("added_tokens", 0, "lstrip", value=True), r"added_tokens\[0\].lstrip"),
        (set_key("normalizer", value={"type": "Lowercase"}), r"normalizer = \{\"type\""),
        (set_key("pre_tokenizer", "pretokenizers", 0, "behavior", value="Removed"), "Isolated"),
        (set_key("pre_tokenizer", "pretokenizers", 1, "add_prefix_space", value=True),
         "add_prefix_space"),
        (set_key("pre_tokenizer", value={"type": "Whitespace"}), "ByteLevel last"),
        (set_key("decoder", value=None), r"decoder = null"),
        (set_key("post_processor", value={"type": "RobertaProcessing"}), "RobertaProcessing"),
        (set_key("model", "vocab", "Ġ", value=None), r"ids must be non-negative integers"),
        (set_key("added_tokens", 1, "id", value="508"), r"added_tokens\[1\] needs a string"),
        (set_key("post_processor", value=[1]), r"post_processor = \[1\] is not supported"),
    ],
)  # fmt: skip
def test_unsupported_or_broken_files_name_the_field(tmp_path, change, message):
    directory = edit(tmp_path, change)
    with pytest.raises(ValueError, match=message) as info:
        BPETokenizer.from_pretrained(directory)
    assert "tokenizer.json" in str(info.value)


def test_invalid_json_names_file_and_line(tmp_path):
    directory = edit(tmp_path, lambda data: None)
    (directory / "tokenizer_config.json").write_text('{\n "a": 1,\n}', encoding="utf-8")
    with pytest.raises(ValueError, match=r"tokenizer_config.json: line 3: not valid JSON"):
        BPETokenizer.from_pretrained(directory)


def test_unknown_allowed_special_lists_a_few_names(tokenizers):
    with pytest.raises(ValueError, match=r"\['<\|nope\|>'\]; this vocabulary has .* and 3 more"):
        tokenizers["llama"].encode("x", allowed_special={"<|nope|>"})
