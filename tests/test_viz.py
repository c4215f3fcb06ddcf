"""autograd.viz: the DOT text of a graph, and rendering through Graphviz when `dot` is present."""

import doctest
import re
import shutil

import numpy as np
import pytest

import autograd.viz
from autograd import Tensor
from autograd.viz import render, to_dot
from models import worked_example as we

HAS_DOT = shutil.which("dot") is not None


def parse(dot):
    """DOT text -> ({node id: label}, [(src, dst)])."""
    nodes = dict(re.findall(r'^\s*(n\d+) \[label="((?:[^"\\]|\\.)*)"', dot, flags=re.M))
    edges = re.findall(r"^\s*(n\d+) -> (n\d+);", dot, flags=re.M)
    return nodes, edges


def by_label(nodes, first_line):
    found = [n for n, label in nodes.items() if label.split("\\n")[0] == first_line]
    assert len(found) == 1, f"{first_line!r}: {found} in {nodes}"
    return found[0]


def test_module_doctest():
    assert doctest.testmod(autograd.viz).failed == 0


def test_one_node_per_op_and_per_leaf_with_name_shape_dtype():
    x = Tensor(np.ones((2, 3)), requires_grad=True, dtype=np.float64, name="x")
    w = Tensor(np.ones((3, 4)), requires_grad=True, dtype=np.float64, name="w")
    y = (x @ w).relu().sum()
    nodes, edges = parse(to_dot(y))
    assert sorted(label.split("\\n")[0] for label in nodes.values()) == sorted(
        ["Sum", "Relu", "MatMul", "x", "w"]
    )
    assert nodes[by_label(nodes, "MatMul")] == "MatMul\\n(2, 4) float64"
    assert nodes[by_label(nodes, "w")] == "w\\n(3, 4) float64"
    matmul, relu, total = (by_label(nodes, n) for n in ("MatMul", "Relu", "Sum"))
    assert set(edges) == {
        (by_label(nodes, "x"), matmul),
        (by_label(nodes, "w"), matmul),
        (matmul, relu),
        (relu, total),
    }


def test_output_is_marked_and_constants_are_dashed():
    x = Tensor(np.ones(3), requires_grad=True, dtype=np.float64)
    dot = to_dot((x * 2.0).sum())
    assert re.search(r'n0 \[label="Sum\\n\(\) float64".*peripheries=2', dot)
    assert re.search(r'label="constant\\n\(\) float64", style=dashed', dot)
    assert re.search(r'label="input\\n\(3,\) float64", style=filled', dot)


def test_a_tensor_used_twice_is_one_node_with_two_edges():
    x = Tensor(np.ones(3), requires_grad=True, dtype=np.float64, name="x")
    nodes, edges = parse(to_dot((x * x).sum()))
    assert len(nodes) == 3
    assert edges.count((by_label(nodes, "x"), by_label(nodes, "Mul"))) == 2


def test_parameter_names_come_from_a_module_or_a_dict():
    model = we.WorkedExample()
    for p in model.params.values():
        p.name = None  # only the module can name them now
    f = model.forward()
    for params in (model, dict(model.named_parameters())):
        nodes, _ = parse(to_dot(f.L, params=params))
        for name, p in model.named_parameters():
            assert nodes[by_label(nodes, name)] == f"{name}\\n{p.shape} float64"
    nodes, _ = parse(to_dot(f.L))
    assert sum(label.startswith("input\\n") for label in nodes.values()) == 6


def test_ch11_graph_has_the_notes_names():
    model = we.WorkedExample()
    nodes, edges = parse(to_dot(model.forward().L, params=model))
    titles = {label.split("\\n")[1] for label in nodes.values() if label.count("\\n") == 2}
    assert {"X", "Q", "K", "V", "S0", "S", "A", "Z", "R", "h", "logits", "L"} <= titles
    x = next(n for n, label in nodes.items() if label.startswith("Embedding\\nX"))
    assert sum(src == x for src, _ in edges) == 4  # residual, Q, K, V


def test_names_with_quotes_are_escaped():
    x = Tensor(np.ones(2), requires_grad=True, dtype=np.float64, name='say "hi" \\o/')
    assert 'label="say \\"hi\\" \\\\o/\\n(2,) float64"' in to_dot(x.sum())


def test_released_graph_and_bad_arguments_are_explained():
    x = Tensor(np.ones(2), requires_grad=True, dtype=np.float64)
    y = (x * 2).sum()
    y.backward()
    with pytest.raises(RuntimeError, match="released by backward.*retain_graph=True"):
        to_dot(y)
    with pytest.raises(TypeError, match="to_dot: expected a Tensor, got ndarray"):
        to_dot(np.ones(2))
    with pytest.raises(TypeError, match="params must be a dict"):
        to_dot(x, params=[x])
    with pytest.raises(TypeError, match=r"params\['w'\] is a ndarray"):
        to_dot(x, params={"w": np.ones(2)})


def test_render_refuses_an_unknown_format(tmp_path):
    x = Tensor(np.ones(2), requires_grad=True, dtype=np.float64)
    with pytest.raises(ValueError, match="use .svg, .png or .pdf"):
        render(x.sum(), tmp_path / "graph.txt")


def test_render_without_dot_names_the_missing_program(monkeypatch, tmp_path):
    monkeypatch.setattr(autograd.viz.shutil, "which", lambda name: None)
    x = Tensor(np.ones(2), requires_grad=True, dtype=np.float64)
    with pytest.raises(RuntimeError, match="Graphviz program 'dot' was not found"):
        render(x.sum(), tmp_path / "graph.svg")


@pytest.mark.skipif(
    not HAS_DOT, reason="Graphviz 'dot' is not installed (apt-get install graphviz)"
)
@pytest.mark.parametrize("suffix, magic", [("svg", b"<svg"), ("png", b"\x89PNG")])
def test_render_writes_the_picture(tmp_path, suffix, magic):
    model = we.WorkedExample()
    path = render(model.forward().L, tmp_path / f"graph.{suffix}", params=model)
    content = path.read_bytes()
    assert magic in content[:400]
    if suffix == "svg":
        assert b"Softmax" in content and b"W_Q" in content
