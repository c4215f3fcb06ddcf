"""Every op of the registry (tests/op_cases.py), in forward mode: the same hypothesis strategies as
test_ops_property.py, each op's JVP rule checked by autograd.testing.check_jvp (float64) against
central differences along a random direction and against the op's own VJP by the transpose
identity <J v, u> = <v, J^T u>.

Adding an op = one `register(...)` line in op_cases.py (and a `jvp` beside its backward); this
file and the mutation test cover it.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from op_cases import CASES

from autograd import kernels
from autograd.testing import check_example_jvp

EXAMPLES = max(10, settings.default.max_examples // 2)


@pytest.mark.parametrize("name", sorted(CASES))
def test_op_jvp(name):
    case = CASES[name]

    @settings(max_examples=EXAMPLES)
    @given(case.strategy)
    def run(example):
        with kernels.use_backend(case.backend):
            check_example_jvp(example)

    run()
