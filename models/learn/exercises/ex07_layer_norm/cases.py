"""Exercise 7's probes and engine cases: layer norm over 2-D and 3-D inputs."""

import autograd.functional as F
from autograd.testing.references import np_layer_norm
from models.learn.checks import Case

PARTS = {"layer_norm_backward": ("dx", "dw", "db")}


def probes(p):
    n = p.r.standard_normal
    return {"layer_norm_backward": [(n((2, 3, 4)), n(4), n((2, 3, 4)), 1e-5)]}


def cases(r):
    n = r.standard_normal
    return [
        Case("F.layer_norm(x, w, b)", F.layer_norm, np_layer_norm, [n((3, 4)), n(4), n(4)]),
        Case("F.layer_norm(x, w, b)", F.layer_norm, np_layer_norm, [n((2, 2, 5)) * 3, n(5), n(5)]),
    ]
