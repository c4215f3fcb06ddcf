"""The training job: loss falls, determinism, exact resume, Ctrl-C, checkpoint files, sampling."""

import dataclasses
import json
import os
import signal
import time

import numpy as np
import pytest

import nn
from models import sample, train
from models.gpt import GPT
from models.tokenizer import CharTokenizer
from models.train import TRAINER as loop
from models.training.loop import stop_on_interrupt
from models.training.tasks.language import LanguageConfig

TEXT = (
    "def add(a, b):\n    return a + b\n\n"
    "def sub(a, b):\n    return a - b\n\n"
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n\n"
) * 40


@pytest.fixture
def data_file(tmp_path):
    path = tmp_path / "code.txt"
    path.write_text(TEXT, encoding="utf-8")
    return path


def tiny_settings(data_file, out, **overrides):
    settings = {
        "data": str(data_file),
        "out": str(out),
        "steps": 12,
        "batch_size": 8,
        "block_size": 16,
        "n_layer": 1,
        "n_head": 2,
        "n_embd": 16,
        "lr": 1e-2,
        "min_lr": 1e-3,
        "warmup": 3,
        "eval_every": 4,
        "eval_batches": 2,
        "sample_tokens": 0,
    }
    settings.update(overrides)
    return LanguageConfig(**settings)


def test_short_run_loss_falls(data_file, tmp_path):
    settings = tiny_settings(data_file, tmp_path / "run", steps=40, eval_every=20)
    history = loop.train(settings, quiet=True)
    losses = history["loss"]
    assert len(losses) == 40
    assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 1.0
    assert history["eval_val"][-1] < history["eval_val"][0]
    assert history["eval_val"][-1] < history["baseline"]  # this repetitive text is easy


def test_same_seed_gives_bit_identical_losses(data_file, tmp_path):
    a = loop.train(tiny_settings(data_file, tmp_path / "a", eval_every=12), quiet=True)
    b = loop.train(tiny_settings(data_file, tmp_path / "b", eval_every=12), quiet=True)
    assert a["loss"] == b["loss"]
    c = loop.train(tiny_settings(data_file, tmp_path / "c", eval_every=12, seed=7), quiet=True)
    assert c["loss"] != a["loss"]


class _StopAfter:
    """A stop request that is seen at the end of step n (as a Ctrl-C during that step)."""

    def __init__(self, n):
        self.n, self.calls = n, 0

    def is_set(self):
        self.calls += 1
        return self.calls >= self.n

    def set(self):
        self.calls = self.n


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("dropout", [0.0, 0.2])
def test_resume_continues_with_exactly_the_uninterrupted_losses(
    data_file, tmp_path, dropout, compiled
):
    # compiled (the default): every step is a replay, also the first of the resumed run
    full = loop.train(
        tiny_settings(data_file, tmp_path / "full", dropout=dropout), quiet=True, compile=compiled
    )

    # Interrupt after step 6 (not a multiple of eval_every): the stop request is honoured at the
    # next step boundary, as a Ctrl-C is, and the checkpoint is written there.
    settings = tiny_settings(data_file, tmp_path / "cut", dropout=dropout)
    cut = loop.train(settings, quiet=True, stop=_StopAfter(6), compile=compiled)
    assert cut["interrupted"] and len(cut["loss"]) == 6
    assert json.loads((tmp_path / "cut" / "train_state.json").read_text())["step"] == 6

    resumed = loop.train(settings, resume=True, quiet=True, compile=compiled)
    assert resumed["loss"] == full["loss"]  # steps 0-5 from the checkpoint, 6-11 recomputed
    assert resumed["eval_val"] == full["eval_val"]
    a = nn.load_safetensors(tmp_path / "full" / "model.safetensors")[0]
    b = nn.load_safetensors(tmp_path / "cut" / "model.safetensors")[0]
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def test_after_backward_hook_sees_every_parameter_each_step(data_file, tmp_path):
    seen = []
    history = loop.train(
        tiny_settings(data_file, tmp_path / "run", steps=3),
        quiet=True,
        after_backward=lambda params: seen.append(all(p.grad is not None for p in params)),
    )
    assert seen == [True, True, True] and len(history["loss"]) == 3


