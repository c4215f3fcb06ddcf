"""Exercise 10's probes and its own check: nn.optim.AdamW's trajectory on the learner's step
against glassgrad's own."""

import numpy as np

import nn
from models.learn.checks import Failed, close, rng
from models.learn.plug import plugged
from models.learn.text import say

PARTS = {"adamw_step": ("p", "m", "v")}


def probes(p):
    r, n = p.r, p.r.standard_normal
    args = (
        n((2, 3)),
        n((2, 3)),
        n((2, 3)) * 0.1,
        r.uniform(0, 0.1, (2, 3)),
        3,
        0.1,
        (0.9, 0.999),
        1e-3,  # large enough that where eps is added shows
        0.1,
    )
    return {"adamw_step": [args]}


def cases(r):
    return []  # the optimizer is no op of check_op's: see check


def _trajectory(steps: int = 5) -> list[np.ndarray]:
    r = rng(10)
    params = [nn.Parameter(r.standard_normal((3, 2))), nn.Parameter(r.standard_normal(4))]
    for p in params:
        p.data = p.data.astype(np.float64)
    opt = nn.optim.AdamW(params, lr=0.05, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.2)
    out = []
    for _ in range(steps):
        for p in params:
            p.grad = r.standard_normal(p.shape)
        opt.step()
        out.extend(p.data.copy() for p in params)
    return out


def check(functions, lang):
    expected = _trajectory()
    with plugged(functions):
        try:
            got = _trajectory()
        except NotImplementedError as exc:
            raise Failed(say("stub", lang, name="adamw_step"), "stub") from exc
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        if not close(g, e):
            label = f"nn.optim.AdamW, step {i // 2 + 1}, parameter {i % 2} {e.shape}"
            raise Failed(say("case", lang, case=label, shapes="(3, 2), (4,)"), "engine")
