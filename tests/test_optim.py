"""Optimizers against their updates written out by hand; the notes' ch. 11 step; clipping;
the learning-rate schedule; bit-exact resume from state_dict."""

import copy
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import autograd
import autograd.functional as F
import nn
from autograd import Tensor
from nn import optim


@pytest.fixture
def f64():
    autograd.set_default_dtype(np.float64)


def grads_sequence(shape, steps, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=shape) for _ in range(steps)]


def run(optimizer, params, grads_per_step):
    for grads in grads_per_step:
        for p, g in zip(params, grads, strict=True):
            p.grad = g.copy()
        optimizer.step()


# --- the updates, written out by hand --------------------------------------------------------


def test_sgd_plain_momentum_and_weight_decay(f64):
    start = np.array([1.0, -2.0, 0.5])
    grads = grads_sequence(3, 4)
    p = nn.Parameter(start.copy())
    run(optim.SGD([p], lr=0.1), [p], [[g] for g in grads])
    np.testing.assert_allclose(p.data, start - 0.1 * sum(grads), rtol=1e-15)

    p = nn.Parameter(start.copy())
    run(optim.SGD([p], lr=0.1, momentum=0.9, weight_decay=0.01), [p], [[g] for g in grads])
    theta, buf = start.copy(), None
    for g in grads:
        d = g + 0.01 * theta
        buf = d if buf is None else 0.9 * buf + d
        theta = theta - 0.1 * buf
    np.testing.assert_allclose(p.data, theta, rtol=1e-14)


def adam_by_hand(theta, grads, lr, b1, b2, eps, wd, decoupled):
    m = np.zeros_like(theta)
    v = np.zeros_like(theta)
    for t, g in enumerate(grads, start=1):
        if decoupled:
            theta = theta - lr * wd * theta
        else:
            g = g + wd * theta
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        m_hat = m / (1 - b1**t)
        v_hat = v / (1 - b2**t)
        theta = theta - lr * m_hat / (np.sqrt(v_hat) + eps)
    return theta


@settings(deadline=None)
@given(
    lr=st.floats(1e-4, 0.5),
    b1=st.floats(0.0, 0.99),
    b2=st.floats(0.5, 0.9999),
    wd=st.sampled_from([0.0, 0.1]),
    decoupled=st.booleans(),
    seed=st.integers(0, 1000),
)
def test_adam_and_adamw_match_the_formulas(lr, b1, b2, wd, decoupled, seed):
    autograd.set_default_dtype(np.float64)
    start = np.random.default_rng(seed + 1).normal(size=(2, 3))
    grads = grads_sequence((2, 3), 5, seed)
    p = nn.Parameter(start.copy())
    cls = optim.AdamW if decoupled else optim.Adam
    opt = cls([p], lr=lr, betas=(b1, b2), eps=1e-8, weight_decay=wd)
    run(opt, [p], [[g] for g in grads])
    expected = adam_by_hand(start, grads, lr, b1, b2, 1e-8, wd, decoupled)
    np.testing.assert_allclose(p.data, expected, rtol=1e-12, atol=1e-14)
    assert opt.state[p]["step"] == 5


def test_adamw_param_groups_exclude_biases_from_decay(f64):
    lin = nn.Linear(3, 2)
    lin.bias.data = np.ones(2)
    w0, b0 = lin.weight.data.copy(), lin.bias.data.copy()
    opt = optim.AdamW(
        [{"params": [lin.weight]}, {"params": [lin.bias], "weight_decay": 0.0, "lr": 0.05}],
        lr=0.01,
        weight_decay=0.5,
    )
    assert [g["weight_decay"] for g in opt.param_groups] == [0.5, 0.0]
    grads = grads_sequence((3, 2), 3, 1), grads_sequence(2, 3, 2)
    run(opt, [lin.weight, lin.bias], list(zip(*grads, strict=True)))
    b = (0.9, 0.999)
    expected_w = adam_by_hand(w0, grads[0], 0.01, *b, 1e-8, 0.5, True)
    expected_b = adam_by_hand(b0, grads[1], 0.05, *b, 1e-8, 0.0, True)
    np.testing.assert_allclose(lin.weight.data, expected_w, rtol=1e-13)
    np.testing.assert_allclose(lin.bias.data, expected_b, rtol=1e-13)


