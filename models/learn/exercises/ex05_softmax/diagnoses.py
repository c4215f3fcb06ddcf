"""Exercise 5's classic mistakes, each as the wrong function it amounts to."""

MISTAKES = {
    "softmax_backward": [
        ("d_softmax_no_diagonal", lambda a, g: -a * (a * g).sum(axis=-1, keepdims=True)),
        ("d_softmax_only_diagonal", lambda a, g: a * g),
        ("d_softmax_wrong_axis", lambda a, g: a * (g - (a * g).sum(axis=0, keepdims=True))),
        ("d_softmax_whole_array", lambda a, g: a * (g - (a * g).sum())),
    ],
}
