"""The property suite's registry: every differentiable op of the engine, one entry each.

An entry is a hypothesis strategy that draws an `Example` (the op on Tensors, the same maths in
plain numpy, the input arrays) and the kernel backend it runs under. `test_ops_property.py` runs
`check_op` on every entry; `test_mutation.py` breaks every entry's backward and checks that
`check_op` notices. Adding an op = one `register(...)` line here, and both suites cover it.

Shapes include 0-d, size-1 and broadcast dims, negative axes and T = 1; values include large
magnitudes, exact zeros where the derivative is defined there, and -inf masks where they are legal.
The checker (`check_op`), the numpy references and the generic strategies are the public
`autograd.testing`; this file holds only the registry of glassgrad's own ops.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import autograd
import autograd.functional as F
import nn
from autograd import ops, unbroadcast
from autograd.kernels.examples import quantized_weight
from autograd.quantized import KEPT, block_size, quantized_linear
from autograd.testing import Example
from autograd.testing.references import (
    np_attention,
    np_cross_entropy,
    np_gelu_exact,
    np_gelu_tanh,
    np_layer_norm,
    np_log_softmax,
    np_logsumexp,
    np_rms_norm,
    np_softmax,
)
from autograd.testing.strategies import (
    BROADCAST_PAIR,
    SHAPE,
    SHAPE_1D_UP,
    elementwise,
    logits,
    norm_inputs,
    one,
    qkv,
    seeded,
    two,
    values,
)


@dataclass(frozen=True)
class Case:
    strategy: st.SearchStrategy
    backend: str = "numba"  # the kernel path the op runs on ("numpy": the reference kernels)


CASES: dict[str, Case] = {}


def register(name: str, strategy: st.SearchStrategy, both_backends: bool = False) -> None:
    """Add an op; `both_backends` registers it once per kernel path (name[numba], name[numpy])."""
    if both_backends:
        for backend in ("numba", "numpy"):
            CASES[f"{name}[{backend}]"] = Case(strategy, backend)
    else:
        CASES[name] = Case(strategy)


# --- elementwise ops ----------------------------------------------------------------------------

register("add", elementwise(lambda a, b: a + b, np.add, two(large=True, zeros=True)))
register("sub", elementwise(lambda a, b: a - b, np.subtract, two(large=True, zeros=True)))
register("mul", elementwise(lambda a, b: a * b, np.multiply, two(large=True, zeros=True)))
register("div", elementwise(lambda a, b: a / b, np.divide, two(low=0.5, high=3.0)))
register("pow", elementwise(lambda a, b: a**b, np.power, two(low=0.5, high=2.0)))
register("neg", elementwise(lambda a: -a, np.negative, one(large=True, zeros=True)))
register("exp", elementwise(lambda a: a.exp(), np.exp, one(low=-3.0, high=3.0, zeros=True)))
register("log", elementwise(lambda a: a.log(), np.log, one(low=0.1, high=5.0)))
register("sqrt", elementwise(lambda a: a.sqrt(), np.sqrt, one(low=0.1, high=5.0)))
register("tanh", elementwise(lambda a: a.tanh(), np.tanh, one(large=True, zeros=True)))
register(
    "relu",
    elementwise(
        lambda a: a.relu(), lambda a: np.maximum(a, 0), one(away_from_zero=1e-3, large=True)
    ),
)
register(
    "sigmoid",
    elementwise(lambda a: a.sigmoid(), lambda a: np.exp(-np.logaddexp(0, -a)), one(large=True)),
)
register(
    "silu",
    elementwise(F.silu, lambda a: a * np.exp(-np.logaddexp(0, -a)), one(large=True, zeros=True)),
    both_backends=True,
)
# the gate large (x 1e3: silu's saturated tails), the up projection not: with both ~1e3 the
# products' rounding in the checked sum (~1e6) swamps a small derivative's central difference
register(
    "swiglu",
    SHAPE.flatmap(
        lambda s: st.tuples(values([s], large=True, zeros=True), values([s], zeros=True))
    ).map(
        lambda ab: Example(
            F.swiglu, lambda a, b: a * np.exp(-np.logaddexp(0, -a)) * b, [ab[0][0], ab[1][0]]
        )
    ),
    both_backends=True,
)
register("scalar_radd", elementwise(lambda a: 2.5 + a, lambda a: 2.5 + a, one()))
register("scalar_rsub", elementwise(lambda a: 2.5 - a, lambda a: 2.5 - a, one()))
register("scalar_rmul", elementwise(lambda a: 2.5 * a, lambda a: 2.5 * a, one(zeros=True)))
register("scalar_rdiv", elementwise(lambda a: 2.5 / a, lambda a: 2.5 / a, one(low=0.5, high=3.0)))
register("scalar_pow", elementwise(lambda a: a**3, lambda a: a**3, one(zeros=True)))
register("scalar_rpow", elementwise(lambda a: 2.0**a, lambda a: 2.0**a, one()))


@st.composite
def integer_power_case(draw):
    """a ** n with integer exponents 0..3 (a constant) and exact zeros in a: d/da 0**0 is 0."""
    shapes = draw(BROADCAST_PAIR).input_shapes
    rng = seeded(draw)
    a = np.where(rng.random(shapes[0]) < 0.5, 0.0, rng.uniform(-3, 3, shapes[0]))
    n = np.where(rng.random(shapes[1]) < 0.5, 0, rng.integers(1, 4, shapes[1])).astype(np.float64)
    return Example(lambda x, y: x**y, np.power, [a, n], differentiable=[True, False])


register("pow_integer_exponent", integer_power_case())


# --- reductions ---------------------------------------------------------------------------------


@st.composite
def reduction_case(draw, method):
    shape = draw(SHAPE)
    ndim = len(shape)
    axes = draw(st.lists(st.integers(0, max(ndim - 1, 0)), unique=True, max_size=ndim))
    axes = tuple(ax - ndim if draw(st.booleans()) else ax for ax in axes)  # negative axes too
    axis = draw(st.sampled_from([None, axes, axes[0] if axes else None]))
    if method == "mean" and axis == ():
        axis = None
    keepdims = draw(st.booleans())
    # ties are left out of max: at a k-way tie the central difference is 1/2, the even split 1/k
    (x,) = draw(values([shape], large=True, zeros=method != "max"))
    return Example(
        lambda t: getattr(t, method)(axis=axis, keepdims=keepdims),
        lambda a: getattr(np, method)(a, axis=axis, keepdims=keepdims),
        [x],
    )


for _method in ("sum", "mean", "max"):
    register(_method, reduction_case(_method))


# --- shape ops ----------------------------------------------------------------------------------


@st.composite
def reshape_case(draw):
    shape = draw(SHAPE)
    (x,) = draw(values([shape]))
    target = draw(st.one_of(st.permutations([*shape, 1]).map(tuple), st.just((-1,))))
    return Example(lambda t: t.reshape(target), lambda a: a.reshape(target), [x])


@st.composite
def transpose_case(draw):
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=4, min_side=1, max_side=4))
    (x,) = draw(values([shape], large=True))
    ndim = len(shape)
    axes = draw(st.permutations(range(ndim)))
    # negative and mixed-sign axes name the same permutation: transpose(-1, 0) on 2-d is .T
    signs = draw(st.lists(st.booleans(), min_size=ndim, max_size=ndim))
    axes = tuple(ax - ndim if neg else ax for ax, neg in zip(axes, signs, strict=True))
    if draw(st.sampled_from([True, False, False, False])):
        return Example(lambda t: t.T, np.transpose, [x])
    return Example(lambda t: t.transpose(*axes), lambda a: np.transpose(a, axes), [x])


register("reshape", reshape_case())
register("transpose", transpose_case())


@st.composite
def matmul_case(draw):
    """np.matmul-compatible pairs: 1-D, 2-D and batched with broadcasting of batch dims."""
    n, k, m = draw(st.integers(1, 4)), draw(st.integers(1, 4)), draw(st.integers(1, 4))
    batch = draw(
        hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=2, max_side=3)
    )
    a_batch, b_batch = batch.input_shapes
    a = (k,) if draw(st.booleans()) and not a_batch else (*a_batch, n, k)
    b = (k,) if draw(st.booleans()) and not b_batch else (*b_batch, k, m)
    return Example(lambda x, y: x @ y, np.matmul, draw(values([a, b], zeros=True)))


register("matmul", matmul_case())


@st.composite
def getitem_case(draw):
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
    return Example(lambda t: t[index], lambda a: a[index], draw(values([shape])))


register("getitem", getitem_case())


# The ops that other ops' VJPs apply (for create_graph): each is also a differentiable op.


@st.composite
def sum_to_case(draw):
    """ops.SumTo (unbroadcast as an op): a of the broadcast shape summed back to an input's."""
    pair = draw(BROADCAST_PAIR)
    shape = pair.input_shapes[0]
    (a,) = draw(values([pair.result_shape], large=True, zeros=True))
    return Example(
        lambda t: ops.SumTo.apply(t, shape=shape),
        lambda x: unbroadcast(x, shape),
        [a],
    )


