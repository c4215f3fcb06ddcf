"""Data-parallel training over MPI: `mpiexec -n N python -m models.train --ddp ...`.

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
just before step STEP (counted from 0); tests use it to check that a failing rank stops the job.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import sys
import threading
import time
import traceback
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

import nn
from autograd import get_default_dtype, set_default_dtype
from models import train
from models.data import eval_batches, get_batch, prepare_corpus, unigram_baseline
from models.gpt import GPT, GPTConfig

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
    model: GPT, optimizer: nn.optim.Optimizer, settings: dict[str, Any]
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


# --- the run -------------------------------------------------------------------------------------


def ddp_step(
    model: GPT,
    optimizer: nn.optim.Optimizer,
    reducer: GradientAllreduce,
    x: np.ndarray,
    y: np.ndarray,
    lr: float,
    grad_clip: float,
    stop: bool = False,
) -> tuple[float, float, bool]:
    """models.train.train_step with the gradients averaged over the ranks.

    x, y: this rank's rows of the global batch. Returns (global loss, gradient norm, whether any
    rank asked to stop). The global loss is the mean of the ranks' mean losses: that equals the
    mean over the global batch because every shard has the same number of rows and training
    targets are never ignore_index, so every shard counts the same number of targets.
    """
    optimizer.zero_grad()
    _, loss = model(x, y)
    loss.backward()
    global_loss, stop_all = reducer(loss.item(), stop)
    # The gradients are now identical on every rank, so are the norm, the clipping and the step.
    norm = nn.clip_grad_norm_(reducer.params, grad_clip)
    if not math.isfinite(norm):
        raise FloatingPointError(
            f"train: the gradient norm is {norm} (loss {global_loss}); the run diverged, try a "
            "lower --lr"
        )
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.step()
    return global_loss, norm, stop_all


def train_ddp(
    settings: dict[str, Any],
    comm: Any,
    resume: bool = False,
    quiet: bool = False,
    stop: threading.Event | None = None,
) -> dict[str, Any]:
    """Run (or continue) training on this rank of `comm`; the history dict of models.train.train
    (global losses), on every rank. Only rank 0 logs, evaluates, saves, plots and samples."""
    previous_dtype = get_default_dtype()
    set_default_dtype(np.dtype(settings["dtype"]))
    try:
        return _train_ddp(settings, comm, resume, quiet, stop or threading.Event())
    finally:
        set_default_dtype(previous_dtype)


def _setup(
    s: dict[str, Any], resume: bool
) -> tuple[GPT, nn.optim.Optimizer, Any, Any, int, dict[str, Any]]:
    """Model, optimizer, tokenizer, corpus, first step and history, as models.train builds them."""
    if resume:
        model, optimizer, tokenizer, state = train.load_run(Path(s["out"]))
        corpus = prepare_corpus(s["data"], tokenizer=tokenizer)
        return model, optimizer, tokenizer, corpus, state["step"], state["history"]
    corpus = prepare_corpus(s["data"])
    config = GPTConfig(
        vocab_size=corpus.tokenizer.vocab_size,
        block_size=s["block_size"],
        n_layer=s["n_layer"],
        n_head=s["n_head"],
        n_embd=s["n_embd"],
        dropout=s["dropout"],
    )
    model = GPT(config, rng=np.random.default_rng(s["seed"]))
    optimizer = nn.optim.AdamW(
        train.param_groups(model, s["weight_decay"]), lr=s["lr"], betas=(0.9, 0.99)
    )
    history: dict[str, Any] = {
        k: [] for k in ("step", "loss", "lr", "eval_step", "eval_train", "eval_val")
    }
    return model, optimizer, corpus.tokenizer, corpus, 0, history


def _train_ddp(
    s: dict[str, Any], comm: Any, resume: bool, quiet: bool, stop: threading.Event
) -> dict[str, Any]:
    from tqdm import tqdm

    rank, world = comm.Get_rank(), comm.Get_size()
    is_main = rank == 0
    quiet = quiet or not is_main
    if s["batch_size"] % world:
        raise SystemExit(
            f"train --ddp: --batch-size {s['batch_size']} must be divisible by the number of "
            f"ranks {world} (each rank takes an equal share of the global batch)"
        )
    if s["dropout"] > 0:
        # Every rank would draw the same dropout masks (same seed), and only rank 0's mask stream
        # is saved for --resume; rather than train on correlated masks, refuse.
        raise SystemExit(
            f"train --ddp: --dropout {s['dropout']} is not supported with --ddp (the ranks would "
            "share one dropout mask stream); use --dropout 0"
        )
    failure = _injected_failure()
    out = Path(s["out"])
    model, optimizer, tokenizer, corpus, start, history = _setup(s, resume)
    reducer = GradientAllreduce(comm, [p for g in optimizer.param_groups for p in g["params"]])
    check_replicas(comm, fingerprint(model, optimizer, s))

    if is_main:
        baseline = unigram_baseline(corpus.train, corpus.val, tokenizer.vocab_size)
        history["baseline"] = baseline
        evals = {
            name: eval_batches(ids, s["batch_size"], s["block_size"], s["eval_batches"], s["seed"])
            for name, ids in (("train", corpus.train), ("val", corpus.val))
        }
        train._log(
            quiet,
            f"GPT with {model.num_parameters():,} parameters, {s['dtype']}, data-parallel over "
            f"{world} MPI ranks ({s['batch_size'] // world} of {s['batch_size']} sequences each; "
            f"one {reducer.nbytes / 1e6:.2f} MB Allreduce per step); data: {corpus.source}; "
            f"unigram baseline {baseline:.3f} nats/token",
        )
    model.train()
    steps, tokens_per_step = s["steps"], s["batch_size"] * s["block_size"]
    bar = tqdm(total=steps, initial=start, disable=quiet, unit="step", dynamic_ncols=True)
    began, step = time.perf_counter(), start
    interrupted = False
    try:
        while step < steps:
            if failure is not None and failure == (rank, step):
                raise RuntimeError(f"injected failure on rank {rank} at step {step} ({FAIL_ENV})")
            lr = nn.optim.cosine_with_warmup(step, s["lr"], s["warmup"], steps, s["min_lr"])
            x, y = get_batch(
                corpus.train, s["batch_size"], s["block_size"], s["seed"], step, rank, world
            )
            loss, _, interrupted = ddp_step(
                model, optimizer, reducer, x, y, lr, s["grad_clip"], stop.is_set()
            )
            history["step"].append(step)
            history["loss"].append(loss)
            history["lr"].append(lr)
            step += 1
            rate = (step - start) * tokens_per_step / (time.perf_counter() - began)
            bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{rate:,.0f}", refresh=False)
            bar.update(1)
            if interrupted:  # all ranks learn of a stop request in the same step
                break
            if is_main and (step % s["eval_every"] == 0 or step == steps):
                train._evaluate(model, evals, step, history, quiet)
                train.save_run(out, model, optimizer, tokenizer, step, s, history)
                train.plot_losses(out / "loss.png", history, baseline)
    finally:
        bar.close()
    seconds = time.perf_counter() - began
    if interrupted and is_main:
        train.save_run(out, model, optimizer, tokenizer, step, s, history)
        train.plot_losses(out / "loss.png", history, baseline)
        print(f"interrupted at step {step}: checkpoint saved in {out}; continue with --resume")
    history.update(
        interrupted=interrupted,
        seconds=seconds,
        tokens_per_s=(step - start) * tokens_per_step / max(seconds, 1e-9),
        world_size=world,
    )
    if is_main and not interrupted and s["sample_tokens"] > 0:
        history["sample"] = train.sample_text(
            model, tokenizer, s["sample_prompt"], s["sample_tokens"], s["seed"]
        )
    return history


def main(args: argparse.Namespace) -> int:
    """`python -m models.train --ddp ...` under mpiexec: models.train.main hands over here."""
    comm = _mpi().COMM_WORLD
    with abort_on_error(comm):
        settings = train.resolve_settings(args)
        with train.stop_on_interrupt() as stop:
            history = train_ddp(settings, comm, resume=args.resume, quiet=args.quiet, stop=stop)
    if history["interrupted"]:
        return 130
    if comm.Get_rank() == 0:
        val = history["eval_val"][-1] if history["eval_val"] else float("nan")
        print(
            f"done: {settings['steps']} steps on {comm.Get_size()} ranks in "
            f"{history['seconds']:.0f} s ({history['tokens_per_s']:,.0f} tokens/s); val loss "
            f"{val:.3f} vs unigram baseline {history['baseline']:.3f} nats/token; checkpoint and "
            f"loss.png in {settings['out']}"
        )
        if "sample" in history:
            print("--- sample (temperature 0.8) ---")
            print(history["sample"])
    return 0
