"""The JAX baseline: the GPT-2 of models.architectures.gpt.GPT (and benchmarks/torch_ref.py), one
jitted step.

Parameters are copied from a glassgrad GPT's state_dict (HF names, (in, out) weights); the step
(forward, mean cross-entropy, backward by jax.value_and_grad, AdamW with torch's formula) is one
jax.jit with the parameters and moments donated, which is how a JAX user writes a training loop.
Imported only when jax is installed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def _layer_norm(x: Any, w: Any, b: Any) -> Any:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + 1e-5) * w + b


def _loss(params: dict[str, Any], idx: Any, targets: Any, n_head: int, n_layer: int) -> Any:
    p = lambda name: params["transformer." + name]
    B, T = idx.shape
    wte = p("wte.weight")
    C = wte.shape[1]
    H, D = n_head, C // n_head
    x = wte[idx] + p("wpe.weight")[:T]
    causal = jnp.tril(jnp.ones((T, T), dtype=bool))
    for i in range(n_layer):
        h = _layer_norm(x, p(f"h.{i}.ln_1.weight"), p(f"h.{i}.ln_1.bias"))
        qkv = h @ p(f"h.{i}.attn.c_attn.weight") + p(f"h.{i}.attn.c_attn.bias")
        q, k, v = (
            qkv[..., j * C : (j + 1) * C].reshape(B, T, H, D).transpose(0, 2, 1, 3)
            for j in range(3)
        )
        scores = jnp.where(causal, q @ k.transpose(0, 1, 3, 2) / np.sqrt(D), -jnp.inf)
        y = jax.nn.softmax(scores, axis=-1) @ v
        y = y.transpose(0, 2, 1, 3).reshape(B, T, C)
        x = x + y @ p(f"h.{i}.attn.c_proj.weight") + p(f"h.{i}.attn.c_proj.bias")
        h = _layer_norm(x, p(f"h.{i}.ln_2.weight"), p(f"h.{i}.ln_2.bias"))
        h = jax.nn.gelu(h @ p(f"h.{i}.mlp.c_fc.weight") + p(f"h.{i}.mlp.c_fc.bias"), True)
        x = x + h @ p(f"h.{i}.mlp.c_proj.weight") + p(f"h.{i}.mlp.c_proj.bias")
    logits = _layer_norm(x, p("ln_f.weight"), p("ln_f.bias")) @ wte.T
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.take_along_axis(logp, targets[..., None], axis=-1).mean()


def train_step(
    model: Any, batch: tuple[np.ndarray, np.ndarray], lr: float, weight_decay: float
) -> Callable[[], float]:
    """A zero-argument callable running one jitted AdamW step; it returns that step's loss."""
    n_head, n_layer = model.config.n_head, model.config.n_layer
    b1, b2, eps = 0.9, 0.999, 1e-8

    @jax.jit
    def step(params, m, v, t, idx, targets):
        loss, grads = jax.value_and_grad(_loss)(params, idx, targets, n_head, n_layer)
        t = t + 1
        new_p, new_m, new_v = {}, {}, {}
        for k, g in grads.items():  # torch.optim.AdamW's update, parameter by parameter
            new_m[k] = b1 * m[k] + (1 - b1) * g
            new_v[k] = b2 * v[k] + (1 - b2) * g * g
            mhat = new_m[k] / (1 - b1**t)
            vhat = new_v[k] / (1 - b2**t)
            new_p[k] = params[k] * (1 - lr * weight_decay) - lr * mhat / (jnp.sqrt(vhat) + eps)
        return loss, new_p, new_m, new_v, t

    step = jax.jit(step.__wrapped__, donate_argnums=(0, 1, 2))
    state = {
        "params": {k: jnp.asarray(a) for k, a in model.state_dict().items()},
        "t": jnp.asarray(0.0, dtype=jnp.float32),
    }
    state["m"] = {k: jnp.zeros_like(a) for k, a in state["params"].items()}
    state["v"] = {k: jnp.zeros_like(a) for k, a in state["params"].items()}
    idx, targets = (jnp.asarray(a) for a in batch)

    def run() -> float:
        loss, state["params"], state["m"], state["v"], state["t"] = step(
            state["params"], state["m"], state["v"], state["t"], idx, targets
        )
        return float(loss)  # waits for the step: JAX dispatches asynchronously

    return run
