"""A gradient-penalty training step: the loss contains ||dD/dx||^2, so its gradient needs the
second derivatives d^2 D / dx dtheta (autograd.grad with create_graph=True).

A small discriminator D (2 -> 16 -> 1, tanh) learns to tell "real" points (a ring of radius 2)
from "fake" ones (a Gaussian blob at the origin) with the logistic GAN loss, regularised by the
R1 penalty of Mescheder et al. (2018): gamma/2 * mean over real x of ||dD(x)/dx||^2. The
penalty's own gradient flows through the graph of dD/dx, which is what create_graph builds.

    python -m models.gradient_penalty [--steps N]
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import numpy as np

import autograd
import autograd.functional as F
import nn
from autograd import Tensor

GAMMA = 1.0


class Discriminator(nn.Module):
    def __init__(self, hidden: int = 16, seed: int = 0) -> None:
        super().__init__()
        rng = np.random.default_rng(seed)
        self.fc1 = nn.Linear(2, hidden, rng=rng, std=0.7)
        self.fc2 = nn.Linear(hidden, 1, rng=rng, std=0.7)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.fc1(x).tanh())[..., 0]  # one score per point


def softplus(z: Tensor) -> Tensor:
    """log(1 + e^z) = logsumexp([0, z]), stable for any z."""
    return F.logsumexp(autograd.stack([Tensor(np.zeros(z.shape), dtype=z.dtype), z], axis=-1))


def r1_penalty(d: Discriminator, real: np.ndarray) -> Tensor:
    """gamma/2 * mean_x ||dD(x)/dx||^2 at the real points, as a Tensor with a graph."""
    x = Tensor(real, requires_grad=True)
    (dx,) = autograd.grad(d(x).sum(), x, create_graph=True)  # row i: dD(x_i)/dx_i
    return 0.5 * GAMMA * (dx * dx).sum(axis=-1).mean()


def losses(d: Discriminator, real: np.ndarray, fake: np.ndarray) -> tuple[Tensor, Tensor]:
    """(logistic discriminator loss, R1 penalty)."""
    adversarial = softplus(-d(Tensor(real))).mean() + softplus(d(Tensor(fake))).mean()
    return adversarial, r1_penalty(d, real)


def train_step(d: Discriminator, opt, real: np.ndarray, fake: np.ndarray) -> tuple[float, float]:
    """One step on loss + penalty; backward goes through the penalty's gradient graph."""
    adversarial, penalty = losses(d, real, fake)
    opt.zero_grad()
    (adversarial + penalty).backward()
    opt.step()
    return adversarial.item(), penalty.item()


def batch(rng: np.random.Generator, n: int = 64) -> tuple[np.ndarray, np.ndarray]:
    angle = rng.uniform(0, 2 * np.pi, n)
    real = 2.0 * np.stack([np.cos(angle), np.sin(angle)], axis=-1) + 0.1 * rng.standard_normal(
        (n, 2)
    )
    return real, 0.5 * rng.standard_normal((n, 2))


def main(argv: Sequence[str] | None = None) -> list[tuple[float, float]]:
    first_paragraph = " ".join(__doc__.split("\n\n")[0].split())
    parser = argparse.ArgumentParser(
        prog="python -m models.gradient_penalty", description=first_paragraph
    )
    parser.add_argument("--steps", type=int, default=200, help="training steps (default 200)")
    steps = parser.parse_args(argv).steps
    autograd.set_default_dtype(np.float64)
    d = Discriminator()
    opt = nn.optim.Adam(d.parameters(), lr=1e-2)
    rng = np.random.default_rng(0)
    history = []
    for step in range(steps + 1):
        history.append(train_step(d, opt, *batch(rng)))
        if step % 50 == 0:
            adversarial, penalty = history[-1]
            print(f"step {step:3d}: discriminator loss {adversarial:.4f}  R1 penalty {penalty:.4f}")
    return history


if __name__ == "__main__":
    main()
