"""Exercise 4's classic mistakes, told apart by graphs whose answers differ for each: a tensor
used twice (one branch kept), a tensor reached by paths of different lengths (the order), a
second backward (a leaf overwritten), and how often each op's backward runs (once per path)."""

import numpy as np

import autograd.ops as ops
from autograd import Tensor
from models.learn.checks import Failed, short
from models.learn.text import say


def loop_probes(lang: str) -> None:
    """Raise Failed, with the mistake's diagnosis, unless the plugged-in loop gets each graph
    right and runs every op's backward once."""
    calls: dict[int, int] = {}
    counted = (ops.Mul, ops.Add)
    originals = {cls: cls.__dict__["backward"] for cls in counted}

    def counting(original):
        def backward(self, g):
            calls[id(self)] = calls.get(id(self), 0) + 1
            return original(self, g)

        return backward

    def x_grad(build, passes=1) -> np.ndarray:
        x = Tensor(np.array([1.0, 2.0]), requires_grad=True, dtype=np.float64)
        for _ in range(passes):
            build(x).sum().backward()
        return x.grad

    def check(name, build, expected, key, passes=1):
        calls.clear()
        try:
            got = x_grad(build, passes)
        except NotImplementedError as exc:
            raise Failed(say("stub", lang, name="run_backward"), "stub") from exc
        except Exception as exc:
            error = short(exc)
            raise Failed(say("raised", lang, name="run_backward", error=error), "raised") from exc
        shown = None if got is None else got.tolist()
        line = say("loop_probe", lang, probe=name, expected=expected, got=shown)
        if got is None or not np.allclose(got, expected):
            if key == "d_loop_not_accumulated" and got is not None:
                half = np.allclose(got, np.array(expected) / 2)  # one branch of two kept
                key = "d_loop_not_accumulated" if half else "d_loop_order"
            elif key == "d_loop_not_accumulated":
                key = "d_loop_order"  # nothing arrived: the loop ran ops before their gradient
            raise Failed(line, key, say(key, lang))
        if any(count > 1 for count in calls.values()):
            raise Failed(line, "d_loop_twice", say("d_loop_twice", lang))

    for cls in counted:
        cls.backward = counting(originals[cls])
    try:
        check(
            "y = 3x; z = y + y",
            lambda x: (lambda y: y + y)(x * 3.0),
            [6.0, 6.0],
            "d_loop_not_accumulated",
        )

        def order(x):
            a = x * 2.0
            b = a * 3.0
            return a + b  # a reaches the output directly and through b: dL/da = 1 + 3

        check("a = 2x; b = 3a; z = a + b", order, [8.0, 8.0], "d_loop_order")

        def deep(x):  # a used by a chain of three more ops: every path must arrive first
            a = x * 1.0
            b = a * 2.0
            c = b * 1.0
            return (a + c) * 1.0

        check("a = x; c = 2a; z = a + c", deep, [3.0, 3.0], "d_loop_order")
        check(
            "(2x).sum() then (2x).sum() again",
            lambda x: x * 2.0,
            [4.0, 4.0],
            "d_leaf_overwritten",
            passes=2,
        )
    finally:
        for cls in counted:
            cls.backward = originals[cls]
