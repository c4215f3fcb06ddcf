"""The decoder against Hugging Face transformers, on the tiny checkpoints of tests/fixtures/hf
(made once by make_fixtures.py there, in float64 with every float32 cast of transformers pointed
at float64): logits, the loss, every gradient and the greedy tokens of Llama (BF16, GQA, llama3
RoPE, untied), Qwen2 (q/k/v biases, MQA, tied), Mistral (F16, sharded, rope_parameters) and
GPT-2, each loaded by models.from_pretrained as the directory is."""

from pathlib import Path

import numpy as np
import pytest

import models
from models.architectures.gpt import GPT
from models.architectures.llama import Llama

HF = Path(__file__).resolve().parent / "fixtures" / "hf"
FAMILIES = {"llama": Llama, "qwen2": Llama, "mistral": Llama, "gpt2": GPT}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def loaded(request):
    name = request.param
    model = models.from_pretrained(HF / name, dtype=np.float64)
    return name, model, dict(np.load(HF / name / "reference.npz"))


def hf_targets(labels):
    """HF scores logits[:, t] against labels[:, t + 1]; ours against targets[:, t]."""
    targets = np.full_like(labels, -100)
    targets[:, :-1] = labels[:, 1:]
    return targets


def test_the_family_and_settings_come_from_config_json(loaded):
    name, model, ref = loaded
    assert type(model) is FAMILIES[name]
    assert sorted(model.config.eos_token_ids) == sorted(ref["eos_token_ids"].tolist())
    assert all(p.dtype == np.float64 for p in model.parameters())


def test_logits_and_loss_equal_hf_in_float64(loaded):
    _, model, ref = loaded
    logits, loss = model(ref["input_ids"], hf_targets(ref["labels"]))
    np.testing.assert_allclose(logits.data, ref["logits"], rtol=0, atol=1e-12)
    np.testing.assert_allclose(loss.item(), float(ref["loss"]), rtol=1e-13)


def test_every_gradient_equals_hf_in_float64(loaded):
    _, model, ref = loaded
    model.zero_grad()
    _, loss = model(ref["input_ids"], hf_targets(ref["labels"]))
    loss.backward()
    transposed = model.transposed_in_files()
    grads = {key[len("grad:") :]: value for key, value in ref.items() if key.startswith("grad:")}
    ours = dict(model.named_parameters())
    assert sorted(grads) == sorted(ours)  # HF's names, one to one
    for name, expected in grads.items():
        grad = ours[name].grad.T if name in transposed else ours[name].grad
        scale = max(1.0, np.abs(expected).max())
        np.testing.assert_allclose(grad, expected, rtol=0, atol=1e-12 * scale, err_msg=name)


@pytest.mark.parametrize("use_cache", [True, False])
def test_greedy_tokens_equal_hf(loaded, use_cache):
    _, model, ref = loaded
    assert float(ref["greedy_min_margin"]) > 1e-6  # no near-tie for rounding to flip
    prompt = ref["prompt_ids"]
    new = ref["greedy_ids"].shape[1] - prompt.shape[1]
    out = model.generate(prompt, new, temperature=0, eos_id=[], use_cache=use_cache)
    np.testing.assert_array_equal(out, ref["greedy_ids"])


def test_float32_default_and_save_pretrained_round_trip(tmp_path):
    model = models.from_pretrained(HF / "llama")  # BF16 on disk -> float32
    assert model.transformer.wte.weight.dtype == np.float32
    model.save_pretrained(tmp_path)
    again = models.from_pretrained(tmp_path)
    for (name, p), (_, q) in zip(model.named_parameters(), again.named_parameters(), strict=True):
        np.testing.assert_array_equal(p.data, q.data, err_msg=name)
    assert again.config == model.config


# --- the command lines on the fixtures' tokenizers and chat templates ---------------------------


def test_sample_cli_on_every_family(capsys):
    from models.sample import main

    for name in ("llama", "qwen2"):  # the fixtures with a tokenizer
        args = ["--ckpt", str(HF / name), "--prompt", "Hello", "--max-new-tokens", "4"]
        assert main([*args, "--temperature", "0"]) == 0
        assert capsys.readouterr().out.startswith("Hello")


def test_chat_cli_renders_the_template_and_keeps_the_conversation(monkeypatch, capsys):
    from models import chat
    from models.formats.tokenizer import load_tokenizer

    turns = iter(["Hi", "And you?", "/reset", "Hi"])
    seen = []

    def typed(prompt):
        try:
            return next(turns)
        except StopIteration:
            raise EOFError from None

    reply = chat.Chat.reply

    def recorded(self, text):  # what each turn ran: the template's ids, then the reply
        yield from reply(self, text)
        seen.append((list(self.tokens), [dict(m) for m in self.messages]))

    monkeypatch.setattr("builtins.input", typed)
    monkeypatch.setattr(chat.Chat, "reply", recorded)
    args = ["--ckpt", str(HF / "qwen2"), "--temperature", "0", "--max-new-tokens", "6"]
    assert chat.main(args) == 0
    out = capsys.readouterr().out
    assert "(conversation cleared)" in out
    tok = load_tokenizer(HF / "qwen2")
    for tokens, messages in seen:
        rendered = tok.apply_chat_template(messages[:-1], add_generation_prompt=True)
        assert tokens[: len(rendered)] == rendered  # the cache holds the template's ids
    assert seen[0][1] == seen[2][1]  # after /reset the conversation starts anew
    assert [m["role"] for m in seen[1][1]] == ["user", "assistant", "user", "assistant"]
