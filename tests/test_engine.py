"""The graph core: accumulation, deep graphs, release, no_grad, dtypes, in-place safety, errors."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import autograd
from autograd import Tensor, no_grad


def test_design_example():
    x = Tensor(np.ones((2, 3)), requires_grad=True)
    y = (x * 2 + 1).sum()
    y.backward()
    assert x.grad.shape == x.shape and x.grad.dtype == np.float32
    np.testing.assert_array_equal(x.grad, np.full((2, 3), 2.0))


def test_default_dtype_and_switch():
    assert Tensor([1.0, 2.0]).dtype == np.float32
    assert Tensor(np.ones(3)).dtype == np.float32  # float arrays take the default too
    assert Tensor(np.ones(3), dtype=np.float64).dtype == np.float64
    assert Tensor(np.array([1, 2])).dtype.kind == "i"  # ids stay integers
    autograd.set_default_dtype(np.float64)
    assert Tensor([1.0]).dtype == np.float64
    with pytest.raises(ValueError, match="float32 or float64"):
        autograd.set_default_dtype(np.int32)


def test_scalar_operand_keeps_tensor_dtype():
    x = Tensor([1.0, 2.0], requires_grad=True)
    assert (x * np.float64(2.0)).dtype == np.float32
    assert (2.0 + x).dtype == np.float32


def test_gradients_accumulate_over_every_use():
    # notes 10.2: a variable used on several branches receives the sum of their gradients
    x = Tensor([2.0, 3.0], requires_grad=True)
    y = x * x + x * 3 + x
    y.sum().backward()
    np.testing.assert_allclose(x.grad, 2 * x.data + 4)


def test_grad_accumulates_across_backward_calls_until_zeroed():
    x = Tensor([1.0], requires_grad=True)
    (x * 2).sum().backward()
    (x * 3).sum().backward()
    np.testing.assert_array_equal(x.grad, [5.0])
    x.zero_grad()
    assert x.grad is None


def test_diamond_graph():
    x = Tensor([1.5], requires_grad=True)
    a = x.exp()
    b = a * a  # a reaches b twice
    c = a + b
    c.backward()
    np.testing.assert_allclose(x.grad, np.exp(1.5) + 2 * np.exp(3.0), rtol=1e-6)


def test_chain_of_100000_ops_has_no_recursion_limit():
    x = Tensor([1.0], requires_grad=True)
    y = x
    for _ in range(100_000):
        y = y + 1.0
    y.backward()
    np.testing.assert_array_equal(x.grad, [1.0])


def test_graph_is_released_after_backward():
    x = Tensor([1.0, 2.0], requires_grad=True)
    y = (x * x).sum()
    y.backward()
    with pytest.raises(RuntimeError, match="already released.*retain_graph=True"):
        y.backward()


def test_retain_graph_allows_a_second_backward():
    x = Tensor([1.0, 2.0], requires_grad=True)
    y = (x * x).sum()
    y.backward(retain_graph=True)
    y.backward()
    np.testing.assert_array_equal(x.grad, 4 * x.data)


def test_backward_needs_grad_for_non_scalar():
    x = Tensor([1.0, 2.0], requires_grad=True)
    y = x * 2
    with pytest.raises(RuntimeError, match=r"shape \(2,\).*pass grad="):
        y.backward()
    y.backward(np.array([1.0, 10.0]))
    np.testing.assert_array_equal(x.grad, [2.0, 20.0])


def test_backward_rejects_bad_seeds():
    x = Tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(ValueError, match=r"grad has shape \(3,\).*\(2,\)"):
        (x * 2).backward(np.ones(3))
    with pytest.raises(ValueError, match="NaN or Inf"):
        (x * 2).backward(np.array([1.0, np.nan]))
    with pytest.raises(RuntimeError, match="does not require grad"):
        Tensor([1.0]).backward()


def test_integer_tensors_cannot_require_grad():
    with pytest.raises(TypeError, match=r"only float tensors can require grad.*int64"):
        Tensor(np.array([1, 2]), requires_grad=True)
    t = Tensor(np.array([1, 2]))
    with pytest.raises(TypeError, match="int"):
        t.requires_grad = True


def test_shape_errors_name_the_op_and_shapes():
    a = Tensor(np.ones((2, 3)), requires_grad=True)
    with pytest.raises(ValueError, match=r"MatMul: shapes \(2, 3\) and \(4, 5\)"):
        a @ Tensor(np.ones((4, 5)))
    with pytest.raises(ValueError, match=r"Add: .*\(2,3\) \(4,\).*float32"):
        a + Tensor(np.ones(4))
    with pytest.raises(ValueError, match=r"Reshape: .*\(2, 3\) float32"):
        a.reshape(4, 2)
    with pytest.raises(ValueError, match="sum: axis 5 is out of range"):
        a.sum(axis=5)


def test_no_grad_records_nothing_and_is_thread_local():
    x = Tensor([1.0], requires_grad=True)
    seen = {}

    def other_thread():
        seen["other"] = (x * 2).requires_grad

    with no_grad():
        y = x * 2
        worker = threading.Thread(target=other_thread)
        worker.start()
        worker.join()
    assert not y.requires_grad and y.op is None
    assert seen["other"] is True  # no_grad in this thread did not leak into the other
    assert autograd.is_grad_enabled()


def test_detach_item_numpy_asarray():
    x = Tensor([[1.0, 2.0]], requires_grad=True)
    d = (x * 3).detach()
    assert not d.requires_grad and d.op is None
    assert Tensor([4.0]).item() == 4.0
    with pytest.raises(ValueError, match="one-element"):
        x.item()
    assert x.numpy() is x.data
    np.testing.assert_array_equal(np.asarray(x), [[1.0, 2.0]])
    assert np.asarray(x, dtype=np.float64).dtype == np.float64


def test_retain_grad_keeps_intermediate_gradients():
    x = Tensor([1.0, 2.0], requires_grad=True)
    h = (x * 3).retain_grad()
    (h * h).sum().backward()
    np.testing.assert_array_equal(h.grad, 2 * h.data)


def test_inplace_change_of_saved_tensor_is_detected():
    w = Tensor([1.0, 2.0], requires_grad=True)
    x = Tensor([3.0, 4.0])
    y = (w * x).sum()  # Mul saved x
    x += 1.0
    with pytest.raises(RuntimeError, match=r"Mul: input 1 \(shape \(2,\)\) was modified in place"):
        y.backward()


def test_setitem_on_saved_tensor_is_detected():
    w = Tensor([1.0, 2.0], requires_grad=True)
    x = Tensor([3.0, 4.0])
    y = (w * x).sum()
    x[0] = 10.0
    with pytest.raises(RuntimeError, match="version 0 -> 1"):
        y.backward()


def test_inplace_on_unsaved_input_is_fine():
    w = Tensor([1.0, 2.0], requires_grad=True)
    b = Tensor([3.0, 4.0])
    y = (w + b).sum()  # Add saves only shapes
    b += 1.0
    y.backward()
    np.testing.assert_array_equal(w.grad, [1.0, 1.0])


def test_inplace_on_saved_output_is_detected():
    x = Tensor([0.5, 1.0], requires_grad=True)
    y = x.exp()  # Exp saves its output
    z = y.detach()
    y.data = z.data * 2  # the API's data setter bumps the version
    with pytest.raises(RuntimeError, match="its output"):
        y.sum().backward()


def test_inplace_on_tensor_requiring_grad_is_refused_outside_no_grad():
    w = Tensor([1.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="in-place change of a tensor that requires grad"):
        w += 1.0
    with no_grad():
        w += 1.0
    np.testing.assert_array_equal(w.data, [2.0])


def test_detect_anomaly_names_the_op_and_the_line():
    x = Tensor([0.0, 1.0], requires_grad=True)
    with autograd.detect_anomaly():
        with pytest.raises(autograd.AnomalyError, match=r"Inf in forward output of Div") as info:
            _ = Tensor([1.0, 1.0]) / x
        assert "test_engine.py" in str(info.value)
        y = x.sqrt()  # forward is finite; d sqrt(x)/dx at 0 is Inf
        with pytest.raises(autograd.AnomalyError, match="gradient produced by Sqrt.backward"):
            y.sum().backward()


def test_anomaly_mode_is_off_by_default():
    x = Tensor([0.0], requires_grad=True)
    with np.errstate(divide="ignore"):
        y = Tensor([1.0]) / x
    assert np.isinf(y.data).all()
    assert not hasattr(y.op, "created_at")


def test_trace_prints_one_step_per_op(capsys):
    x = Tensor([1.0, 2.0], requires_grad=True, name="x")
    y = (x * x).sum()
    y.backward(trace=True)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[")]
    assert len(lines) == 2 and "Sum" in lines[0] and "Mul" in lines[1]


def test_gradcheck_reports_the_worst_element():
    class WrongSquare(autograd.Function):
        def forward(self, a):
            self.save_for_backward(a)
            return a * a

        def backward(self, g):
            (a,) = self.saved
            return (g * a,)  # should be 2a

    x = Tensor(np.array([1.0, -3.0]), dtype=np.float64, requires_grad=True)
    with pytest.raises(autograd.GradcheckError, match=r"input 0\[1\]") as info:
        autograd.gradcheck(lambda t: WrongSquare.apply(t), [x])
    assert info.value.result.analytic != pytest.approx(info.value.result.numeric)
    good = autograd.gradcheck(lambda t: t * t, [x])
    assert good.ok and good.max_rel_error < 1e-8
    with pytest.raises(TypeError, match="float64"):
        autograd.gradcheck(lambda t: t * t, [Tensor([1.0], requires_grad=True)])


def test_inplace_change_of_an_input_saved_as_a_view_is_detected():
    import nn

    w = Tensor(np.ones((3, 2)), requires_grad=True)
    x = Tensor(np.ones((2, 2, 3)))
    y = nn.linear(x, w).sum()  # linear saves x reshaped to (4, 3): a view of x's array
    x[0, 0, 0] = 5.0
    with pytest.raises(RuntimeError, match="modified in place"):
        y.backward()


def test_gradients_never_alias_each_other_or_the_seed():
    a = Tensor([1.0, 2.0], requires_grad=True)
    b = Tensor([3.0, 4.0], requires_grad=True)
    seed = np.array([1.0, 1.0], dtype=np.float32)
    (a + b).backward(seed)  # Add hands the same incoming array to both inputs
    assert not np.shares_memory(a.grad, b.grad)
    assert not np.shares_memory(a.grad, seed) and not np.shares_memory(b.grad, seed)
    a.grad += 1.0
    np.testing.assert_array_equal(b.grad, [1.0, 1.0])
    np.testing.assert_array_equal(seed, [1.0, 1.0])
    h = (a * 2).retain_grad()
    (h + a).sum().backward()  # h's .grad and a's contribution from h start as the same array
    assert not np.shares_memory(h.grad, a.grad)