def test_cli_writes_checkpoint_plot_and_sample(data_file, tmp_path, capsys):
    out = tmp_path / "demo"
    argv = ["--data", str(data_file), "--out", str(out), "--steps", "8", "--batch-size", "4"]
    argv += ["--block-size", "16", "--n-layer", "1", "--n-head", "2", "--n-embd", "16"]
    argv += ["--eval-every", "4", "--eval-batches", "1", "--sample-tokens", "30", "--quiet"]
    assert train.main(argv) == 0
    printed = capsys.readouterr().out
    assert "done: 8 steps" in printed and "unigram baseline" in printed and "--- sample" in printed
    for name in (
        "model.safetensors",
        "config.json",
        "tokenizer.json",
        "optimizer.safetensors",
        "train_state.json",
        "loss.png",
    ):
        assert (out / name).is_file(), name
    assert (out / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    config = json.loads((out / "config.json").read_text())
    assert config["n_positions"] == 16 and config["n_layer"] == 1
    model = GPT.from_pretrained(out)
    assert model.config.vocab_size == CharTokenizer.load(out / "tokenizer.json").vocab_size

    assert sample.main(["--ckpt", str(out), "--prompt", "def ", "--max-new-tokens", "20"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("def ") and len(text.rstrip("\n")) >= 4
    assert sample.main(["--ckpt", str(out), "--prompt", "€"]) == 2
    assert "not in the" in capsys.readouterr().err

    # Resuming the finished run with more steps continues it; a different model is refused.
    assert train.main(["--out", str(out), "--resume", "--steps", "10", "--quiet"]) == 0
    assert json.loads((out / "train_state.json").read_text())["step"] == 10
    with pytest.raises(SystemExit, match="cannot change --n-embd 32"):
        train.main(["--out", str(out), "--resume", "--n-embd", "32", "--quiet"])


def test_resume_detects_a_save_cut_short(data_file, tmp_path):
    settings = tiny_settings(data_file, tmp_path / "run", steps=4)
    loop.train(settings, quiet=True)
    state_path = tmp_path / "run" / "train_state.json"
    state = json.loads(state_path.read_text())
    state["step"] = 8
    state_path.write_text(json.dumps(state))
    with pytest.raises(SystemExit, match="inconsistent"):
        loop.train(dataclasses.replace(settings, steps=10), resume=True, quiet=True)
    with pytest.raises(SystemExit, match="no checkpoint"):
        loop.train(
            dataclasses.replace(settings, out=str(tmp_path / "none")), resume=True, quiet=True
        )


def test_first_ctrl_c_requests_a_stop_second_interrupts():
    before = signal.getsignal(signal.SIGINT)  # (a background job starts with SIGINT ignored)
    with stop_on_interrupt() as stop:
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.wait(5)
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(2)  # the handler runs here at the latest
    assert signal.getsignal(signal.SIGINT) is before


def test_the_command_line_compiles_by_default(data_file, tmp_path):
    parser = loop.build_parser()
    args = ["--data", str(data_file), "--out", str(tmp_path)]
    assert parser.parse_args(args).compile is True
    assert parser.parse_args([*args, "--no-compile"]).compile is False


def test_bad_settings_are_refused(data_file, tmp_path):
    with pytest.raises(SystemExit, match="--steps must be >= 1"):
        train.main(["--data", str(data_file), "--out", str(tmp_path), "--steps", "0"])


def test_compiled_run_follows_the_eager_run(data_file, tmp_path):
    # The default replays the step through autograd.compile (fusion on: the batch sharded over
    # the threads, fused attention): the losses follow --no-compile's within float32 rounding.
    eager = loop.train(tiny_settings(data_file, tmp_path / "eager"), quiet=True, compile=False)
    compiled = loop.train(tiny_settings(data_file, tmp_path / "compiled"), quiet=True)
    assert compiled["compiled"] and not eager.get("compiled")
    np.testing.assert_allclose(compiled["loss"], eager["loss"], rtol=1e-4)
    assert compiled["loss"] != eager["loss"]  # not the same arithmetic: the test can tell
