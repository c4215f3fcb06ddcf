"""Plugging a learner's functions into the engine in place of glassgrad's own.

The mechanism is the mutation test's (tests/test_mutation.py): a primitive's `backward` is a class
attribute, so assigning another function to it changes what every node of that class runs, and
the original is put back afterwards. Each learner function has one adapter, in its exercise's
plug.py, that turns the node's saved state into the learner's arguments (the exercises'
signatures are plain numpy, one case each), so the whole engine — check_op, the worked example, a
GPT — runs on the learner's code.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from models.learn.exercises import EXERCISES

# learner function name -> its adapter: (owner, attribute, replacement) for each patch
ADAPTERS: dict[str, Callable[[Callable], list]] = {
    name: adapter for e in EXERCISES for name, adapter in e.part("plug").ADAPTERS.items()
}


@contextmanager
def plugged(functions: dict[str, Callable]) -> Iterator[None]:
    """Inside the block the engine runs the given learner functions (name -> function)."""
    patches = [patch for name, fn in functions.items() for patch in ADAPTERS[name](fn)]
    originals = [(owner, attr, owner.__dict__[attr]) for owner, attr, _ in patches]
    try:
        for owner, attr, replacement in patches:
            setattr(owner, attr, replacement)
        yield
    finally:
        for owner, attr, original in reversed(originals):
            setattr(owner, attr, original)
