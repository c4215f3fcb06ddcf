"""autograd.grad(create_graph=True) and what is built on it: vjp, jvp, hvp, hessian, gradgradcheck.

Each check is against an independent answer: central differences of the gradient (hvp on the
GPT), of the output (jvp), or a Hessian derived by hand. The per-op second derivatives are in
test_higher_order_property.py.
"""

import numpy as np
import pytest

import autograd
import autograd.functional as F
from autograd import Tensor, ops
from models.architectures.gpt import GPT, GPTConfig


def rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


# --- autograd.grad ------------------------------------------------------------------------------


def test_grad_differentiates_any_number_of_times(float64):
    x = Tensor([0.5, -2.0, 3.0], requires_grad=True)
    y = (x**4).sum()
    expected = [4 * x.data**3, 12 * x.data**2, 24 * x.data, np.full(3, 24.0)]
    g = y
    for want in expected:
        (g,) = autograd.grad(g.sum(), x, create_graph=True)
        np.testing.assert_allclose(g.data, want, rtol=1e-12)
    assert x.grad is None  # grad() returns gradients; it leaves .grad alone


def test_grad_without_create_graph_returns_constants_and_frees_the_graph(float64):
    x = Tensor([1.0, 2.0], requires_grad=True)
    y = (x * x).sum()
    (g,) = autograd.grad(y, x)
    np.testing.assert_array_equal(g.data, [2.0, 4.0])
    assert not g.requires_grad
    with pytest.raises(RuntimeError, match="already released"):
        autograd.grad(y, x)


def test_grad_of_several_outputs_and_inputs_with_grad_outputs(float64):
    a, b = Tensor(rand(2, 3), requires_grad=True), Tensor(rand(3, seed=1), requires_grad=True)
    u, w = a * b, (a @ b).exp()
    gu, gw = rand(2, 3, seed=2), rand(2, seed=3)
    da, db = autograd.grad([u, w], [a, b], [gu, Tensor(gw)])
    e = np.exp(a.data @ b.data)
    np.testing.assert_allclose(da.data, gu * b.data + (gw * e)[:, None] * b.data, rtol=1e-12)
    np.testing.assert_allclose(db.data, (gu * a.data).sum(0) + a.data.T @ (gw * e), rtol=1e-12)


def test_grad_of_an_intermediate_tensor_and_unused_inputs(float64):
    x = Tensor([1.0, 2.0], requires_grad=True)
    unused = Tensor([3.0], requires_grad=True)
    h = x * 3
    y = (h * h).sum()
    (dh,) = autograd.grad(y, h, retain_graph=True)
    np.testing.assert_allclose(dh.data, 2 * h.data)
    with pytest.raises(RuntimeError, match="input 1 .* is not used"):
        autograd.grad(y, [x, unused], retain_graph=True)
    dx, none = autograd.grad(y, [x, unused], allow_unused=True)
    assert none is None
    np.testing.assert_allclose(dx.data, 18 * x.data)


def test_backward_create_graph_leaves_differentiable_grads(float64):
    x = Tensor([1.0, 2.0], requires_grad=True)
    (x**3).sum().backward(create_graph=True)
    assert isinstance(x.grad, Tensor) and x.grad.requires_grad  # 3 x^2, with its graph
    (second,) = autograd.grad(x.grad.sum(), x)
    np.testing.assert_allclose(second.data, 6 * x.data)


def test_create_graph_needs_a_differentiable_vjp(float64):
    class NumpyOnly(autograd.Function):  # a user op with a numpy backward only
        def forward(self, a):
            self.save_for_backward(a)
            return np.sin(a)

        def backward(self, g):
            (a,) = self.saved
            return (g * np.cos(a),)

    x = Tensor([0.5], requires_grad=True)
    autograd.grad(NumpyOnly.apply(x).sum(), x)  # first order is fine
    with pytest.raises(NotImplementedError, match="NumpyOnly has no differentiable VJP"):
        autograd.grad(NumpyOnly.apply(x).sum(), x, create_graph=True)


def test_detect_anomaly_watches_the_differentiable_backward(float64):
    x = Tensor([0.0, 1.0], requires_grad=True)
    with autograd.detect_anomaly():
        (g,) = autograd.grad(x.exp().sum(), x, create_graph=True)  # Tensor gradients observed
        autograd.grad(g.sum(), x)
        # The VJP of sqrt is itself ops (g / (2 sqrt x)): its Inf at 0 is a forward output.
        with pytest.raises(autograd.AnomalyError, match="Inf in forward output of Div"):
            autograd.grad(x.sqrt().sum(), x, create_graph=True)


