"""The one training loop: every model kind (the GPT, the encoder, the encoder-decoder) trains here.

A kind subclasses Trainer and plugs in what differs: its settings and command-line flags, how the
data is prepared and a batch drawn, how the model is built, saved and loaded, the loss, the
evaluation and the sample it prints (models/train.py, models/encoder.py, models/seq2seq.py). The
loop owns the rest: settings (defaults < checkpoint < command line), the progress bar, the
evaluation cadence, checkpoints and a bit-exact --resume, Ctrl-C, the compiled step, --ddp (the
MPI ranks of models/ddp.py), the summary line and loss.png.

The run is deterministic: batch `step` is a function of (seed, step), so the same seed gives
bit-identical losses and a resumed run continues with exactly the losses of the uninterrupted one.
Ctrl-C finishes the current step, saves a checkpoint and exits. Everything is written under --out
(settings["out"] None: nothing is written, for runs in a test or a notebook):

    model.safetensors + config.json   the model (the GPT's under Hugging Face GPT-2 names)
    tokenizer.json                    the vocabulary, for the kinds that read text
    optimizer.safetensors + train_state.json   what --resume needs to continue bit-exactly
    loss.png                          the loss curves (and the kind's metric) against baselines

Fine-tuning (docs/finetune.md) is the same loop from a trained model: --init-from DIR loads it
(its shape settings come from DIR; a different --n-layer is an error), --freeze GLOB freezes
parameters by name, --lora-rank r trains LoRA adapters only (and a checkpoint then holds the
adapter alone: adapter_model.safetensors + adapter_config.json), --grad-accum N makes each step
the update of N micro-batches, weighted by their counted targets.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import json
import math
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

import autograd
import nn
from autograd import Tensor
from models import ddp
from models.ddp import SINGLE_PROCESS, Replicas

STATE_FORMAT = "glassgrad-train-state"
# Flags that steer this invocation only; they are never saved with the run.
CONTROL = ("resume", "quiet", "ddp", "compile")
# Settings every kind has, and those of them a resumed run must keep (its own add to them).
COMMON_RUN_DEFINING = (
    "init_from",
    "freeze",
    "lora_rank",
    "lora_alpha",
    "lora_targets",
    "grad_accum",
    "batch_size",
    "n_layer",
    "n_head",
    "n_embd",
    "dropout",
    "lr",
    "min_lr",
    "warmup",
    "weight_decay",
    "grad_clip",
    "seed",
    "dtype",
)
# Counts that must be >= 1, of those a kind has.
POSITIVE = (
    "steps",
    "batch_size",
    "eval_every",
    "block_size",
    "eval_batches",
    "eval_size",
    "grad_accum",
)
Batch = tuple[np.ndarray, ...]
GradHook = Callable[[list[nn.Parameter]], None]
LossFn = Callable[..., Tensor]


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """GPT-2 style decay: only the matmul weights; biases, LayerNorm gains and the embedding
    tables (the token table is also the tied output head) are not pulled towards zero."""
    tables = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    decay, no_decay = [], []
    for p in model.parameters():
        (decay if p.ndim == 2 and id(p) not in tables else no_decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


# --- one optimizer step -----------------------------------------------------------------------


def _diverged(norm: float, loss: float) -> FloatingPointError:
    return FloatingPointError(
        f"train: the gradient norm is {norm} (loss {loss}); the run diverged, try a lower --lr"
    )


def train_step(
    loss_fn: LossFn,
    optimizer: nn.optim.Optimizer,
    batch: Batch,
    lr: float,
    grad_clip: float,
    after_backward: GradHook | None = None,
    replicas: Replicas = SINGLE_PROCESS,
    stop: threading.Event | None = None,
    grad_accum: int = 1,
) -> tuple[float, float, bool]:
    """Forward (loss_fn(*batch)), backward, (after_backward), reduce over replicas, clip, update.

    Returns (loss, gradient norm, whether to stop after this step). The batch is this process's
    rows of the global batch; after reduce every process holds the same averaged gradients, so
    the norm, the clipping and the update are identical everywhere. grad_accum N: the batch runs
    as N micro-batches whose gradients add up (nn.accumulate_gradients).
    """
    params = [p for group in optimizer.param_groups for p in group["params"]]
    optimizer.zero_grad()
    if grad_accum > 1:
        micro = micro_batches(batch, grad_accum)
        weights = nn.accumulation_weights([m[-1] for m in micro], dtype=params[0].dtype)
        loss = nn.accumulate_gradients(loss_fn, micro, weights)
    else:
        loss = loss_fn(*batch)
        loss.backward()
    if after_backward is not None:
        after_backward(params)
    loss_value, stop_now = replicas.reduce(loss.item(), stop is not None and stop.is_set())
    norm = nn.clip_grad_norm_(params, grad_clip)
    if not math.isfinite(norm):
        raise _diverged(norm, loss_value)
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.step()
    return loss_value, norm, stop_now


def micro_batches(batch: Batch, n: int) -> list[Batch]:
    """The batch's arrays cut along their first axis into n micro-batches, each array a copy of
    its own (a compiled step takes each as an argument, and arguments must not share memory).
    The targets are each micro-batch's last array."""
    rows = len(batch[0])
    if rows % n:
        raise SystemExit(f"train: --grad-accum {n} does not divide the batch of {rows} rows")
    size = rows // n
    return [tuple(a[i * size : (i + 1) * size].copy() for a in batch) for i in range(n)]


