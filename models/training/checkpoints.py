"""A run's files under --out, and reading them back for a bit-exact --resume.

    model.safetensors + config.json   the model (the task writes them: save_model)
    tokenizer.json                    the vocabulary, for the tasks that read text
    optimizer.safetensors + train_state.json   what --resume needs to continue bit-exactly

A LoRA run (--lora-rank) saves its adapter alone (adapter_model.safetensors +
adapter_config.json); --resume loads the base (--init-from) again and the adapter on top.
train_state.json is written last and names the step the other files carry in their metadata, so
a save cut short is detected.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import nn
from models.training.adapt import adapt
from models.training.step import param_groups

STATE_FORMAT = "glassgrad-train-state"


def dropout_rngs(model: nn.Module) -> dict[str, Any]:
    """The dropout layers' generators by module name: their states are saved with the run."""
    return {
        name: m.rng
        for name, m in model.named_modules()
        if isinstance(m, nn.Dropout) and m.rng is not None
    }


def save_run(
    task: Any,
    out: Path,
    model: nn.Module,
    optimizer: nn.optim.Optimizer,
    data: Any,
    step: int,
    config: Any,
    history: dict[str, Any],
) -> None:
    """Write every file of the run; train_state.json last."""
    out.mkdir(parents=True, exist_ok=True)
    stamp = {"step": str(step)}
    if config.lora_rank is not None:  # the adapter alone; the base is --init-from
        # the base as a path that holds wherever the adapter is used from (a hub name as it is)
        base = Path(config.init_from)
        base_model = str(base.absolute()) if base.exists() else config.init_from
        nn.save_adapter(out, model, metadata=stamp, base_model=base_model)
    else:
        task.save_model(out, model, data, stamp)
    arrays, optimizer_rest = nn.split_optimizer_state(optimizer.state_dict())
    nn.save_safetensors(out / "optimizer.safetensors", arrays, metadata=stamp)
    state = {
        "format": STATE_FORMAT,
        "trainer": task.name,
        "step": step,
        "settings": dataclasses.asdict(config),
        "optimizer": optimizer_rest,
        "dropout_rng": {k: g.bit_generator.state for k, g in dropout_rngs(model).items()},
        "history": history,
    }
    nn.save_json_atomic(out / "train_state.json", state)


def read_train_state(name: str, out: Path, asking: str | None = None) -> dict[str, Any]:
    """train_state.json of a run of command `name` (train, encoder, seq2seq) in `out`; a refusal
    (SystemExit) opens with `asking` (default "<name>: --resume")."""
    asking = f"{name}: --resume" if asking is None else asking
    path = out / "train_state.json"
    if not path.is_file():
        raise SystemExit(f"{asking}: no checkpoint in {out} ({path.name} is missing)")
    state = json.loads(path.read_text(encoding="utf-8"))
    if state.get("format") != STATE_FORMAT:
        raise SystemExit(f"{asking}: {path} is not a {STATE_FORMAT} file")
    kind = state.get("trainer", "train")  # written before the kinds shared this loop: a GPT
    if kind != name:
        raise SystemExit(f"{asking}: {out} holds a run of `python -m models.{kind}`")
    return state


def load_run(
    task: Any, out: Path, config: Any
) -> tuple[nn.Module, nn.optim.Optimizer, dict[str, Any]]:
    """Model and optimizer exactly as save_run left them, and the saved train state."""
    state = read_train_state(task.name, out)
    step = str(state["step"])
    lora = config.lora_rank is not None
    if lora:  # the base again, then the adapter saved in out
        model = task.pretrained(Path(config.init_from), config)
        adapt(model, config, task.name)
        nn.load_adapter(out, model)
    else:
        model = adapt(task.load_model(out, config), config, task.name)
    arrays, meta = nn.load_safetensors(out / "optimizer.safetensors")
    weights = nn.lora.ADAPTER_WEIGHTS if lora else "model.safetensors"
    _, model_meta = nn.load_safetensors(out / weights)
    if meta.get("step") != step or model_meta.get("step") != step:
        raise SystemExit(
            f"{task.name}: --resume: {out} is inconsistent (train_state step {step}, model "
            f"step {model_meta.get('step')}, optimizer step {meta.get('step')}): a save was "
            "cut short"
        )
    optimizer = nn.optim.AdamW(param_groups(model, config.weight_decay))
    optimizer.load_state_dict(nn.join_optimizer_state(arrays, state["optimizer"]))
    rngs = dropout_rngs(model)
    for name, saved in state["dropout_rng"].items():
        rngs[name].bit_generator.state = saved
    return model, optimizer, state
