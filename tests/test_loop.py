"""The one training loop (models/training/loop.py) trains every model kind: the GPT, the encoder
and the encoder-decoder each train a few steps through it, compiled or eager, and a run cut short
and resumed continues bit for bit as the uninterrupted one."""

import json

import numpy as np
import pytest

import nn
from models import encoder, seq2seq, train
from models.architectures.seq2seq import PAD
from models.training.loop import Trainer
from models.training.tasks.digits import DigitTasks
from tests.test_train import _StopAfter as StopAfter

TEXT = "def add(a, b):\n    return a + b\n\nclass Point:\n    x = 1\n    y = 2\n\n" * 30
TINY = ["--steps", "8", "--eval-every", "4", "--n-layer", "1", "--n-head", "2", "--n-embd", "16"]
KINDS = {
    "gpt": (train.TRAINER, ["--batch-size", "4", "--block-size", "16", "--eval-batches", "1"]),
    "encoder": (
        encoder.TRAINER,
        ["--batch-size", "4", "--block-size", "16", "--eval-batches", "2"],
    ),
    # Batches of one source length: seq2seq's padded batches do not compile (see below).
    "seq2seq": (seq2seq.TRAINER, ["--batch-size", "8", "--eval-size", "20", "--bucket"]),
}


@pytest.fixture
def data_file(tmp_path):
    path = tmp_path / "code.txt"
    path.write_text(TEXT, encoding="utf-8")
    return path


