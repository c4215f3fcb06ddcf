"""The HTML lesson (autograd.viz.to_html, models.worked_example --html): what the page says.

tests/test_lesson_browser.py drives the same page in headless Chromium.
"""

import html
import re
from pathlib import Path

import numpy as np
import pytest

import autograd
from autograd import Function, Tensor, ops
from autograd.viz import to_html
from autograd.viz.lesson import _layout, _op_doc, build_lesson, latex
from models import worked_example as we

LESSON = Path(__file__).resolve().parent.parent / "docs" / "lesson.html"
REGENERATE = "python -m models.worked_example --html docs/lesson.html"
# The notes' ch. 11 numbers a learner must find on the page (11.2-11.6).
NOTES_NUMBERS = {
    "L": "2.541928",
    "p_C": "0.078714",
    "a21": "0.731059",
    "dL/dS": "0.133562",
    "dL/dh": "[[1.260945, 0.581626]]",
    "L after the update": "1.761382",
}
OPS_IN_CH11 = 15


def sections(page):
    """step index -> the text of its <section> (tags removed, entities decoded)."""
    found = re.findall(r'<section class="step[^"]*" id="step-(\d+)".*?</section>', page, re.S)
    bodies = re.findall(r'<section class="step.*?</section>', page, re.S)
    assert [int(i) for i in found] == list(range(len(bodies)))
    return [html.unescape(re.sub(r"<[^>]+>", " ", body)) for body in bodies]


def step_titled(texts, *words):
    """The one step whose heading (its first line) contains all of `words`."""
    hits = [t for t in texts if all(w in t.strip().split("\n")[0] for w in words)]
    assert len(hits) == 1, f"{words}: {len(hits)} steps"
    return hits[0]


@pytest.fixture(scope="module")
def page():
    return LESSON.read_text(encoding="utf-8")


# --- the generated file -----------------------------------------------------------------------


def test_committed_lesson_is_what_the_generator_writes_now(tmp_path):
    fresh = we.write_lesson_page(tmp_path / "lesson.html").read_bytes()
    assert fresh == LESSON.read_bytes(), f"docs/lesson.html is out of date: run `{REGENERATE}`"


def test_the_page_is_one_self_contained_file(page):
    assert len(page.encode()) < 3_000_000
    assert "://" not in page  # no URL of any kind: no CDN, no font, no xmlns
    assert not re.search(r"<(link|img|iframe|object|embed)\b|\bsrc=|@import|@font-face", page)
    assert re.findall(r"url\(([^)]*)\)", page) == ["#arrow", "#arrow-forward", "#arrow-backward"]


def test_one_graph_node_per_op_and_per_leaf(page):
    kinds = re.findall(r'<g class="node (\w+)', page)
    assert kinds.count("op") == OPS_IN_CH11
    assert kinds.count("param") == 6 and kinds.count("const") == 2  # E..U; sqrt(d_k), -inf
    texts = sections(page)
    forward = [t for t in texts if "Forward " in t.split("\n", 3)[1]]
    backward = [t for t in texts if "Backward " in t.split("\n", 3)[1]]
    assert len(forward) == len(backward) == OPS_IN_CH11
    assert len(texts) == 1 + 2 * OPS_IN_CH11 + 2  # start, ops both ways, leaves' grads, update


def test_the_notes_numbers_are_in_their_steps(page):
    texts = sections(page)
    loss = step_titled(texts, "Forward 15 of 15: CrossEntropy \u2192 L")
    assert NOTES_NUMBERS["L"] in loss and NOTES_NUMBERS["p_C"] in loss
    assert (
        NOTES_NUMBERS["a21"]
        in step_titled(texts, "Forward 8 of", "Softmax \u2192 A").split("Output")[1]
    )
    softmax_back = step_titled(texts, "Backward 8 of 15: Softmax \u2192 A")
    assert re.search(r"dL/dS \(2, 2\)\s+\[\[ 0.000000,  0.000000\],\s+\[ 0.133562, -0.133562\]\]",
                     softmax_back)  # fmt: skip
    head = step_titled(texts, "Backward 2 of 15: MatMul \u2192 logits")
    assert re.search(r"dL/dh \(1, 2\)\s+\[\[1.260945, 0.581626\]\]", head)
    update = texts[-1]
    assert re.search(r"L\s+2.541928\s+1.761382", update)
    assert "W_Q[2]  1 \u2192 0.986644" in update


