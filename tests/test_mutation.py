"""The suite proves it can fail: every op of the registry gets a wrong backward, and check_op must
notice. Two mutations per op: every input gradient scaled by 1.5, and one element off by 0.01.
Then the same one order up: every op gets a wrong differentiable VJP (Function.vjp, what
create_graph=True runs), and gradgradcheck (check_op_twice) must notice: its gradients scaled by
1.5, or their values kept but their derivatives (the double backward) scaled by 1.5.

The op's primitive is the Function that made its output (found by running the op once), so a new
op registered in op_cases.py is mutated here without a line of its own.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import Phase, given, settings
from op_cases import CASES

import autograd
from autograd import Tensor, kernels
from autograd.testing import check_example, check_example_twice


def scaled(fn, grads):
    return tuple(None if g is None else g * 1.5 for g in grads)


def one_element_off(fn, grads):
    grads = list(grads)
    for i, g in enumerate(grads):
        if g is not None and g.size and fn.inputs[i].requires_grad:
            grads[i] = np.array(g)  # a copy: g may be a read-only view
            grads[i].flat[0] += 0.01
            break
    return tuple(grads)


MUTATIONS = {"scaled_by_1.5": scaled, "one_element_off_by_0.01": one_element_off}


def primitive_of(example):
    """The Function class that produced the op's output on float64 inputs."""
    autograd.set_default_dtype(np.float64)
    differentiable = example.differentiable or [True] * len(example.arrays)
    inputs = [
        Tensor(np.array(a, dtype=np.float64), requires_grad=d) if d else a
        for a, d in zip(example.arrays, differentiable, strict=True)
    ]
    return type(example.op(*inputs).op)


def caught(example, mutation) -> bool:
    """True when check_op fails on `example` with the primitive's backward mutated."""
    cls = primitive_of(example)
    original = cls.backward
    cls.backward = lambda self, g: mutation(self, original(self, g))
    try:
        check_example(example)
    except AssertionError:
        return True
    finally:
        cls.backward = original
    return False


class Caught(Exception):
    """Raised to stop hypothesis at the first example on which the mutation was caught."""


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
@pytest.mark.parametrize("name", sorted(CASES))
def test_check_op_catches_a_wrong_backward(name, mutation):
    case = CASES[name]

    # derandomized, no shrinking: stop at the first example that catches the mutation
    @settings(max_examples=50, derandomize=True, database=None, phases=[Phase.generate])
    @given(case.strategy)
    def search(example):
        if caught(example, MUTATIONS[mutation]):
            raise Caught

    with kernels.use_backend(case.backend), pytest.raises(Caught):
        search()


def vjp_values_scaled(r):
    return r * 1.5


def vjp_derivatives_scaled(r):
    """The same value, but d(r)/d(anything) is 1.5 times too large."""
    return r.detach() + (r - r.detach()) * 1.5


SECOND_ORDER_MUTATIONS = {
    "vjp_scaled_by_1.5": vjp_values_scaled,
    "double_backward_scaled_by_1.5": vjp_derivatives_scaled,
}


def caught_twice(example, mutation) -> bool:
    """True when check_op_twice fails on `example` with the primitive's vjp mutated."""
    cls = primitive_of(example)
    own_vjp = cls.__dict__.get("vjp")  # None: inherited (ops.Op runs backward on Tensors)
    original = cls.vjp
    cls.vjp = lambda self, g, out: tuple(
        None if r is None else mutation(r) for r in original(self, g, out)
    )
    try:
        check_example_twice(example)
    except AssertionError:
        return True
    finally:
        if own_vjp is None:
            del cls.vjp
        else:
            cls.vjp = own_vjp
    return False


@pytest.mark.parametrize("mutation", sorted(SECOND_ORDER_MUTATIONS))
@pytest.mark.parametrize("name", sorted(CASES))
def test_gradgradcheck_catches_a_wrong_double_backward(name, mutation):
    case = CASES[name]

    @settings(max_examples=50, derandomize=True, database=None, phases=[Phase.generate])
    @given(case.strategy)
    def search(example):
        if caught_twice(example, SECOND_ORDER_MUTATIONS[mutation]):
            raise Caught

    with kernels.use_backend(case.backend), pytest.raises(Caught):
        search()
