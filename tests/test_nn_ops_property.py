"""The two primitives nn defines (nn.linear's LinearFn and the rotary rotation) in the same
central-difference property suite as every autograd op (tests/opcheck.check_op)."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from opcheck import check_op

import nn


@given(
    lead=hnp.array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=4),
    n_in=st.integers(1, 5),
    n_out=st.integers(1, 5),
    bias=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_linear(lead, n_in, n_out, bias, seed):
    rng = np.random.default_rng(seed)
    x, w, b = rng.standard_normal((*lead, n_in)), rng.standard_normal((n_in, n_out)), None
    if bias:
        b = rng.standard_normal(n_out)
        check_op(nn.linear, lambda x, w, b: x @ w + b, [x, w, b])
    else:
        check_op(nn.linear, lambda x, w: x @ w, [x, w])


@given(
    shape=st.tuples(
        st.integers(1, 2), st.integers(1, 2), st.integers(1, 6), st.sampled_from([2, 4, 6])
    ),
    offset=st.integers(0, 5),
    seed=st.integers(0, 2**16),
)
def test_rotary(shape, offset, seed):
    x = np.random.default_rng(seed).standard_normal(shape)
    cos, sin = nn.rotary_tables(16, shape[-1])
    t, half = shape[2], shape[-1] // 2
    c, s = cos[offset : offset + t], sin[offset : offset + t]

    def reference(a):  # pairs (r, r + D/2) turned by position * w_r (notes 8.6)
        x1, x2 = a[..., :half], a[..., half:]
        return np.concatenate([x1 * c - x2 * s, x1 * s + x2 * c], axis=-1)

    check_op(lambda t_: nn.apply_rotary(t_, cos, sin, offset), reference, [x])
