"""The notes' checkable claims outside ch. 11, each test citing its section, run on the engine.

(Chapter 11's numbers are in test_worked_example.py.)
"""

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import autograd
import autograd.functional as F
from autograd import Tensor


def t64(values, requires_grad=False):
    return Tensor(values, requires_grad=requires_grad, dtype=np.float64)


finite_scores = arrays(
    np.float64,
    st.integers(2, 6),
    elements=st.floats(-20, 20, allow_nan=False, allow_infinity=False),
)


# --- 5.2: Q and K separate make matching asymmetric -------------------------------------------


def test_5_2_projected_match_is_asymmetric():
    x_a, x_b = t64([[1.0, 0.0]]), t64([[0.0, 1.0]])
    W_Q, W_K = t64([[1.0], [0.0]]), t64([[0.0], [1.0]])
    q_a, q_b, k_a, k_b = x_a @ W_Q, x_b @ W_Q, x_a @ W_K, x_b @ W_K
    assert (q_a.item(), k_b.item(), q_b.item(), k_a.item()) == (1.0, 1.0, 0.0, 0.0)
    assert (q_a @ k_b.T).item() == 1.0  # a's need matches b ...
    assert (q_b @ k_a.T).item() == 0.0  # ... but not the other way round
    assert (x_a @ x_b.T).item() == 0.0  # although the raw vectors are orthogonal
    B = (W_Q @ W_K.T).data  # the bilinear form x_i B x_j^T
    assert not np.allclose(B, B.T)


@settings(deadline=None)
@given(st.integers(1, 3), st.integers(0, 2**32 - 1))
def test_5_2_bilinear_form_rank_and_tied_projections(d_k, seed):
    rng = np.random.default_rng(seed)
    W_Q, W_K = rng.standard_normal((4, d_k)), rng.standard_normal((4, d_k))
    X = rng.standard_normal((5, 4))
    scores = ((t64(X) @ t64(W_Q)) @ (t64(X) @ t64(W_K)).T).data
    B = W_Q @ W_K.T
    np.testing.assert_allclose(scores, X @ B @ X.T, atol=1e-12)
    assert np.linalg.matrix_rank(B) <= d_k
    # W_Q = W_K forces B = W_Q W_Q^T: symmetric positive semi-definite.
    tied = W_Q @ W_Q.T
    np.testing.assert_allclose(tied, tied.T, atol=1e-12)
    assert np.linalg.eigvalsh(tied).min() >= -1e-10


# --- 5.3: scaling W_V changes the content, not the weights -------------------------------------


def test_5_3_doubling_w_v_doubles_z_and_keeps_a():
    scores = t64([math.log(0.8), math.log(0.2)])
    X = t64([[1.0, 0.0], [0.0, 1.0]])  # v_1 = (1, 0), v_2 = (0, 1) with W_V = I
    A = F.softmax(scores)
    np.testing.assert_allclose(A.data, [0.8, 0.2], atol=1e-15)
    z = A @ (X @ t64(np.eye(2)))
    np.testing.assert_allclose(z.data, [0.8, 0.2], atol=1e-15)
    A2 = F.softmax(scores)  # Q/K untouched, so the same scores and weights
    z2 = A2 @ (X @ t64(2 * np.eye(2)))
    np.testing.assert_array_equal(A2.data, A.data)
    np.testing.assert_allclose(z2.data, [1.6, 0.4], atol=1e-15)


# --- 6.2: softmax is positive, sums to 1, has ratios e^(s_j - s_k), ignores shifts ------------


@settings(deadline=None)
@given(finite_scores, st.floats(-50, 50))
def test_6_2_softmax_properties_and_shift_invariance(s, c):
    a = F.softmax(t64(s)).data
    assert np.all(a > 0)
    assert a.sum() == pytest.approx(1.0, abs=1e-12)
    j, k = int(np.argmax(s)), int(np.argmin(s))
    assert a[j] / a[k] == pytest.approx(math.exp(s[j] - s[k]), rel=1e-9)
    np.testing.assert_allclose(F.softmax(t64(s + c)).data, a, rtol=1e-9, atol=1e-15)


