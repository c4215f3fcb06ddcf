"""The fused optimizer of a compiled step: AdamW / Adam as one Numba loop over a flat parameter
buffer, with the gradients written straight into the matching flat gradient buffer. Its
arithmetic is eager AdamW's, operation for operation in the parameter dtype.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np


def flat_optimizer(plan: Any, optimizer: Any, with_grad: set[int]) -> Callable[[], None] | None:
    """AdamW / Adam as one loop per parameter group over flat buffers, or None (not fusable:
    then the optimizer's own step() is replayed). Called before the program is built: the
    parameters move into the flat buffer and their gradient buffers are views of the flat one,
    so that the backward writes the gradients where the update reads them."""
    # The optimizer says which update its step() applies (nn.optim.Adam.flat_update_rule): the
    # engine sits below nn and knows no optimizer class.
    describe = getattr(optimizer, "flat_update_rule", None)
    rule = describe() if describe is not None else None
    if rule is None or rule["rule"] != "adam":
        return None
    # frozen parameters (requires_grad=False) stay where they are: no flat slot, no moments
    params = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
    leaf_of = {id(v.tensor): v for v in plan.leaves}
    if not params or any(
        id(p) not in leaf_of or leaf_of[id(p)].id not in with_grad for p in params
    ):
        return None  # a parameter without a gradient this step: eager skips it; keep eager
    dtypes = {p.dtype for p in params}
    steps = {optimizer.state.get(p, {}).get("step", 0) for p in params}
    if len(dtypes) != 1 or len(steps) != 1:
        return None
    dtype = dtypes.pop()
    total = sum(p.size for p in params)
    flat = {name: np.zeros(total, dtype) for name in ("param", "grad", "exp_avg", "exp_avg_sq")}
    offset, ranges = 0, []
    for group in optimizer.param_groups:
        start = offset
        for p in (p for p in group["params"] if p.requires_grad):
            view = lambda name, o=offset, p=p: flat[name][o : o + p.size].reshape(p.shape)
            np.copyto(view("param"), p.data)
            p.data = view("param")  # the parameter now lives in the flat buffer
            plan.vals[leaf_of[id(p)].id] = p.data
            plan.grads[leaf_of[id(p)].id] = view("grad")
            if p.grad is not None:  # the traced call's gradient, moved as well
                np.copyto(view("grad"), p.grad)
                p.grad = view("grad")
            state = optimizer.state.setdefault(p, {})
            for name in ("exp_avg", "exp_avg_sq"):
                if name in state:
                    np.copyto(view(name), state[name])
                state[name] = view(name)
            state.setdefault("step", 0)
            offset += p.size
        ranges.append((group, slice(start, offset)))
    kernel = _adam_kernel()
    decoupled = rule["decoupled"]
    states, first = optimizer.state, params[0]  # the step count: read from the state each time
    s = dtype.type

    def update(part: int = 0, parts: int = 1) -> None:
        """The update of part `part` of `parts` equal pieces of every group (a batch-sharded
        step runs the pieces on its threads, autograd/compile/shard.py); count() counts the step."""
        t = states[first]["step"] + 1
        for group, where in ranges:
            lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
            size = where.stop - where.start
            piece = slice(
                where.start + part * size // parts, where.start + (part + 1) * size // parts
            )
            kernel(
                piece.stop - piece.start,
                flat["param"][piece],
                flat["grad"][piece],
                flat["exp_avg"][piece],
                flat["exp_avg_sq"][piece],
                s(1.0 - lr * wd if decoupled else 1.0),
                s(0.0 if decoupled else wd),
                s(b1),
                s(1.0 - b1),
                s(b2),
                s(1.0 - b2),
                s(np.sqrt(1.0 - b2**t)),
                s(eps),
                s(lr / (1.0 - b1**t)),
            )

    def count() -> None:
        t = states[first]["step"] + 1
        for p in params:
            states[p]["step"] = t

    def run() -> None:
        update()
        count()

    run.update, run.count = update, count
    run.flat_grad = flat["grad"]  # a batch-sharded step adds the other shards' gradients here
    run.note = (
        f"{type(optimizer).__name__} fused: one Numba loop over a flat buffer of "
        f"{len(params)} parameters ({total:,} values), {len(ranges)} group(s)"
    )
    return run


def _adam_kernel() -> Any:
    from autograd.kernels import adam  # imports Numba: only when a step is planned

    return adam.adam_update
