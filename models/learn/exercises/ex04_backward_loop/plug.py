"""Exercise 4: how its function takes the place of glassgrad's own (models/learn/plug.py)."""

from collections.abc import Callable

import autograd.tensor as tensor
from autograd import hooks


def _run_backward(learner: Callable) -> list:
    own_loop = tensor.run_backward

    def run_backward(roots, seeds, retain_graph, observers=(), create_graph=False, inputs=None):
        # the learner's loop runs every plain backward(); autograd.grad, create_graph, traces and
        # autograd.compile keep glassgrad's own (they need more than the exercise asks)
        if create_graph or inputs is not None or observers or hooks.RECORDER or len(roots) != 1:
            return own_loop(roots, seeds, retain_graph, observers, create_graph, inputs)
        learner(roots[0], seeds[0])
        return None

    return [(tensor, "run_backward", run_backward)]


# the learner's function -> its adapter
ADAPTERS = {"run_backward": _run_backward}
