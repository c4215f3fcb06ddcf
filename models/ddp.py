"""Data-parallel training over MPI: `mpiexec -n N python -m models.train --ddp ...` (or
models.encoder, models.seq2seq: --ddp is the training loop's, models/training/loop.py).

The distributed engine is MPI (through mpi4py; `pip install "glassgrad[mpi]"` brings the mpich
wheel, no system MPI needed). Every rank runs this same loop:

1. builds the same model from the same seed (or loads the same checkpoint on --resume), and checks
   that all ranks agree: a fingerprint of the parameters, optimizer state and settings is gathered
   and compared before the first step;
2. takes its rows of each global batch: batches are a pure function of (seed, step), so rank r
   simply keeps rows r, r + N, ... of the batch a single process would draw (models.data.get_batch);
3. after backward, averages the gradients with ONE Allreduce over one preallocated flat buffer
   (gradients, the loss and a stop flag), so every rank takes the identical optimizer step.

Rank 0 alone shows the progress bar, evaluates, writes the (atomic) checkpoints and loss.png, and
prints the sample; every rank can --resume from them, with any number of ranks that divides the
batch size, since the global batch does not depend on the number of ranks. With float64 the losses
and parameters equal a single-process run with the same global batch up to rounding.

An exception on any rank prints that rank's error and calls MPI Abort, which stops the whole job
instead of leaving the other ranks waiting forever in the next Allreduce.

Test hook: the environment variable GLASSGRAD_DDP_FAIL="RANK:STEP" makes rank RANK raise an error
in step STEP (counted from 0), before its Allreduce; tests use it to check that a failing rank
stops the job.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import time
import traceback
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

import nn

FAIL_ENV = "GLASSGRAD_DDP_FAIL"


def _mpi() -> Any:
    """The mpi4py.MPI module (importing it initialises MPI), with an install hint if missing."""
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise SystemExit(
            f"train --ddp: needs mpi4py and an MPI library ({exc}); install them with "
            '`pip install "glassgrad[mpi]"` (the mpi4py and mpich wheels, no system MPI needed)'
        ) from None
    return MPI


def find_mpiexec() -> Path | None:
    """The mpiexec of the mpich wheel (installed beside this interpreter, e.g. .venv/bin), else
    the first one on PATH; None when there is none."""
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.is_file():
        return beside
    found = shutil.which("mpiexec")
    return Path(found) if found else None


def mpiexec_command(n: int) -> list[str]:
    """`mpiexec -n n` for this machine, ready for a Python command line to be appended.

    MPICH's launcher (hydra) is told to fork the ranks locally: no ssh and no host name lookup,
    which sandboxes and containers often lack.
    """
    mpiexec = find_mpiexec()
    if mpiexec is None:
        raise FileNotFoundError(
            f"no mpiexec beside {sys.executable} or on PATH; install the MPI extra: "
            'pip install "glassgrad[mpi]"'
        )
    local = ["-launcher", "fork"] if (mpiexec.parent / "mpiexec.hydra").exists() else []
    return [str(mpiexec), *local, "-n", str(n)]


class GradientAllreduce:
    """Averages the gradients of `params` over all ranks with one Allreduce per step.

    One flat buffer is allocated once: the gradients of all parameters back to back, then the
    local loss, then a stop flag. Each call packs the local values in, sums them over the ranks in
    place, divides by the number of ranks and hands the averaged gradients back to the parameters
    as views of the buffer (valid until the next call). The loss and the flag ride along for free:
    one message per step instead of one per parameter plus two for the scalars.
    """

    def __init__(self, comm: Any, params: Sequence[nn.Parameter]) -> None:
        self.comm = comm
        self.params = list(params)
        dtypes = {p.dtype for p in self.params}
        if len(dtypes) != 1:
            raise TypeError(
                "GradientAllreduce: all parameters must share one dtype (one flat buffer), got "
                f"{sorted(map(str, dtypes))}"
            )
        sizes = [p.data.size for p in self.params]
        self.offsets = np.concatenate([[0], np.cumsum(sizes)]).tolist()
        self.buffer = np.zeros(self.offsets[-1] + 2, dtype=dtypes.pop())

    @property
    def nbytes(self) -> int:
        """Bytes each rank contributes to one Allreduce."""
        return self.buffer.nbytes

    def __call__(self, loss: float, stop: bool = False) -> tuple[float, bool]:
        """Average the gradients in place; return (mean loss over ranks, whether any rank asked to
        stop). Every rank must call this once per step, in the same order."""
        MPI = _mpi()
        buf, offsets = self.buffer, self.offsets
        for p, lo, hi in zip(self.params, offsets[:-1], offsets[1:], strict=True):
            # A parameter the local shard did not reach contributes a zero gradient.
            buf[lo:hi] = 0.0 if p.grad is None else p.grad.reshape(-1)
        buf[-2], buf[-1] = loss, float(stop)
        self.comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
        buf /= self.comm.Get_size()
        for p, lo, hi in zip(self.params, offsets[:-1], offsets[1:], strict=True):
            p.grad = buf[lo:hi].reshape(p.shape)
        return float(buf[-2]), bool(buf[-1] > 0)


# --- agreement between ranks -----------------------------------------------------------------


def fingerprint(
    model: nn.Module, optimizer: nn.optim.Optimizer, settings: dict[str, Any]
) -> dict[str, Any]:
    """What must be equal on every rank before the first step: the parameters (float64 sum and a
    CRC of their bytes, in named order), the optimizer state (CRC) and the settings (CRC)."""
    crc, total = 0, 0.0
    for _, p in model.named_parameters():
        crc = zlib.crc32(np.ascontiguousarray(p.data).tobytes(), crc)
        total += float(np.sum(p.data, dtype=np.float64))
    opt_crc = 0
    for index, entry in sorted(optimizer.state_dict()["state"].items()):
        for name, value in sorted(entry.items()):
            data = value.tobytes() if isinstance(value, np.ndarray) else repr(value).encode()
            opt_crc = zlib.crc32(f"{index}.{name}".encode() + data, opt_crc)
    settings_crc = zlib.crc32(json.dumps(settings, sort_keys=True).encode())
    return {
        "param_sum": repr(total),  # a string, so that NaN == NaN
        "param_crc": crc,
        "optimizer_crc": opt_crc,
        "settings_crc": settings_crc,
    }


def check_replicas(comm: Any, mine: dict[str, Any]) -> None:
    """Allgather every rank's fingerprint; raise naming the ranks that differ from rank 0."""
    everyone = comm.allgather(mine)
    differ = [r for r, f in enumerate(everyone) if f != everyone[0]]
    if differ:
        detail = "; ".join(
            f"rank {r}: "
            + ", ".join(
                f"{k} {everyone[r][k]!r} (rank 0: {everyone[0][k]!r})"
                for k in everyone[0]
                if everyone[r][k] != everyone[0][k]
            )
            for r in differ
        )
        raise RuntimeError(
            f"ddp: the replicas differ before the first step ({detail}); every rank must build the "
            "model from the same seed and settings or load the same checkpoint"
        )


