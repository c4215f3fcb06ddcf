"""Exercise 9's classic mistakes: MISTAKES, each as the wrong function it amounts to; FACTORS, a
missing 1/sqrt(d), named with its d; RAISES, .T on 4-D arrays (it reverses every axis)."""

import inspect
import math
import re

import numpy as np

from autograd.testing.references import np_softmax
from models.learn.exercises.ex09_attention.solution import attention_backward


def _mask_times_zero(q, k, v, g, allowed):
    # scores multiplied by the mask: a forbidden score is 0, which softmax still weighs (e^0 = 1)
    d = q.shape[-1]
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(d) * allowed
    a = np_softmax(s, -1)
    da = g @ np.swapaxes(v, -1, -2)
    ds = a * (da - (a * da).sum(axis=-1, keepdims=True)) / math.sqrt(d)
    return ds @ k, np.swapaxes(ds, -1, -2) @ q, np.swapaxes(a, -1, -2) @ g


def _unmasked(q, k, v, g, allowed):
    return attention_backward(q, k, v, g, np.ones_like(allowed))


def _dk_untransposed(q, k, v, g, allowed):
    dq, _, dv = attention_backward(q, k, v, g, allowed)
    scale = 1 / math.sqrt(q.shape[-1])
    s = np.where(allowed, q @ np.swapaxes(k, -1, -2) * scale, -np.inf)
    a = np_softmax(s, -1)
    da = g @ np.swapaxes(v, -1, -2)
    ds = a * (da - (a * da).sum(axis=-1, keepdims=True)) * scale
    return dq, ds @ q, dv


MISTAKES = {
    "attention_backward": [
        ("d_mask_gradient", _unmasked),
        ("d_mask_times_zero", _mask_times_zero),
        ("d_transposed", _dk_untransposed),
    ],
}

# (diagnosis, the factor and the quantity it names): a missing 1/sqrt(d) multiplies by sqrt(d)
FACTORS = {
    "attention_backward": [
        ("d_missing_scale", lambda q, *_: (math.sqrt(q.shape[-1]), q.shape[-1])),
    ],
}


def _uses_dot_t(learner, ref, args) -> bool:
    """It raised on 4-D arrays and its code uses .T (which reverses every axis of a 4-D array)."""
    try:
        source = inspect.getsource(learner)
    except (OSError, TypeError):
        return False
    return bool(re.search(r"\.T\b", source)) and any(np.ndim(a) > 2 for a in args)


# A function that raises, explained: (diagnosis, test(learner, reference, args) -> bool).
RAISES = {"attention_backward": [("d_dot_t_on_4d", _uses_dot_t)]}
