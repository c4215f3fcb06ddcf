"""A run's settings: one typed dataclass per task, its command line built from its fields.

Every setting is a field of TrainConfig (the settings every task has) or of a task's subclass
(LanguageConfig, MaskedConfig and DigitsConfig in models/training/tasks/: language.py, masked.py,
digits.py): its type, its default and its help are there, written once.
A subclass changes a default by declaring the field again with the new default; its help and
whether a resumed run keeps it are looked up in the class that declared it first.

    lr: float = setting("peak learning rate", resume_keeps=True)   # TrainConfig
    lr: float = 3e-3                                              # LanguageConfig's default

build_parser() turns the fields into flags (lr -> --lr, type float, "(default 0.003)") with
default None, so that resolve() tells what was typed from what was not: a resumed run takes its
checkpoint's settings, then what was typed, refusing to change one it must keep.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from dataclasses import MISSING, dataclass
from pathlib import Path
from typing import Any

from models.training.checkpoints import read_train_state


def setting(
    help: str,
    default: Any = MISSING,
    *,
    choices: tuple[str, ...] | None = None,
    resume_keeps: bool = False,
    flag: bool = True,
    positive: bool = False,
) -> Any:
    """A field of a config: help and choices for its flag; resume_keeps: a resumed run refuses
    to change it; flag False: derived from the others, not typed; positive: must be >= 1."""
    return dataclasses.field(
        default=default,
        metadata={
            "help": help,
            "choices": choices,
            "resume_keeps": resume_keeps,
            "flag": flag,
            "positive": positive,
        },
    )


@dataclass(kw_only=True)
class TrainConfig:
    """The settings every task has. The fields without a default get theirs from the task's
    subclass (or, for seq2seq, from its --task)."""

    out: str | None = setting("checkpoint directory, also the one --resume continues")
    steps: int = setting("total optimizer steps", positive=True)
    batch_size: int = setting("sequences per step", resume_keeps=True, positive=True)
    n_layer: int = setting("Transformer blocks", resume_keeps=True)
    n_head: int = setting("attention heads", resume_keeps=True)
    n_embd: int = setting("model width", resume_keeps=True)
    dropout: float = setting("dropout probability", 0.0, resume_keeps=True)
    lr: float = setting("peak learning rate", resume_keeps=True)
    min_lr: float | None = setting(
        "final learning rate (default: lr / 10)", None, resume_keeps=True
    )
    warmup: int = setting("linear warmup steps", resume_keeps=True)
    weight_decay: float = setting("AdamW decay of the matmul weights", 0.0, resume_keeps=True)
    grad_clip: float = setting("max gradient norm", 1.0, resume_keeps=True)
    eval_every: int = setting("steps between evaluations and checkpoints", 250, positive=True)
    seed: int = setting("seed of the initialisation and the batches", 0, resume_keeps=True)
    dtype: str = setting(
        "parameter dtype", "float32", choices=("float32", "float64"), resume_keeps=True
    )
    init_from: str | None = setting(
        "fine-tune this trained model's directory (its shape and tokenizer)",
        None,
        resume_keeps=True,
    )
    freeze: str | None = setting(
        "comma-separated globs of parameter names to freeze ('transformer.h.0.*')",
        None,
        resume_keeps=True,
    )
    lora_rank: int | None = setting(
        "train LoRA adapters of this rank only (with --init-from)", None, resume_keeps=True
    )
    lora_alpha: float = setting("LoRA's update is (alpha / rank) A B", 16.0, resume_keeps=True)
    lora_targets: str | None = setting(
        "comma-separated Linear names or globs to adapt (default: the self-attention "
        "projections, nn.lora.attention_projections: c_attn,*.attn.c_proj for GPT-2, "
        "q_proj,k_proj,v_proj,o_proj for the Llama family)",
        None,
        resume_keeps=True,
    )
    grad_accum: int = setting(
        "micro-batches per step, each --batch-size rows", 1, resume_keeps=True, positive=True
    )


def _declared(config_class: type, name: str) -> dict[str, Any]:
    """The metadata of field `name` where it was first declared (a subclass that changes only
    the default declares it again without metadata)."""
    for cls in reversed(config_class.__mro__):
        fields = getattr(cls, "__dataclass_fields__", {})
        if name in fields and fields[name].metadata:
            return dict(fields[name].metadata)
    raise TypeError(f"{config_class.__name__}.{name}: declare it with setting(help, ...)")


def _flag_type(hint: Any) -> type:
    """int from `int | None`: the type argparse converts the flag's text to."""
    kinds = [t for t in typing.get_args(hint) or (hint,) if t is not type(None)]
    return kinds[0]


