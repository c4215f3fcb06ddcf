"""Data-parallel training (models.ddp): 2 MPI ranks equal 1 process; faults stop the job; resume.

The multi-rank tests run `mpiexec -n 2 python -m models.train --ddp ...` as a subprocess, with
the mpiexec of the mpich wheel that the test extra installs (beside this interpreter, found by
models.ddp.find_mpiexec). They are
skipped, with the reason, only where mpi4py or an mpiexec cannot be found. Every subprocess has a
timeout, so a hang fails the test instead of hanging CI.
"""

import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

import nn
from models import ddp
from models.gpt import GPT, GPTConfig
from models.train import TRAINER as loop
from models.training.tasks.language import LanguageConfig

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 90
TEXT = (
    "def add(a, b):\n    return a + b\n\n"
    "def sub(a, b):\n    return a - b\n\n"
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n\n"
) * 40
# Tiny float64 run without dropout: 2 ranks must reproduce 1 process up to rounding.
STEPS = 6
SETTINGS = {
    "steps": STEPS,
    "batch_size": 8,
    "block_size": 16,
    "n_layer": 1,
    "n_head": 2,
    "n_embd": 16,
    "lr": 1e-2,
    "min_lr": 1e-3,
    "warmup": 2,
    "eval_every": 3,
    "eval_batches": 2,
    "sample_tokens": 0,
    "dtype": "float64",
}


def run_mpi(
    n: int, args: list[str], env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """`mpiexec -n n python args` from the repo root, killed (with all its ranks) on timeout."""
    command = [*ddp.mpiexec_command(n), sys.executable, *args]
    full_env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        # One thread per rank: 2 ranks share 2 cores with other tests.
        "OPENBLAS_NUM_THREADS": "1",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "NUMBA_NUM_THREADS": "1",
        **(env or {}),
    }
    proc = subprocess.Popen(
        command,
        cwd=ROOT,
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, so a timeout kills every rank
    )
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{' '.join(command)} hung for {TIMEOUT_S} s\nstdout:\n{out}\nstderr:\n{err}")
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


# One write per rank: the two ranks' output lines may interleave, never a single write.
PROBE = (
    "import sys; from mpi4py import MPI; c = MPI.COMM_WORLD; "
    "sys.stdout.write(f'<rank {c.Get_rank()} of {c.Get_size()}>\\n')"
)


@pytest.fixture(scope="module")
def mpi():
    if importlib.util.find_spec("mpi4py") is None:
        pytest.skip('mpi4py is not installed (pip install "glassgrad[mpi]")')
    if ddp.find_mpiexec() is None:
        pytest.skip(f"no mpiexec beside {sys.executable} or on PATH (the mpich wheel has one)")
    probe = run_mpi(2, ["-c", PROBE])
    ranks = sorted(re.findall(r"<rank (\d) of (\d)>", probe.stdout))
    assert probe.returncode == 0 and ranks == [("0", "2"), ("1", "2")], (
        f"MPI is installed but `mpiexec -n 2` does not start 2 ranks:\n{probe.stdout}\n"
        f"{probe.stderr}"
    )
    return run_mpi


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("ddp_data") / "code.txt"
    path.write_text(TEXT, encoding="utf-8")
    return path


def cli_args(data_file: Path, out: Path, **overrides) -> list[str]:
    settings = {**SETTINGS, **overrides, "data": str(data_file), "out": str(out)}
    args = ["-m", "models.train", "--ddp", "--quiet"]
    for key, value in settings.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    return args


def saved(out: Path) -> tuple[list[float], dict[str, np.ndarray]]:
    history = json.loads((out / "train_state.json").read_text())["history"]
    params, _ = nn.load_safetensors(out / "model.safetensors")
    return history["loss"], params


def assert_close(a: dict[str, np.ndarray], b: dict[str, np.ndarray], rtol: float) -> None:
    assert a.keys() == b.keys()
    for name in a:
        scale = np.max(np.abs(b[name]))
        err = np.max(np.abs(a[name] - b[name])) / scale
        assert err <= rtol, f"{name}: relative difference {err:.2e} > {rtol:.0e}"


@pytest.fixture(scope="module")
def two_rank_run(mpi, data_file, tmp_path_factory):
    """The uninterrupted 2-rank run: its checkpoint directory."""
    out = tmp_path_factory.mktemp("ddp") / "two"
    result = mpi(2, cli_args(data_file, out))
    assert result.returncode == 0, result.stderr
    assert "on 2 ranks" in result.stdout  # rank 0 printed the summary, once
    assert result.stdout.count("done:") == 1
    return out


def test_two_ranks_equal_one_process(two_rank_run, data_file, tmp_path):
    reference = loop.train(
        LanguageConfig(**SETTINGS, data=str(data_file), out=str(tmp_path / "one")),
        quiet=True,
    )
    losses, params = saved(two_rank_run)
    assert len(losses) == STEPS
    np.testing.assert_allclose(losses, reference["loss"], rtol=1e-12, atol=0)
    # Rounding differs (two half-batch means averaged vs one mean), so not bit-identical; AdamW
    # steps amplify that a little, still far below any real difference (~1e-3 per step).
    assert_close(params, saved(tmp_path / "one")[1], rtol=1e-11)