def test_6_2_max_subtraction_avoids_overflow():
    a = F.softmax(t64([1000.0, 999.0])).data  # e^1000 overflows; the shifted form does not
    np.testing.assert_allclose(a, [math.e / (math.e + 1), 1 / (math.e + 1)], atol=1e-15)


def test_14_3_exercise_2_adding_keeps_multiplying_sharpens():
    s = np.array([2.0, 1.0, 0.0])
    a = F.softmax(t64(s)).data
    np.testing.assert_allclose(F.softmax(t64(s + 100)).data, a, atol=1e-15)
    sharp = F.softmax(t64(s * 100)).data
    assert sharp[0] > a[0] and sharp[0] == pytest.approx(1.0, abs=1e-40)
    tied = F.softmax(t64(np.array([1.0, 1.0, 0.0]) * 1000)).data  # ties share the limit
    np.testing.assert_allclose(tied, [0.5, 0.5, 0.0], atol=1e-15)


# --- 6.3: the complete hand calculation ---------------------------------------------------------


def test_6_3_hand_calculation():
    A = F.softmax(t64([math.log(2), 0.0, 0.0]))
    np.testing.assert_allclose(np.exp([math.log(2), 0.0, 0.0]), [2, 1, 1])
    np.testing.assert_allclose(A.data, [1 / 2, 1 / 4, 1 / 4], atol=1e-15)
    V = t64([[0.0, 0.0], [4.0, 0.0], [0.0, 4.0]])
    z = A @ V
    np.testing.assert_allclose(z.data, [1.0, 1.0], atol=1e-15)
    # A convex combination of the values: non-negative weights that sum to 1 (the convex hull).
    assert np.all(A.data >= 0) and A.data.sum() == pytest.approx(1.0, abs=1e-15)


# --- 7.2: the variance example, by exact enumeration -------------------------------------------


def test_7_2_sum_of_four_signs_by_exact_enumeration():
    outcomes = list(itertools.product((-1, 1), repeat=4))  # 16 equally likely outcomes
    p = Fraction(1, len(outcomes))
    totals = [sum(o) for o in outcomes]
    distribution = {v: totals.count(v) * p for v in sorted(set(totals))}
    assert list(distribution) == [-4, -2, 0, 2, 4]
    assert list(distribution.values()) == [Fraction(n, 16) for n in (1, 4, 6, 4, 1)]
    mean = sum(v * q for v, q in distribution.items())
    second_moment = sum(v * v * q for v, q in distribution.items())
    assert mean == 0
    assert second_moment == Fraction(16 + 16 + 0 + 16 + 16, 16) == 4
    assert math.sqrt(second_moment - mean**2) == 2  # SD 2, though the largest value is 4


def test_7_2_variance_of_a_sum_needs_the_covariance():
    # X = Y = a fair sign: E X = E Y = 0 but Cov(X, Y) = 1, so Var(X + Y) = 1 + 1 + 2 = 4, not 2.
    outcomes = [(x, x) for x in (-1, 1)]
    p = Fraction(1, 2)

    def expect(f):
        return sum(f(x, y) * p for x, y in outcomes)

    var_sum = expect(lambda x, y: (x + y) ** 2) - expect(lambda x, y: x + y) ** 2
    cov = expect(lambda x, y: x * y) - expect(lambda x, y: x) * expect(lambda x, y: y)
    assert var_sum == 1 + 1 + 2 * cov == 4


@pytest.mark.parametrize("d_k", [1, 2, 3])
def test_7_1_dot_product_variance_is_d_k_by_exact_enumeration(d_k):
    # q_r, k_r independent fair signs (mean 0, variance 1): Var(q . k) = d_k, SD sqrt(d_k).
    outcomes = list(itertools.product((-1, 1), repeat=2 * d_k))
    p = Fraction(1, len(outcomes))
    dots = [sum(o[r] * o[d_k + r] for r in range(d_k)) for o in outcomes]
    mean = sum(d * p for d in dots)
    var = sum(d * d * p for d in dots) - mean**2
    assert mean == 0 and var == d_k
    assert var / Fraction(d_k) == 1  # dividing by sqrt(d_k) scales the variance by 1/d_k


# --- 7.3: the softmax Jacobian ------------------------------------------------------------------


