"""Optimizers (SGD, Adam, AdamW), gradient clipping and the warmup + cosine learning-rate schedule.

An optimizer holds `param_groups`: a list of dicts, each with its "params" and its own
hyperparameters ("lr", "weight_decay", ...), so that e.g. biases and norm weights can be kept out
of weight decay. `step()` updates every parameter that requires grad and has a .grad (a frozen
one, requires_grad=False, may sit in a group: it is skipped and gets no state); parameters are
changed in place under no_grad() (which bumps their version, so a stale graph cannot be
back-propagated). `state_dict()` / `load_state_dict()` carry the step counts and moment arrays
exactly, so that a resumed run continues bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from autograd import Tensor, hooks, no_grad
from nn.module import Parameter


class Optimizer:
    """Base class: parameter groups, zero_grad, state save/restore. Subclasses define _update."""

    def __init__(self, params: Iterable[Any], defaults: dict[str, Any]) -> None:
        self.defaults = defaults
        self.param_groups: list[dict[str, Any]] = []
        self.state: dict[Tensor, dict[str, Any]] = {}  # per parameter (Tensors hash by identity)
        items = list(params)
        if not items:
            raise ValueError(f"{type(self).__name__}: got an empty parameter list")
        groups = items if isinstance(items[0], dict) else [{"params": items}]
        for group in groups:
            self.add_param_group(group)

    def add_param_group(self, group: dict[str, Any]) -> None:
        """Add {"params": [...], <hyperparameter>: value, ...}; missing settings take defaults."""
        name = type(self).__name__
        if not isinstance(group, dict) or "params" not in group:
            raise TypeError(f"{name}: a parameter group must be a dict with a 'params' entry")
        unknown = set(group) - set(self.defaults) - {"params"}
        if unknown:
            raise ValueError(
                f"{name}: unknown setting(s) {sorted(unknown)} in a parameter group; "
                f"known: {sorted(self.defaults)}"
            )
        params = list(group["params"])
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        for p in params:
            if not isinstance(p, Parameter) and not (isinstance(p, Tensor) and p.requires_grad):
                raise TypeError(
                    f"{name}: parameters must be Parameters (frozen ones are skipped) or "
                    f"Tensors that require grad, got {p!r}"
                )
            if id(p) in seen:
                raise ValueError(f"{name}: a parameter (shape {p.shape}) appears in two groups")
            seen.add(id(p))
        self.param_groups.append({**self.defaults, **group, "params": params})

    def zero_grad(self) -> None:
        if hooks.RECORDER is not None:  # autograd.compile: replayed as part of the step
            hooks.RECORDER.call("zero_grad", self._clear_grads)
        else:
            self._clear_grads()

    def _clear_grads(self) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                p.grad = None

    def step(self) -> None:
        """Update every parameter that requires grad and received a gradient (frozen: skipped)."""
        if hooks.RECORDER is not None:  # autograd.compile: replayed, or fused (fused_update)
            hooks.RECORDER.optimizer_step(self)
        with no_grad():
            for group in self.param_groups:
                for p in group["params"]:
                    if p.requires_grad and p.grad is not None:
                        self._update(p, p.grad, group, self.state.setdefault(p, {}))

    def _update(self, p: Tensor, grad: np.ndarray, group: dict, state: dict) -> None:
        raise NotImplementedError

    def fused_update(self, trained: Iterable[Tensor]) -> Any:
        """A compiled step's question (autograd/compile/optimizer.py): this optimizer's update over
        flat buffers, or None, the default: then the compiled step replays step()."""
        return None

    # --- save / restore ------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The optimizer's state as plain data, for checkpoints.

        {"state": {index: {name: array or int}}, "param_groups": [{settings, "params": [index]}]};
        parameters are numbered in group order; arrays are copies.
        """
        index: dict[int, int] = {}
        groups = []
        for group in self.param_groups:
            ids = []
            for p in group["params"]:
                index[id(p)] = len(index)
                ids.append(index[id(p)])
            settings = {k: (list(v) if isinstance(v, tuple) else v) for k, v in group.items()}
            groups.append({**settings, "params": ids})
        state = {
            index[id(p)]: {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in s.items()}
            for p, s in self.state.items()
        }
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the settings and per-parameter state from state_dict(); all checked first."""
        name = type(self).__name__
        groups = state_dict["param_groups"]
        if [len(g["params"]) for g in groups] != [len(g["params"]) for g in self.param_groups]:
            raise ValueError(
                f"{name}.load_state_dict: the saved groups have "
                f"{[len(g['params']) for g in groups]} parameters, this optimizer "
                f"{[len(g['params']) for g in self.param_groups]}"
            )
        params = [p for g in self.param_groups for p in g["params"]]
        new_state: dict[Tensor, dict[str, Any]] = {}
        for key, saved in state_dict["state"].items():
            i = int(key)
            if not 0 <= i < len(params):
                raise ValueError(f"{name}.load_state_dict: state for unknown parameter {i}")
            p = params[i]
            entry = {}
            for k, v in saved.items():
                if isinstance(v, np.ndarray):
                    if v.shape != p.shape:
                        raise ValueError(
                            f"{name}.load_state_dict: state {k!r} of parameter {i} has shape "
                            f"{v.shape}, the parameter {p.shape}"
                        )
                    v = np.array(v, dtype=p.dtype, copy=True)
                entry[k] = v
            new_state[p] = entry
        for group, saved in zip(self.param_groups, groups, strict=True):
            for k, v in saved.items():
                if k != "params":
                    group[k] = tuple(v) if isinstance(v, list) else v
        self.state = new_state


class SGD(Optimizer):
    """p -= lr * g, with optional L2 weight decay (g += wd * p) and heavy-ball momentum.

    With momentum m: buf = g on the first step, then buf = m * buf + g; p -= lr * buf.
    """

    def __init__(
        self, params: Iterable[Any], lr: float, momentum: float = 0.0, weight_decay: float = 0.0
    ) -> None:
        if lr < 0 or momentum < 0 or weight_decay < 0:
            raise ValueError(
                f"SGD: lr, momentum and weight_decay must be >= 0, got {lr}, {momentum}, "
                f"{weight_decay}"
            )
        super().__init__(params, {"lr": lr, "momentum": momentum, "weight_decay": weight_decay})

    def _update(self, p, grad, group, state):
        if group["weight_decay"]:
            grad = grad + group["weight_decay"] * p.data
        if group["momentum"]:
            buf = state.get("momentum_buffer")
            if buf is None:
                buf = state["momentum_buffer"] = np.array(grad, dtype=p.dtype, copy=True)
            else:
                buf *= group["momentum"]
                buf += grad
            grad = buf
        p -= group["lr"] * grad


class Adam(Optimizer):
    """Adam (Kingma & Ba): bias-corrected moment estimates; weight_decay is L2 (added to g).

    t += 1;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
    p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)

    The arithmetic, eager and compiled: autograd/kernels/adam.py.
    """

    decoupled = False  # AdamW: decay the weights directly instead of through the gradient

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ) -> None:
        name = type(self).__name__
        if lr < 0 or eps < 0 or weight_decay < 0:
            raise ValueError(
                f"{name}: lr, eps, weight_decay must be >= 0, got {lr}, {eps}, {weight_decay}"
            )
        if not all(0.0 <= b < 1.0 for b in betas) or len(betas) != 2:
            raise ValueError(f"{name}: betas must be two numbers in [0, 1), got {betas}")
        defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay}
        super().__init__(params, defaults)

    def fused_update(self, trained: Iterable[Tensor]) -> FlatAdam | None:
        """Adam(W)'s step as one kernel call per group over flat buffers, for a compiled step
        (the protocol: autograd/compile/optimizer.py), or None. Moves the parameters there."""
        if type(self).step is not Optimizer.step or type(self)._update is not Adam._update:
            return None  # a subclass that changes the update keeps its own step()
        params = [p for group in self.param_groups for p in group["params"] if p.requires_grad]
        sent = {id(p) for p in trained}
        if not params or any(id(p) not in sent for p in params):
            return None  # a parameter without a gradient this step: step() skips it
        dtypes = {p.dtype for p in params}
        steps = {self.state.get(p, {}).get("step", 0) for p in params}
        if len(dtypes) != 1 or len(steps) != 1:
            return None
        return FlatAdam(self, params)

    def _update(self, p, grad, group, state):
        from autograd.kernels import adam  # (imports Numba: at the first step, not with nn)

        if not state:
            state["step"] = 0
            state["exp_avg"] = np.zeros_like(p.data)
            state["exp_avg_sq"] = np.zeros_like(p.data)
        state["step"] += 1
        lr, betas, eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        c = adam.coefficients(lr, betas, eps, wd, self.decoupled, state["step"])
        # the numpy reference, not the Numba loop a compiled step runs: eager is what the
        # compiled-vs-eager tests hold that loop to, bit for bit
        adam.adam_update_numpy(p.data, grad, state["exp_avg"], state["exp_avg_sq"], c)
        p.data = p.data  # the setter counts a change: a graph that saved p refuses backward


class FlatAdam:
    """Adam(W)'s step over four flat buffers (parameters, gradients, both moments), one kernel
    call per parameter group: the fused update of a compiled step (autograd/compile/optimizer.py,
    FusedUpdate). Made by Adam.fused_update: each parameter's array, its gradient and its moments
    become views of the flat buffers (state_dict() still reads them), so the backward writes each
    gradient where the update reads it. The settings are read from the groups at every update
    (a schedule changes "lr"); the step count from the first parameter's state."""

    def __init__(self, optimizer: Adam, params: list[Tensor]) -> None:
        dtype, total = params[0].dtype, sum(p.size for p in params)
        flat = {name: np.zeros(total, dtype) for name in ("param", "grad", "exp_avg", "exp_avg_sq")}
        self.grad_buffers: list[tuple[Tensor, np.ndarray]] = []  # (parameter, its gradient)
        self.ranges: list[tuple[dict[str, Any], slice]] = []  # (group, its part of the buffers)
        offset = 0
        for group in optimizer.param_groups:
            start = offset
            for p in (p for p in group["params"] if p.requires_grad):  # frozen ones stay put
                view = lambda name, o=offset, p=p: flat[name][o : o + p.size].reshape(p.shape)
                np.copyto(view("param"), p.data)
                p.data = view("param")
                if p.grad is not None:  # the traced call's gradient, moved as well
                    np.copyto(view("grad"), p.grad)
                    p.grad = view("grad")
                self.grad_buffers.append((p, view("grad")))
                state = optimizer.state.setdefault(p, {})
                for name in ("exp_avg", "exp_avg_sq"):
                    if name in state:
                        np.copyto(view(name), state[name])
                    state[name] = view(name)
                state.setdefault("step", 0)
                offset += p.size
            self.ranges.append((group, slice(start, offset)))
        self.flat, self.flat_grad = flat, flat["grad"]
        self.decoupled, self.params = optimizer.decoupled, params
        self.states = optimizer.state
        self.note = (
            f"{type(optimizer).__name__} fused: one Numba loop over a flat buffer of "
            f"{len(params)} parameters ({total:,} values), {len(self.ranges)} group(s)"
        )

    def __call__(self) -> None:
        self.update()
        self.count()

    def update(self, part: int = 0, parts: int = 1) -> None:
        """Update part `part` of `parts` equal pieces of every group (a batch-sharded step runs
        the pieces on its threads); count() then counts the step."""
        from autograd.kernels import adam

        t = self.states[self.params[0]]["step"] + 1
        for group, where in self.ranges:
            lr, betas, eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
            c = adam.coefficients(lr, betas, eps, wd, self.decoupled, t)
            size = where.stop - where.start
            piece = slice(
                where.start + part * size // parts, where.start + (part + 1) * size // parts
            )
            flat = [self.flat[name][piece] for name in ("param", "grad", "exp_avg", "exp_avg_sq")]
            adam.adam_update_numba(*flat, c)

    def count(self) -> None:
        t = self.states[self.params[0]]["step"] + 1
        for p in self.params:
            self.states[p]["step"] = t


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov & Hutter): p *= 1 - lr * wd, then Adam.

    Use parameter groups to exclude biases and norm weights, e.g.
    AdamW([{"params": matrices}, {"params": others, "weight_decay": 0.0}], lr=3e-4).
    """

    decoupled = True

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.01,
    ) -> None:
        super().__init__(params, lr, betas, eps, weight_decay)


def clip_grad_norm_(params: Iterable[Tensor], max_norm: float) -> float:
    """Scale all gradients together so that their joint L2 norm is at most max_norm.

    Returns the norm before clipping. A non-finite norm is returned with the gradients left
    unchanged, so the caller can see it and skip the step.
    """
    params = list(params)
    if hooks.RECORDER is not None:  # autograd.compile: re-run on the replay's gradients
        return hooks.RECORDER.call("clip_grad_norm_", _clip_grad_norm, params, max_norm)
    return _clip_grad_norm(params, max_norm)


def _clip_grad_norm(params: list[Tensor], max_norm: float) -> float:
    grads = [p.grad for p in params if p.requires_grad and p.grad is not None]
    total = math.sqrt(sum(float(np.vdot(g, g)) for g in grads))
    if math.isfinite(total) and total > max_norm:
        scale = max_norm / (total + 1e-6)
        for g in grads:
            g *= scale
    return total


def cosine_with_warmup(
    step: int, base_lr: float, warmup_steps: int, total_steps: int, min_lr: float = 0.0
) -> float:
    """Learning rate at `step` (from 0): linear warmup, then cosine decay to min_lr.

    Steps 0 .. warmup_steps - 1 rise linearly to base_lr (step 0 gets base_lr / warmup_steps);
    then lr = min_lr + (base_lr - min_lr) * (1 + cos(pi * progress)) / 2 with progress going from
    0 to 1 at total_steps; after total_steps it stays at min_lr.
    """
    if warmup_steps < 0 or total_steps < warmup_steps:
        raise ValueError(
            f"cosine_with_warmup: need 0 <= warmup_steps <= total_steps, got {warmup_steps}, "
            f"{total_steps}"
        )
    if step < warmup_steps:
        return base_lr * (step + 1) / warmup_steps
    if step >= total_steps:
        return min_lr
    progress = (step - warmup_steps) / (total_steps - warmup_steps)
    return min_lr + (base_lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))
