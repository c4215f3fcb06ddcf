"""loss.png: a run's loss curves against its baselines, and the task's metric beside them."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def metric(history: dict[str, Any]) -> str | None:
    """The task's metric among the evaluations (accuracy), if it has one besides the losses."""
    names = [k[5:] for k in history if k.startswith("eval_") and k != "eval_step"]
    return next((n for n in names if n not in ("train", "val")), None)


def plot_losses(
    path: Path, history: dict[str, Any], baselines: dict[str, float], title: str
) -> None:
    """Per-step training loss, the periodic evaluations and the baselines; a second panel for the
    task's metric when it has one. Written atomically (a temporary file, then renamed)."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    extra = metric(history)
    fig, axes = plt.subplots(1, 2 if extra else 1, figsize=(11 if extra else 7, 4.2))
    ax = axes[0] if extra else axes
    ax.plot(history["step"], history["loss"], lw=0.6, alpha=0.5, label="train (batch)")
    for key, label, style in (("train", "train (eval)", "o-"), ("val", "val", "s-")):
        if f"eval_{key}" in history:
            ax.plot(history["eval_step"], history[f"eval_{key}"], style, label=label)
    if "val" in baselines:
        ax.axhline(baselines["val"], ls="--", c="gray", label=f"baseline {baselines['val']:.2f}")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title(f"glassgrad {title}")
    if extra:
        axes[1].plot(history["eval_step"], history[f"eval_{extra}"], "s-", label="val")
        if extra in baselines:
            axes[1].axhline(baselines[extra], ls="--", c="gray", label="baseline")
        axes[1].set_ylabel(extra.replace("_", " "))
    for a in axes if extra else [ax]:
        a.set_xlabel("step")
        a.legend()
        a.grid(alpha=0.3)
    fig.tight_layout()
    tmp = path.with_name(path.name + ".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)