@st.composite
def broadcast_to_case(draw):
    """ops.BroadcastTo: a repeated up to a shape it broadcasts to."""
    pair = draw(BROADCAST_PAIR)
    (a,) = draw(values([pair.input_shapes[0]], large=True, zeros=True))
    return Example(
        lambda t: ops.BroadcastTo.apply(t, shape=pair.result_shape),
        lambda x: np.broadcast_to(x, pair.result_shape),
        [a],
    )


@st.composite
def scatter_add_case(draw):
    """ops.ScatterAdd (GetItem's VJP as an op): rows of g added at indices that repeat."""
    rows, width = draw(st.integers(1, 5)), draw(st.integers(1, 3))
    size = draw(st.integers(1, 6))
    index = np.array(draw(st.lists(st.integers(0, rows - 1), min_size=size, max_size=size)))
    index = np.concatenate([index, index[:1]])  # at least one repeat: contributions must add
    (g,) = draw(values([(len(index), width)], large=True, zeros=True))

    def reference(x):
        out = np.zeros((rows, width))
        np.add.at(out, index, x)
        return out

    return Example(
        lambda t: ops.ScatterAdd.apply(t, shape=(rows, width), index=index), reference, [g]
    )


def np_normal_cdf(x):
    return 0.5 * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


register("sum_to", sum_to_case())
register("broadcast_to", broadcast_to_case())
register("scatter_add", scatter_add_case())
register(
    "normal_cdf",
    elementwise(lambda a: F.NormalCdf.apply(a), np_normal_cdf, one(large=True, zeros=True)),
)