class CompiledTrainStep:
    """train_step for one process without hooks, through autograd.compile (docs/compile.md).

    The step (zero_grad, forward, backward, clip, AdamW) is traced on the first call of each batch
    shape and replayed after; the learning rate reaches it through the optimizer's param_groups,
    read at each replay. A non-finite gradient norm is caught after the update (the run stops all
    the same).

    Every step is a replay, the first one too: the traced (eager) call is undone (parameters,
    optimizer state and dropout generators restored in place) and the step replayed. So a run
    resumed from a checkpoint, whose first step traces again, continues with exactly the
    uninterrupted run's losses, with the default fusion (the batch sharded over the BLAS's
    threads), whose rounding differs from eager's.
    """

    def __init__(
        self,
        model: nn.Module,
        loss_fn: LossFn,
        optimizer: nn.optim.Optimizer,
        grad_clip: float,
        fusion: bool | str = True,
        grad_accum: int = 1,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.grad_accum = grad_accum
        # the trainable parameters: the frozen ones are neither updated nor saved and restored
        self.params = [
            p for group in optimizer.param_groups for p in group["params"] if p.requires_grad
        ]

        def step(*arrays: np.ndarray) -> tuple[Any, float]:
            optimizer.zero_grad()
            if grad_accum > 1:  # arrays: the weights k_i / K, then each micro-batch's arrays
                k = (len(arrays) - 1) // grad_accum
                micro = [arrays[1 + i * k : 1 + (i + 1) * k] for i in range(grad_accum)]
                loss = nn.accumulate_gradients(loss_fn, micro, arrays[0])
            else:
                loss = loss_fn(*arrays)
                loss.backward()
            norm = nn.clip_grad_norm_(self.params, grad_clip)
            optimizer.step()
            return loss, norm

        self.step = autograd.compile(step, fusion=fusion)

    def __call__(
        self, batch: Batch, lr: float, stop: threading.Event | None = None
    ) -> tuple[float, float, bool]:
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        if self.grad_accum > 1:  # the weights and every micro-batch are the step's arguments
            micro = micro_batches(batch, self.grad_accum)
            weights = nn.accumulation_weights([m[-1] for m in micro], dtype=self.params[0].dtype)
            batch = (weights, *[a for m in micro for a in m])
        plan = self.step.plan_for(*batch)
        # A call that will trace (a new batch shape, or parameters moved by another shape's
        # plan): trace, undo the traced step, then replay it.
        if plan is None or not plan.still_valid():
            saved = self._state()
            self.step(*batch)
            self._restore(saved)
        loss, norm = self.step(*batch)
        loss_value = loss.item()
        if not math.isfinite(norm):
            raise _diverged(norm, loss_value)
        return loss_value, norm, stop is not None and stop.is_set()

    def _state(self) -> tuple[list, list, list]:
        params = [p.data.copy() for p in self.params]
        opt = [
            {k: v.copy() if isinstance(v, np.ndarray) else v for k, v in st.items()}
            if (st := self.optimizer.state.get(p))
            else None
            for p in self.params
        ]
        rngs = [
            (g, copy.deepcopy(g.bit_generator.state))
            for m in self.model.modules()
            for g in vars(m).values()
            if isinstance(g, np.random.Generator)
        ]
        return params, opt, rngs

    def _restore(self, saved: tuple[list, list, list]) -> None:
        """Put the state back in place: the plan holds the arrays (the flat buffers)."""
        params, opt, rngs = saved
        for p, data in zip(self.params, params, strict=True):
            np.copyto(p.data, data)
        for p, before in zip(self.params, opt, strict=True):
            state = self.optimizer.state.get(p, {})
            for k, v in state.items():  # state made by the traced step: back to "none yet"
                old = (before or {}).get(k)
                if isinstance(v, np.ndarray):
                    if old is None:
                        v.fill(0)
                    else:
                        np.copyto(v, old)
                else:
                    state[k] = 0 if old is None else old
        for g, rng_state in rngs:
            g.bit_generator.state = rng_state


def _dropout_rngs(model: nn.Module) -> dict[str, np.random.Generator]:
    return {
        name: m.rng
        for name, m in model.named_modules()
        if isinstance(m, nn.Dropout) and m.rng is not None
    }


def _log(quiet: bool, message: str) -> None:
    if not quiet:
        from tqdm import tqdm

        tqdm.write(message)


# --- the loop and what a model kind plugs into it ---------------------------------------------


class Trainer:
    """The training loop. A subclass is one model kind: it sets the class attributes and
    implements the hooks between the two rulers below; the loop itself is the methods after them.

    Hooks get the run's settings (a flat dict: the kind's DEFAULTS < checkpoint < command line)
    and `data`, whatever prepare() returned (corpus, tokenizer, fixed evaluation batches).
    """

    name = "train"  # the command's name in its messages ("train: --steps must be >= 1")
    prog = "python -m models.train"
    description = ""
    # The kind's settings and their defaults; a kind starts from these (min_lr None: lr / 10).
    DEFAULTS: dict[str, Any] = {
        "dropout": 0.0,
        "min_lr": None,
        "weight_decay": 0.0,
        "grad_clip": 1.0,
        "eval_every": 250,
        "seed": 0,
        "dtype": "float32",
        "init_from": None,
        "freeze": None,
        "lora_rank": None,
        "lora_alpha": 16.0,
        "lora_targets": None,
        "grad_accum": 1,
    }
    RUN_DEFINING: tuple[str, ...] = COMMON_RUN_DEFINING
    # The shape settings a checkpoint fixes (--init-from).
    SHAPE: tuple[str, ...] = ("n_layer", "n_head", "n_embd")
    betas = (0.9, 0.99)
    # BLAS threads for the whole run (None: as the caller has it). One suits small products: a
    # second thread cost 3x on a busy machine (docs/seq2seq.md).
    blas_threads: int | None = None
    title = "training"  # of loss.png
    fusion: bool | str = True  # of the compiled step (autograd.compile)
    # The model and its config dataclass (build; save_model and load_model by default)
    model_class: type[nn.Module] | None = None
    config_class: type | None = None

    # --- hooks: what a model kind plugs in ------------------------------------------------------

    def add_arguments(self, add: Callable[..., None]) -> None:
        """The kind's own flags: add("--flag", help, type=...) appends " (default X)"."""

    def defaults(self, given: dict[str, Any]) -> dict[str, Any]:
        """The defaults for what was given (seq2seq's depend on --task)."""
        return dict(self.DEFAULTS)

    def check_settings(self, settings: dict[str, Any], given: dict[str, Any]) -> None:
        """Refuse (SystemExit naming the flag) or complete the kind's settings in place."""

    def prepare(self, settings: dict[str, Any], saved: Path | None) -> Any:
        """The data (anything the other hooks need); saved: the run's directory on --resume."""
        raise NotImplementedError

    def config_fields(self, settings: dict[str, Any], data: Any) -> dict[str, Any]:
        """The model config's fields besides n_layer, n_head, n_embd and dropout."""
        raise NotImplementedError

    def build(self, settings: dict[str, Any], data: Any) -> nn.Module:
        """A new model, initialised from settings["seed"], in settings["dtype"]."""
        s = settings
        sizes = {k: s[k] for k in ("n_layer", "n_head", "n_embd", "dropout")}
        config = self.config_class(**sizes, **self.config_fields(s, data))
        return self.model_class(config, rng=np.random.default_rng(s["seed"])).to(s["dtype"])

    def save_model(self, out: Path, model: nn.Module, data: Any, stamp: dict[str, str]) -> None:
        """model.safetensors (carrying `stamp` as metadata) and what loading it needs."""
        nn.save_safetensors(out / "model.safetensors", model.state_dict(), metadata=stamp)
        nn.save_json_atomic(out / "config.json", dataclasses.asdict(model.config))

    def load_model(self, out: Path, settings: dict[str, Any]) -> nn.Module:
        """The model save_model wrote."""
        config = json.loads((out / "config.json").read_text(encoding="utf-8"))
        model = self.model_class(self.config_class(**config)).to(settings["dtype"])
        model.load_state_dict(nn.load_safetensors(out / "model.safetensors")[0])
        return model

    def pretrained_settings(self, directory: Path) -> dict[str, Any]:
        """The shape settings (SHAPE) of the model saved in `directory` (--init-from)."""
        config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
        return {k: config[k] for k in self.SHAPE if k in config}

    def pretrained(self, directory: Path, settings: dict[str, Any]) -> nn.Module:
        """The model saved in `directory` (--init-from), in settings["dtype"]."""
        return self.load_model(directory, settings)

    def batch(
        self, settings: dict[str, Any], data: Any, step: int, rank: int, world_size: int
    ) -> Batch:
        """The arrays of training batch `step`, a function of (seed, step) alone: rank r of
        world_size takes rows r, r + world_size, ... of the global batch.

        With the compiled step, every array the loss depends on must be in the batch: one that
        loss() computes from them in numpy is a constant of the trace (docs/compile.md)."""
        raise NotImplementedError

    def loss(self, model: nn.Module, *batch: np.ndarray) -> Tensor:
        """The mean loss of a batch."""
        return model(*batch)[1]

    def tokens(self, batch: Batch) -> int:
        """Tokens in this process's batch, for the tokens/s figures."""
        return batch[0].size

    def baselines(self, data: Any) -> dict[str, float]:
        """What a model that ignores context scores, by metric: "val" (the loss, always) and the
        kind's metric."""
        raise NotImplementedError

    def evaluate(self, model: nn.Module, data: Any, settings: dict[str, Any]) -> dict[str, float]:
        """Metrics on fixed held-out data, the model in eval mode without a graph (the loop sets
        both). "train" and "val" are losses; the first other one is the kind's metric."""
        raise NotImplementedError

    def describe_data(self, data: Any) -> str:
        """The data part of the opening line."""
        raise NotImplementedError

    def report(self, history: dict[str, Any], data: Any, settings: dict[str, Any]) -> list[str]:
        """Result lines printed last, after the summary line (which has the val loss)."""
        return []

    def sample(self, model: nn.Module, data: Any, settings: dict[str, Any]) -> str | None:
        """What the trained model produces, printed after the summary line (None: nothing)."""
        return None

    # --- the loop ---------------------------------------------------------------------------------

    def build_parser(self) -> argparse.ArgumentParser:
        p = argparse.ArgumentParser(prog=self.prog, description=self.description)

        def add(flag: str, help: str, **kwargs: Any) -> None:
            # default=None everywhere: a resumed run must tell what was typed from the defaults.
            key = flag[2:].replace("-", "_")
            default = self.DEFAULTS.get(key)
            if default is not None and kwargs.get("action") != "store_true":
                help += (
                    f" (default {default!r})"
                    if isinstance(default, str)
                    else f" (default {default})"
                )
            p.add_argument(flag, help=help, **kwargs)

        add("--out", "checkpoint directory, also the one --resume continues")
        add("--steps", "total optimizer steps", type=int)
        add("--batch-size", "sequences per step", type=int)
        self.add_arguments(add)
        add("--n-layer", "Transformer blocks", type=int)
        add("--n-head", "attention heads", type=int)
        add("--n-embd", "model width", type=int)
        add("--dropout", "dropout probability", type=float)
        add("--lr", "peak learning rate", type=float)
        add("--min-lr", "final learning rate (default: lr / 10)", type=float)
        add("--warmup", "linear warmup steps", type=int)
        add("--weight-decay", "AdamW decay of the matmul weights", type=float)
        add("--grad-clip", "max gradient norm", type=float)
        add("--eval-every", "steps between evaluations and checkpoints", type=int)
        add("--seed", "seed of the initialisation and the batches", type=int)
        add("--dtype", "parameter dtype", choices=["float32", "float64"])
        add("--init-from", "fine-tune this trained model's directory (its shape and tokenizer)")
        add("--freeze", "comma-separated globs of parameter names to freeze ('transformer.h.0.*')")
        add("--lora-rank", "train LoRA adapters of this rank only (with --init-from)", type=int)
        add("--lora-alpha", "LoRA's update is (alpha / rank) A B", type=float)
        add(
            "--lora-targets",
            "comma-separated Linear names or globs to adapt (default: the self-attention "
            "projections, nn.lora.attention_projections: c_attn,*.attn.c_proj for GPT-2, "
            "q_proj,k_proj,v_proj,o_proj for the Llama family)",
        )
        add("--grad-accum", "micro-batches per step, each --batch-size rows", type=int)
        add("--resume", "continue the run saved in --out", action="store_true")
        add("--quiet", "no progress bar or periodic lines", action="store_true")
        add("--ddp", "data parallel over MPI ranks (run under mpiexec)", action="store_true")
        p.add_argument(
            "--compile",
            action=argparse.BooleanOptionalAction,
            default=True,
            help="replay the step through autograd.compile (traced once per batch shape; the "
            "default); --no-compile runs every step eagerly",
        )
        return p

    def resolve_settings(self, args: argparse.Namespace) -> dict[str, Any]:
        """The run's settings: defaults < checkpoint (on --resume) < what was given on the line."""
        given = {k: v for k, v in vars(args).items() if v is not None and k not in CONTROL}
        settings = {**self.defaults(given), **given}
        if args.resume:
            # Defaults first: a checkpoint older than a setting ran with its default.
            state = self.read_train_state(Path(settings["out"]))
            saved = {**self.defaults(state["settings"]), **state["settings"]}
            changed = [k for k in self.RUN_DEFINING if k in given and given[k] != saved[k]]
            if changed:
                detail = ", ".join(
                    f"--{k.replace('_', '-')} {given[k]!r} (saved {saved[k]!r})" for k in changed
                )
                raise SystemExit(
                    f"{self.name}: --resume continues the saved run; cannot change {detail}"
                )
            settings = {**saved, **given}
        for key in POSITIVE:
            if key in settings and settings[key] < 1:
                flag = key.replace("_", "-")
                raise SystemExit(f"{self.name}: --{flag} must be >= 1, got {settings[key]}")
        if settings["min_lr"] is None:
            settings["min_lr"] = settings["lr"] / 10
        settings["warmup"] = min(settings["warmup"], settings["steps"])
        if settings["lora_rank"] is not None and not settings["init_from"]:
            raise SystemExit(f"{self.name}: --lora-rank adapts a trained model: give --init-from")
        if settings["init_from"] and not args.resume:
            shape = self.pretrained_settings(Path(settings["init_from"]))
            changed = [k for k in shape if k in given and given[k] != shape[k]]
            if changed:
                detail = ", ".join(f"--{k.replace('_', '-')} {given[k]!r}" for k in changed)
                saved = ", ".join(f"{k} {shape[k]!r}" for k in changed)
                raise SystemExit(
                    f"{self.name}: --init-from {settings['init_from']} fixes the model's shape "
                    f"({saved}); cannot change {detail}"
                )
            settings.update(shape)
        self.check_settings(settings, given)
        return settings

    # --- checkpoints ---------------------------------------------------------------------------

    def save_run(
        self,
        out: Path,
        model: nn.Module,
        optimizer: nn.optim.Optimizer,
        data: Any,
        step: int,
        settings: dict[str, Any],
        history: dict[str, Any],
    ) -> None:
        """Write every file of the run. train_state.json goes last and names the step that the
        other files carry in their metadata, so a save cut short is detected on --resume."""
        out.mkdir(parents=True, exist_ok=True)
        stamp = {"step": str(step)}
        if settings["lora_rank"] is not None:  # the adapter alone; the base is --init-from
            nn.save_adapter(out, model, metadata=stamp, base_model=settings["init_from"])
        else:
            self.save_model(out, model, data, stamp)
        arrays, optimizer_rest = nn.split_optimizer_state(optimizer.state_dict())
        nn.save_safetensors(out / "optimizer.safetensors", arrays, metadata=stamp)
        state = {
            "format": STATE_FORMAT,
            "trainer": self.name,
            "step": step,
            "settings": settings,
            "optimizer": optimizer_rest,
            "dropout_rng": {k: g.bit_generator.state for k, g in _dropout_rngs(model).items()},
            "history": history,
        }
        nn.save_json_atomic(out / "train_state.json", state)

    def read_train_state(self, out: Path) -> dict[str, Any]:
        path = out / "train_state.json"
        if not path.is_file():
            raise SystemExit(
                f"{self.name}: --resume: no checkpoint in {out} ({path.name} is missing)"
            )
        state = json.loads(path.read_text(encoding="utf-8"))
        if state.get("format") != STATE_FORMAT:
            raise SystemExit(f"{self.name}: --resume: {path} is not a {STATE_FORMAT} file")
        kind = state.get("trainer", "train")  # written before the kinds shared this loop: a GPT
        if kind != self.name:
            raise SystemExit(
                f"{self.name}: --resume: {out} holds a run of `python -m models.{kind}`"
            )
        return state

    def load_run(
        self, out: Path, settings: dict[str, Any]
    ) -> tuple[nn.Module, nn.optim.Optimizer, dict[str, Any]]:
        """Model and optimizer exactly as save_run left them, and the saved train state."""
        state = self.read_train_state(out)
        step = str(state["step"])
        lora = settings["lora_rank"] is not None
        if lora:  # the base again, then the adapter saved in out
            model = self.pretrained(Path(settings["init_from"]), settings)
            self.adapt(model, settings)
            nn.load_adapter(out, model)
        else:
            model = self.adapt(self.load_model(out, settings), settings)
        arrays, meta = nn.load_safetensors(out / "optimizer.safetensors")
        weights = nn.lora.ADAPTER_WEIGHTS if lora else "model.safetensors"
        _, model_meta = nn.load_safetensors(out / weights)
        if meta.get("step") != step or model_meta.get("step") != step:
            raise SystemExit(
                f"{self.name}: --resume: {out} is inconsistent (train_state step {step}, model "
                f"step {model_meta.get('step')}, optimizer step {meta.get('step')}): a save was "
                "cut short"
            )
        optimizer = nn.optim.AdamW(param_groups(model, settings["weight_decay"]))
        optimizer.load_state_dict(nn.join_optimizer_state(arrays, state["optimizer"]))
        rngs = _dropout_rngs(model)
        for name, saved in state["dropout_rng"].items():
            rngs[name].bit_generator.state = saved
        return model, optimizer, state

    def adapt(self, model: nn.Module, settings: dict[str, Any]) -> nn.Module:
        """--freeze and --lora-rank applied to the model (in place; returned)."""
        if settings["freeze"]:
            try:
                model.freeze(*[g.strip() for g in settings["freeze"].split(",") if g.strip()])
            except KeyError as exc:
                raise SystemExit(f"{self.name}: --freeze: {exc.args[0]}") from None
        if settings["lora_rank"] is not None:
            rng = np.random.default_rng(settings["seed"])
            targets = settings["lora_targets"] or nn.lora.attention_projections(model)
            try:
                nn.apply_lora(
                    model,
                    targets,
                    settings["lora_rank"],
                    settings["lora_alpha"],
                    rng=rng,
                )
            except (KeyError, ValueError) as exc:
                raise SystemExit(f"{self.name}: --lora-targets: {exc.args[0]}") from None
        return model

    def plot_losses(self, path: Path, history: dict[str, Any], baselines: dict[str, float]) -> None:
        """loss.png: per-step training loss, the periodic evaluations and the baselines; a second
        panel for the kind's metric (accuracy) when it has one."""
        import matplotlib

        matplotlib.use("Agg")  # no display needed
        import matplotlib.pyplot as plt

        metric = _metric(history)
        fig, axes = plt.subplots(1, 2 if metric else 1, figsize=(11 if metric else 7, 4.2))
        ax = axes[0] if metric else axes
        ax.plot(history["step"], history["loss"], lw=0.6, alpha=0.5, label="train (batch)")
        for key, label, style in (("train", "train (eval)", "o-"), ("val", "val", "s-")):
            if f"eval_{key}" in history:
                ax.plot(history["eval_step"], history[f"eval_{key}"], style, label=label)
        if "val" in baselines:
            ax.axhline(
                baselines["val"], ls="--", c="gray", label=f"baseline {baselines['val']:.2f}"
            )
        ax.set_ylabel("cross-entropy (nats/token)")
        ax.set_title(f"glassgrad {self.title}")
        if metric:
            axes[1].plot(history["eval_step"], history[f"eval_{metric}"], "s-", label="val")
            if metric in baselines:
                axes[1].axhline(baselines[metric], ls="--", c="gray", label="baseline")
            axes[1].set_ylabel(metric.replace("_", " "))
        for a in axes if metric else [ax]:
            a.set_xlabel("step")
            a.legend()
            a.grid(alpha=0.3)
        fig.tight_layout()
        tmp = path.with_name(path.name + ".tmp.png")
        fig.savefig(tmp, dpi=110)
        plt.close(fig)
        os.replace(tmp, path)

    # --- the run -------------------------------------------------------------------------------

    def train(self, settings: dict[str, Any], **options: Any) -> dict[str, Any]:
        """fit() without the model: the run's history."""
        return self.fit(settings, **options)[1]

    def fit(
        self,
        settings: dict[str, Any],
        resume: bool = False,
        quiet: bool = False,
        after_backward: GradHook | None = None,
        stop: threading.Event | None = None,
        replicas: Replicas = SINGLE_PROCESS,
        compile: bool = True,
    ) -> tuple[nn.Module, dict[str, Any]]:
        """Run (or continue) training with resolved settings; returns the model and the history.

        compile: replay the step through autograd.compile (the default; one process, no
        after_backward hook); with compile=False, several ranks or a hook, every step runs eagerly.

        history: "step"/"loss"/"lr" per step; "eval_step" and "eval_<metric>" per evaluation
        (the GPT's "eval_train", "eval_val"); "baseline" (the loss's), "baselines" (by metric),
        "interrupted", "compiled", "step_ms",
        "tokens_per_s", "seconds", "world_size", "sample". With replicas (models.ddp), only the
        main process logs, evaluates and saves.
        """
        from tqdm import tqdm

        s, stop = settings, stop or threading.Event()
        out, main = (None if s["out"] is None else Path(s["out"])), replicas.is_main
        quiet = quiet or not main
        init = None if s["init_from"] is None else Path(s["init_from"])
        if resume:
            model, optimizer, state = self.load_run(out, s)
            data = self.prepare(s, init or out)  # a fine-tuning run keeps its base's tokenizer
            start, history = state["step"], state["history"]
        else:
            data = self.prepare(s, init)
            model = self.pretrained(init, s) if init else self.build(s, data)
            self.adapt(model, s)
            groups = param_groups(model, s["weight_decay"])
            optimizer = nn.optim.AdamW(groups, lr=s["lr"], betas=self.betas)
            start, history = 0, {k: [] for k in ("step", "loss", "lr", "eval_step")}
        note = replicas.start(model, optimizer, s, start)
        baselines = history["baselines"] = self.baselines(data)
        history["baseline"] = baselines["val"]
        _log(
            quiet,
            f"{model.describe()}: {_parameters(model)}, {s['dtype']}{note}; "
            f"{self.describe_data(data)}",
        )
        model.train()
        loss_fn = self._loss_fn(model)
        compiled = None
        if compile and replicas.world_size == 1 and after_backward is None:
            compiled = CompiledTrainStep(
                model, loss_fn, optimizer, s["grad_clip"], self.fusion, s["grad_accum"]
            )

        def checkpoint() -> None:
            if out is not None:
                self.save_run(out, model, optimizer, data, step, s, history)
                self.plot_losses(out / "loss.png", history, baselines)

        steps, tokens = s["steps"], 0
        step_times: list[float] = []
        bar = tqdm(total=steps, initial=start, disable=quiet, unit="step", dynamic_ncols=True)
        began, step = time.perf_counter(), start
        interrupted = False
        try:
            while step < steps and not interrupted:
                lr = nn.optim.cosine_with_warmup(step, s["lr"], s["warmup"], steps, s["min_lr"])
                # --grad-accum N: the step's batch holds N micro-batches of --batch-size rows
                rows = {**s, "batch_size": s["batch_size"] * s["grad_accum"]}
                batch = self.batch(rows, data, step, replicas.rank, replicas.world_size)
                # A stop request (Ctrl-C) ends the run after this step, on every process at once.
                step_start = time.perf_counter()
                if compiled is not None:
                    loss, _, interrupted = compiled(batch, lr, stop)
                else:
                    loss, _, interrupted = train_step(
                        loss_fn,
                        optimizer,
                        batch,
                        lr,
                        s["grad_clip"],
                        after_backward,
                        replicas,
                        stop,
                        s["grad_accum"],
                    )
                step_times.append(time.perf_counter() - step_start)
                history["step"].append(step)
                history["loss"].append(loss)
                history["lr"].append(lr)
                step += 1
                tokens += self.tokens(batch) * replicas.world_size
                rate = tokens / (time.perf_counter() - began)
                bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{rate:,.0f}", refresh=False)
                bar.update(1)
                if main and not interrupted and (step % s["eval_every"] == 0 or step == steps):
                    self._evaluate(model, data, s, step, history, quiet)
                    checkpoint()
        finally:
            bar.close()
        seconds = time.perf_counter() - began
        if interrupted and main:
            checkpoint()
            where = "" if out is None else f": checkpoint saved in {out}; continue with --resume"
            print(f"interrupted at step {step}{where}")
        history.update(
            interrupted=interrupted,
            compiled=compiled is not None,
            # the first step traces (compiled) or warms up: the median of the others
            step_ms=1e3 * float(np.median(step_times[1:] or step_times)) if step_times else None,
            seconds=seconds,
            tokens_per_s=tokens / max(seconds, 1e-9),
            world_size=replicas.world_size,
        )
        if compiled is not None and not quiet and step_times:
            history["eager_step_ms"] = self._eager_step_ms(model, s, batch)
        if main and not interrupted:
            sample = self.sample(model, data, s)
            if sample is not None:
                history["sample"] = sample
        history["report"] = self.report(history, data, s) if main and not interrupted else []
        return model, history

    def _loss_fn(self, model: nn.Module) -> LossFn:
        return lambda *batch: self.loss(model, *batch)

    def _evaluate(
        self,
        model: nn.Module,
        data: Any,
        settings: dict[str, Any],
        step: int,
        history: dict[str, Any],
        quiet: bool,
    ) -> None:
        was_training = model.training
        model.eval()
        try:
            with autograd.no_grad():
                metrics = self.evaluate(model, data, settings)
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

    def _eager_step_ms(self, model: nn.Module, settings: dict[str, Any], batch: Batch) -> float:
        """ms of an eager step on a throwaway copy of the model (the speed-up reference)."""
        twin = copy.deepcopy(model)
        optimizer = nn.optim.AdamW(param_groups(twin, settings["weight_decay"]), betas=self.betas)
        times = []
        for _ in range(3):
            start = time.perf_counter()
            train_step(
                self._loss_fn(twin),
                optimizer,
                batch,
                settings["lr"],
                settings["grad_clip"],
                grad_accum=settings["grad_accum"],
            )
            times.append(time.perf_counter() - start)
        return 1e3 * float(np.median(times[1:]))

    @staticmethod
    @contextlib.contextmanager
    def stop_on_interrupt() -> Iterator[threading.Event]:
        """The first Ctrl-C sets the event (the loop saves and stops after the current step, so a
        checkpoint never holds a half-applied update); a second one interrupts at once."""
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

    def run(self, args: argparse.Namespace, replicas: Replicas = SINGLE_PROCESS) -> int:
        """A whole run from parsed command-line arguments; the main process prints the summary."""
        settings = self.resolve_settings(args)
        with self.stop_on_interrupt() as stop:
            history = self.train(
                settings,
                resume=args.resume,
                quiet=args.quiet,
                stop=stop,
                replicas=replicas,
                compile=args.compile,
            )
        if history["interrupted"]:
            return 130
        if replicas.is_main:
            val = history["eval_val"][-1] if history.get("eval_val") else float("nan")
            where = f" on {replicas.world_size} ranks" if replicas.world_size > 1 else ""
            files = (
                "" if settings["out"] is None else f"; checkpoint and loss.png in {settings['out']}"
            )
            speed = f"{history['tokens_per_s']:,.0f} tokens/s{_speedup(history)}"
            loss = f"val loss {val:.3f} vs unigram baseline {history['baseline']:.3f} nats/token"
            print(
                f"done: {settings['steps']} steps{where} in {history['seconds']:.0f} s ({speed}); "
                f"{loss}{files}"
            )
            if "sample" in history:
                print(history["sample"])
            for line in history["report"]:
                print(line)
        return 0

    def main(self, argv: list[str] | None = None) -> int:
        """The command line: parse, then run in this process or as one MPI rank (--ddp)."""
        args = self.build_parser().parse_args(argv)
        with contextlib.ExitStack() as context:
            if self.blas_threads is not None:
                from threadpoolctl import threadpool_limits

                # A context, so that callers (tests) keep their own setting.
                context.enter_context(threadpool_limits(self.blas_threads, user_api="blas"))
            if not args.ddp:
                return self.run(args)
            comm = ddp.world()
            with ddp.abort_on_error(comm):
                return self.run(args, replicas=ddp.DataParallel(comm))


def _parameters(model: nn.Module) -> str:
    """'110,400 parameters', or '4,096 trainable of 110,400 parameters' when some are frozen."""
    trainable, total = model.parameter_counts()
    if trainable == total:
        return f"{total:,} parameters"
    return f"{trainable:,} trainable of {total:,} parameters"


def _metric(history: dict[str, Any]) -> str | None:
    """The kind's metric among the evaluations (accuracy), if it has one besides the losses."""
    names = [k[5:] for k in history if k.startswith("eval_") and k != "eval_step"]
    return next((n for n in names if n not in ("train", "val")), None)


def _speedup(history: dict[str, Any]) -> str:
    """', compiled step 9.1 ms vs eager 14.0 ms (1.54x)' for the summary line, or ''."""
    eager, ms = history.get("eager_step_ms"), history.get("step_ms")
    if not history.get("compiled") or eager is None or not ms:
        return "" if history.get("compiled") else ", eager steps"
    return f", compiled step {ms:.1f} ms vs eager {eager:.1f} ms ({eager / ms:.2f}x)"
