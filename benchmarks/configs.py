"""The standard GPT configurations and the FLOP count used for GFLOP/s figures."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from models.architectures.gpt import GPTConfig


@dataclass(frozen=True)
class BenchConfig:
    """A GPT shape plus the batch size a training step uses."""

    name: str
    vocab_size: int
    block_size: int
    n_layer: int
    n_head: int
    n_embd: int
    batch_size: int

    def gpt_config(self) -> GPTConfig:
        return GPTConfig(
            vocab_size=self.vocab_size,
            block_size=self.block_size,
            n_layer=self.n_layer,
            n_head=self.n_head,
            n_embd=self.n_embd,
        )

    def describe(self) -> str:
        return (
            f"V{self.vocab_size}/T{self.block_size}/L{self.n_layer}/H{self.n_head}/"
            f"C{self.n_embd}/B{self.batch_size}"
        )


STANDARD = {
    "tiny": BenchConfig("tiny", 65, 64, 2, 4, 64, 16),
    "mid": BenchConfig("mid", 65, 128, 4, 4, 128, 16),
    "small": BenchConfig("small", 65, 256, 6, 6, 384, 4),
}

_KEYS = {"V": "vocab_size", "T": "block_size", "L": "n_layer", "H": "n_head", "C": "n_embd"}


def parse_config(text: str) -> BenchConfig:
    """A standard name ("tiny", "mid", "small") or a spec like "V65/T128/L4/H4/C128/B16"."""
    if text in STANDARD:
        return STANDARD[text]
    values: dict[str, int] = {}
    for part in text.split("/"):
        key, number = part[:1].upper(), part[1:]
        if key not in (*_KEYS, "B") or not number.isdigit() or key in values:
            raise ValueError(
                f"benchmarks: bad config {text!r}: use one of {', '.join(STANDARD)} or "
                "V<vocab>/T<block>/L<layers>/H<heads>/C<embd>/B<batch>, "
                "e.g. V65/T128/L4/H4/C128/B16"
            )
        values[key] = int(number)
    missing = [key for key in (*_KEYS, "B") if key not in values]
    if missing:
        raise ValueError(f"benchmarks: config {text!r} lacks {', '.join(missing)}")
    config = BenchConfig(
        text, **{field: values[key] for key, field in _KEYS.items()}, batch_size=values["B"]
    )
    config.gpt_config()  # validates (positive sizes, heads dividing C)
    return config


FLOPS_FORMULA = (
    "training FLOPs per step = tokens * (6 N + 12 L T C), tokens = B T, N = parameters "
    "without the position table (the tied wte counts once, as the output head's matmul), "
    "12 L T C = the attention-score and weighted-sum matmuls, forward + backward (PaLM appendix B "
    "/ nanoGPT estimate_mfu: 12 L H Q T with H Q = C; the causal half is not subtracted)"
)


def train_flops(config: BenchConfig, n_params_no_wpe: int) -> float:
    """FLOPs of one training step (forward + backward), by FLOPS_FORMULA."""
    tokens = config.batch_size * config.block_size
    per_token = 6 * n_params_no_wpe + 12 * config.n_layer * config.block_size * config.n_embd
    return float(tokens * per_token)


def training_step(model: Any, optimizer: Any) -> Callable[[Any, Any], Any]:
    """The step every training benchmark times: zero_grad, forward with the loss, backward,
    the optimizer's update; returns the loss (a Tensor). Compile it or call it eagerly."""

    def step(x: Any, y: Any) -> Any:
        optimizer.zero_grad()
        _, loss = model(x, y)
        loss.backward()
        optimizer.step()
        return loss

    return step