@st.composite
def concat_case(draw):
    shapes = draw(st.lists(SHAPE.filter(lambda s: len(s) >= 1), min_size=1, max_size=3))
    base = shapes[0]
    axis = draw(st.integers(-len(base), len(base) - 1))
    shapes = [
        tuple(s[0] if d == axis % len(base) else n for d, n in enumerate(base)) for s in shapes
    ]
    return Example(
        lambda *ts: autograd.concat(ts, axis=axis),
        lambda *a: np.concatenate(a, axis),
        draw(values(shapes)),
    )


@st.composite
def stack_case(draw):
    shape, n = draw(SHAPE), draw(st.integers(1, 3))
    axis = draw(st.integers(-len(shape) - 1, len(shape)))
    return Example(
        lambda *ts: autograd.stack(ts, axis=axis),
        lambda *a: np.stack(a, axis),
        draw(values([shape] * n)),
    )


@st.composite
def where_case(draw):
    shapes = draw(BROADCAST_PAIR)
    a, b = draw(values(shapes.input_shapes, zeros=True))
    cond = draw(hnp.arrays(np.bool_, shapes.result_shape))
    return Example(
        lambda x, y: autograd.where(cond, x, y), lambda x, y: np.where(cond, x, y), [a, b]
    )


register("concat", concat_case())
register("stack", stack_case())
register("where", where_case())


# --- the Transformer ops of autograd.functional (both kernel paths) ------------------------------


