"""Bugs the first property suite let through, one test each (each failed before its fix)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import autograd
import autograd.functional as F
from autograd import Tensor, no_grad


def test_transpose_with_negative_and_mixed_sign_axes(float64):
    x = Tensor(np.arange(9.0).reshape(3, 3), requires_grad=True)
    weights = np.arange(9.0).reshape(3, 3)
    (x.transpose(-1, 0) * weights).sum().backward()
    np.testing.assert_array_equal(x.grad, weights.T)
    y = Tensor(np.ones((3, 4)), requires_grad=True)
    y.transpose(-1, 0).sum().backward()
    assert y.grad.shape == (3, 4)
    z = Tensor(np.ones((2, 3, 4)), requires_grad=True)
    assert z.transpose(0, -1, 1).shape == (2, 4, 3)
    with pytest.raises(ValueError, match=r"transpose: axes \(0, 3\) are not a permutation"):
        y.transpose(0, 3)


def test_power_zero_at_zero_has_gradient_zero(float64):
    # d/dx x^0 = 0 everywhere, also at x = 0 (PyTorch agrees); 0 * 0^-1 was 0 * inf = NaN
    x = Tensor(np.array([0.0, 2.0]), requires_grad=True)
    (x**0).sum().backward()
    np.testing.assert_array_equal(x.grad, [0.0, 0.0])
    y = Tensor(np.array([0.0, 2.0]), requires_grad=True)
    (y ** Tensor(np.array([0.0, 1.0]))).sum().backward()
    np.testing.assert_array_equal(y.grad, [0.0, 1.0])


def test_gather_with_an_index_that_broadcasts(float64):
    x = Tensor(np.arange(20.0).reshape(4, 5), requires_grad=True)
    index = np.array([[3], [0]])  # (2, 1) against (4, 5) along axis 0: broadcast to (2, 5)
    out = F.gather(x, index, axis=0)
    np.testing.assert_array_equal(out.data, np.take_along_axis(x.data, index, axis=0))
    out.sum().backward()
    expected = np.zeros((4, 5))
    expected[[3, 0]] = 1.0
    np.testing.assert_array_equal(x.grad, expected)


def test_equality_is_elementwise_and_tensors_stay_hashable():
    x = Tensor(np.array([0.0, 1.0, 0.0]))
    np.testing.assert_array_equal(x == 0, [True, False, True])
    np.testing.assert_array_equal(x != 0, [False, True, False])
    np.testing.assert_array_equal(x[x == 0].data, [0.0, 0.0])
    np.testing.assert_array_equal(x == Tensor(np.array([0.0, 0.0, 1.0])), [True, False, False])
    assert len({x, x, Tensor(np.zeros(3))}) == 2  # hashed by identity


def test_changed_squeezed_max_output_is_caught():
    x = Tensor(np.array([[1.0, 3.0], [4.0, 2.0]]), requires_grad=True)
    m = x.max(axis=1)  # a squeezed view of the array Max saved
    with no_grad():
        m[0] = 10.0
    with pytest.raises(RuntimeError, match="modified in place"):
        m.sum().backward()


@pytest.mark.parametrize("view", ["reshape", "basic_index"])
def test_saved_output_changed_through_a_view_is_caught(view):
    x = Tensor(np.array([0.5, 1.0]), requires_grad=True)
    y = x.exp()  # Exp saves its output
    with no_grad():
        alias = y.reshape(2, 1) if view == "reshape" else y[0:1]
        alias += 1.0
    with pytest.raises(RuntimeError, match="modified in place"):
        y.sum().backward()


def test_saved_leaf_changed_through_detach_is_caught():
    x = Tensor(np.array([1.0, 2.0]), requires_grad=True)
    y = (x * x).sum()
    d = x.detach()
    d += 1.0
    with pytest.raises(RuntimeError, match="modified in place"):
        y.backward()


def test_a_fresh_output_does_not_share_the_version_of_its_input():
    x = Tensor(np.array([1.0, 2.0]), requires_grad=True)
    y = x * 2.0
    z = y.exp()
    with no_grad():
        y += 1.0  # y is not what Exp saved (it saved z), and z is a fresh array
    z.sum().backward()  # must not raise
    np.testing.assert_allclose(x.grad, 2 * z.data)


def test_from_pretrained_dtype_wins_over_the_default(tmp_path):
    from models.architectures.gpt import GPT, GPTConfig

    config = GPTConfig(vocab_size=5, block_size=4, n_layer=1, n_head=1, n_embd=4)
    GPT(config).save_pretrained(tmp_path)
    autograd.set_default_dtype(np.float32)
    model = GPT.from_pretrained(tmp_path, dtype=np.float64)
    assert {p.dtype for p in model.parameters()} == {np.dtype(np.float64)}
    logits, _ = model(np.zeros((1, 2), dtype=np.int64))
    assert logits.dtype == np.float64


def test_numpy_errors_keep_the_op_name_and_the_cause():
    strings = Tensor(np.array(["a", "b"]))
    with pytest.raises(TypeError, match=r"Add: .*(inputs: \(2,\) <U1, \(2,\) int64)") as info:
        strings + Tensor(np.array([1, 2]))
    assert "ufunc 'add'" in str(info.value)  # numpy's own words are kept
    assert info.value.__cause__ is not None


def test_dtype_promotion_follows_numpy_for_arrays_and_keeps_the_tensor_dtype_for_scalars():
    x = Tensor(np.ones(2, dtype=np.float32))
    assert (x + np.ones(2, dtype=np.float64)).dtype == np.float64
    assert (np.ones(2, dtype=np.float64) * x).dtype == np.float64
    assert (x + Tensor(np.ones(2), dtype=np.float64)).dtype == np.float64
    assert (x + 2.5).dtype == np.float32  # a Python number takes the tensor's dtype
    assert (x * np.float64(2.0)).dtype == np.float32  # so does a numpy scalar
    assert (x + np.ones(2, dtype=np.float32)).dtype == np.float32


def test_safetensors_header_with_a_list_dtype_is_a_checkpoint_error(tmp_path):
    import nn

    header = json.dumps({"w": {"dtype": ["F32"], "shape": [1], "data_offsets": [0, 4]}}).encode()
    path = tmp_path / "bad.safetensors"
    path.write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 4)
    with pytest.raises(nn.CheckpointError, match="dtype"):
        nn.load_safetensors(path)


def test_the_jvp_check_s_transpose_identity_where_a_softmax_probability_underflows(monkeypatch):
    """check_jvp's <J v, u> = <v, J^T u> compared terms of 1e-261 (softmax of [-9196, -10181,
    -9805]: p (v - <p, v>) cancels to rounding of |v| ~ 1e4, far above them) to 1e-9 of
    themselves; the check now also allows rounding relative to v and u. It still catches a VJP
    that is off."""
    from autograd.testing import check_jvp

    x = np.array([-9196.32192763, -10180.83802856, -9805.23119407])
    check_jvp(lambda t: F.softmax(t, 0), [x])
    backward = F.Softmax.backward
    monkeypatch.setattr(F.Softmax, "backward", lambda self, g: (1.001 * backward(self, g)[0],))
    with pytest.raises(AssertionError, match="transpose identity"):
        check_jvp(lambda t: F.softmax(t, 0), [np.array([0.3, -1.2, 2.0])])
