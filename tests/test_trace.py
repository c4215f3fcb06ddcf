"""backward(trace=True): the steps, shapes, norms and accumulation it prints."""

import contextlib
import io
import re

import numpy as np
import pytest

from autograd import Tensor
from models import worked_example as we


def traced(loss):
    """Run backward with the trace on and return the printed lines."""
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        loss.backward(trace=True)
    return buffer.getvalue().splitlines()


def headers(lines):
    return [line for line in lines if line.startswith("[")]


def step_output(header):
    """'[  3] MatMul -> Z W_O (2, 2) float64  from ...' -> ('MatMul', 'Z W_O')."""
    match = re.match(r"\[\s*\d+\] (\w+) -> (.+?) \(", header)
    assert match, header
    return match.group(1), match.group(2)


def numbers(line):
    return [float(x) for x in re.findall(r"-?\d+\.\d{6}", line)]


@pytest.fixture(scope="module")
def ch11_trace():
    return traced(we.WorkedExample().forward().L)


def test_ch11_trace_follows_the_chain_of_11_4(ch11_trace):
    order = [step_output(h)[1] for h in headers(ch11_trace)]
    # 11.4: the error reaches the logits, then h, then the mixing Z, the weights A, the scores S,
    # then Q/K/V and finally the input rows X = E[A, B].
    chain = ["L", "logits", "h", "R", "Z", "A", "S", "S0", "Q K^T", "Q", "K", "V", "X"]
    positions = [order.index(name) for name in chain]
    assert positions == sorted(positions), order
    ops = dict(step_output(h)[::-1] for h in headers(ch11_trace))
    assert ops["L"] == "CrossEntropy" and ops["A"] == "Softmax" and ops["X"] == "Embedding"


def gradient_line(lines, after_step, target):
    """The '-> target' line printed inside the step whose output is `after_step`."""
    start = next(i for i, h in enumerate(lines) if h.startswith("[") and f"-> {after_step} (" in h)
    for line in lines[start + 1 :]:
        if line.startswith("["):
            break
        if line.strip().startswith(f"-> {target} "):
            return line
    raise AssertionError(f"no gradient for {target} in the step of {after_step}")


def test_ch11_trace_shows_the_notes_numbers(ch11_trace):
    lines = ch11_trace
    assert numbers(gradient_line(lines, "L", "logits"))[1:] == [0.339660, 0.581626, -0.921286]
    assert numbers(gradient_line(lines, "logits", "h"))[1:] == [1.260945, 0.581626]
    assert numbers(gradient_line(lines, "A", "S"))[1:] == [0, 0, 0.133562, -0.133562]
    assert numbers(gradient_line(lines, "Q", "W_Q"))[1:] == [0, 0.133562]
    assert numbers(gradient_line(lines, "K", "W_K"))[1:] == [0.133562, -0.133562]
    u = [0.248311, 0.425203, -0.673514, 0.431008, 0.738049, -1.169057]
    assert numbers(gradient_line(lines, "logits", "U"))[1:] == u
    e = [1.055387, 0.425203, 1.466503, 0.871611, 0, 0]
    assert numbers(gradient_line(lines, "X", "E"))[1:] == e


def test_ch11_trace_norms_are_the_gradient_norms(ch11_trace):
    line = gradient_line(ch11_trace, "logits", "h")
    assert numbers(line)[0] == pytest.approx(np.hypot(1.260945, 0.581626), abs=1e-6)
    header = next(h for h in headers(ch11_trace) if "-> h (" in h)
    assert "from R (2, 2)" in header and "(1, 2) float64" in header


def test_ch11_trace_shows_x_accumulating_four_contributions(ch11_trace):
    notes = [line for line in ch11_trace if "earlier: used more than once" in line]
    assert len(notes) == 3 and all(line.strip().startswith("-> X ") for line in notes)
    summed = next(line for line in ch11_trace if "grad of X" in line)
    assert "(sum of 4 contributions)" in summed
    assert numbers(summed)[1:] == [1.055387, 0.425203, 1.466503, 0.871611]


def test_every_parameter_leaf_is_reported(ch11_trace):
    leaves = {line.split()[1] for line in ch11_trace if line.strip().startswith("leaf ")}
    assert leaves == set(we.PARAMETER_NAMES)


def test_one_step_per_op_and_tensor_used_twice_in_one_op():
    x = Tensor([1.0, 2.0], requires_grad=True, dtype=np.float64, name="x")
    lines = traced((x * x).sum())
    assert [step_output(h)[0] for h in headers(lines)] == ["Sum", "Mul"]
    # x * x: both inputs are x, so the second contribution adds to the first.
    to_x = [line for line in lines if line.strip().startswith("-> x ")]
    assert len(to_x) == 2 and "adds to 1 earlier" in to_x[1] and "earlier" not in to_x[0]
    leaf = next(line for line in lines if line.strip().startswith("leaf x"))
    assert "(sum of 2 contributions)" in leaf and numbers(leaf)[1:] == [2.0, 4.0]


def test_unnamed_tensors_are_labelled_by_their_op():
    x = Tensor(np.ones(3), requires_grad=True, dtype=np.float64)
    out = "\n".join(traced((x.exp() * 2).sum()))
    assert "<Mul output>" in out and "<Exp output>" in out and "leaf <leaf> (3,)" in out
    assert "<constant>" in out  # the 2 of x.exp() * 2 is a constant input


def test_large_gradients_print_only_their_norm():
    x = Tensor(np.ones((4, 5)), requires_grad=True, dtype=np.float64, name="big")
    line = next(line for line in traced((x * 3).sum()) if "-> big" in line)
    assert "[" not in line and numbers(line) == [pytest.approx(np.sqrt(20) * 3, abs=1e-6)]