register(
    "softmax",
    logits().map(
        lambda c: Example(lambda t: F.softmax(t, c[1]), lambda a: np_softmax(a, c[1]), [c[0]])
    ),
    both_backends=True,
)
register(
    "log_softmax",
    logits().map(
        lambda c: Example(
            lambda t: F.log_softmax(t, c[1]), lambda a: np_log_softmax(a, c[1]), [c[0]]
        )
    ),
    both_backends=True,
)


@st.composite
def logsumexp_case(draw):
    x, axis = draw(logits())
    keepdims = draw(st.booleans())
    return Example(
        lambda t: F.logsumexp(t, axis, keepdims), lambda a: np_logsumexp(a, axis, keepdims), [x]
    )


register("logsumexp", logsumexp_case(), both_backends=True)


register(
    "layer_norm",
    norm_inputs().map(lambda c: Example(F.layer_norm, np_layer_norm, list(c), forward_rtol=1e-9)),
    both_backends=True,
)
register(
    "rms_norm",
    norm_inputs().map(lambda c: Example(F.rms_norm, np_rms_norm, list(c[:2]))),
    both_backends=True,
)


@st.composite
def gather_case(draw):
    shape = draw(SHAPE_1D_UP)
    rng = seeded(draw)
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    index_shape = list(shape)
    index_shape[axis] = draw(st.integers(1, 6))  # repeats are likely: they must accumulate
    for d in range(len(shape)):  # size-1 dims on either side broadcast like np.take_along_axis
        if d != axis % len(shape) and draw(st.booleans()):
            index_shape[d] = 1 if shape[d] > 1 else draw(st.integers(1, 3))
    index = rng.integers(0, shape[axis], index_shape)
    return Example(
        lambda t: F.gather(t, index, axis),
        lambda a: np.take_along_axis(a, index, axis),
        [rng.standard_normal(shape)],
    )


register("gather", gather_case())


@st.composite
def embedding_case(draw):
    rng = seeded(draw)
    vocab, dim = draw(st.integers(1, 6)), draw(st.integers(1, 5))
    idx_shape = draw(hnp.array_shapes(min_dims=0, max_dims=2, min_side=1, max_side=6))
    idx = rng.integers(0, vocab, idx_shape)
    return Example(
        lambda w: F.embedding(w, idx), lambda w: w[idx], [rng.standard_normal((vocab, dim))]
    )


register("embedding", embedding_case(), both_backends=True)


@st.composite
def cross_entropy_case(draw):
    rng = seeded(draw)
    lead = draw(hnp.array_shapes(min_dims=1, max_dims=2, min_side=1, max_side=5))
    vocab = draw(st.integers(1, 7))
    z = rng.standard_normal((*lead, vocab)) * draw(st.sampled_from([1.0, 10.0, 1e4]))
    targets = rng.integers(0, vocab, lead)
    targets[rng.random(lead) < draw(st.sampled_from([0.0, 0.3, 1.0]))] = -100

    return Example(
        lambda t: F.cross_entropy(t, targets),
        lambda z: np_cross_entropy(z, targets),
        [z],
        forward_rtol=1e-9,
    )


register("cross_entropy", cross_entropy_case(), both_backends=True)


@st.composite
def gelu_case(draw, approximate):
    shape = draw(SHAPE_1D_UP)
    x = seeded(draw).standard_normal(shape) * draw(st.sampled_from([1.0, 3.0, 30.0]))
    reference = np_gelu_tanh if approximate == "tanh" else np_gelu_exact
    return Example(lambda t: F.gelu(t, approximate), reference, [x])


register("gelu_tanh", gelu_case("tanh"), both_backends=True)
register("gelu_none", gelu_case("none"))


@st.composite
def dropout_case(draw):
    shape, p, seed = (
        draw(SHAPE_1D_UP),
        draw(st.sampled_from([0.1, 0.5, 0.9])),
        draw(st.integers(0, 2**32 - 1)),
    )
    x = np.random.default_rng(seed).standard_normal(shape)
    keep = np.random.default_rng(seed).random(shape) >= p
    return Example(
        lambda t: F.dropout(t, p, True, rng=np.random.default_rng(seed)),
        lambda a: a * keep / (1 - p),
        [x],
    )


