"""Exercise 1: the reference solution."""


def unbroadcast(grad, shape):
    # a dimension that broadcasting added in front, or stretched from size 1, was used many
    # times in the forward pass: its gradient is the sum over those uses (notes 10.5)
    lead = grad.ndim - len(shape)
    stretched = tuple(lead + i for i, n in enumerate(shape) if n == 1 and grad.shape[lead + i] != 1)
    return grad.sum(axis=tuple(range(lead)) + stretched).reshape(shape)
