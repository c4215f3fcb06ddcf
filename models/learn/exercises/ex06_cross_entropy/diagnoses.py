"""Exercise 6's classic mistakes: MISTAKES, each as the wrong function it amounts to; FACTORS, a
constant factor that is a quantity of the case (a missing 1/N, named with its N)."""

import numpy as np

from autograd.testing.references import np_softmax


def _whole_array(logits, targets, ignore_index=-100):
    kept = targets != ignore_index
    p = np.exp(logits - logits.max())
    p /= p.sum()
    p[np.flatnonzero(kept), targets[kept]] -= 1
    return p * (kept / max(int(kept.sum()), 1))[:, None]


def _mean_over_all(logits, targets, ignore_index=-100):
    kept = targets != ignore_index
    p = np_softmax(logits, -1)
    p[np.flatnonzero(kept), targets[kept]] -= 1
    return p * kept[:, None] / len(targets)


def _ignored_rows_kept(logits, targets, ignore_index=-100):
    kept = targets != ignore_index
    p = np_softmax(logits, -1)
    p[np.flatnonzero(kept), targets[kept]] -= 1
    return p / max(int(kept.sum()), 1)


MISTAKES = {
    "log_softmax_backward": [
        ("d_log_softmax_no_sum", lambda y, g: g - np.exp(y) * g),
        ("d_softmax_whole_array", lambda y, g: g - np.exp(y) * g.sum()),
    ],
    "cross_entropy_backward": [
        ("d_ignored_rows", _ignored_rows_kept),
        ("d_mean_over_all_rows", _mean_over_all),
        ("d_softmax_whole_array", _whole_array),
    ],
}

# (diagnosis, the factor and the quantity it names): a missing 1/N multiplies by N
FACTORS = {
    "cross_entropy_backward": [
        (
            "d_missing_mean",
            lambda logits, targets, ignore=-100: [int((targets != ignore).sum())] * 2,
        ),
    ],
}