@contextlib.contextmanager
def abort_on_error(comm: Any) -> Iterator[None]:
    """Turn an exception on one rank into a stop of the whole job, with that rank's error.

    The other ranks would otherwise wait forever in their next collective call. With a single
    rank there is nobody to wait, so the exception propagates as usual.
    """
    try:
        yield
    except BaseException as exc:
        if comm.Get_size() == 1 or (isinstance(exc, SystemExit) and exc.code in (None, 0)):
            raise
        rank, size = comm.Get_rank(), comm.Get_size()
        if isinstance(exc, SystemExit):  # a usage error: its message says it all
            message = f"{exc.code}\n"
        else:
            message = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        sys.stdout.flush()
        sys.stderr.write(f"ddp: rank {rank} of {size} failed; aborting the job:\n{message}")
        sys.stderr.flush()
        # MPI_Abort kills every rank at once; give mpiexec's output forwarding a moment to pass
        # this message on first (under load it was lost: the job died with empty output).
        time.sleep(0.5)
        comm.Abort(1)
        os._exit(1)  # MPI_Abort may return before the process manager kills us: never go on


def _injected_failure() -> tuple[int, int] | None:
    """(rank, step) from GLASSGRAD_DDP_FAIL="RANK:STEP", the test hook; None when unset."""
    value = os.environ.get(FAIL_ENV)
    if not value:
        return None
    try:
        rank, step = (int(part) for part in value.split(":"))
    except ValueError:
        raise SystemExit(f"ddp: {FAIL_ENV} must look like RANK:STEP, got {value!r}") from None
    return rank, step