@settings(deadline=None)
@given(finite_scores)
def test_7_3_softmax_jacobian(s):
    x = t64(s, requires_grad=True)
    a = F.softmax(x)
    n = len(s)
    jacobian = np.empty((n, n))
    for j in range(n):  # row j = d a_j / d s, from one backward pass with seed e_j
        x.grad = None
        a.backward(np.eye(n)[j], retain_graph=True)
        jacobian[j] = x.grad
    av = a.data
    expected = av[:, None] * (np.eye(n) - av[None, :])  # a_j (delta_jk - a_k)
    np.testing.assert_allclose(jacobian, expected, atol=1e-12)


def test_7_3_saturated_softmax_passes_almost_no_gradient():
    def jacobian_size(scale):
        x = t64(np.array([1.0, 0.0, -1.0]) * scale, requires_grad=True)
        a = F.softmax(x)
        a.backward(np.array([1.0, -1.0, 0.5]))
        return np.abs(x.grad).max()

    assert jacobian_size(1.0) > 0.1
    assert jacobian_size(50.0) < 1e-20


def test_7_3_softmax_gradcheck():
    autograd.gradcheck(lambda x: F.softmax(x), [t64(np.array([0.3, -1.2, 2.0]), True)])


# --- 8.6: without mask or positions, attention is permutation equivariant -----------------------


def attention(X, W_Q, W_K, W_V, causal):
    q, k, v = ((X @ W)[None, None] for W in (W_Q, W_K, W_V))
    return F.scaled_dot_product_attention(q, k, v, causal=causal)[0, 0]


@settings(deadline=None)
@given(st.integers(2, 6), st.integers(0, 2**32 - 1))
def test_8_6_permutation_equivariance_without_mask(n, seed):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, 4))
    W = [t64(rng.standard_normal((4, 3))) for _ in range(3)]
    P = np.eye(n)[rng.permutation(n)]
    Z = attention(t64(X), *W, causal=False).data
    Z_permuted = attention(t64(P @ X), *W, causal=False).data
    np.testing.assert_allclose(Z_permuted, P @ Z, atol=1e-12)  # Z(PX) = P Z(X)


def test_8_6_the_causal_mask_breaks_equivariance():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((3, 4))
    W = [t64(rng.standard_normal((4, 3))) for _ in range(3)]
    P = np.eye(3)[[2, 0, 1]]
    Z = attention(t64(X), *W, causal=True).data
    Z_permuted = attention(t64(P @ X), *W, causal=True).data
    assert not np.allclose(Z_permuted, P @ Z)


# --- 14.3 exercise 1: the shapes of a two-head layer --------------------------------------------


def test_14_3_exercise_1_shapes():
    n, d, d_k, d_v, H, N = 5, 12, 3, 4, 2, 100
    rng = np.random.default_rng(1)

    def param(*shape):
        return t64(rng.standard_normal(shape) * 0.1, requires_grad=True)

    X = param(n, d)
    heads, Qs, As = [], [], []
    for _ in range(H):
        W_Q, W_K, W_V = param(d, d_k), param(d, d_k), param(d, d_v)
        Q, K, V = X @ W_Q, X @ W_K, X @ W_V
        allowed = np.tril(np.ones((n, n), dtype=bool))
        scale = math.sqrt(d_k)  # per head: sqrt(3), whatever N or n are
        A = F.softmax(autograd.where(allowed, Q @ K.T / scale, t64(-np.inf)))
        Qs.append(Q)
        As.append(A)
        heads.append(A @ V)
    concat = autograd.concat(heads, axis=-1)
    W_O, U = param(H * d_v, d), param(d, N)
    logits = (X + concat @ W_O) @ U
    assert Qs[0].shape == (5, 3)
    assert As[0].shape == (5, 5)
    assert concat.shape == (5, 8)
    assert W_O.shape == (8, 12)
    assert U.shape == (12, 100)
    assert logits.shape == (n, N)
    loss = F.cross_entropy(logits, rng.integers(0, N, size=n))
    loss.backward()
    assert W_O.grad.shape == (8, 12) and U.grad.shape == (12, 100) and X.grad.shape == (n, d)
