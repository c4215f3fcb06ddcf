"""Newton's method with second derivatives from the engine: logistic regression in a few steps.

The problem: L2-regularised logistic regression on a fixed synthetic data set (200 points, 5
features), written with the engine's ops; its loss is the notes' cross-entropy (9.2) with logits
[0, x.w], i.e. mean(log(1 + e^(x.w)) - y x.w), plus lam/2 |w|^2. Two second-order methods:

- Newton: w <- w - H^-1 g with the full Hessian H (autograd.hessian: one reverse pass through the
  gradient's graph per parameter);
- Hessian-free (Newton-CG): the same step, H^-1 g solved by conjugate gradients, touching H only
  through Hessian-vector products (autograd.hvp), so H is never formed.

Both reach |grad| < 1e-10 from w = 0 in five iterations: quadratic convergence, the number of
correct digits roughly doubling per step once close.

    python -m models.newton
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import numpy as np

import autograd
import autograd.functional as F
from autograd import Tensor

LAM = 1e-2


def data(n: int = 200, d: int = 5, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Features x (n, d) and labels y drawn from a logistic model with known weights."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d))
    true_w = rng.standard_normal(d)
    y = (rng.random(n) < 1 / (1 + np.exp(-x @ true_w))).astype(np.int64)
    return x, y


def loss_fn(x: np.ndarray, y: np.ndarray):
    """w -> mean cross-entropy of logits [0, x w] against y, plus LAM/2 |w|^2."""
    features = Tensor(x, dtype=np.float64)
    zeros = Tensor(np.zeros(len(x)), dtype=np.float64)

    def loss(w: Tensor) -> Tensor:
        logits = autograd.stack([zeros, features @ w], axis=-1)
        return F.cross_entropy(logits, y) + 0.5 * LAM * (w * w).sum()

    return loss


def _gradient(loss, w: np.ndarray) -> np.ndarray:
    t = Tensor(w, requires_grad=True, dtype=np.float64)
    return autograd.grad(loss(t), t)[0].data


def newton(loss, w: np.ndarray, steps: int = 8, tol: float = 1e-10) -> list[tuple[float, float]]:
    """Full Newton steps; returns (loss, |grad|) before each step and after the last."""
    history = []
    for _ in range(steps + 1):
        g = _gradient(loss, w)
        history.append((loss(Tensor(w, dtype=np.float64)).item(), float(np.linalg.norm(g))))
        if history[-1][1] < tol:
            break
        h = autograd.hessian(loss, w).data  # (d, d)
        w = w - np.linalg.solve(h, g)
    return history


def conjugate_gradient(hvp, b: np.ndarray, iterations: int = 50, tol: float = 1e-12) -> np.ndarray:
    """Solve H p = b for symmetric positive definite H, given only p -> H p."""
    p = np.zeros_like(b)
    r = b.copy()
    direction = r.copy()
    rr = r @ r
    for _ in range(iterations):
        if np.sqrt(rr) < tol:
            break
        hd = hvp(direction)
        alpha = rr / (direction @ hd)
        p += alpha * direction
        r -= alpha * hd
        rr, previous = r @ r, rr
        direction = r + (rr / previous) * direction
    return p


def hessian_free(loss, w: np.ndarray, steps: int = 8, tol: float = 1e-10):
    """Newton-CG steps: H^-1 g by conjugate gradients on Hessian-vector products."""
    history = []
    for _ in range(steps + 1):
        g = _gradient(loss, w)
        history.append((loss(Tensor(w, dtype=np.float64)).item(), float(np.linalg.norm(g))))
        if history[-1][1] < tol:
            break

        def hvp(v: np.ndarray, w: np.ndarray = w) -> np.ndarray:
            return autograd.hvp(loss, w, v)[1].data

        w = w - conjugate_gradient(hvp, g)
    return history


def main(argv: Sequence[str] | None = None) -> None:
    first_paragraph = " ".join(__doc__.split("\n\n")[0].split())
    argparse.ArgumentParser(prog="python -m models.newton", description=first_paragraph).parse_args(
        argv
    )
    x, y = data()
    loss = loss_fn(x, y)
    w0 = np.zeros(x.shape[1])
    for name, method in (
        ("Newton (full Hessian)", newton),
        ("Hessian-free (CG + hvp)", hessian_free),
    ):
        print(name)
        for i, (value, norm) in enumerate(method(loss, w0)):
            print(f"  iteration {i}: loss {value:.12f}  |grad| {norm:.3e}")


if __name__ == "__main__":
    main()
