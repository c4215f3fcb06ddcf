"""Exercise 1's classic mistakes, each as the wrong function it amounts to."""


def _left_aligned(grad, shape):
    # shapes lined up from the left: the trailing axes taken for the ones broadcasting added
    out = grad.sum(axis=tuple(range(len(shape), grad.ndim)))
    stretched = tuple(i for i, n in enumerate(shape) if n == 1 and out.shape[i] != 1)
    return out.sum(axis=stretched, keepdims=True)


MISTAKES = {"unbroadcast": [("d_unbroadcast_wrong_axes", _left_aligned)]}
