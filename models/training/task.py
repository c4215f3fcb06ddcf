"""What a task plugs into the loop (models/training/loop.py): its settings, data, model and
metrics. The tasks: language modelling and chat fine-tuning with the GPT/Llama decoder
(models/training/tasks/language.py, chat.py), masked characters with the encoder (masked.py), the
digit tasks with the encoder-decoder (digits.py).

Hooks get the run's config (an instance of the task's Config, models/training/config.py) and
`data`, whatever prepare() returned (corpus, tokenizer, fixed evaluation batches).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np

import nn
from autograd import Tensor
from models.training.config import TrainConfig, field_defaults
from models.training.step import Batch


class Task:
    """A task: set the class attributes, implement the hooks that raise NotImplementedError."""

    name = "train"  # the command's name in its messages ("train: --steps must be >= 1")
    prog = "python -m models.train"
    description = ""
    title = "training"  # of loss.png
    Config: type[TrainConfig] = TrainConfig
    # The shape settings a checkpoint fixes (--init-from).
    SHAPE: tuple[str, ...] = ("n_layer", "n_head", "n_embd")
    betas = (0.9, 0.99)
    fusion: bool | str = True  # of the compiled step (autograd.compile)
    # BLAS threads for the whole run (None: as the caller has it). One suits small products: a
    # second thread cost 3x on a busy machine (docs/seq2seq.md).
    blas_threads: int | None = None
    # The model and its config dataclass (build; save_model and load_model by default)
    model_class: type[nn.Module] | None = None
    model_config_class: type | None = None

    # --- settings ---------------------------------------------------------------------------------

    def defaults(self, given: dict[str, Any]) -> dict[str, Any]:
        """The Config's defaults for what was given (seq2seq's depend on --task)."""
        return field_defaults(self.Config)

    def check(self, config: TrainConfig, given: dict[str, Any]) -> None:
        """Refuse (SystemExit naming the flag) or complete the task's settings in place."""

    # --- the model --------------------------------------------------------------------------------

    def config_fields(self, config: TrainConfig, data: Any) -> dict[str, Any]:
        """The model config's fields besides n_layer, n_head, n_embd and dropout."""
        raise NotImplementedError

    def build(self, config: TrainConfig, data: Any) -> nn.Module:
        """A new model, initialised from config.seed, in config.dtype."""
        sizes = {k: getattr(config, k) for k in ("n_layer", "n_head", "n_embd", "dropout")}
        model_config = self.model_config_class(**sizes, **self.config_fields(config, data))
        rng = np.random.default_rng(config.seed)
        return self.model_class(model_config, rng=rng).to(config.dtype)

    def save_model(self, out: Path, model: nn.Module, data: Any, stamp: dict[str, str]) -> None:
        """model.safetensors (carrying `stamp` as metadata) and what loading it needs."""
        nn.save_safetensors(out / "model.safetensors", model.state_dict(), metadata=stamp)
        nn.save_json_atomic(out / "config.json", dataclasses.asdict(model.config))

    def load_model(self, out: Path, config: TrainConfig) -> nn.Module:
        """The model save_model wrote."""
        fields = json.loads((out / "config.json").read_text(encoding="utf-8"))
        model = self.model_class(self.model_config_class(**fields)).to(config.dtype)
        model.load_state_dict(nn.load_safetensors(out / "model.safetensors")[0])
        return model

    def pretrained_shape(self, directory: Path) -> dict[str, Any]:
        """The shape settings (SHAPE) of the model saved in `directory` (--init-from)."""
        fields = json.loads((directory / "config.json").read_text(encoding="utf-8"))
        return {k: fields[k] for k in self.SHAPE if k in fields}

    def pretrained(self, directory: Path, config: TrainConfig) -> nn.Module:
        """The model saved in `directory` (--init-from), in config.dtype."""
        return self.load_model(directory, config)

    # --- data, loss and metrics -------------------------------------------------------------------

    def prepare(self, config: TrainConfig, saved: Path | None) -> Any:
        """The data (anything the other hooks need); saved: the run's directory on --resume."""
        raise NotImplementedError

    def batch(self, config: TrainConfig, data: Any, step: int, rank: int, world_size: int) -> Batch:
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
        task's metric."""
        raise NotImplementedError

    def evaluate(self, model: nn.Module, data: Any, config: TrainConfig) -> dict[str, float]:
        """Metrics on fixed held-out data, the model in eval mode without a graph (the loop sets
        both). "train" and "val" are losses; the first other one is the task's metric."""
        raise NotImplementedError

    def describe_data(self, data: Any) -> str:
        """The data part of the opening line."""
        raise NotImplementedError

    def report(self, history: dict[str, Any], data: Any, config: TrainConfig) -> list[str]:
        """Result lines printed last, after the summary line (which has the val loss)."""
        return []

    def sample(self, model: nn.Module, data: Any, config: TrainConfig) -> str | None:
        """What the trained model produces, printed after the summary line (None: nothing)."""
        return None
