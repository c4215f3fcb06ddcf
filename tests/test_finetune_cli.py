"""python -m models.train as a fine-tuning job: --init-from, --freeze, --lora-*, --grad-accum,
and python -m models.lora merge on what a LoRA run saved (docs/finetune.md)."""

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

import models
import nn
from benchmarks import finetune as bench
from models import finetune_demo, sample
from models import lora as models_lora
from models.architectures.gpt import GPT
from models.formats.tokenizer import load_tokenizer
from models.train import LANGUAGE, TRAINER
from models.training import chat_data
from models.training.sft import chat_format, chatml, conversation_segments

FIXTURES = Path(__file__).parent / "fixtures" / "hf"

TEXT = (
    "def add(a, b):\n    return a + b\n\n"
    "def sub(a, b):\n    return a - b\n\n"
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n\n"
) * 40 + chatml(chat_data.conversation("a.f", "f(x)"))  # every character a chat needs
TINY = ["--steps", "6", "--batch-size", "4", "--block-size", "16", "--eval-every", "3"]
TINY += ["--eval-batches", "1", "--sample-tokens", "0", "--dtype", "float64", "--lr", "1e-2"]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A trained GPT-2-format directory (model, config, tokenizer) to fine-tune, and the text."""
    root = tmp_path_factory.mktemp("finetune")
    data = root / "code.txt"
    data.write_text(TEXT, encoding="utf-8")
    argv = ["--out", str(root / "base"), "--data", str(data), *TINY, "--quiet"]
    assert TRAINER.main([*argv, "--n-layer", "2", "--n-head", "2", "--n-embd", "16"]) == 0
    return root / "base", data


def _settings(argv):
    return TRAINER.resolve_settings(TRAINER.build_parser().parse_args(argv))


def _fit(argv, **options):
    return TRAINER.fit(_settings(argv), quiet=True, **options)


class StopAfter:
    """A stop request that arrives after n steps (as Ctrl-C would)."""

    def __init__(self, n):
        self.n, self.calls = n, 0

    def is_set(self):
        self.calls += 1
        return self.calls >= self.n


def test_init_from_takes_the_checkpoints_shape_and_starts_from_its_weights(base):
    directory, data = base
    argv = ["--init-from", str(directory), "--data", str(data), *TINY, "--out", ""]
    settings = _settings(argv)
    assert (settings.n_layer, settings.n_head, settings.n_embd) == (2, 2, 16)
    settings.out = None
    model, history = TRAINER.fit(settings, quiet=True)
    assert (model.config.n_layer, model.config.n_embd) == (2, 16)  # not the defaults 4, 128
    x, y = LANGUAGE.batch(settings, LANGUAGE.prepare(settings, directory), 0, 0, 1)
    start = GPT.from_pretrained(directory, dtype=np.float64)(x, y)[1].item()
    assert abs(history["loss"][0] - start) <= 1e-12 * start  # step 0: the checkpoint's model
    with pytest.raises(SystemExit, match=r"shape \(n_layer 2\); cannot change --n-layer 4"):
        _settings([*argv, "--n-layer", "4"])
    with pytest.raises(SystemExit, match="exceeds the 16 positions"):
        _settings([*argv, "--block-size", "17"])
    with pytest.raises(SystemExit, match="--lora-rank adapts a trained model"):
        _settings(["--data", str(data), *TINY, "--lora-rank", "2"])


def test_freeze_leaves_the_frozen_parameters_as_they_were(base, tmp_path):
    directory, data = base
    argv = ["--init-from", str(directory), "--data", str(data), *TINY, "--out", str(tmp_path)]
    model, _ = _fit([*argv, "--freeze", "transformer.h.0.*,transformer.wte.weight"])
    start = dict(GPT.from_pretrained(directory, dtype=np.float64).named_parameters())
    for name, p in model.named_parameters():
        frozen = name.startswith("transformer.h.0.") or name == "transformer.wte.weight"
        assert np.array_equal(p.data, start[name].data) == frozen, name
        assert p.requires_grad != frozen
    with pytest.raises(SystemExit, match="--freeze: .*no parameter name matches"):
        _fit([*argv, "--freeze", "h.0.*"])


def test_lora_run_saves_the_adapter_alone_resumes_exactly_and_merges(base, tmp_path):
    directory, data = base
    argv = ["--init-from", str(directory), "--data", str(data), *TINY]
    argv += ["--lora-rank", "2", "--lora-alpha", "4"]
    model, history = _fit([*argv, "--out", str(tmp_path / "whole")])
    out = tmp_path / "whole"
    assert sorted(p.name for p in out.iterdir()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
        "loss.png",
        "optimizer.safetensors",
        "train_state.json",
    ]
    assert nn.lora.read_adapter_config(out)["base_model"] == str(directory)
    # c_attn (16 -> 48) and attn.c_proj (16 -> 16) of 2 layers, rank 2
    assert model.parameter_counts()[0] == 2 * 2 * ((16 + 48) + (16 + 16))
    # interrupted after 2 steps, then resumed: the uninterrupted run's losses
    half = [*argv, "--out", str(tmp_path / "half")]
    _, first = _fit(half, stop=StopAfter(2))
    assert first["interrupted"] and len(first["loss"]) == 2
    resumed_model, resumed = TRAINER.fit(_settings([*half, "--resume"]), resume=True, quiet=True)
    assert resumed["loss"] == history["loss"]
    # merged: a plain GPT-2 directory with the same logits
    merge = ["merge", "--base", str(directory), "--adapter", str(out), "--dtype", "float64"]
    merge += ["--out"]
    assert models_lora.main([*merge, str(tmp_path / "merged")]) == 0
    merged = GPT.from_pretrained(tmp_path / "merged", dtype=np.float64)
    x = np.arange(16)[None] % 10
    np.testing.assert_allclose(merged(x)[0].data, model(x)[0].data, rtol=1e-10, atol=1e-12)
    # the run's directory itself loads for sampling and chat: its base with the adapter folded
    # in (float32, as models.lora merge's float32 output), then quantized if asked
    folded, tokenizer = sample.load(out)
    assert not nn.lora.lora_modules(folded)
    np.testing.assert_allclose(folded(x)[0].data, model(x)[0].data, rtol=1e-4, atol=1e-5)
    assert list(tokenizer.encode(TEXT[:40])) == list(load_tokenizer(directory).encode(TEXT[:40]))
    with pytest.raises(ValueError, match="quantize_linears: layer .* multiple of 32"):
        sample.load(out, quantize="q8_0")  # quantized after the folding: this model is too small
    with pytest.raises(ValueError, match="cannot be folded into"):
        sample.load(out, quantize="gguf")


def test_an_adapter_names_its_base_by_a_path_that_holds_from_anywhere(base, tmp_path, monkeypatch):
    directory, data = base
    monkeypatch.chdir(directory.parent)  # --init-from given relative to here
    argv = ["--init-from", directory.name, "--data", str(data), *TINY, "--steps", "1"]
    _fit([*argv, "--lora-rank", "2", "--out", str(tmp_path / "run")])
    assert nn.lora.read_adapter_config(tmp_path / "run")["base_model"] == str(directory)
    monkeypatch.chdir(tmp_path)
    assert sample.load(tmp_path / "run")[0].config == GPT.from_pretrained(directory).config


@pytest.mark.parametrize("compile", [False, True])
def test_grad_accum_gives_the_update_of_one_larger_batch(base, compile, monkeypatch):
    directory, data = base
    argv = ["--init-from", str(directory), "--data", str(data), *TINY, "--out", ""]
    runs, rows_seen = [], []
    loss = LANGUAGE.loss
    monkeypatch.setattr(LANGUAGE, "loss", lambda m, *b: rows_seen.append(len(b[0])) or loss(m, *b))
    for rows, micro in (("4", "1"), ("2", "2")):
        settings = _settings([*argv, "--batch-size", rows, "--grad-accum", micro])
        settings.out = None
        rows_seen.clear()
        runs.append(TRAINER.fit(settings, quiet=True, compile=compile))
        assert set(rows_seen) == {int(rows)}  # the forward sees micro-batches of --batch-size
    (one, h1), (accumulated, h2) = runs
    np.testing.assert_allclose(h2["loss"], h1["loss"], rtol=1e-12)
    # over all parameters at once: the key bias's gradient is 0 up to rounding (a softmax ignores
    # a shift of its logits), so Adam's steps there are rounding noise of the two summation orders
    a = np.concatenate([p.data.ravel() for p in accumulated.parameters()])
    b = np.concatenate([p.data.ravel() for p in one.parameters()])
    assert np.linalg.norm(a - b) <= 1e-12 * np.linalg.norm(b)


def test_the_real_model_demo_refuses_a_path_that_is_no_model_before_writing(tmp_path):
    with pytest.raises(SystemExit, match=r"^finetune_demo --real: --model .*nothing does not"):
        finetune_demo.main(
            ["--real", "--model", str(tmp_path / "nothing"), "--out", str(tmp_path / "o")]
        )
    assert not (tmp_path / "o").exists()


def test_sft_trains_the_assistant_tokens_only_and_the_demo_moves_the_held_out_metric(
    tmp_path, capsys
):
    assert finetune_demo.main(["--quick", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    rows = {
        line.split("|")[1].strip(): float(line.split("|")[2])
        for line in printed.splitlines()
        if line.startswith("| ") and line.split("|")[2].strip()[:1].isdigit()
    }
    assert rows["LoRA r 8"] < rows["pretrained"] and rows["full"] < rows["pretrained"] - 0.5
    assert "432 training conversations, 48 held-out functions" in printed
    assert json.loads((tmp_path / "base" / "config.json").read_text())["model_type"] == "llama"
    assert sorted(p.name for p in (tmp_path / "lora").iterdir())[:2] == [
        "adapter_config.json",
        "adapter_model.safetensors",
    ]


def _lora_on_sums(base, out):
    """Two float64 LoRA r 2 steps of --sft on a dozen sums ("2+2?" -> "4") from base into out."""
    chats = out.parent / "chats.jsonl"
    pairs = [("2+2?", "4"), ("3+3?", "6"), ("1+1?", "2"), ("4+4?", "8")] * 3
    chat_data.write_jsonl(chats, [chat_data.conversation(q, a) for q, a in pairs])
    argv = ["--init-from", str(base), "--sft", str(chats), "--lora-rank", "2", "--out", str(out)]
    return _fit([*argv, "--steps", "2", "--batch-size", "2", "--dtype", "float64"])


def test_a_hugging_face_llama_family_directory_fine_tunes_with_its_chat_template(tmp_path):
    """Qwen2's tiny checkpoint (tests/fixtures/hf): its tokenizer, its ChatML template with
    <|im_start|> / <|im_end|> as single tokens, LoRA on q/k/v/o_proj, merged and read back by
    models.from_pretrained with the logits of base + adapter."""
    qwen = FIXTURES / "qwen2"
    out = tmp_path / "lora"
    model, history = _lora_on_sums(qwen, out)
    assert nn.lora.read_adapter_config(out)["target_modules"][:4] == [
        f"model.layers.0.self_attn.{p}" for p in ("q_proj", "k_proj", "v_proj", "o_proj")
    ]
    tokenizer = load_tokenizer(qwen)
    segments = conversation_segments(chat_data.conversation("2+2?", "4"), chat_format(tokenizer)[0])
    assert [text for text, trained in segments if trained] == ["4<|im_end|>\n"]
    merge = ["merge", "--base", str(qwen), "--adapter", str(out), "--dtype", "float64"]
    assert models_lora.main([*merge, "--out", str(tmp_path / "merged")]) == 0
    merged = models.from_pretrained(tmp_path / "merged", dtype=np.float64)
    x = np.arange(12)[None]
    np.testing.assert_allclose(merged(x)[0].data, model(x)[0].data, rtol=1e-10, atol=1e-12)


CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_a_gguf_file_fine_tunes_with_lora_and_merges_into_a_directory(tmp_path):
    """--init-from a .gguf file (a tiny llama with SmolLM2's tokenizer pipeline and a ChatML
    template in its metadata, written by gguf's writer): LoRA trains, and models.lora merge
    writes a Hugging Face directory (config, weights, tokenizer.json + template) whose logits
    are base + adapter's and whose tokenizer is the file's."""
    pytest.importorskip("gguf")
    from models.formats.tokenizer import BPETokenizer

    base = _tiny_chat_gguf(tmp_path / "tiny.gguf")
    out = tmp_path / "lora"
    model, history = _lora_on_sums(base, out)
    assert len(history["loss"]) == 2 and np.isfinite(history["loss"]).all()
    merge = ["merge", "--base", str(base), "--adapter", str(out), "--dtype", "float64"]
    assert models_lora.main([*merge, "--out", str(tmp_path / "merged")]) == 0
    merged = models.from_pretrained(tmp_path / "merged", dtype=np.float64)
    x = np.arange(12)[None]
    np.testing.assert_allclose(merged(x)[0].data, model(x)[0].data, rtol=1e-10, atol=1e-12)
    base_logits = models.from_pretrained(base, dtype=np.float64)(x)[0].data
    assert np.abs(merged(x)[0].data - base_logits).max() > 1e-6  # the adapter did something
    written, original = (BPETokenizer.from_pretrained(p) for p in (tmp_path / "merged", base))
    text = "a = 12345 + f(x)  # Ünïcode"
    assert written.encode(text) == original.encode(text)
    assert written.chat_template == CHATML


def _tiny_chat_gguf(path):
    """A tiny Q8_0 llama GGUF file with SmolLM2's tokenizer pipeline and a ChatML template in its
    metadata (written by gguf's writer); returns its path."""
    from models.formats.gguf import read_metadata

    make = _load_script(Path(__file__).parent / "fixtures" / "gguf" / "make_fixtures.py")
    tokenizer_file = Path(__file__).parent / "fixtures" / "tokenizers" / "gguf" / "smollm.gguf"
    meta = read_metadata(tokenizer_file)
    keys = ("tokens", "token_type", "merges", "pre", "bos_token_id", "eos_token_id")
    tokenizer_keys = {f"tokenizer.ggml.{k}": meta[f"tokenizer.ggml.{k}"] for k in keys}
    vocab = len(meta["tokenizer.ggml.tokens"])
    make.write_llama(
        path,
        "Q8_0",
        size=dict(make.SMALL, vocab=vocab),
        metadata={**tokenizer_keys, "tokenizer.chat_template": CHATML, "llama.context_length": 256},
    )
    return path


def _load_script(path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_fine_tuning_benchmark_worker_runs_both_modes_on_a_tiny_llama():
    for mode, trainable in (("full", 51_360), ("lora", 2 * 8 * (2 * (32 + 32) + 2 * (32 + 16)))):
        result = bench.worker_glassgrad(str(FIXTURES / "llama"), mode, 2, 8, 1, 2)
        assert (result["trainable"], len(result["times"]), len(result["warmup_s"])) == (
            trainable,
            1,
            2,
        )
        assert np.isfinite(result["loss0"]) and result["step_s"] > 0


def test_sft_refuses_a_conversation_the_model_cannot_hold(base, tmp_path):
    directory, _ = base
    chats = tmp_path / "chats.jsonl"
    chat_data.write_jsonl(chats, [chat_data.conversation("a.f", "f(x)")] * 4)
    argv = ["--init-from", str(directory), "--sft", str(chats), "--steps", "1", "--out", ""]
    with pytest.raises(SystemExit, match=r"tokens long, more than the model's 16 positions"):
        _fit(argv)
    with pytest.raises(SystemExit, match="--sft and --data are two kinds of data"):
        _settings([*argv, "--data", str(chats)])
    chat_data.write_jsonl(chats, [chat_data.conversation("a.f", "f(\u00e9)")] * 4)
    with pytest.raises(SystemExit, match=r"chats.jsonl: CharTokenizer.encode: 1 character"):
        _fit(argv)


def test_bad_data_files_are_one_line_errors_naming_the_flag(base, tmp_path):
    """The command line's data, refused as `train: --data ...` / `train: --sft ...` (SystemExit,
    which the CLI prints as one line), not a traceback: missing, a directory, empty, not a
    conversation, too short for one training window."""
    directory, text = base
    (tmp_path / "empty.txt").write_text("", encoding="utf-8")
    (tmp_path / "short.txt").write_text("ab", encoding="utf-8")
    window = text.read_text(encoding="utf-8")[:30]  # the base's characters; val: 3 < 16 + 1
    (tmp_path / "window.txt").write_text(window, encoding="utf-8")
    (tmp_path / "chats.jsonl").write_text('{"text": "no messages"}\n', encoding="utf-8")
    fine_tune = ["--init-from", str(directory), "--steps", "1", "--out", ""]
    for argv, message in (
        (["--data", str(tmp_path / "missing.txt")], r"^train: --data .*: no such file: .*missing"),
        (["--data", str(tmp_path)], r"^train: --data .*: .* is a directory, not a text file$"),
        (["--data", str(tmp_path / "empty.txt")], r"^train: --data .*: .*empty.txt is empty$"),
        (["--data", str(tmp_path / "short.txt")], r"^train: --data .*short.txt: .*too few"),
        (["--data", str(tmp_path / "window.txt")], r"^train: --data .*window.txt: .*window needs"),
        (["--sft", str(tmp_path / "missing.jsonl")], r"^train: --sft: .*No such file"),
        (["--sft", str(tmp_path / "chats.jsonl")], r"^train: --sft: .*chats.jsonl:1: expected"),
    ):
        with pytest.raises(SystemExit, match=message):
            _fit([*fine_tune, *argv])


def test_lora_on_a_quantized_base_trains_resumes_and_merges_into_the_float_base(tmp_path):
    """--quantize gguf keeps a Q8_0 file's blocks frozen (QLoRA): only the adapters train, a
    resumed run repeats the uninterrupted one's losses, and the adapter merged into the float
    base (the same file dequantized) gives the trained model's logits; --quantize q8_0 trains
    too, and --quantize without --lora-rank is refused."""
    pytest.importorskip("gguf")
    base = _tiny_chat_gguf(tmp_path / "tiny.gguf")
    chats = tmp_path / "chats.jsonl"
    pairs = [("2+2?", "4"), ("3+3?", "6"), ("1+1?", "2"), ("4+4?", "8")] * 3
    chat_data.write_jsonl(chats, [chat_data.conversation(q, a) for q, a in pairs])
    argv = ["--init-from", str(base), "--sft", str(chats), "--lora-rank", "2"]
    argv += ["--steps", "4", "--batch-size", "2", "--dtype", "float64", "--eval-every", "2"]
    argv += ["--quantize", "gguf"]
    model, history = _fit([*argv, "--out", str(tmp_path / "whole")])
    quantized = [m for m in model.modules() if isinstance(m, nn.QuantizedLinear)]
    assert quantized and all(m.weight.format == "q8_0" for m in quantized)
    assert len(history["loss"]) == 4 and history["loss"][-1] < history["loss"][0]
    half = [*argv, "--out", str(tmp_path / "half")]
    _, first = _fit(half, stop=StopAfter(2))
    assert first["interrupted"] and len(first["loss"]) == 2
    _, resumed = TRAINER.fit(_settings([*half, "--resume"]), resume=True, quiet=True)
    assert resumed["loss"] == history["loss"]
    merge = ["merge", "--base", str(base), "--adapter", str(tmp_path / "whole"), "--dtype"]
    assert models_lora.main([*merge, "float64", "--out", str(tmp_path / "merged")]) == 0
    merged = models.from_pretrained(tmp_path / "merged", dtype=np.float64)
    x = np.arange(12)[None]
    np.testing.assert_allclose(merged(x)[0].data, model(x)[0].data, rtol=1e-10, atol=1e-10)
    q8 = [a if a != "gguf" else "q8_0" for a in argv]
    _, history_q8 = _fit([*q8, "--out", str(tmp_path / "q8")])
    assert np.isfinite(history_q8["loss"]).all()
    with pytest.raises(SystemExit, match="--quantize freezes the base"):
        _settings(["--init-from", str(base), "--sft", str(chats), "--quantize", "q8_0"])
