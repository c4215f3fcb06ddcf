"""Hypothesis strategies for checking ops: the shapes and values the property suite draws.

This module imports hypothesis (a test dependency, `pip install glassgrad[test]`);
`autograd.testing` itself does not. Shapes include 0-d, size-1 and broadcast dims; values
include large magnitudes (x 1e3), exact zeros and, for logits, -inf masks and ties.

>>> import numpy as np
>>> from hypothesis import given
>>> from autograd.testing import check_op
>>> from autograd.testing.strategies import one
>>> @given(one(low=0.1, high=5.0))
... def test_log(arrays):
...     check_op(lambda t: t.log(), np.log, arrays)
"""

from __future__ import annotations

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from autograd.testing import Example

SHAPE = hnp.array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=4)
SHAPE_1D_UP = hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=5)
BROADCAST_PAIR = hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=3, max_side=4)


def seeded(draw) -> np.random.Generator:
    """A numpy generator seeded by hypothesis (so the example shrinks and replays)."""
    return np.random.default_rng(draw(st.integers(0, 2**32 - 1)))


@st.composite
def values(draw, shapes, low=-3.0, high=3.0, away_from_zero=0.0, large=False, zeros=False):
    """Arrays of the given shapes: seeded uniform values; `large` sometimes scales them by 1e3;
    `zeros` sets some elements to exactly 0 (only where the op's derivative exists at 0)."""
    rng = seeded(draw)
    scale = draw(st.sampled_from([1.0, 1.0, 1e3])) if large else 1.0
    with_zeros = zeros and draw(st.booleans())
    arrays = []
    for shape in shapes:
        x = rng.uniform(low, high, size=shape)
        if away_from_zero:  # keep kinks and poles (relu at 0, 1/x) out of the eps neighbourhood
            x = np.where(x >= 0, x + away_from_zero, x - away_from_zero)
        x = x * scale
        if with_zeros:
            x = np.where(rng.random(shape) < 0.3, 0.0, x)
        arrays.append(x)
    return arrays


def one(shape_strategy=SHAPE, **kw):
    """[x]: one array of a drawn shape (values' keywords)."""
    return shape_strategy.flatmap(lambda s: values([s], **kw))


def two(**kw):
    """[a, b]: two arrays of mutually broadcastable shapes (values' keywords)."""
    return BROADCAST_PAIR.flatmap(lambda b: values(b.input_shapes, **kw))


def elementwise(op, reference, arrays_strategy):
    """Examples of op (on Tensors) against reference (on arrays) on the drawn arrays."""
    return arrays_strategy.map(lambda arrays: Example(op, reference, arrays))


@st.composite
def logits(draw, allow_inf=True):
    """An array, an axis, and values that may be huge (+-1e4) or contain -inf (whole slices too)."""
    shape = draw(SHAPE_1D_UP)
    rng = seeded(draw)
    x = rng.standard_normal(shape) * draw(st.sampled_from([1.0, 3.0, 1e4]))
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    if allow_inf and draw(st.booleans()):
        x[rng.random(shape) < 0.3] = -np.inf
        if draw(st.booleans()):  # an entirely -inf slice along the axis
            index = [0] * len(shape)
            index[axis] = slice(None)
            x[tuple(index)] = -np.inf
    if draw(st.booleans()):  # ties: equal logits
        x = np.where(np.isfinite(x), np.round(x), x)
    return x, axis


@st.composite
def norm_inputs(draw):
    """(x, weight, bias) for a normalisation over the last axis."""
    shape = draw(SHAPE_1D_UP)
    rng = seeded(draw)
    # (not 100: with C = 2 the output is +-1 whatever x is, and the only x-dependence left is
    # through eps at 1e-9 of the variance, below what central differences resolve)
    x = rng.standard_normal(shape) * draw(st.sampled_from([0.1, 1.0, 10.0]))
    # Rows whose values nearly coincide make LayerNorm ill-conditioned (its derivatives grow like
    # 1/spread): central differences cannot resolve them; test_reliability covers them instead.
    assume(shape[-1] == 1 or np.ptp(x, axis=-1).min() > 0.2 * np.abs(x).max())
    return x, rng.standard_normal(shape[-1:]), rng.standard_normal(shape[-1:])


@st.composite
def qkv(draw, any_value_width=False, grouped=False):
    """(q, k, v, causal): (B, H, T, D) arrays, Tq <= Tk (a KV-cache step when Tq < Tk).
    grouped: k and v have Hkv heads, each read by a group of 2 or 3 query heads (H = Hkv group)."""
    rng = seeded(draw)
    b, h = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    kv_heads, h = (h, h * draw(st.integers(2, 3))) if grouped else (h, h)
    tk = draw(st.sampled_from([1, 2, 3, 5, 8]))
    tq = draw(st.integers(1, tk))  # Tq < Tk: a KV-cache step (bottom-right aligned causal)
    d = draw(st.sampled_from([1, 2, 3, 5]))
    scale = draw(st.sampled_from([1.0, 3.0]))
    q = rng.standard_normal((b, h, tq, d)) * scale
    k = rng.standard_normal((b, kv_heads, tk, d)) * scale
    v = rng.standard_normal((b, kv_heads, tk, draw(st.integers(1, 4)) if any_value_width else d))
    return q, k, v, draw(st.booleans())
