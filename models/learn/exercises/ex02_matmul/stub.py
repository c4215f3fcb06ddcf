"""The learner's starting file: `start` writes it with this docstring replaced by the
exercise's statement (en.md or zh.md)."""


def matmul_backward(a, b, g):
    """a (n, k), b (k, m), g (n, m) -> (da, db)"""
    raise NotImplementedError("exercise 2: write matmul_backward")
