"""The capstone: every piece of the learner's at once, on the notes' ch. 11 example and a GPT.

With all ten exercises' functions plugged in (unbroadcast, matmul, the elementwise rules, the
backward loop, softmax, cross-entropy, layernorm, embedding, attention, AdamW), the notes' ch. 11
worked example must give L 2.541928 -> 1.761382 after one step of gradient descent, and a small
GPT trained with AdamW for 200 steps in float64 must produce glassgrad's own losses to 1e-9.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

import numpy as np

import autograd
import nn
from models.gpt import GPT, GPTConfig
from models.learn.plug import plugged
from models.learn.text import say
from models.worked_example import WorkedExample

NOTES_L = (2.541928, 1.761382)  # notes 11.3 and 11.6, 6 decimals
STEPS = 200
LOSS_TOLERANCE = 1e-9
TEXT = "the cat sat on the mat. the dog sat on the log. "  # enough to learn something in 200 steps
CONFIG = dict(block_size=8, n_layer=1, n_head=2, n_embd=8)
BATCH = 4


class CapstoneFailed(Exception):
    def __init__(self, line: str, diagnosis: str):
        super().__init__(line)
        self.line, self.diagnosis = line, diagnosis


def worked_example_losses() -> tuple[float, float]:
    """L before and after one step of the notes' ch. 11 example, on whatever the engine runs."""
    model = WorkedExample()
    model.forward().L.backward()
    before = model.loss()
    model.step()
    return before, model.loss()


def gpt_losses(steps: int = STEPS, stop: Callable[[int, float], bool] | None = None) -> list[float]:
    """The training losses of the capstone's GPT (float64, AdamW, fixed batches); `stop(step,
    loss)` ends the run early (a learner's run stops at the first loss that differs)."""
    vocab = sorted(set(TEXT))
    ids = np.array([vocab.index(ch) for ch in TEXT])
    config = GPTConfig(vocab_size=len(vocab), **CONFIG)
    model = GPT(config, rng=np.random.default_rng(0)).to(np.float64)
    optimizer = nn.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    rng = np.random.default_rng(1)
    losses = []
    for step in range(steps):
        starts = rng.integers(0, len(ids) - config.block_size - 1, BATCH)
        x = np.stack([ids[s : s + config.block_size] for s in starts])
        y = np.stack([ids[s + 1 : s + config.block_size + 1] for s in starts])
        _, loss = model(x, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if stop is not None and stop(step, losses[-1]):
            break
    return losses


@cache
def glassgrad_losses() -> tuple[float, ...]:
    autograd.set_default_dtype(np.float64)
    return tuple(gpt_losses())


def n_parameters() -> int:
    config = GPTConfig(vocab_size=len(set(TEXT)), **CONFIG)
    return sum(p.size for p in GPT(config, rng=np.random.default_rng(0)).parameters())


def run_pieces(functions: dict[str, Callable], lang: str) -> list[str]:
    """The capstone's two runs with `functions` plugged in; raises CapstoneFailed at the first
    number that is not glassgrad's. Returns the lines to print."""
    autograd.set_default_dtype(np.float64)
    expected = glassgrad_losses()
    with plugged(functions):
        try:
            before, after = worked_example_losses()
        except Exception as exc:
            raise CapstoneFailed(f"{type(exc).__name__}: {exc}", "ch11") from exc
        line = say("capstone_ch11", lang, before=before, after=after)
        if (round(before, 6), round(after, 6)) != NOTES_L:
            raise CapstoneFailed(line, "ch11")
        worst = [0.0]

        def differs(step: int, loss: float) -> bool:
            worst[0] = max(worst[0], abs(loss - expected[step]))
            return not abs(loss - expected[step]) <= LOSS_TOLERANCE

        try:
            losses = gpt_losses(stop=differs)
        except Exception as exc:
            raise CapstoneFailed(f"{type(exc).__name__}: {exc}", "gpt") from exc
    if len(losses) < STEPS or worst[0] > LOSS_TOLERANCE:
        step = len(losses) - 1
        diverged = say(
            "capstone_gpt_diverged", lang, step=step, got=losses[step], expected=expected[step]
        )
        raise CapstoneFailed(line + "\n  " + diverged, "gpt")
    gpt = say(
        "capstone_gpt",
        lang,
        params=n_parameters(),
        steps=STEPS,
        worst=worst[0],
        first=losses[0],
        last=losses[-1],
    )
    return [line, gpt]