def test_max_with_ties_twice(float64):
    """max splits the gradient evenly between ties (share s = 1/k); d^2 max(x)^2 = 2 s s^T."""
    x = Tensor([5.0, 5.0, 5.0, 1.0], requires_grad=True)
    (g,) = autograd.grad(x.max() ** 2, x, create_graph=True)
    share = np.array([1, 1, 1, 0]) / 3
    np.testing.assert_allclose(g.data, 2 * 5.0 * share)
    h = autograd.hessian(lambda t: t.max() ** 2, x)
    np.testing.assert_allclose(h.data, 2 * np.outer(share, share))


# --- gradgradcheck ------------------------------------------------------------------------------


def test_gradgradcheck_fails_on_a_wrong_double_backward(float64, monkeypatch):
    x = Tensor(rand(2, 3), requires_grad=True)
    assert autograd.gradgradcheck(lambda t: t.exp(), [x]).ok
    # A plausible bug: the VJP g * e^x uses e^x as a constant, so its value is right but its own
    # derivative is lost.
    monkeypatch.setattr(ops.Exp, "vjp", lambda self, g, out: (g * out.detach(),), raising=False)
    with pytest.raises(autograd.GradcheckError, match=r"second derivatives.*FAILED.*analytic 0,"):
        autograd.gradgradcheck(lambda t: t.exp(), [x])


def test_gradgradcheck_fails_on_a_wrong_first_gradient(float64, monkeypatch):
    x = Tensor(rand(3), requires_grad=True)
    monkeypatch.setattr(ops.Exp, "vjp", lambda self, g, out: (g * out * 1.5,), raising=False)
    with pytest.raises(autograd.GradcheckError, match=r"first gradient, create_graph\) FAILED"):
        autograd.gradgradcheck(lambda t: t.exp(), [x])


def test_gradgradcheck_never_passes_a_nan_second_derivative(float64, monkeypatch):
    x = Tensor(rand(3), requires_grad=True)

    def nan_derivative(self, g, out):
        r = g * out  # the right value; d(r)/d(anything) is 0 * inf = NaN
        return (r.detach() + (r * 0).sqrt(),)

    monkeypatch.setattr(ops.Exp, "vjp", nan_derivative, raising=False)
    with np.errstate(all="ignore"):
        result = autograd.gradgradcheck(lambda t: t.exp(), [x], rtol=np.inf, raise_exception=False)
    assert not result.ok and np.isinf(result.max_abs_error)


# --- vjp, jvp, hvp, hessian ---------------------------------------------------------------------


def mlp(x, w1, w2):
    return F.gelu(x @ w1) @ w2


def test_vjp_matches_grad(float64):
    primals = (rand(4, 3), rand(3, 5, seed=1), rand(5, 2, seed=2))
    out, vjp_fn = autograd.vjp(mlp, primals)
    u = rand(4, 2, seed=3)
    grads = vjp_fn(u)
    again = vjp_fn(2 * u)  # callable again: the graph is kept
    xs = [Tensor(p, requires_grad=True) for p in primals]
    (mlp(*xs) * u).sum().backward()
    for g, g2, x in zip(grads, again, xs, strict=True):
        np.testing.assert_allclose(g.data, x.grad, rtol=1e-12)
        np.testing.assert_allclose(g2.data, 2 * x.grad, rtol=1e-12)
    assert out.shape == (4, 2)


def test_jvp_matches_central_differences_of_the_output(float64):
    primals = (rand(4, 3), rand(3, 5, seed=1), rand(5, 2, seed=2))
    tangents = tuple(rand(*p.shape, seed=10 + i) for i, p in enumerate(primals))
    out, tangent_out = autograd.jvp(mlp, primals, tangents)
    eps = 1e-6

    def at(step):
        return mlp(*[Tensor(p + step * t) for p, t in zip(primals, tangents, strict=True)]).data

    numeric = (at(eps) - at(-eps)) / (2 * eps)
    np.testing.assert_allclose(out.data, at(0.0), rtol=1e-12)
    np.testing.assert_allclose(tangent_out.data, numeric, rtol=1e-7, atol=1e-8)


def test_jvp_of_several_outputs_with_a_constant_one(float64):
    def fn(x):
        return (x * x).sum(), Tensor(np.ones(2)), F.softmax(x)

    x, v = rand(3), rand(3, seed=1)
    (s, c, p), (ds, dc, dp) = autograd.jvp(fn, (x,), (v,))
    np.testing.assert_allclose(ds.data, 2 * x @ v)
    np.testing.assert_array_equal(dc.data, [0.0, 0.0])
    sm = p.data
    np.testing.assert_allclose(dp.data, sm * (v - sm @ v), rtol=1e-12)