def test_formulas_come_from_the_ops_comments_with_their_sections(page):
    texts = sections(page)
    head = step_titled(texts, "Forward 14 of 15: MatMul \u2192 logits")
    assert "out = a @ b (np.matmul rules)" in head and "da = g @ b^T, db = a^T @ g" in head
    assert "notes 10.4" in head and "Here a = h, b = U." in head
    assert 'data-latex="\\mathrm{out} = a\\, b"' in page


def test_a_tensor_used_four_times_shows_each_term_and_the_sum(page):
    x = step_titled(sections(page), "Backward 15 of 15: Embedding \u2192 X")
    assert re.search(r"g = g1 \+ g2 \+ g3 \+ g4\s+\[\[1.055387, 0.425203\],", x)
    for source in ("Add \u2192 R", "MatMul \u2192 V", "MatMul \u2192 K", "MatMul \u2192 Q"):
        assert f"from {source}" in x
    assert 'data-latex="g = g_{1} + g_{2} + g_{3} + g_{4}"' in page


def test_the_cli_writes_the_page(tmp_path, capsys):
    we.main(["--html", str(tmp_path / "l.html")])
    assert capsys.readouterr().out == f"lesson written to {tmp_path / 'l.html'}\n"
    assert (tmp_path / "l.html").read_bytes() == LESSON.read_bytes()


# --- to_html on any graph ---------------------------------------------------------------------


def small_graph():
    """x used twice by one op, h used by two ops, a constant; every value exact in float64."""
    x = Tensor([1.0, 2.0], requires_grad=True, dtype=np.float64, name="x")
    w = Tensor([3.0, -1.0], requires_grad=True, dtype=np.float64, name="w")
    h = x * x
    h.name = "h"
    h.retain_grad()
    return x, w, h, (h * w + h * 2.0).sum()


def test_to_html_leaves_grad_as_a_plain_backward_and_keeps_the_graph(tmp_path):
    x, w, h, y = small_graph()
    w.grad = np.array([10.0, 10.0])  # to_html accumulates onto it, like backward
    to_html(y, tmp_path / "p.html")
    rx, rw, rh, ry = small_graph()
    ry.backward()
    np.testing.assert_array_equal(x.grad, rx.grad)
    np.testing.assert_array_equal(h.grad, rh.grad)  # retain_grad is honoured
    np.testing.assert_array_equal(w.grad, rw.grad + 10.0)
    y.backward()  # the graph was retained: a second backward adds the same again
    np.testing.assert_array_equal(x.grad, 2 * rx.grad)


def test_to_html_on_a_small_graph_shows_both_terms_of_a_sum(tmp_path):
    x, w, h, y = small_graph()
    page = to_html(y, tmp_path / "p.html", title="x & w").read_text(encoding="utf-8")
    assert "<title>x &amp; w</title>" in page
    texts = sections(page)
    assert len(re.findall(r'<g class="node op', page)) == 5  # Mul Mul Mul Add Sum
    square = step_titled(texts, "Backward", "Mul \u2192 h")
    assert re.search(r"g\d\s+\[ 3.000000, -1.000000\]\s+from Mul", square)  # via h * w
    assert re.search(r"g\d\s+\[2.000000, 2.000000\]\s+from Mul", square)  # via h * 2
    assert re.search(r"g = g1 \+ g2\s+\[5.000000, 1.000000\]", square)
    # x * x: one op sends x two contributions, both listed on the leaves' step
    assert re.search(r"g2\s+\[5.000000, 2.000000\]\s+from Mul \u2192 h", texts[-1])
    assert re.search(r"x.grad \(2,\) = g1 \+ g2\s+\[10.000000,  4.000000\]", texts[-1])
    assert "constant: receives no gradient" in texts[0]


def test_params_name_the_leaves(tmp_path):
    model = we.WorkedExample()
    for p in model.params.values():
        p.name = None
    page = to_html(model.forward().L, tmp_path / "p.html", params=model).read_text("utf-8")
    assert "W_Q.grad (2, 1)" in page
    with pytest.raises(TypeError, match="to_html: params must be a dict"):
        to_html(model.forward().L, tmp_path / "q.html", params=[1])