def settings(kind, data_file, out, *extra):
    trainer, argv = KINDS[kind]
    argv = [*TINY, *argv, "--out", str(out), "--warmup", "2", *extra]
    if kind != "seq2seq":
        argv += ["--data", str(data_file)]
    if kind == "gpt":
        argv += ["--sample-tokens", "0"]
    return trainer, trainer.resolve_settings(trainer.build_parser().parse_args(argv))


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "eager"])
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_each_kind_trains_and_resumes_bit_exactly(kind, compiled, data_file, tmp_path):
    trainer, full_settings = settings(kind, data_file, tmp_path / "full")
    full = trainer.train(full_settings, quiet=True, compile=compiled)
    assert full["compiled"] is compiled and len(full["loss"]) == 8
    assert full["eval_step"] == [4, 8] and np.isfinite(full["eval_val"]).all()

    # Cut after step 3 (between evaluations): the checkpoint is written at the stop.
    _, cut_settings = settings(kind, data_file, tmp_path / "cut")
    cut = trainer.train(cut_settings, quiet=True, stop=StopAfter(3), compile=compiled)
    assert cut["interrupted"] and len(cut["loss"]) == 3
    assert json.loads((tmp_path / "cut" / "train_state.json").read_text())["step"] == 3

    resumed = trainer.train(cut_settings, resume=True, quiet=True, compile=compiled)
    assert resumed["loss"] == full["loss"]  # steps 0-2 from the checkpoint, 3-7 recomputed
    metrics = [k for k in full if k.startswith("eval_")]
    assert len(metrics) >= 2 and all(resumed[k] == full[k] for k in metrics)
    a = nn.load_safetensors(tmp_path / "full" / "model.safetensors")[0]
    b = nn.load_safetensors(tmp_path / "cut" / "model.safetensors")[0]
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    assert (tmp_path / "cut" / "loss.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("kind", ["encoder", "seq2seq"])
def test_compiled_steps_follow_the_eager_ones(kind, data_file, tmp_path):
    trainer, s = settings(kind, data_file, None)
    s.out = None  # nothing written
    eager = trainer.train(s, quiet=True, compile=False)
    compiled = trainer.train(s, quiet=True)
    assert compiled["compiled"] and not eager["compiled"]
    np.testing.assert_allclose(compiled["loss"], eager["loss"], rtol=1e-4)
    assert not (tmp_path / "None").exists()


def test_padded_seq2seq_batches_compile_with_each_batchs_own_mask(tmp_path):
    # Without --bucket a batch mixes source lengths, so it is padded. Its padding mask travels in
    # the batch (models.architectures.seq2seq.source_keys) as a step argument, so each replay
    # masks its own batch's padding; a mask computed inside the step would be a constant of the
    # first trace.
    trainer, s = settings("seq2seq", None, tmp_path / "run", "--steps", "6", "--dtype", "float64")
    s.bucket, s.eval_every = False, 100
    data = trainer.task.prepare(s, None)
    batches = [trainer.task.batch(s, data, step, 0, 1) for step in range(6)]
    assert all((b[0] == PAD).any() for b in batches)
    assert len({b[0].shape for b in batches}) < 6  # some shapes come back: those steps replay
    eager = trainer.train(s, quiet=True, compile=False)
    compiled = trainer.train(s, quiet=True)
    assert compiled["compiled"] and not eager["compiled"]
    np.testing.assert_allclose(compiled["loss"], eager["loss"], rtol=1e-12)


def test_resume_refuses_another_kinds_run(data_file, tmp_path):
    trainer, s = settings("encoder", data_file, tmp_path / "run", "--steps", "2")
    trainer.train(s, quiet=True)
    argv = ["--out", str(tmp_path / "run"), "--resume"]
    with pytest.raises(SystemExit, match="holds a run of `python -m models.encoder`"):
        train.TRAINER.resolve_settings(train.TRAINER.build_parser().parse_args(argv))


def test_the_three_commands_write_checkpoints_and_resume(data_file, tmp_path, capsys):
    out = tmp_path / "s2s"
    argv = ["--task", "sort", "--steps", "4", "--batch-size", "8", "--n-layer", "1"]
    argv += ["--n-embd", "16", "--eval-size", "10", "--quiet", "--out", str(out)]
    assert seq2seq.main(argv) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("done: 4 steps") and printed[1].startswith("e.g. ")
    assert seq2seq.main(["--out", str(out), "--resume", "--steps", "6", "--quiet"]) == 0
    assert json.loads((out / "train_state.json").read_text())["step"] == 6
    with pytest.raises(SystemExit, match="cannot change --task 'add'"):
        seq2seq.main(["--out", str(out), "--resume", "--task", "add"])


def test_fused_plans_of_several_batch_shapes_resume_bit_exactly(tmp_path):
    # With fusion each new batch shape's plan moves the parameters into its own flat buffer, so
    # the previous shape's plan traces again when its shape comes back: that call too must be
    # traced, undone and replayed, not left as the traced (eager) step.
    task = DigitTasks()
    task.fusion = True
    trainer = Trainer(task)
    _, full_settings = settings("seq2seq", None, tmp_path / "full")
    full = trainer.train(full_settings, quiet=True)
    _, cut_settings = settings("seq2seq", None, tmp_path / "cut")
    trainer.train(cut_settings, quiet=True, stop=StopAfter(3))
    resumed = trainer.train(cut_settings, resume=True, quiet=True)
    assert resumed["loss"] == full["loss"]
    a = nn.load_safetensors(tmp_path / "full" / "model.safetensors")[0]
    b = nn.load_safetensors(tmp_path / "cut" / "model.safetensors")[0]
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_each_rank_takes_its_rows_of_the_one_global_batch(kind, data_file, tmp_path):
    # --ddp: rank r of n takes rows r, r + n, ... of what one process draws, every array alike
    # (the encoder's masks and targets too), so the ranks together train on the same batch.
    trainer, s = settings(kind, data_file, tmp_path)
    data = trainer.task.prepare(s, None)
    whole = trainer.task.batch(s, data, 5, 0, 1)
    for rank in range(2):
        part = trainer.task.batch(s, data, 5, rank, 2)
        assert len(part) == len(whole)
        for mine, all_rows in zip(part, whole, strict=True):
            np.testing.assert_array_equal(mine, all_rows[rank::2])
