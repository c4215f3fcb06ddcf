"""Every op of the registry (tests/op_cases.py), twice differentiable: the same hypothesis
strategies as test_ops_property.py, checked by gradgradcheck in float64 (check_op_twice). Fewer
examples than the first-order suite (a quarter of the profile's: 6 under "ci", 100 under
"thorough"): each one differentiates a gradient, element by element.

Adding an op = one `register(...)` line in op_cases.py; this file and the mutation test cover it.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from op_cases import CASES

from autograd import kernels
from autograd.testing import check_example_twice

EXAMPLES = max(6, settings.default.max_examples // 4)


@pytest.mark.parametrize("name", sorted(CASES))
def test_op_twice(name):
    case = CASES[name]

    @settings(max_examples=EXAMPLES)
    @given(case.strategy)
    def run(example):
        with kernels.use_backend(case.backend):
            check_example_twice(example)

    run()