def test_failing_rank_stops_the_job_and_every_rank_resumes(mpi, two_rank_run, data_file, tmp_path):
    out = tmp_path / "failed"
    # Rank 1 fails before step 4; rank 0 had saved step 3 before it could reach step 4's Allreduce.
    result = mpi(2, cli_args(data_file, out), env={ddp.FAIL_ENV: "1:4"})
    assert result.returncode != 0
    assert "ddp: rank 1 of 2 failed" in result.stderr
    assert "RuntimeError: injected failure on rank 1 at step 4" in result.stderr
    assert json.loads((out / "train_state.json").read_text())["step"] == 3

    # A checkpoint of a 2-rank run also resumes in one process (the global batch is the same).
    single = tmp_path / "single"
    shutil.copytree(out, single)
    history = loop.train(
        loop.resolve_settings(loop.build_parser().parse_args(["--out", str(single), "--resume"])),
        resume=True,
        quiet=True,
    )
    full_losses, full_params = saved(two_rank_run)
    np.testing.assert_allclose(history["loss"], full_losses, rtol=1e-12, atol=0)

    resumed = mpi(2, ["-m", "models.train", "--ddp", "--quiet", "--out", str(out), "--resume"])
    assert resumed.returncode == 0, resumed.stderr
    losses, params = saved(out)
    assert losses == full_losses  # same ranks, same operations: bit-identical
    for name, value in params.items():
        np.testing.assert_array_equal(value, full_params[name], err_msg=name)


def test_usage_error_on_all_ranks_stops_the_job(mpi, data_file, tmp_path):
    result = mpi(2, cli_args(data_file, tmp_path / "odd", batch_size=5))
    assert result.returncode != 0
    assert "--batch-size 5 must be divisible by the number of ranks 2" in result.stderr


def test_benchmark_reports_tokens_per_s_and_scaling(mpi):
    from benchmarks import ddp as bench
    from benchmarks.configs import STANDARD

    ctx = types.SimpleNamespace(quick=True, reps=1, log=lambda msg: None)
    [record] = bench.ddp_suite(ctx, STANDARD["tiny"])
    one, two = record["variants"]["1 rank"], record["variants"]["2 ranks"]
    assert one["tokens_per_s"] > 0 and two["tokens_per_s"] > 0
    efficiency = two["tokens_per_s"] / (2 * one["tokens_per_s"])
    assert record["ratios"]["scaling_efficiency"] == pytest.approx(efficiency)
    assert record["params"]["allreduce_bytes"] == 4 * (record["params"]["n_params"] + 2)
    assert "| 2 | " in bench.text_report({**record["params"], "ranks": {"1": one, "2": two}})


# --- in-process pieces, with a stand-in communicator -------------------------------------------


class FakeComm:
    """Rank 0 of a 2-rank world whose other rank contributes `other` to every Allreduce."""

    def __init__(self, other: np.ndarray | None = None, gathered: list | None = None) -> None:
        self.other, self.gathered, self.calls = other, gathered, []

    def Get_rank(self) -> int:
        return 0

    def Get_size(self) -> int:
        return 2

    def Allreduce(self, sendbuf, recvbuf, op) -> None:
        assert sendbuf is FAKE_MPI.IN_PLACE and op is FAKE_MPI.SUM
        self.calls.append(recvbuf.size)
        recvbuf += self.other

    def allgather(self, obj):
        return [obj, *self.gathered]


FAKE_MPI = types.SimpleNamespace(IN_PLACE=object(), SUM=object())


def tiny_model(seed: int = 0) -> tuple[GPT, nn.optim.AdamW]:
    model = GPT(
        GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=8),
        rng=np.random.default_rng(seed),
    )
    return model, nn.optim.AdamW(model.parameters(), lr=1e-2)


def test_one_allreduce_per_step_averages_grads_loss_and_stop_flag(monkeypatch, float64):
    monkeypatch.setattr(ddp, "_mpi", lambda: FAKE_MPI)
    model, _ = tiny_model()
    params = list(model.parameters())
    rng = np.random.default_rng(1)
    for p in params:
        p.grad = rng.standard_normal(p.shape)
    mine = [p.grad.copy() for p in params]
    n = sum(p.data.size for p in params)
    other = rng.standard_normal(n + 2)
    other[-2:] = [3.0, 1.0]  # the other rank's loss, and it asks to stop
    comm = FakeComm(other)
    reducer = ddp.GradientAllreduce(comm, params)
    loss, stop = reducer(1.0, stop=False)
    assert comm.calls == [n + 2]  # one call, one flat buffer: all gradients + loss + flag
    assert loss == 2.0 and stop
    offset = 0
    for p, g in zip(params, mine, strict=True):
        expected = (g + other[offset : offset + g.size].reshape(g.shape)) / 2
        np.testing.assert_allclose(p.grad, expected, rtol=1e-15)
        offset += g.size
    assert reducer.nbytes == (n + 2) * 8


def test_replicas_that_differ_are_named(float64):
    model, optimizer = tiny_model()
    settings = {"seed": 0}
    mine = ddp.fingerprint(model, optimizer, settings)
    assert ddp.fingerprint(*tiny_model(), settings) == mine  # same seed: same replica
    ddp.check_replicas(FakeComm(gathered=[mine]), mine)

    other = ddp.fingerprint(*tiny_model(seed=1), settings)
    with pytest.raises(RuntimeError, match=r"replicas differ.*rank 1: param_sum"):
        ddp.check_replicas(FakeComm(gathered=[other]), mine)
    changed = ddp.fingerprint(model, optimizer, {"seed": 1})
    with pytest.raises(RuntimeError, match=r"rank 1: settings_crc"):
        ddp.check_replicas(FakeComm(gathered=[changed]), mine)


def test_dropout_is_refused_with_ddp(data_file, tmp_path):
    settings = LanguageConfig(**SETTINGS, data=str(data_file), out=str(tmp_path), dropout=0.1)
    with pytest.raises(SystemExit, match="--dropout 0.1 is not supported with --ddp"):
        loop.train(settings, replicas=ddp.DataParallel(FakeComm()))
