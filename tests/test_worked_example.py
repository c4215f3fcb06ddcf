"""Every number the notes print in ch. 11 (11.2-11.7), recomputed by models.worked_example.

The notes print 6 decimals of unrounded values, so each check is |ours - printed| <= 5e-7.
"""

import math

import numpy as np
import pytest

import autograd.functional as F
from autograd import Tensor
from models import worked_example as we

HALF_ULP_6 = 5e-7  # half a unit in the 6th decimal

# --- the notes' printed values ----------------------------------------------------------------
A_ = 0.731059  # a = e / (e + 1)
C_ = 0.268941  # c = 1 / (e + 1)
NOTES_11_2 = {
    "X": [[1, 0], [0, 1]],
    "Q": [[0], [1]],
    "K": [[1], [0]],
    "V": [[1, 0], [0, 1]],
    "S0": [[0, 0], [1, 0]],
    "A": [[1, 0], [A_, C_]],
    "Z": [[1, 0], [A_, C_]],
}
NOTES_H = [0.731059, 1.268941]
NOTES_LOGITS = [A_, 1 + C_, -A_]
NOTES_P = [0.339660, 0.581626, 0.078714]
NOTES_L = 2.541928
NOTES_DLOGITS = [0.339660, 0.581626, -0.921286]
NOTES_DH = [1.260945, 0.581626]
NOTES_DS = [[0, 0], [0.133562, -0.133562]]
NOTES_GRADS = {
    "W_Q": [[0], [0.133562]],
    "W_K": [[0.133562], [-0.133562]],
    "W_V": [[0.921825, 0.425203], [0.339120, 0.156423]],
    "W_O": [[0.921825, 0.425203], [0.339120, 0.156423]],
    "U": [[0.248311, 0.425203, -0.673514], [0.431008, 0.738049, -1.169057]],
    "E": [[1.055387, 0.425203], [1.466503, 0.871611], [0, 0]],
}
NOTES_W_Q_2_NEW = 0.986644
NOTES_U_2C_NEW = 0.116906
NOTES_AFTER = {"a21": 0.713748, "p_A": 0.271374, "p_B": 0.556819, "p_C": 0.171807, "L": 1.761382}


def assert_printed(ours, printed, what):
    ours = np.asarray(ours, dtype=np.float64)
    printed = np.asarray(printed, dtype=np.float64)
    assert ours.shape == printed.shape, f"{what}: shape {ours.shape}, notes {printed.shape}"
    worst = np.max(np.abs(ours - printed))
    assert worst <= HALF_ULP_6, f"{what}: ours {ours}, notes print {printed} (off by {worst:.2e})"


@pytest.fixture(scope="module")
def results():
    _, r = we.run()
    return r


def test_parameters_are_the_24_elements_of_11_1():
    model = we.WorkedExample()
    assert [name for name, _ in model.named_parameters()] == list(we.PARAMETER_NAMES)
    assert sum(p.size for _, p in model.named_parameters()) == 24
    assert all(p.dtype == np.float64 for _, p in model.named_parameters())


def test_a_and_c_are_the_closed_forms_of_11_2(results):
    a, c = results.before.A.data[1]
    assert a == pytest.approx(math.e / (math.e + 1), abs=1e-15)
    assert c == pytest.approx(1 / (math.e + 1), abs=1e-15)
    assert_printed([a, c], [A_, C_], "a, c")


@pytest.mark.parametrize("name", list(NOTES_11_2))
def test_forward_values_of_11_2(results, name):
    assert_printed(getattr(results.before, name).data, NOTES_11_2[name], name)


def test_mask_of_11_2(results):
    S = results.before.S.data
    assert S[0, 1] == -np.inf
    assert_printed(np.where(np.isinf(S), 0.0, S), [[0, 0], [1, 0]], "S (finite part)")


def test_residual_scores_and_loss_of_11_3(results):
    assert_printed(results.before.h.data[0], NOTES_H, "h")
    assert_printed(results.before.logits.data[0], NOTES_LOGITS, "logits")
    assert_printed(results.p_before, NOTES_P, "p")
    assert_printed(results.before.L.item(), NOTES_L, "L")
    assert results.before.L.item() == pytest.approx(-math.log(results.p_before[2]), abs=1e-14)


def test_backward_to_the_scores_of_11_4(results):
    assert_printed(results.dlogits, NOTES_DLOGITS, "dL/dlogits")
    assert_printed(results.dh, NOTES_DH, "dL/dh")
    # W_O = I and V = I: Z-bar equals R-bar (first row zero, second row h-bar) and so does A-bar.
    expected_dz = np.array([[0, 0], NOTES_DH])
    assert_printed(results.dZ, expected_dz, "dL/dZ")
    assert_printed(results.dA, expected_dz, "dL/dA")
    assert_printed(results.dS, NOTES_DS, "dL/dS")


def test_s21_bar_formula_of_11_4(results):
    a, c = results.before.A.data[1]
    gh1, gh2 = results.dh
    assert results.dS[1, 0] == pytest.approx(a * (gh1 - a * gh1 - c * gh2), abs=1e-15)