register("dropout", dropout_case())


def attention_example(case, allowed=None, forward_rtol=1e-9):
    q, k, v, causal = case
    return Example(
        lambda a, b, c: F.scaled_dot_product_attention(a, b, c, causal=causal, mask=allowed),
        lambda a, b, c: np_attention(a, b, c, causal, allowed),
        [q, k, v],
        forward_rtol=forward_rtol,
    )


@st.composite
def masked_attention_case(draw, grouped=False):
    case = draw(qkv(grouped=grouped))
    allowed = seeded(draw).random((case[0].shape[2], case[1].shape[2])) < 0.6
    allowed[:, 0] = True  # every row keeps at least one key
    return attention_example(case, allowed)


register("attention", qkv().map(attention_example), both_backends=True)
register("attention_masked", masked_attention_case())
# grouped-query attention (notes 8.1): K/V heads shared by groups of query heads
register("attention_grouped", qkv(grouped=True).map(attention_example), both_backends=True)
register("attention_grouped_masked", masked_attention_case(grouped=True))
# notes ch. 11 has d_k = 1 and d_v = 2: V's width is independent of Q/K's
register("attention_value_width", qkv(any_value_width=True).map(attention_example))


# --- the primitives nn builds on (linear, rotary) -------------------------------------------------


@st.composite
def linear_case(draw):
    lead = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=4))
    n_in, n_out = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    rng = seeded(draw)
    x, w = rng.standard_normal((*lead, n_in)), rng.standard_normal((n_in, n_out))
    if draw(st.booleans()):
        return Example(nn.linear, lambda x, w, b: x @ w + b, [x, w, rng.standard_normal(n_out)])
    return Example(nn.linear, lambda x, w: x @ w, [x, w])


@st.composite
def quantized_linear_case(draw):
    """x @ W (+ b) with W frozen in a block format (a K-quant's random blocks): x and b are the
    inputs, W a parameter; 1-d x (one row: the matrix-vector kernel) too. Tile edges:
    test_quantized.py's kernel tests."""
    lead = draw(hnp.array_shapes(min_dims=0, max_dims=2, min_side=1, max_side=3))
    fmt = draw(st.sampled_from(KEPT))
    n_in = block_size(fmt) * draw(st.sampled_from([1, 2]))
    n_out = draw(st.sampled_from([1, 2, 5, 33]))
    rng = seeded(draw)
    weight = quantized_weight(rng, fmt, n_in, n_out)
    w = weight.dequantize().astype(np.float64)
    x = rng.standard_normal((*lead, n_in)) * draw(st.sampled_from([1.0, 1e3]))
    if draw(st.booleans()):
        return Example(
            lambda x, b: quantized_linear(x, weight, b),
            lambda x, b: x @ w + b,
            [x, rng.standard_normal(n_out)],
        )
    return Example(lambda x: quantized_linear(x, weight), lambda x: x @ w, [x])


@st.composite
def rotary_case(draw):
    shape = draw(
        st.tuples(
            st.integers(1, 2), st.integers(1, 2), st.integers(1, 6), st.sampled_from([2, 4, 6])
        )
    )
    offset = draw(st.integers(0, 5))
    x = seeded(draw).standard_normal(shape)
    cos, sin = nn.rotary_tables(16, shape[-1])
    t, half = shape[2], shape[-1] // 2
    c, s = cos[offset : offset + t], sin[offset : offset + t]

    def reference(a):  # pairs (r, r + D/2) turned by position * w_r (notes 8.6)
        x1, x2 = a[..., :half], a[..., half:]
        return np.concatenate([x1 * c - x2 * s, x1 * s + x2 * c], axis=-1)

    return Example(lambda t_: nn.apply_rotary(t_, cos, sin, offset), reference, [x])


register("linear", linear_case())
register("quantized_linear", quantized_linear_case(), both_backends=True)
register("rotary", rotary_case())