# --- the processes a run trains on -------------------------------------------------------------


class Replicas:
    """The processes a run trains on: one (this class), or the MPI ranks of DataParallel.

    The training loop (models/training/loop.py) asks it which rows of each global batch this
    process takes (rank, world size), lets it make the gradients, the loss and a stop request
    agree across processes after backward (reduce), and leaves logging, evaluation and
    checkpoints to the main process.
    """

    rank = 0
    world_size = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def start(
        self, model: nn.Module, optimizer: nn.optim.Optimizer, settings: dict[str, Any], step: int
    ) -> str:
        """Called once before the first step; returns a note for the run's opening line."""
        return ""

    def reduce(self, loss: float, stop: bool) -> tuple[float, bool]:
        """After backward: average the gradients over the processes; (loss, stop) for all."""
        return loss, stop


SINGLE_PROCESS = Replicas()


def world() -> Any:
    """MPI's COMM_WORLD: every rank of this job."""
    return _mpi().COMM_WORLD


class DataParallel(Replicas):
    """This process as one rank of `comm` in the training loop (see Replicas).

    start: checks that the global batch splits evenly, builds the one-buffer Allreduce and checks
    that every rank holds the same replica. reduce: averages the gradients, the loss and the stop
    request over the ranks (one Allreduce), so every rank then takes the same optimizer step.
    """

    def __init__(self, comm: Any) -> None:
        self.comm = comm
        self.rank, self.world_size = comm.Get_rank(), comm.Get_size()
        self.reducer: GradientAllreduce | None = None
        self.step = 0
        self.failure = _injected_failure()

    def start(
        self, model: nn.Module, optimizer: nn.optim.Optimizer, settings: dict[str, Any], step: int
    ) -> str:
        batch, world = settings["batch_size"], self.world_size
        if batch % world:
            raise SystemExit(
                f"train --ddp: --batch-size {batch} must be divisible by the number of ranks "
                f"{world} (each rank takes an equal share of the global batch)"
            )
        if settings.get("dropout", 0.0) > 0:
            # Every rank would draw the same dropout masks (same seed), and only rank 0's mask
            # stream is saved for --resume; rather than train on correlated masks, refuse.
            raise SystemExit(
                f"train --ddp: --dropout {settings['dropout']} is not supported with --ddp (the "
                "ranks would share one dropout mask stream); use --dropout 0"
            )
        params = [p for group in optimizer.param_groups for p in group["params"]]
        self.reducer = GradientAllreduce(self.comm, params)
        check_replicas(self.comm, fingerprint(model, optimizer, settings))
        self.step = step
        return (
            f", data-parallel over {world} MPI ranks ({batch // world} of {batch} sequences "
            f"each; one {self.reducer.nbytes / 1e6:.2f} MB Allreduce per step)"
        )

    def reduce(self, loss: float, stop: bool) -> tuple[float, bool]:
        """The global loss is the mean of the ranks' mean losses. For the GPT that equals the
        mean over the global batch: every shard has the same number of rows and the GPT's training
        targets are never ignore_index, so every shard counts the same number of targets. The
        encoder's masked characters and seq2seq's padded targets differ in number between shards:
        there each rank's mean weighs as much as any other's, as in PyTorch's DDP, so the run is
        not bit for bit the single-process one (the ranks still agree with each other)."""
        if self.failure == (self.rank, self.step):
            raise RuntimeError(
                f"injected failure on rank {self.rank} at step {self.step} ({FAIL_ENV})"
            )
        self.step += 1
        return self.reducer(loss, stop)