@pytest.mark.parametrize("name", list(NOTES_GRADS))
def test_parameter_gradients_of_11_5(results, name):
    assert_printed(results.grads[name], NOTES_GRADS[name], f"dL/d{name}")


def test_input_row_of_c_gets_no_gradient_but_its_output_column_does(results):
    # 11.5 and exercise 4 (14.3): C is never looked up, but it is scored.
    assert np.all(results.grads["E"][2] == 0)
    assert np.all(results.grads["U"][:, 2] != 0)


def test_update_of_11_6(results):
    assert_printed(results.updated["W_Q"][1, 0], NOTES_W_Q_2_NEW, "W_Q[2] after the update")
    assert_printed(results.updated["U"][1, 2], NOTES_U_2C_NEW, "U[2, C] after the update")
    for name, grad in results.grads.items():
        expected = we.initial_parameters()[name] - 0.1 * grad
        np.testing.assert_allclose(results.updated[name], expected, rtol=0, atol=1e-15)


def test_after_update_table_of_11_6(results):
    after = results.after
    ours = {"a21": after.A.data[1, 0], "L": after.L.item()}
    ours.update({f"p_{v}": results.p_after[i] for i, v in enumerate(we.VOCAB)})
    for key, printed in NOTES_AFTER.items():
        assert_printed(ours[key], printed, f"{key} after the update")
    # The notes' reading of the table: the target got likelier but is still not the top token,
    # and attention to the first position went down.
    assert results.p_after[2] > results.p_before[2]
    assert np.argmax(results.p_after) != 2
    assert after.A.data[1, 0] < results.before.A.data[1, 0]


def test_central_differences_over_24_elements_of_11_7(results):
    assert results.max_abs_diff < 3e-11, results.worst_element


def test_central_difference_check_catches_a_wrong_gradient():
    model = we.WorkedExample()
    model.forward().L.backward()
    model.params["U"].grad[0, 0] += 1e-6
    diff, where = we.central_difference_check(model)
    assert diff == pytest.approx(1e-6, rel=1e-3) and where == "U[0, 0]"


def test_step_without_gradients_is_refused():
    model = we.WorkedExample()
    model.params["E"].grad = np.zeros((3, 2))
    with pytest.raises(RuntimeError, match="W_Q has no gradient"):
        model.step()


def test_missing_parameter_is_named():
    values = we.initial_parameters()
    del values["U"]
    with pytest.raises(KeyError, match="U"):
        we.WorkedExample(values)


def test_default_output_prints_the_notes_tables(capsys):
    we.main([])
    out = capsys.readouterr().out
    printed = [A_, C_, *NOTES_P, NOTES_L, *NOTES_DH, 0.133562, -0.133562, NOTES_W_Q_2_NEW]
    printed += [NOTES_U_2C_NEW, *NOTES_AFTER.values(), 1.055387, 1.466503, 0.871611, -1.169057]
    for value in printed:
        assert f"{value:.6f}" in out, f"{value:.6f} missing from the printed tables"
    for section in ("11.2", "11.3", "11.4", "11.5", "11.6", "11.7"):
        assert section in out


def test_explain_prints_graph_trace_and_tables(capsys):
    we.main(["--explain"])
    out = capsys.readouterr().out
    assert "digraph autograd {" in out
    assert '[label="Softmax\\nA\\n(2, 2) float64"' in out
    steps = [line for line in out.splitlines() if line.startswith("[")]
    assert steps and "CrossEntropy -> L" in steps[0]
    assert "(sum of 4 contributions)" in out  # X feeds the residual, Q, K and V
    assert f"{NOTES_AFTER['L']:.6f}" in out


def test_explicit_attention_ops_agree_with_the_fused_attention():
    # The example spells attention out (S, mask, softmax, A V) to show each step; the engine's
    # fused op must give the same Z and the same gradients. The fused op wants one width D for
    # q, k and v, while here d_k = 1 and d_v = 2: pad q and k with a zero column and scale q by
    # sqrt(2), so that q' k'^T / sqrt(2) = q k^T / sqrt(1) stays the notes' S0.
    model = we.WorkedExample()
    f = model.forward()
    for t in (f.Q, f.K, f.V, f.Z):
        t.retain_grad()
    f.L.backward()
    pad = np.zeros((2, 1))
    q = Tensor(np.hstack([f.Q.data * np.sqrt(2), pad])[None, None], dtype=np.float64)
    k = Tensor(np.hstack([f.K.data, pad])[None, None], requires_grad=True, dtype=np.float64)
    v = Tensor(f.V.data[None, None], requires_grad=True, dtype=np.float64)
    q.requires_grad = True
    Z = F.scaled_dot_product_attention(q, k, v, causal=True)
    np.testing.assert_allclose(Z.data[0, 0], f.Z.data, atol=1e-15)
    Z.backward(f.Z.grad[None, None])
    np.testing.assert_allclose(q.grad[0, 0, :, :1] * np.sqrt(2), f.Q.grad, atol=1e-12)
    np.testing.assert_allclose(k.grad[0, 0, :, :1], f.K.grad, atol=1e-12)
    np.testing.assert_allclose(v.grad[0, 0], f.V.grad, atol=1e-12)
