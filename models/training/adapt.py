"""Fine-tuning's changes to a loaded model (docs/finetune.md): --freeze and --lora-rank."""

from __future__ import annotations

from typing import Any

import numpy as np

import nn


def adapt(model: nn.Module, config: Any, name: str) -> nn.Module:
    """config.freeze and config.lora_rank applied to the model (in place; returned); errors name
    the flag, for command `name`."""
    if config.freeze:
        try:
            model.freeze(*[g.strip() for g in config.freeze.split(",") if g.strip()])
        except KeyError as exc:
            raise SystemExit(f"{name}: --freeze: {exc.args[0]}") from None
    if config.lora_rank is not None:
        rng = np.random.default_rng(config.seed)
        targets = config.lora_targets or nn.lora.attention_projections(model)
        try:
            nn.apply_lora(model, targets, config.lora_rank, config.lora_alpha, rng=rng)
        except (KeyError, ValueError) as exc:
            raise SystemExit(f"{name}: --lora-targets: {exc.args[0]}") from None
    return model