def test_parameters_without_grad_are_skipped_and_zero_grad_clears():
    a, b = nn.Parameter(np.ones(2)), nn.Parameter(np.ones(2))
    opt = optim.Adam([a, b], lr=0.1)
    a.grad = np.ones(2, np.float32)
    opt.step()
    assert (a.data < 1).all() and (b.data == 1).all() and b not in opt.state
    opt.zero_grad()
    assert a.grad is None


def test_bad_arguments_are_clear_errors():
    p = nn.Parameter(np.ones(2))
    with pytest.raises(ValueError, match="empty parameter list"):
        optim.SGD([], lr=0.1)
    with pytest.raises(ValueError, match=r"unknown setting\(s\) \['weight_decy'\]"):
        optim.AdamW([{"params": [p], "weight_decy": 0.0}])
    with pytest.raises(ValueError, match="appears in two groups"):
        optim.SGD([{"params": [p]}, {"params": [p]}], lr=0.1)
    with pytest.raises(TypeError, match="Tensors that require grad"):
        optim.SGD([Tensor(np.ones(2))], lr=0.1)
    with pytest.raises(ValueError, match="betas"):
        optim.Adam([p], betas=(0.9, 1.0))


def test_step_bumps_versions_so_stale_graphs_fail():
    lin = nn.Linear(2, 2)
    loss = lin(Tensor(np.ones((1, 2)))).sum()
    loss.backward(retain_graph=True)
    optim.SGD(lin.parameters(), lr=0.1).step()
    with pytest.raises(RuntimeError, match="modified in place"):
        loss.backward()


# --- notes ch. 11: one step of plain gradient descent, lr 0.1 ---------------------------------


