"""Every primitive op, property-tested: hypothesis draws shapes (0-d, size-1, broadcast) and values;
`check_op` compares the forward with numpy and the backward with central differences (float64).

Adding an op = one line in OPS (or one small test below when it needs special arguments).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from opcheck import check_op

import autograd
from autograd import Tensor

SHAPE = hnp.array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=4)
BROADCAST_PAIR = hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=3, max_side=4)


@st.composite
def values(draw, shapes, low=-3.0, high=3.0, away_from_zero=0.0, large=False):
    """Arrays of the given shapes: seeded uniform values; `large` sometimes scales them by 1e3."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    scale = draw(st.sampled_from([1.0, 1.0, 1e3])) if large else 1.0
    arrays = []
    for shape in shapes:
        x = rng.uniform(low, high, size=shape)
        if away_from_zero:  # keep kinks and poles (relu at 0, 1/x) out of the eps neighbourhood
            x = np.where(x >= 0, x + away_from_zero, x - away_from_zero)
        arrays.append(x * scale)
    return arrays


def one(shape_strategy=SHAPE, **kw):
    return shape_strategy.flatmap(lambda s: values([s], **kw))


def two(**kw):
    return BROADCAST_PAIR.flatmap(lambda b: values(b.input_shapes, **kw))


# name -> (op on Tensors, the same in numpy, input strategy)
OPS = {
    "add": (lambda a, b: a + b, np.add, two(large=True)),
    "sub": (lambda a, b: a - b, np.subtract, two(large=True)),
    "mul": (lambda a, b: a * b, np.multiply, two(large=True)),
    "div": (lambda a, b: a / b, np.divide, two(low=0.5, high=3.0)),
    "pow": (lambda a, b: a**b, np.power, two(low=0.5, high=2.0)),
    "neg": (lambda a: -a, np.negative, one(large=True)),
    "exp": (lambda a: a.exp(), np.exp, one(low=-3.0, high=3.0)),
    "log": (lambda a: a.log(), np.log, one(low=0.1, high=5.0)),
    "sqrt": (lambda a: a.sqrt(), np.sqrt, one(low=0.1, high=5.0)),
    "tanh": (lambda a: a.tanh(), np.tanh, one(large=True)),
    "relu": (lambda a: a.relu(), lambda a: np.maximum(a, 0), one(away_from_zero=1e-3, large=True)),
    "sigmoid": (lambda a: a.sigmoid(), lambda a: np.exp(-np.logaddexp(0, -a)), one(large=True)),
    "scalar_radd": (lambda a: 2.5 + a, lambda a: 2.5 + a, one()),
    "scalar_rsub": (lambda a: 2.5 - a, lambda a: 2.5 - a, one()),
    "scalar_rmul": (lambda a: 2.5 * a, lambda a: 2.5 * a, one()),
    "scalar_rdiv": (lambda a: 2.5 / a, lambda a: 2.5 / a, one(low=0.5, high=3.0)),
    "scalar_pow": (lambda a: a**3, lambda a: a**3, one()),
    "scalar_rpow": (lambda a: 2.0**a, lambda a: 2.0**a, one()),
    "transpose": (lambda a: a.T, np.transpose, one(large=True)),
    "sum_all": (lambda a: a.sum(), np.sum, one(large=True)),
    "mean_all": (lambda a: a.mean(), np.mean, one(large=True)),
    "max_all": (lambda a: a.max(), np.max, one(large=True)),
}


@pytest.mark.parametrize("name", sorted(OPS))
def test_op(name):
    op, reference, inputs = OPS[name]

    @given(inputs)
    def run(arrays):
        check_op(op, reference, arrays)

    run()


@st.composite
def reduction_case(draw):
    shape = draw(SHAPE)
    ndim = len(shape)
    axis = draw(
        st.one_of(
            st.none(),
            st.integers(-ndim, ndim - 1) if ndim else st.none(),
            st.lists(st.integers(0, max(ndim - 1, 0)), unique=True, max_size=ndim).map(tuple),
        )
    )
    return shape, axis, draw(st.booleans()), draw(values([shape], large=True))[0]


@pytest.mark.parametrize("method", ["sum", "mean", "max"])
@given(case=reduction_case())
def test_reductions(method, case):
    shape, axis, keepdims, x = case
    if method == "mean" and axis == ():
        axis = None
    check_op(
        lambda t: getattr(t, method)(axis=axis, keepdims=keepdims),
        lambda a: getattr(np, method)(a, axis=axis, keepdims=keepdims),
        [x],
    )


