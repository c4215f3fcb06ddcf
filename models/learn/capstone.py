"""The capstone: all the learner's pieces at once, on the notes' ch. 11 example and the demo GPT.

With all ten exercises' functions plugged in (unbroadcast, matmul, the elementwise rules, the
backward loop, softmax, cross-entropy, layernorm, embedding, attention, AdamW):

1. the notes' ch. 11 worked example must give L 2.541928 -> 1.761382 after one step of gradient
   descent;
2. the demo GPT, the model `make demo` / `python -m models.train` trains, with the training
   code's own defaults (models/training/: its LanguageConfig, the stdlib corpus, the
   character tokenizer, the batches, AdamW with its schedule and gradient clipping), trained
   eagerly in float64 for its first 200 steps, must produce glassgrad's own losses to 1e-9 at
   every step.

Glassgrad's losses are computed in the same run, step by step beside the learner's: two BLAS
builds (or thread counts) round differently, so stored numbers would not do. At the first step
that differs, each exercise's pieces are tried alone on glassgrad's state to name the likely cause.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

import autograd
import nn
from autograd.compile.plan import one_blas_thread
from models.learn.exercises import EXERCISES
from models.learn.plug import plugged
from models.learn.text import say
from models.train import LANGUAGE, TRAINER
from models.training.step import Batch, EagerTrainStep, param_groups
from models.training.tasks.language import LanguageConfig
from models.worked_example import WorkedExample

NOTES_L = (2.541928, 1.761382)  # notes 11.3 and 11.6, 6 decimals
STEPS = 200
LOSS_TOLERANCE = 1e-9
PROGRESS_LINES = 20  # table rows printed over a run (and every step that differs)


class CapstoneFailed(Exception):
    def __init__(self, line: str, diagnosis: str):
        super().__init__(line)
        self.line, self.diagnosis = line, diagnosis


def demo_settings(**overrides: Any) -> LanguageConfig:
    """What `python -m models.train --dtype float64` runs with (the loop resolves the GPT's
    defaults as for the command line; float64: the capstone's 1e-9 is a float64 bar), with
    `overrides` (the tests' smaller GPT)."""
    args = TRAINER.build_parser().parse_args(["--dtype", "float64"])
    return dataclasses.replace(TRAINER.resolve_settings(args), **overrides)


class DemoRun:
    """models.train's run, one eager step at a time: the corpus, tokenizer, batches and model are
    the GPT trainer's (models/train.py), the optimizer, schedule, clipping and step the loop's
    (models/training/: Trainer.fit, train_step)."""

    def __init__(self, settings: LanguageConfig):
        self.settings = settings
        self.data = LANGUAGE.prepare(settings, None)
        self.model = LANGUAGE.build(settings, self.data)
        groups = param_groups(self.model, settings.weight_decay)
        self.optimizer = nn.optim.AdamW(groups, lr=settings.lr, betas=LANGUAGE.betas)
        self.model.train()

    def batch(self, step: int) -> Batch:
        return LANGUAGE.batch(self.settings, self.data, step, rank=0, world_size=1)

    def lr(self, step: int) -> float:
        """The learning rate at `step` of the whole run (warmup, then cosine over its steps):
        the capstone's 200 steps are the first of the demo's."""
        s = self.settings
        return nn.optim.cosine_with_warmup(step, s.lr, s.warmup, s.steps, s.min_lr)

    def step(self, step: int) -> float:
        """Train on batch `step` at that step's learning rate; returns the batch's loss."""
        loss_fn = partial(LANGUAGE.loss, self.model)
        train_step = EagerTrainStep(loss_fn, self.optimizer, self.settings.grad_clip)
        return train_step(self.batch(step), self.lr(step))[0]

    def loss(self, step: int) -> float:
        """The loss on batch `step` without training (the next step's loss, before it runs)."""
        with autograd.no_grad():
            return LANGUAGE.loss(self.model, *self.batch(step)).item()

    def state(self) -> tuple[dict, dict]:
        return (
            {k: v.copy() for k, v in self.model.state_dict().items()},
            _copied(self.optimizer.state_dict()),
        )

    def load(self, state: tuple[dict, dict]) -> None:
        self.model.load_state_dict(state[0])
        self.optimizer.load_state_dict(_copied(state[1]))


def _copied(tree: Any) -> Any:
    """A copy of an optimizer state dict: its arrays copied, so that steps leave it alone."""
    if isinstance(tree, dict):
        return {k: _copied(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_copied(v) for v in tree]
    return tree.copy() if isinstance(tree, np.ndarray) else tree


def worked_example_losses() -> tuple[float, float]:
    """L before and after one step of the notes' ch. 11 example, on whatever the engine runs."""
    model = WorkedExample()
    model.forward().L.backward()
    before = model.loss()
    model.step()
    return before, model.loss()


def _by_exercise(functions: dict[str, Callable]) -> dict[int, dict[str, Callable]]:
    return {
        e.number: {name: functions[name] for name in e.functions if name in functions}
        for e in EXERCISES
    }


def _causes(
    pieces: dict[int, dict[str, Callable]], effect: Callable[[], float], bar: float, lang: str
) -> str:
    """Which exercise is the likely cause: each one's pieces alone (every other piece
    glassgrad's) run `effect`: how far that moves glassgrad's number (inf: it raises). Named:
    those beyond the bar, else the one that moves it most (a difference that grew over steps)."""
    effects = {}
    for number, functions in pieces.items():
        with plugged(functions):
            try:
                effects[number] = effect()
            except Exception:
                effects[number] = math.inf

    def size(n: int) -> float:  # a NaN is as far as it gets
        return math.inf if math.isnan(effects[n]) else effects[n]

    ranked = sorted(effects, key=size, reverse=True)
    named = [n for n in ranked if size(n) > bar] or ranked[:1]
    lines = []
    for n in named:
        title = EXERCISES[n - 1].title[lang]
        if effects[n] == math.inf:
            lines.append(say("capstone_cause_raises", lang, n=n, title=title))
        else:
            lines.append(say("capstone_cause", lang, n=n, title=title, effect=effects[n]))
    if effects[named[0]] <= bar:  # below the bar alone: name the runner-up for comparison
        runner_up = ranked[1]
        lines[0] += say("capstone_cause_grown", lang, n=runner_up, effect=effects[runner_up])
    return "\n  ".join(lines)


def _ch11(pieces: dict[int, dict[str, Callable]], lang: str) -> str:
    everything = {name: fn for functions in pieces.values() for name, fn in functions.items()}
    with plugged(everything):
        try:
            before, after = worked_example_losses()
        except Exception as exc:
            line = f"{type(exc).__name__}: {exc}"
        else:
            line = say("capstone_ch11", lang, before=before, after=after)
            if (round(before, 6), round(after, 6)) == NOTES_L:
                return line
    ours = worked_example_losses()

    def effect() -> float:
        return max(abs(a - b) for a, b in zip(worked_example_losses(), ours, strict=True))

    # the notes' 6 decimals: a difference under half a unit in the last one does not show
    raise CapstoneFailed(line + "\n  " + _causes(pieces, effect, 5e-7, lang), "ch11")


def _alone(
    settings: LanguageConfig, state: tuple[dict, dict], step: int, expected_next: float
) -> Callable[[], float]:
    """For _causes: from glassgrad's `state` before `step`, run that step; how far is the next
    step's loss then from glassgrad's `expected_next`?"""
    scratch = DemoRun(settings)

    def effect() -> float:
        scratch.load(state)
        scratch.step(step)
        return abs(scratch.loss(step + 1) - expected_next)

    return effect


def _gpt(
    pieces: dict[int, dict[str, Callable]],
    lang: str,
    settings: LanguageConfig,
    steps: int,
    progress: Callable[[str], None],
) -> str:
    """Glassgrad's run and the learner's side by side, step by step; raises at the first loss
    that differs (or the first step that raises), naming the exercises whose pieces alone make
    glassgrad's own run differ at that point."""
    everything = {name: fn for functions in pieces.values() for name, fn in functions.items()}
    ours, yours = DemoRun(settings), DemoRun(settings)
    s, model = settings, ours.model
    what = say("capstone_demo_gpt" if s == demo_settings() else "capstone_other_gpt", lang)
    progress(
        say(
            "capstone_gpt_header",
            lang,
            what=what,
            model=model.describe(),
            params=model.num_parameters(),
            source=ours.data.corpus.source,
            tokenizer=s.tokenizer,
            batch=s.batch_size,
            block=s.block_size,
            lr=s.lr,
            warmup=s.warmup,
            total=s.steps,
            clip=s.grad_clip,
            steps=steps,
        )
    )
    progress(say("capstone_gpt_columns", lang))
    every = max(1, steps // PROGRESS_LINES)
    worst, losses, states = 0.0, [], [ours.state()]  # states[-1]: glassgrad's before this step
    for step in range(steps):
        expected = ours.step(step)
        try:
            with plugged(everything):
                got = yours.step(step)
        except Exception as exc:
            # the suspects: pieces that make this very step of glassgrad's raise or differ
            error = f"{type(exc).__name__}: {exc}"
            line = say("capstone_gpt_raised", lang, step=step, error=error)
            effect = _alone(settings, states[-1], step, ours.loss(step + 1))
            causes = _causes(pieces, effect, LOSS_TOLERANCE, lang)
            raise CapstoneFailed(line + "\n  " + causes, "gpt") from exc
        diff = abs(got - expected)
        if not diff <= LOSS_TOLERANCE or step % every == 0 or step == steps - 1:
            progress(f"  {step:>5}  {got:16.12f}  {expected:16.12f}  {diff:9.1e}")
        if not diff <= LOSS_TOLERANCE:
            # a loss is the forward of the previous step's update (step 0's is glassgrad's
            # own forward, which no piece changes): that update is the suspect
            line = say(
                "capstone_gpt_diverged",
                lang,
                step=step,
                got=got,
                expected=expected,
                diff=diff,
                bar=LOSS_TOLERANCE,
            )
            effect = _alone(settings, states[0], step - 1, expected)
            causes = _causes(pieces, effect, LOSS_TOLERANCE, lang)
            raise CapstoneFailed(line + "\n  " + causes, "gpt")
        worst = max(worst, diff)
        losses.append(got)
        states = [states[-1], ours.state()]
    return say(
        "capstone_gpt",
        lang,
        what=what,
        params=model.num_parameters(),
        steps=steps,
        worst=worst,
        bar=LOSS_TOLERANCE,
        first=losses[0],
        last=losses[-1],
    )


def run_pieces(
    functions: dict[str, Callable],
    lang: str,
    settings: LanguageConfig | None = None,
    steps: int = STEPS,
    progress: Callable[[str], None] = lambda line: None,
) -> list[str]:
    """The capstone's two runs with `functions` (name -> the learner's function) plugged in;
    raises CapstoneFailed at the first number that is not glassgrad's. The GPT is the demo's
    (demo_settings()) unless `settings` says otherwise; `progress` gets the table as it runs.
    Returns the lines of the verdict."""
    autograd.set_default_dtype(np.float64)
    pieces = _by_exercise(functions)
    ch11 = _ch11(pieces, lang)
    settings = demo_settings() if settings is None else settings
    # One BLAS thread for both runs (they compare within one process, so what is checked is
    # the same): the demo's products are small; on a quiet 2-core machine a second thread saved
    # a fifth of the time, on a busy one each product waited for a thread that was not scheduled
    # and the capstone took 164 s instead of 42-50 s on that machine (docs/learn.md).
    with one_blas_thread()():
        try:
            gpt = _gpt(pieces, lang, settings, steps, progress)
        except CapstoneFailed as failure:
            raise CapstoneFailed(ch11 + "\n  " + failure.line, failure.diagnosis) from failure
    return [ch11, gpt]