def test_notes_chapter_11_update_reproduced_with_sgd(f64):
    E = nn.Parameter([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    W_Q, W_K = nn.Parameter([[0.0], [1.0]]), nn.Parameter([[1.0], [0.0]])
    W_V, W_O = nn.Parameter(np.eye(2)), nn.Parameter(np.eye(2))
    U = nn.Parameter([[1.0, 0.0, -1.0], [0.0, 1.0, 0.0]])
    params = [E, W_Q, W_K, W_V, W_O, U]
    tokens = np.array([0, 1])  # A, B (ids 1, 2 in the notes)
    allowed = np.tril(np.ones((2, 2), dtype=bool))  # j <= i (notes 7.4)
    minus_inf = Tensor(np.array(-np.inf))

    def forward():
        X = F.embedding(E, tokens)
        Q, K, V = X @ W_Q, X @ W_K, X @ W_V
        S = Q @ K.T / math.sqrt(1)  # d_k = 1
        A = F.softmax(autograd.where(allowed, S, minus_inf))
        R = X + (A @ V) @ W_O
        logits = R @ U
        # Only the last position has a target (C); the first is ignored.
        return F.cross_entropy(logits, np.array([-100, 2])), A, logits

    loss, A, logits = forward()
    assert loss.item() == pytest.approx(2.541928, abs=1e-6)
    assert A.data[1, 0] == pytest.approx(0.731059, abs=1e-6)
    loss.backward()
    np.testing.assert_allclose(W_Q.grad.ravel(), [0, 0.133562], atol=1e-6)
    np.testing.assert_allclose(
        U.grad, [[0.248311, 0.425203, -0.673514], [0.431008, 0.738049, -1.169057]], atol=1e-6
    )
    np.testing.assert_allclose(E.grad[2], [0, 0])  # C was never an input
    optim.SGD(params, lr=0.1).step()
    assert W_Q.data[1, 0] == pytest.approx(0.986644, abs=1e-6)
    assert U.data[1, 2] == pytest.approx(0.116906, abs=1e-6)
    with autograd.no_grad():
        loss, A, logits = forward()
    assert loss.item() == pytest.approx(1.761382, abs=1e-6)
    assert A.data[1, 0] == pytest.approx(0.713748, abs=1e-6)
    probs = F.softmax(logits).data[1]
    np.testing.assert_allclose(probs, [0.271374, 0.556819, 0.171807], atol=1e-6)


# --- clipping and the schedule ------------------------------------------------------------------


def test_clip_grad_norm(f64):
    a, b = nn.Parameter(np.zeros(1)), nn.Parameter(np.zeros(2))
    a.grad, b.grad = np.array([3.0]), np.array([0.0, 4.0])
    assert nn.clip_grad_norm_([a, b], 1.0) == pytest.approx(5.0)
    joint = math.hypot(a.grad[0], b.grad[1])
    assert joint == pytest.approx(1.0, abs=1e-6)
    assert a.grad[0] / b.grad[1] == pytest.approx(0.75)  # the direction is kept
    a.grad = np.array([0.3])
    assert nn.clip_grad_norm_([a], 1.0) == pytest.approx(0.3)
    assert a.grad[0] == 0.3
    a.grad = np.array([np.inf])
    assert nn.clip_grad_norm_([a, nn.Parameter(np.zeros(1))], 1.0) == math.inf
    assert a.grad[0] == np.inf


def test_cosine_with_warmup():
    lr = lambda step: optim.cosine_with_warmup(step, 1.0, 10, 110, min_lr=0.1)
    assert [lr(s) for s in (0, 4, 9)] == pytest.approx([0.1, 0.5, 1.0])
    assert lr(10) == pytest.approx(1.0)
    assert lr(60) == pytest.approx(0.55)  # halfway through the cosine
    assert lr(109) == pytest.approx(0.1, abs=1e-3)
    assert lr(110) == lr(500) == 0.1
    values = [lr(s) for s in range(10, 111)]
    assert all(x >= y for x, y in zip(values, values[1:], strict=False))
    assert optim.cosine_with_warmup(0, 3e-4, 0, 100) == pytest.approx(3e-4)
    with pytest.raises(ValueError, match="warmup_steps <= total_steps"):
        optim.cosine_with_warmup(0, 1.0, 20, 10)


# --- saving and restoring ---------------------------------------------------------------------


def train_steps(model, opt, steps, start):
    rng = np.random.default_rng(start)
    for step in range(start, start + steps):
        for group in opt.param_groups:
            group["lr"] = optim.cosine_with_warmup(step, 1e-2, 2, 10)
        x = Tensor(rng.normal(size=(4, 3)).astype(np.float32))
        loss = (model(x) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        nn.clip_grad_norm_(model.parameters(), 0.5)
        opt.step()
        rng = np.random.default_rng(step + 1)


@pytest.mark.parametrize(
    "make",
    [
        lambda ps: optim.AdamW(ps, lr=1e-2, weight_decay=0.1),
        lambda ps: optim.SGD(ps, lr=1e-2, momentum=0.9),
    ],
)
def test_resume_from_state_dict_is_bit_exact(make):
    def build():
        return nn.Sequential(nn.Linear(3, 8), nn.GELU(), nn.Linear(8, 2))

    straight = build()
    opt = make(straight.parameters())
    train_steps(straight, opt, 6, 0)

    first = build()
    opt1 = make(first.parameters())
    train_steps(first, opt1, 3, 0)
    model_state, opt_state = first.state_dict(), copy.deepcopy(opt1.state_dict())
    resumed = nn.Sequential(nn.Linear(3, 8), nn.GELU(), nn.Linear(8, 2))
    resumed.load_state_dict(model_state)
    opt2 = make(resumed.parameters())
    opt2.load_state_dict(opt_state)
    train_steps(resumed, opt2, 3, 3)
    for (name, a), (_, b) in zip(
        straight.named_parameters(), resumed.named_parameters(), strict=True
    ):
        np.testing.assert_array_equal(a.data, b.data, err_msg=name)


def test_optimizer_state_dict_checks_before_changing():
    a, b = nn.Parameter(np.ones(2)), nn.Parameter(np.ones(3))
    opt = optim.Adam([a, b], lr=0.1)
    a.grad, b.grad = np.ones(2, np.float32), np.ones(3, np.float32)
    opt.step()
    state = opt.state_dict()
    assert state["param_groups"][0]["params"] == [0, 1] and state["state"][1]["step"] == 1
    state["state"][0]["exp_avg"][...] = 9  # a copy: the optimizer is unaffected
    assert opt.state[a]["exp_avg"][0] != 9
    other = optim.Adam([b, a], lr=0.1)  # same count, but the shapes are swapped
    with pytest.raises(ValueError, match=r"state 'exp_avg' of parameter 0 has shape \(2,\)"):
        other.load_state_dict(state)
    assert other.state == {}
    with pytest.raises(ValueError, match=r"saved groups have \[2\] parameters"):
        optim.Adam([a], lr=0.1).load_state_dict(state)
