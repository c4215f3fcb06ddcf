"""Exercise 2's classic mistakes, each as the wrong function it amounts to."""

MISTAKES = {
    "matmul_backward": [
        ("d_transposed", lambda a, b, g: (g @ b, a @ g)),
        ("d_swapped", lambda a, b, g: (a.T @ g, g @ b.T)),
    ],
}