def test_hessian_of_a_small_function_matches_the_hand_derived_one(float64):
    # f(x) = 1/2 x^T A x + logsumexp(x):  H = (A + A^T)/2 + diag(p) - p p^T,  p = softmax(x)
    a = rand(4, 4, seed=1)
    x = rand(4, seed=2)

    def f(t):
        return 0.5 * (t @ Tensor(a) @ t) + F.logsumexp(t)

    p = np.exp(x - x.max()) / np.exp(x - x.max()).sum()
    expected = (a + a.T) / 2 + np.diag(p) - np.outer(p, p)
    h = autograd.hessian(f, x)
    assert h.shape == (4, 4)
    np.testing.assert_allclose(h.data, expected, rtol=1e-12, atol=1e-14)
    # shape x.shape + x.shape for a matrix input: d^2 sum(X^3) / dX_ij dX_kl = 6 X_ij [ij = kl]
    m = rand(2, 3, seed=3)
    h2 = autograd.hessian(lambda t: (t**3).sum(), m)
    assert h2.shape == (2, 3, 2, 3)
    np.testing.assert_allclose(h2.data.reshape(6, 6), np.diag(6 * m.reshape(-1)), atol=1e-14)
    # a linear function has a zero Hessian
    np.testing.assert_array_equal(autograd.hessian(lambda t: t.sum(), m).data, 0)


def test_hvp_of_the_gpt_loss_matches_central_differences_of_the_gradient(float64):
    model = GPT(GPTConfig(vocab_size=5, block_size=4, n_layer=1, n_head=2, n_embd=4))
    rng = np.random.default_rng(1)
    with autograd.no_grad():
        for p in model.parameters():  # not tiny weights: curvature everywhere
            p.data = p.data + rng.normal(0, 0.3, p.shape)
    idx, targets = rng.integers(0, 5, (2, 4)), rng.integers(0, 5, (2, 4))
    params = list(model.parameters())
    v = [rng.standard_normal(p.shape) for p in params]

    def loss(*_):  # the model reads its own parameters
        return model(idx, targets)[1]

    value, hv = autograd.hvp(loss, params, v)
    assert len(hv) == len(params) and all(
        h.shape == p.shape for h, p in zip(hv, params, strict=True)
    )

    def gradient_at(step):
        with autograd.no_grad():
            for p, d in zip(params, v, strict=True):
                p.data = p.data + step * d
        grads = autograd.grad(loss(), params)
        with autograd.no_grad():
            for p, d in zip(params, v, strict=True):
                p.data = p.data - step * d
        return np.concatenate([g.data.reshape(-1) for g in grads])

    eps = 1e-5
    numeric = (gradient_at(eps) - gradient_at(-eps)) / (2 * eps)
    analytic = np.concatenate([h.data.reshape(-1) for h in hv])
    assert np.abs(analytic).max() > 1e-2  # a real curvature, not zeros matching zeros
    np.testing.assert_allclose(analytic, numeric, rtol=1e-6, atol=1e-8)
    assert value.item() == pytest.approx(loss().item(), rel=1e-12)
    # H is symmetric: <u, H v> = <v, H u>
    u = [rng.standard_normal(p.shape) for p in params]
    _, hu = autograd.hvp(loss, params, u)
    uhv = sum(float((a * h.data).sum()) for a, h in zip(u, hv, strict=True))
    vhu = sum(float((b * h.data).sum()) for b, h in zip(v, hu, strict=True))
    assert uhv == pytest.approx(vhu, rel=1e-10)
    assert all(p.grad is None for p in params)  # hvp leaves .grad alone


# --- the two runnable examples ------------------------------------------------------------------


def test_newton_and_hessian_free_converge_in_a_few_steps(float64):
    from models import newton

    x, y = newton.data()
    loss = newton.loss_fn(x, y)
    w0 = np.zeros(x.shape[1])
    full, free = newton.newton(loss, w0), newton.hessian_free(loss, w0)
    for history in (full, free):
        norms = [n for _, n in history]
        assert len(history) <= 7 and norms[-1] < 1e-10
        assert all(b < a**1.5 for a, b in zip(norms[2:], norms[3:], strict=False))  # quadratic
    assert full[-1][0] == pytest.approx(free[-1][0], rel=1e-12)


def test_gradient_penalty_step_differentiates_through_the_gradient(float64, capsys):
    from models import gradient_penalty as gp

    d = gp.Discriminator(hidden=3)
    real, fake = gp.batch(np.random.default_rng(1), n=4)
    params = list(d.parameters())
    # The penalty's gradient with respect to D's weights is a double backward (d^2 D / dx dtheta).
    autograd.gradcheck(lambda *_: gp.r1_penalty(d, real), params, atol=1e-8, rtol=1e-6)
    history = gp.main(["--steps", "20"])
    assert "R1 penalty" in capsys.readouterr().out
    assert history[-1][0] < history[0][0] and np.isfinite(history).all()
