"""nn.Module bookkeeping: registration, names, modes, state_dict / load_state_dict, containers."""

import numpy as np
import pytest

import autograd
import nn
from autograd import Tensor


class Inner(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Parameter(np.ones((2, 3)))
        self.drop = nn.Dropout(0.5)
        self.b = nn.Parameter(np.zeros(3))


class Outer(nn.Module):
    def __init__(self):
        super().__init__()
        self.first = Inner()
        self.scale = nn.Parameter(np.full(1, 2.0))
        self.layers = nn.ModuleList([nn.Linear(3, 4), nn.Linear(4, 2, bias=False)])

    def forward(self, x):
        h = x @ self.first.a + self.first.b
        for layer in self.layers:
            h = layer(h)
        return h * self.scale


def test_parameters_register_on_assignment_in_order():
    m = Outer()
    names = [name for name, _ in m.named_parameters()]
    assert names == [
        "scale",
        "first.a",
        "first.b",
        "layers.0.weight",
        "layers.0.bias",
        "layers.1.weight",
    ]
    assert [p for p in m.parameters()] == [p for _, p in m.named_parameters()]
    assert m.num_parameters() == 1 + 6 + 3 + 12 + 4 + 8
    assert [name for name, _ in m.named_modules()] == [
        "",
        "first",
        "first.drop",
        "layers",
        "layers.0",
        "layers.1",
    ]
    assert len(list(m.modules())) == 6


def test_parameter_is_a_float_leaf_tensor_in_default_dtype():
    p = nn.Parameter([1, 2, 3])
    assert isinstance(p, Tensor) and p.requires_grad and p.is_leaf
    assert p.dtype == autograd.get_default_dtype()
    autograd.set_default_dtype(np.float64)
    assert nn.Parameter(np.ones(2, dtype=np.float32)).dtype == np.float64
    assert nn.Parameter(np.ones(2), dtype=np.float32).dtype == np.float32
    with pytest.raises(TypeError, match="Parameter"):
        nn.Parameter(np.array(["a"]))


def test_attribute_reads_are_plain_and_reassignment_unregisters():
    lin = nn.Linear(2, 3)
    # Stored as ordinary attributes: reads never go through a __getattr__ hook.
    assert "weight" in lin.__dict__ and not hasattr(nn.Module, "__getattr__")
    lin.weight = nn.Parameter(np.zeros((2, 3)))
    assert [n for n, _ in lin.named_parameters()] == ["weight", "bias"]
    lin.bias = None
    assert [n for n, _ in lin.named_parameters()] == ["weight"]
    m = Outer()
    del m.first
    assert all(not n.startswith("first") for n, _ in m.named_parameters())


def test_assigning_before_super_init_is_a_clear_error():
    class Broken(nn.Module):
        def __init__(self):
            self.w = nn.Parameter(np.ones(1))

    with pytest.raises(AttributeError, match=r"Broken.*super\(\).__init__"):
        Broken()


def test_shared_parameter_and_module_are_listed_once():
    m = nn.Module()
    m.enc = nn.Linear(2, 2)
    m.dec = nn.Linear(2, 2)
    m.dec.weight = m.enc.weight  # tied weights
    m.again = m.enc
    assert [n for n, _ in m.named_parameters()] == ["enc.weight", "enc.bias", "dec.bias"]
    assert m.num_parameters() == 4 + 2 + 2
    assert list(m.state_dict()) == ["enc.weight", "enc.bias", "dec.bias"]


def test_train_eval_propagate_and_zero_grad():
    m = Outer()
    assert all(mod.training for mod in m.modules())
    assert m.eval() is m
    assert not any(mod.training for mod in m.modules())
    m.train()
    assert all(mod.training for mod in m.modules())
    m.layers.train(False)
    assert m.training and not m.layers[0].training
    x = Tensor(np.ones((5, 2)))
    m(x).sum().backward()
    assert all(p.grad is not None for p in m.parameters())
    m.zero_grad()
    assert all(p.grad is None for p in m.parameters())


def test_repr_is_a_tree():
    text = repr(Outer())
    assert text.splitlines()[0] == "Outer("
    assert "  (first): Inner(" in text
    assert "    (drop): Dropout(p=0.5)" in text
    assert "(1): Linear(in_features=4, out_features=2, bias=False)" in text
    assert repr(nn.ReLU()) == "ReLU()"


def test_state_dict_is_copies_and_roundtrips():
    m = Outer()
    state = m.state_dict()
    assert set(state) == {n for n, _ in m.named_parameters()}
    state["scale"][...] = 7.0
    assert m.scale.data[0] == 2.0  # a copy, not a view
    other = Outer()
    for p in other.parameters():
        p.data = np.random.default_rng(1).normal(size=p.shape).astype(p.dtype)
    other.load_state_dict(state)
    for (name, p), (_, q) in zip(m.named_parameters(), other.named_parameters(), strict=True):
        expected = 7.0 if name == "scale" else p.data
        np.testing.assert_array_equal(q.data, expected)
        assert q.dtype == p.dtype


def test_load_state_dict_reports_every_problem_and_changes_nothing():
    m = Outer()
    before = m.state_dict()
    bad = dict(before)
    del bad["first.a"]
    del bad["layers.1.weight"]
    bad["first.c"] = np.ones(3)
    bad["layers.0.weight"] = np.ones((4, 3))  # transposed
    bad["scale"] = np.ones(1) * 9  # valid on its own, must still not be loaded
    with pytest.raises(KeyError) as info:
        m.load_state_dict(bad)
    message = str(info.value)
    for fragment in (
        "first.a",
        "layers.1.weight",
        "unexpected keys: first.c",
        "shape mismatch for layers.0.weight: checkpoint (4, 3), model (3, 4)",
        "nothing was loaded",
    ):
        assert fragment in message
    for name, value in m.state_dict().items():
        np.testing.assert_array_equal(value, before[name])


def test_load_state_dict_non_strict_loads_what_matches():
    m = Outer()
    m.load_state_dict({"scale": np.array([5.0]), "extra": np.ones(2)}, strict=False)
    assert m.scale.data[0] == 5.0
    with pytest.raises(KeyError, match="shape mismatch for scale"):
        m.load_state_dict({"scale": np.ones(2)}, strict=False)


def test_load_state_dict_bumps_version_so_stale_graphs_fail():
    lin = nn.Linear(2, 2)
    out = lin(Tensor(np.ones((1, 2)))).sum()
    lin.load_state_dict(lin.state_dict())
    with pytest.raises(RuntimeError, match="modified in place"):
        out.backward()


def test_buffers_persistent_and_not():
    m = nn.Module()
    m.register_buffer("running", np.zeros(3))
    m.register_buffer("table", np.ones(2), persistent=False)
    assert list(m.state_dict()) == ["running"]
    m.load_state_dict({"running": np.arange(3.0)})
    np.testing.assert_array_equal(m.running, [0, 1, 2])
    m.running = np.full(3, 4.0)
    assert m.state_dict()["running"][0] == 4.0
    with pytest.raises(TypeError, match="buffer 'running'"):
        m.running = 3


def test_module_list_and_sequential():
    layers = nn.ModuleList([nn.Linear(2, 2) for _ in range(3)])
    assert len(layers) == 3 and isinstance(layers[-1], nn.Linear)
    assert len(layers[1:]) == 2
    with pytest.raises(IndexError, match="out of range for 3"):
        layers[3]
    with pytest.raises(TypeError, match="expected a Module"):
        layers.append(np.ones(2))
    seq = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
    x = Tensor(np.random.default_rng(0).normal(size=(5, 3)))
    expected = seq[2](seq[0](x).relu()).data
    np.testing.assert_array_equal(seq(x).data, expected)
    assert [n for n, _ in seq.named_parameters()] == ["0.weight", "0.bias", "2.weight", "2.bias"]


def test_forward_must_be_defined():
    with pytest.raises(NotImplementedError, match="Module does not define forward"):
        nn.Module()(1)