def field_defaults(config_class: type) -> dict[str, Any]:
    """Each field's default, of those that have one."""
    return {f.name: f.default for f in dataclasses.fields(config_class) if f.default is not MISSING}


def resume_keeps(config_class: type) -> list[str]:
    """The settings a resumed run must keep."""
    return [
        f.name
        for f in dataclasses.fields(config_class)
        if _declared(config_class, f.name)["resume_keeps"]
    ]


def build_parser(config_class: type, prog: str, description: str) -> argparse.ArgumentParser:
    """A flag per field (help with its default), every default None, and the flags that steer
    this invocation only, never saved with the run: --resume, --quiet, --ddp, --compile."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    hints = typing.get_type_hints(config_class)
    for f in dataclasses.fields(config_class):
        meta = _declared(config_class, f.name)
        if not meta["flag"]:
            continue
        kind, help = _flag_type(hints[f.name]), meta["help"]
        options: dict[str, Any] = {"choices": meta["choices"]} if meta["choices"] else {}
        if kind is bool:
            options["action"] = "store_true"
        else:
            if kind is not str:
                options["type"] = kind
            if f.default not in (MISSING, None):
                shown = repr(f.default) if isinstance(f.default, str) else f.default
                help += f" (default {shown})"
        parser.add_argument("--" + f.name.replace("_", "-"), help=help, default=None, **options)
    parser.add_argument("--resume", action="store_true", help="continue the run saved in --out")
    parser.add_argument("--quiet", action="store_true", help="no progress bar or periodic lines")
    parser.add_argument(
        "--ddp", action="store_true", help="data parallel over MPI ranks (run under mpiexec)"
    )
    parser.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="replay the step through autograd.compile (traced once per batch shape; the "
        "default); --no-compile runs every step eagerly",
    )
    return parser


def resolve(task: Any, args: argparse.Namespace) -> Any:
    """The run's config (task.Config): defaults < checkpoint (on --resume) < what was given on
    the line, checked by the task (task.check, which may complete it)."""
    config_class, name = task.Config, task.name
    given = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(config_class)
        if getattr(args, f.name, None) is not None
    }
    settings = {**task.defaults(given), **given}
    if args.resume:
        # Defaults first: a checkpoint older than a setting ran with its default.
        state = read_train_state(name, Path(settings["out"]))["settings"]
        saved = {**task.defaults(state), **state}
        changed = [k for k in resume_keeps(config_class) if k in given and given[k] != saved[k]]
        if changed:
            detail = ", ".join(
                f"--{k.replace('_', '-')} {given[k]!r} (saved {saved[k]!r})" for k in changed
            )
            raise SystemExit(f"{name}: --resume continues the saved run; cannot change {detail}")
        settings = {**saved, **given}
    for f in dataclasses.fields(config_class):
        if _declared(config_class, f.name)["positive"] and settings[f.name] < 1:
            flag = f.name.replace("_", "-")
            raise SystemExit(f"{name}: --{flag} must be >= 1, got {settings[f.name]}")
    if settings["min_lr"] is None:
        settings["min_lr"] = settings["lr"] / 10
    settings["warmup"] = min(settings["warmup"], settings["steps"])
    if settings["lora_rank"] is not None and not settings["init_from"]:
        raise SystemExit(f"{name}: --lora-rank adapts a trained model: give --init-from")
    if settings["init_from"] and not args.resume:
        shape = task.pretrained_shape(Path(settings["init_from"]))
        changed = [k for k in shape if k in given and given[k] != shape[k]]
        if changed:
            detail = ", ".join(f"--{k.replace('_', '-')} {given[k]!r}" for k in changed)
            fixed = ", ".join(f"{k} {shape[k]!r}" for k in changed)
            raise SystemExit(
                f"{name}: --init-from {settings['init_from']} fixes the model's shape "
                f"({fixed}); cannot change {detail}"
            )
        settings.update(shape)
    config = config_class(**settings)
    task.check(config, given)
    return config