def test_max_splits_gradient_evenly_between_ties():
    x = Tensor([[1.0, 3.0, 3.0], [2.0, 0.0, 2.0]], requires_grad=True)
    x.max(axis=1).sum().backward()
    np.testing.assert_array_equal(x.grad, [[0, 0.5, 0.5], [0.5, 0, 0.5]])
    y = Tensor([5.0, 5.0, 5.0, 1.0], requires_grad=True)
    y.max().backward()
    np.testing.assert_allclose(y.grad, [1 / 3, 1 / 3, 1 / 3, 0])


@given(shape=SHAPE, data=st.data())
def test_reshape(shape, data):
    x = data.draw(values([shape]))[0]
    target = data.draw(st.permutations(list(shape) + [1]).map(tuple))
    check_op(lambda t: t.reshape(target), lambda a: a.reshape(target), [x])
    check_op(lambda t: t.reshape(-1), lambda a: a.reshape(-1), [x])


@given(shape=SHAPE, data=st.data())
def test_transpose_with_axes(shape, data):
    x = data.draw(values([shape]))[0]
    axes = tuple(data.draw(st.permutations(range(len(shape)))))
    check_op(lambda t: t.transpose(*axes), lambda a: np.transpose(a, axes), [x])


@st.composite
def matmul_shapes(draw):
    """np.matmul-compatible pairs: 1-D, 2-D and batched with broadcasting of batch dims."""
    n, k, m = draw(st.integers(1, 4)), draw(st.integers(1, 4)), draw(st.integers(1, 4))
    batch = draw(
        hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=2, max_side=3)
    )
    a_batch, b_batch = batch.input_shapes
    a = (k,) if draw(st.booleans()) and not a_batch else (*a_batch, n, k)
    b = (k,) if draw(st.booleans()) and not b_batch else (*b_batch, k, m)
    return a, b


@given(shapes=matmul_shapes(), data=st.data())
def test_matmul(shapes, data):
    check_op(lambda a, b: a @ b, np.matmul, data.draw(values(shapes)))


@st.composite
def index_case(draw):
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=5))
    kind = draw(st.sampled_from(["int", "slice", "advanced", "repeated", "bool", "mixed"]))
    if kind == "int":
        index = draw(st.integers(-shape[0], shape[0] - 1))
    elif kind == "slice":
        start = draw(st.integers(0, shape[0] - 1))
        index = (slice(start, None, draw(st.integers(1, 2))), Ellipsis)
    elif kind in ("advanced", "repeated"):
        size = draw(st.integers(1, 6))
        index = np.array(draw(st.lists(st.integers(0, shape[0] - 1), min_size=size, max_size=size)))
        if kind == "repeated":
            index = np.concatenate([index, index[:1]])
    elif kind == "bool":
        index = np.array(draw(st.lists(st.booleans(), min_size=shape[0], max_size=shape[0])))
    else:
        index = (slice(None), np.array([0, 0]), *([] if len(shape) < 3 else [0]))
        if len(shape) < 2:
            index = np.array([0, 0])
    return shape, index


@given(case=index_case(), data=st.data())
def test_getitem(case, data):
    shape, index = case
    check_op(lambda t: t[index], lambda a: a[index], data.draw(values([shape])))


def test_getitem_repeated_indices_accumulate():
    x = Tensor([1.0, 2.0, 3.0], requires_grad=True)
    x[np.array([0, 0, 2, 0])].sum().backward()
    np.testing.assert_array_equal(x.grad, [3.0, 0.0, 1.0])


@given(shapes=st.lists(SHAPE.filter(lambda s: len(s) >= 1), min_size=1, max_size=3), data=st.data())
def test_concat(shapes, data):
    base = shapes[0]
    shapes = [(s[0], *base[1:]) for s in shapes]  # agree on every axis but the first
    arrays = data.draw(values(shapes))
    check_op(lambda *ts: autograd.concat(ts, axis=0), lambda *a: np.concatenate(a, 0), arrays)


@given(shape=SHAPE, n=st.integers(1, 3), data=st.data())
def test_stack(shape, n, data):
    axis = data.draw(st.integers(-len(shape) - 1, len(shape)))
    arrays = data.draw(values([shape] * n))
    check_op(lambda *ts: autograd.stack(ts, axis=axis), lambda *a: np.stack(a, axis), arrays)


@given(shapes=BROADCAST_PAIR, data=st.data())
def test_where(shapes, data):
    a, b = data.draw(values(shapes.input_shapes))
    cond = data.draw(hnp.arrays(np.bool_, shapes.result_shape))
    check_op(lambda x, y: autograd.where(cond, x, y), lambda x, y: np.where(cond, x, y), [a, b])


def test_array_on_the_left_defers_to_tensor():
    x = Tensor([1.0, 2.0], requires_grad=True)
    y = np.array([3.0, 4.0]) * x + np.array([1.0, 1.0])
    assert isinstance(y, Tensor)
    y.sum().backward()
    np.testing.assert_array_equal(x.grad, [3.0, 4.0])
