"""Every op of the registry (tests/op_cases.py), property-tested: hypothesis draws the shapes and
values; `check_op` compares the forward with numpy and the backward with central differences
(float64), and checks that each VJP mutates and aliases nothing.

Adding an op = one `register(...)` line in op_cases.py; this file and the mutation test cover it.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from op_cases import CASES

from autograd import Tensor, kernels
from autograd.testing import check_example


@pytest.mark.parametrize("name", sorted(CASES))
def test_op(name):
    case = CASES[name]

    @given(case.strategy)
    def run(example):
        with kernels.use_backend(case.backend):
            check_example(example)

    run()


def test_max_splits_gradient_evenly_between_ties():
    x = Tensor([[1.0, 3.0, 3.0], [2.0, 0.0, 2.0]], requires_grad=True)
    x.max(axis=1).sum().backward()
    np.testing.assert_array_equal(x.grad, [[0, 0.5, 0.5], [0.5, 0, 0.5]])
    y = Tensor([5.0, 5.0, 5.0, 1.0], requires_grad=True)
    y.max().backward()
    np.testing.assert_allclose(y.grad, [1 / 3, 1 / 3, 1 / 3, 0])


def test_getitem_repeated_indices_accumulate():
    x = Tensor([1.0, 2.0, 3.0], requires_grad=True)
    x[np.array([0, 0, 2, 0])].sum().backward()
    np.testing.assert_array_equal(x.grad, [3.0, 0.0, 1.0])


def test_array_on_the_left_defers_to_tensor():
    x = Tensor([1.0, 2.0], requires_grad=True)
    y = np.array([3.0, 4.0]) * x + np.array([1.0, 1.0])
    assert isinstance(y, Tensor)
    y.sum().backward()
    np.testing.assert_array_equal(x.grad, [3.0, 4.0])
