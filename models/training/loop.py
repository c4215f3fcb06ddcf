"""The one training loop: every task (models/training/task.py) trains here.

    python -m models.train | models.encoder | models.seq2seq  [--resume] [--ddp] [--no-compile]

Trainer(task).main(argv) parses the task's config (models/training/config.py), then fit() runs
it: per step the learning rate (warmup, then cosine), the task's batch, one optimizer step
(models/training/step.py: compiled by default; eager with --ddp or a hook), every eval_every
steps the task's evaluation and a checkpoint (models/training/checkpoints.py) with loss.png
(models/training/plot.py). The main process prints the summary line and the task's sample.

The run is deterministic: batch `step` is a function of (seed, step), so the same seed gives
bit-identical losses and a resumed run continues with exactly the losses of the uninterrupted one.
Ctrl-C finishes the current step, saves a checkpoint and exits. Everything is written under
--out (config.out None: nothing is written, for runs in a test or a notebook).

Fine-tuning (docs/finetune.md) is the same loop from a trained model: --init-from DIR loads it
(its shape settings come from DIR; a different --n-layer is an error), --freeze GLOB freezes
parameters by name, --lora-rank r trains LoRA adapters only (models/training/adapt.py),
--grad-accum N makes each step the update of N micro-batches, weighted by their counted targets.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

import autograd
import nn
from models import ddp
from models.ddp import SINGLE_PROCESS, Replicas
from models.training import checkpoints, config
from models.training.adapt import adapt
from models.training.config import TrainConfig
from models.training.plot import plot_losses
from models.training.step import (
    Batch,
    CompiledTrainStep,
    EagerTrainStep,
    GradHook,
    LossFn,
    param_groups,
)
from models.training.task import Task


class Trainer:
    """The loop for one command: its task's command line (main, build_parser), a run from a
    config (fit). choose(config): the task that trains it, when a flag picks among tasks of one
    config (models.train's --sft: chat fine-tuning); by default `task` itself."""

    def __init__(self, task: Task, choose: Callable[[TrainConfig], Task] | None = None) -> None:
        self.task = task
        self.choose = choose or (lambda c: task)

    # --- the command line ---------------------------------------------------------------------

    def build_parser(self) -> argparse.ArgumentParser:
        t = self.task
        return config.build_parser(t.Config, t.prog, t.description)

    def resolve_settings(self, args: argparse.Namespace) -> Any:
        """The run's config from parsed arguments (defaults < checkpoint < command line)."""
        return config.resolve(self.task, args)

    def main(self, argv: list[str] | None = None) -> int:
        """The command line: parse, then run in this process or as one MPI rank (--ddp)."""
        args = self.build_parser().parse_args(argv)
        with contextlib.ExitStack() as context:
            if self.task.blas_threads is not None:
                from threadpoolctl import threadpool_limits

                # A context, so that callers (tests) keep their own setting.
                context.enter_context(threadpool_limits(self.task.blas_threads, user_api="blas"))
            if not args.ddp:
                return self.run(args)
            comm = ddp.world()
            with ddp.abort_on_error(comm):
                return self.run(args, replicas=ddp.DataParallel(comm))

    def run(self, args: argparse.Namespace, replicas: Replicas = SINGLE_PROCESS) -> int:
        """A whole run from parsed command-line arguments; the main process prints the summary."""
        c = self.resolve_settings(args)
        with stop_on_interrupt() as stop:
            history = self.train(
                c, resume=args.resume, quiet=args.quiet, stop=stop, replicas=replicas,
                compile=args.compile,
            )  # fmt: skip
        if history["interrupted"]:
            return 130
        if replicas.is_main:
            val = history["eval_val"][-1] if history.get("eval_val") else float("nan")
            where = f" on {replicas.world_size} ranks" if replicas.world_size > 1 else ""
            files = "" if c.out is None else f"; checkpoint and loss.png in {c.out}"
            speed = f"{history['tokens_per_s']:,.0f} tokens/s{_speedup(history)}"
            loss = f"val loss {val:.3f} vs unigram baseline {history['baseline']:.3f} nats/token"
            print(
                f"done: {c.steps} steps{where} in {history['seconds']:.0f} s ({speed}); "
                f"{loss}{files}"
            )
            if "sample" in history:
                print(history["sample"])
            for line in history["report"]:
                print(line)
        return 0

    # --- the run ------------------------------------------------------------------------------

    def train(self, c: TrainConfig, **options: Any) -> dict[str, Any]:
        """fit() without the model: the run's history."""
        return self.fit(c, **options)[1]

    def fit(
        self,
        c: TrainConfig,
        resume: bool = False,
        quiet: bool = False,
        after_backward: GradHook | None = None,
        stop: threading.Event | None = None,
        replicas: Replicas = SINGLE_PROCESS,
        compile: bool = True,
    ) -> tuple[nn.Module, dict[str, Any]]:
        """Run (or continue) training with a resolved config c; returns the model and history.

        compile: replay the step through autograd.compile (the default; one process, no
        after_backward hook); with compile=False, several ranks or a hook, every step runs eagerly.

        history: "step"/"loss"/"lr" per step; "eval_step" and "eval_<metric>" per evaluation
        (the GPT's "eval_train", "eval_val"); "baseline" (the loss's), "baselines" (by metric),
        "interrupted", "compiled", "step_ms", "tokens_per_s", "seconds", "world_size",
        "sample". With replicas (models.ddp), only the main process logs, evaluates and saves.
        """
        from tqdm import tqdm

        task, stop = self.choose(c), stop or threading.Event()
        out, main = (None if c.out is None else Path(c.out)), replicas.is_main
        quiet = quiet or not main
        init = None if c.init_from is None else Path(c.init_from)
        if resume:
            model, optimizer, state = checkpoints.load_run(task, out, c)
            data = task.prepare(c, init or out)  # a fine-tuning run keeps its base's tokenizer
            start, history = state["step"], state["history"]
        else:
            data = task.prepare(c, init)
            model = adapt(task.pretrained(init, c) if init else task.build(c, data), c, task.name)
            optimizer = nn.optim.AdamW(
                param_groups(model, c.weight_decay), lr=c.lr, betas=task.betas
            )
            start, history = 0, {k: [] for k in ("step", "loss", "lr", "eval_step")}
        note = replicas.start(model, optimizer, dataclasses.asdict(c), start)
        baselines = history["baselines"] = task.baselines(data)
        history["baseline"] = baselines["val"]
        opening = f"{model.describe()}: {_parameters(model)}, {c.dtype}{note}"
        _log(quiet, f"{opening}; {task.describe_data(data)}")
        model.train()

        def loss_fn(*batch: np.ndarray) -> autograd.Tensor:
            return task.loss(model, *batch)

        if compile and replicas.world_size == 1 and after_backward is None:
            step_once = CompiledTrainStep(
                model, loss_fn, optimizer, c.grad_clip, task.fusion, c.grad_accum
            )
        else:
            step_once = EagerTrainStep(
                loss_fn, optimizer, c.grad_clip, c.grad_accum, after_backward, replicas
            )

        def checkpoint() -> None:
            if out is not None:
                checkpoints.save_run(task, out, model, optimizer, data, step, c, history)
                plot_losses(out / "loss.png", history, baselines, task.title)

        # --grad-accum N: the step's batch holds N micro-batches of --batch-size rows
        rows = dataclasses.replace(c, batch_size=c.batch_size * c.grad_accum)
        tokens, step_times = 0, []
        bar = tqdm(total=c.steps, initial=start, disable=quiet, unit="step", dynamic_ncols=True)
        began, step, interrupted = time.perf_counter(), start, False
        try:
            while step < c.steps and not interrupted:
                lr = nn.optim.cosine_with_warmup(step, c.lr, c.warmup, c.steps, c.min_lr)
                batch = task.batch(rows, data, step, replicas.rank, replicas.world_size)
                # A stop request (Ctrl-C) ends the run after this step, on every process at once.
                step_start = time.perf_counter()
                loss, _, interrupted = step_once(batch, lr, stop)
                step_times.append(time.perf_counter() - step_start)
                history["step"].append(step)
                history["loss"].append(loss)
                history["lr"].append(lr)
                step += 1
                tokens += task.tokens(batch) * replicas.world_size
                rate = tokens / (time.perf_counter() - began)
                bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{rate:,.0f}", refresh=False)
                bar.update(1)
                if main and not interrupted and (step % c.eval_every == 0 or step == c.steps):
                    _evaluate(task, model, data, c, step, history, quiet)
                    checkpoint()
        finally:
            bar.close()
        seconds = time.perf_counter() - began
        if interrupted and main:
            checkpoint()
            where = "" if out is None else f": checkpoint saved in {out}; continue with --resume"
            print(f"interrupted at step {step}{where}")
        compiled = isinstance(step_once, CompiledTrainStep)
        history.update(
            interrupted=interrupted,
            compiled=compiled,
            # the first step traces (compiled) or warms up: the median of the others
            step_ms=1e3 * float(np.median(step_times[1:] or step_times)) if step_times else None,
            seconds=seconds,
            tokens_per_s=tokens / max(seconds, 1e-9),
            world_size=replicas.world_size,
        )
        if compiled and not quiet and step_times:
            history["eager_step_ms"] = _eager_step_ms(task, model, c, batch)
        if main and not interrupted:
            sample = task.sample(model, data, c)
            if sample is not None:
                history["sample"] = sample
        history["report"] = task.report(history, data, c) if main and not interrupted else []
        return model, history


def _evaluate(
    task: Task,
    model: nn.Module,
    data: Any,
    c: TrainConfig,
    step: int,
    history: dict[str, Any],
    quiet: bool,
) -> None:
    """The task's metrics, in eval mode without a graph, appended to the history and logged."""
    was_training = model.training
    model.eval()
    try:
        with autograd.no_grad():
            metrics = task.evaluate(model, data, c)
    finally:
        model.train(was_training)
    history["eval_step"].append(step)
    for key, value in metrics.items():
        history.setdefault(f"eval_{key}", []).append(value)
    shown = [
        f"{key} loss {value:.4f}" if key in ("train", "val") else f"{key} {value:.4f}"
        for key, value in metrics.items()
    ]
    _log(quiet, f"step {step}: {', '.join(shown)}")


def _eager_step_ms(task: Task, model: nn.Module, c: TrainConfig, batch: Batch) -> float:
    """ms of an eager step on a throwaway copy of the model (the speed-up reference)."""
    twin = copy.deepcopy(model)
    optimizer = nn.optim.AdamW(param_groups(twin, c.weight_decay), betas=task.betas)
    loss_fn: LossFn = lambda *arrays: task.loss(twin, *arrays)  # noqa: E731
    step = EagerTrainStep(loss_fn, optimizer, c.grad_clip, c.grad_accum)
    times = []
    for _ in range(3):
        start = time.perf_counter()
        step(batch, c.lr)
        times.append(time.perf_counter() - start)
    return 1e3 * float(np.median(times[1:]))


@contextlib.contextmanager
def stop_on_interrupt() -> Iterator[threading.Event]:
    """The first Ctrl-C sets the event (the loop saves and stops after the current step, so a
    checkpoint never holds a half-applied update); a second one interrupts at once."""
    import signal

    stop = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield stop  # signal handlers can only be installed from the main thread
        return

    def handler(signum: int, frame: Any) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield stop
    finally:
        signal.signal(signal.SIGINT, previous)


def _log(quiet: bool, message: str) -> None:
    if not quiet:
        from tqdm import tqdm

        tqdm.write(message)


def _parameters(model: nn.Module) -> str:
    """'110,400 parameters', or '4,096 trainable of 110,400 parameters' when some are frozen."""
    trainable, total = model.parameter_counts()
    if trainable == total:
        return f"{total:,} parameters"
    return f"{trainable:,} trainable of {total:,} parameters"


def _speedup(history: dict[str, Any]) -> str:
    """', compiled step 9.1 ms vs eager 14.0 ms (1.54x)' for the summary line, or ''."""
    eager, ms = history.get("eager_step_ms"), history.get("step_ms")
    if not history.get("compiled") or eager is None or not ms:
        return "" if history.get("compiled") else ", eager steps"
    return f", compiled step {ms:.1f} ms vs eager {eager:.1f} ms ({eager / ms:.2f}x)"
