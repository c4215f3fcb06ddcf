"""Exercise 3's classic mistakes: MISTAKES, each as the wrong function it amounts to; RAISES, a
function that raises, explained (its code works once the reduced axes are put back for it)."""

import numpy as np

from models.learn.checks import close, copied
from models.learn.exercises.ex03_elementwise.solution import sum_backward


def _max_each_tie(a, g, axes, keepdims):
    winners = a == a.max(axis=axes, keepdims=True)
    return winners * sum_backward(g, a.shape, axes, keepdims)


def _max_first_tie(a, g, axes, keepdims):
    (axis,) = axes
    first = np.zeros(a.shape, bool)
    np.put_along_axis(first, np.expand_dims(a.argmax(axis=axis), axis), True, axis=axis)
    return first * sum_backward(g, a.shape, axes, keepdims)


MISTAKES = {
    "tanh_backward": [("d_tanh_twice", lambda y, g: g * (1 - np.tanh(y) ** 2))],
    "max_backward": [
        ("d_ties_not_split", _max_each_tie),
        ("d_ties_first_only", _max_first_tie),
    ],
}


def _with_reduced_axes_kept(args: tuple, g_at: int, shape: tuple) -> tuple:
    """A reduction VJP's args (..., axes, keepdims) with g (at g_at) given its reduced axes back
    as size-1 axes, and keepdims=True: what it gets once the axes are put back."""
    args = list(args)
    axes = args[-2]
    args[g_at] = args[g_at].reshape(tuple(1 if d in axes else n for d, n in enumerate(shape)))
    args[-1] = True
    return tuple(args)


def _reduction_axes_not_put_back(learner, ref, args, g_at: int, shape_of) -> bool:
    """It raised, yet with the reduced axes put back for it, it gives the right answer."""
    if args[-1]:  # keepdims: nothing to put back
        return False
    fixed = _with_reduced_axes_kept(args, g_at, shape_of(args))
    try:
        return close(learner(*copied(fixed)), ref(*copied(args)))
    except Exception:
        return False


# A function that raises, explained: (diagnosis, test(learner, reference, args) -> bool).
RAISES = {
    "sum_backward": [
        (
            "d_reduced_axes_not_put_back",
            lambda f, r, a: _reduction_axes_not_put_back(f, r, a, 0, lambda args: args[1]),
        )
    ],
    "max_backward": [
        (
            "d_reduced_axes_not_put_back",
            lambda f, r, a: _reduction_axes_not_put_back(f, r, a, 1, lambda args: args[0].shape),
        )
    ],
}