def test_the_output_is_deterministic(tmp_path):
    first = to_html(small_graph()[-1], tmp_path / "a.html").read_bytes()
    assert to_html(small_graph()[-1], tmp_path / "b.html").read_bytes() == first


def test_bad_inputs_name_the_function_and_the_shape(tmp_path):
    x = Tensor(np.ones((2, 3)), requires_grad=True, dtype=np.float64)
    with pytest.raises(ValueError, match=r"to_html: .*scalar.*shape \(2, 3\)"):
        to_html(x * 2, tmp_path / "p.html")
    with pytest.raises(ValueError, match=r"to_html: the output \(shape \(\)\) has no graph"):
        to_html(Tensor(1.0, requires_grad=True), tmp_path / "p.html")
    with autograd.no_grad():
        y = (x * 2).sum()
    with pytest.raises(ValueError, match=r"to_html: the output \(shape \(\)\) has no graph"):
        to_html(y, tmp_path / "p.html")
    y = (x * 2).sum()
    y.backward()
    with pytest.raises(RuntimeError, match=r"to_html: the graph through Sum \(output shape \(\)\)"):
        to_html(y, tmp_path / "p.html")
    with pytest.raises(TypeError, match="to_html: expected a Tensor, got ndarray"):
        to_html(np.ones(()), tmp_path / "p.html")
    assert not (tmp_path / "p.html").exists()


def test_an_op_without_a_formula_comment_still_gets_its_steps(tmp_path):
    class Twice(Function):
        def forward(self, a):
            return 2 * a

        def backward(self, g):
            return (2 * g,)

    x = Tensor([1.0], requires_grad=True, dtype=np.float64)
    page = to_html(Twice.apply(x).sum(), tmp_path / "p.html").read_text("utf-8")
    assert "Twice has no formula comment in its code." in page
    np.testing.assert_array_equal(x.grad, [2.0])


def test_comment_parsing_and_latex():
    doc = _op_doc(ops.MatMul)
    assert doc.forward == "out = a @ b (np.matmul rules)"
    assert doc.vjp == "da = g @ b^T, db = a^T @ g  (notes 10.4), batch dims summed"
    assert doc.sections == ["10.4"]
    assert _op_doc(ops.Relu).sections == ["8.2"]
    assert latex("out = a * b;  da = g * b, db = g * a") == (
        r"\mathrm{out} = a \odot b,\quad \mathrm{da} = g \odot b,\quad \mathrm{db} = g \odot a"
    )
    assert latex("out = sqrt(a);  da = g / (2 out)") == (
        r"\mathrm{out} = \sqrt{a},\quad \mathrm{da} = g / (2 \mathrm{out})"
    )
    assert latex("da = g @ b^T, db = a^T @ g  (notes 10.4), batch dims summed") == (
        r"\mathrm{da} = g\, b^{\top},\quad \mathrm{db} = a^{\top}\, g"
    )


def test_layout_keeps_boxes_of_a_layer_apart():
    x, w, h, y = small_graph()
    lesson = build_lesson(y)
    _layout(lesson.nodes, lesson.edges)
    for a in lesson.nodes:
        for b in lesson.nodes:
            if a is not b and a.layer == b.layer:
                assert abs(a.x - b.x) >= (a.width + b.width) / 2 + 1, (a.title, b.title)
    for src, dst, _ in lesson.edges:
        assert lesson.nodes[src].layer < lesson.nodes[dst].layer


def test_every_sentence_is_written_in_both_languages_and_the_notes_are_quoted(page):
    assert page.count('data-lang="en"') == page.count('data-lang="zh"') > 200
    texts = sections(page)
    start = texts[0]
    assert "The notes, 11.1" in start and "笔记原文，11.1" in start
    assert "玩具词表只有 A、B、C" in start  # the notes' own words, 11.1
    softmax_back = step_titled(texts, "Backward 8 of 15: Softmax \u2192 A")
    assert "反向 8/15：Softmax \u2192 A" in softmax_back
    assert "第一行只有一个允许位置，其 Softmax 恒为 1" in softmax_back  # 11.4
    assert "例如 W_Q 第二元素从 1 变成约" in texts[-1]  # 11.6
