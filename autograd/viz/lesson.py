"""The lesson behind `autograd.viz.to_html`: a graph's forward and backward pass, step by step.

`build_lesson(output)` walks the graph of a scalar output, lays it out in layers (inputs at the
top, the output at the bottom), and records one step per op of the forward pass, then one per op
of the backward pass: the op's formula and VJP (from the comment above the op's code, notes'
section included), its inputs and output, the gradient arriving and the gradients leaving, and the
sum `g = g1 + g2` where a tensor is used twice (notes 10.2). `write_lesson(lesson, path)` makes of
it one self-contained HTML file: inline SVG, CSS and JS (`lesson_page/` beside this file), no URL.

The page speaks English and Chinese: every sentence the lesson writes is a `Text` (en, zh) and
a switch in the page shows one language (`#lang=zh` in the address opens it in Chinese; the
default follows the browser's language); numbers, labels and formulas are shared. A caller may add
steps, rows and quotes of the notes before writing; `models.worked_example --html` adds the
notes' own ch. 11 wording to each step and the update (11.6). The output is deterministic (same
graph, same bytes), so a generated page can be committed and checked against the generator.
"""

from __future__ import annotations

import html
import inspect
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from string import Template
from typing import Any

import numpy as np

from autograd.tensor import Function, Tensor

PAGE_DIR = Path(__file__).resolve().parent / "lesson_page"
MAX_VALUES = 60  # arrays with more elements are summarised by numpy's `...`

# Geometry of the graph drawing, in SVG pixels. Labels are monospace, so a label's width is
# known here from its length and no two boxes can overlap.
CHAR_W = 6.6  # width of one character of the 11px monospace label font
NODE_H = 32
LAYER_H = 46  # one layer of boxes plus the room for edges below it
GAP = 16  # horizontal gap between two boxes of one layer
MARGIN = 12


# --- what a step shows ------------------------------------------------------------------------


@dataclass(frozen=True)
class Text:
    """A sentence in English and in Chinese; the page's language switch shows one of them."""

    en: str
    zh: str


Words = str | Text  # a plain str is shown in both languages (numbers, names, code)


@dataclass
class Row:
    """One line of the side panel: a label, a value (numbers, kept as printed) and a note."""

    label: str
    value: str = ""
    note: Words = ""


@dataclass
class Formula:
    """A formula as the code's comment writes it, and its LaTeX (what a click copies)."""

    kind: Words  # "forward", "VJP", "sum", ...
    text: str
    latex: str


@dataclass
class Step:
    phase: str  # "start", "forward", "backward", "grads", or a caller's own (e.g. "update")
    title: Words
    badge: Words = ""  # e.g. the notes' sections of the op's formula
    node: str | None = None  # the graph node to highlight (its id), if any
    edges: list[int] = field(default_factory=list)  # indices of the edges to highlight
    marked: list[str] = field(default_factory=list)  # nodes to outline, e.g. leaves given a grad
    formulas: list[Formula] = field(default_factory=list)
    text: list[Words] = field(default_factory=list)  # short paragraphs
    blocks: list[tuple[Words, list[Row]]] = field(default_factory=list)  # (heading, rows)
    quotes: list[tuple[str, Text]] = field(default_factory=list)  # (section, the notes' words)


@dataclass
class Node:
    id: str
    kind: str  # "op", "param" (a leaf that requires grad) or "const"
    title: str  # the op's name, or the leaf's name
    subtitle: str  # the tensor's name (ops) and shape
    layer: int = 0
    x: float = 0.0  # centre
    width: float = 0.0


@dataclass
class Lesson:
    title: Words
    nodes: list[Node]
    edges: list[tuple[int, int, int]]  # (source node, target node, input slot)
    steps: list[Step]
    _index: dict[int, int]  # id(tensor) -> node index

    def node_of(self, tensor: Tensor) -> str:
        """The graph node id of a tensor of the lesson's graph."""
        return self.nodes[self._index[id(tensor)]].id

    def step_of(self, tensor: Tensor, phase: str) -> Step:
        """The forward or backward step of the op that produced `tensor`."""
        node = self.node_of(tensor)
        return next(s for s in self.steps if s.phase == phase and s.node == node)


# --- numbers and labels -----------------------------------------------------------------------


def fmt(values: Any) -> str:
    """Numbers with 6 fixed decimals, like the notes' tables (the same on every machine)."""
    return np.array2string(
        np.asarray(values),
        precision=6,
        floatmode="fixed",
        separator=", ",
        suppress_small=True,
        threshold=MAX_VALUES,
        edgeitems=3,
        max_line_width=60,
    )


def _label(t: Tensor, names: dict[int, str]) -> str:
    name = names.get(id(t)) or t.name
    if name:
        return name
    if t.op is not None:
        return f"<{t.op.name} output>"
    return "input" if t.requires_grad else "constant"


def _shape(t: Tensor) -> str:
    return str(tuple(t.shape))


def _d(label: str) -> str:
    """dL/dX, with parentheses where the name has a space (dL/d(Z W_O))."""
    return f"dL/d({label})" if " " in label else f"dL/d{label}"


# --- an op's formula, read from the comment above its code ------------------------------------

_SECTION = re.compile(r"\d+\.\d+")
_PAREN = re.compile(r"\(([^()]*)\)")
_FUNCTIONS = {"ln", "log", "exp", "max", "min", "tanh", "sqrt", "sum"}
_GREEK = {"eps": r"\varepsilon", "pi": r"\pi", "phi": r"\phi", "Phi": r"\Phi", "inf": r"\infty"}


def _comment(cls: type) -> list[str]:
    """The `#` lines at the top of an op's class body (empty when it has none or no source)."""
    try:
        source, _ = inspect.getsourcelines(cls)
    except (OSError, TypeError):
        return []
    lines = []
    for line in source[1:]:
        stripped = line.strip()
        if not stripped.startswith("#"):
            break
        lines.append(stripped.lstrip("#").strip())
    return lines


def _sections(comment: str) -> list[str]:
    """The notes' sections a comment cites: `(notes 10.4)`, `(10.3)`, `(..., notes 8.2)`."""
    found = []
    for inside in _PAREN.findall(comment):
        if "notes" in inside or re.fullmatch(r"[\d., ]+", inside):
            found += [s for s in _SECTION.findall(inside) if s not in found]
    return found


def latex(text: str) -> str:
    """The code comments' ASCII maths as LaTeX: `da = g @ b^T` -> `\\mathrm{da} = g\\, b^{\\top}`.

    Prose in parentheses and clauses without `=` are left out: only the equations are copied.
    """
    text = re.sub(r"\([^()]*(?:notes|[A-Za-z]{2,} [A-Za-z]{2,})[^()]*\)", "", text)
    clauses = [c.strip() for c in re.split(r";|,(?![^()]*\))", text) if "=" in c]
    out = []
    for clause in clauses:
        s = re.sub(r"\s+", " ", clause)
        s = re.sub(r"sqrt\(([^()]*)\)", r"\\sqrt{\1}", s)
        s = re.sub(r"\^\(([^()]*)\)", r"^{\1}", s)
        s = re.sub(r"\^T\b", r"^{\\top}", s)
        s = re.sub(r"\^(-?\w+)", r"^{\1}", s)
        s = re.sub(r"\bsum_(\w+)", r"\\sum_{\\mathrm{\1}}", s)
        s = s.replace("<=", r"\le").replace(">=", r"\ge").replace("==", "=")
        s = s.replace(" @ ", r"\, ").replace(" * ", r" \odot ").replace("%", r"\%")

        def word(m: re.Match) -> str:
            w = m.group(0)
            if w in _GREEK:
                return _GREEK[w]
            return f"\\{w}" if w in _FUNCTIONS else f"\\mathrm{{{w}}}"

        s = re.sub(r"(?<![\\\w{])[A-Za-z]{2,}(?![\w}])", word, s)
        out.append(s.strip())
    return r",\quad ".join(out)


@dataclass
class _OpDoc:
    forward: str
    vjp: str
    notes: list[str]
    sections: list[str]


def _op_doc(cls: type) -> _OpDoc | None:
    """Forward formula, VJP, remarks and notes' sections from an op's comment.

    The ops write `# out = a * b;  da = g * b, db = g * a` (forward, then VJP after the first
    `;`); a longer comment continues the VJP on lines with an `=`, remarks on lines without.
    """
    lines = _comment(cls)
    if not lines:
        return None
    first, _, rest = lines[0].partition(";")
    vjp = [rest.strip()] if rest.strip() else []
    vjp += [line for line in lines[1:] if "=" in line]
    notes = [line for line in lines[1:] if "=" not in line]
    return _OpDoc(first.strip(), ";  ".join(vjp), notes, _sections(" ".join(lines)))


def _argument_names(fn: Function, count: int) -> list[str]:
    """What the op's formula calls its inputs: the parameter names of its forward()."""
    names: list[str] = []
    for p in list(inspect.signature(fn.forward).parameters.values()):
        if p.kind is p.VAR_POSITIONAL:
            return names + [f"{p.name}[{i}]" for i in range(count - len(names))]
        if p.kind is p.POSITIONAL_OR_KEYWORD and len(names) < count:
            names.append(p.name)
    return names + [f"input {i}" for i in range(len(names), count)]


# --- the graph: nodes in forward order, then a layered layout ---------------------------------


def _walk(output: Tensor) -> list[Tensor]:
    """Every tensor of output's graph, each after its inputs (forward order), inputs in order."""
    order: list[Tensor] = []
    seen: set[int] = set()
    stack: list[tuple[Tensor, bool]] = [(output, False)]  # explicit: long chains are fine
    while stack:
        t, inputs_done = stack.pop()
        if inputs_done:
            order.append(t)
            continue
        if id(t) in seen:
            continue
        seen.add(id(t))
        stack.append((t, True))
        fn = t.op
        if fn is None:
            continue
        if getattr(fn, "inputs", None) is None:
            raise RuntimeError(
                f"to_html: the graph through {fn.name} (output shape {t.shape}) was released by "
                "backward(); build the page before backward() or pass retain_graph=True"
            )
        stack.extend((p, False) for p in reversed(fn.inputs) if id(p) not in seen)
    return order


def _layout(nodes: list[Node], edges: list[tuple[int, int, int]]) -> list[list[float]]:
    """Sets each node's layer and x; returns, per edge, the x where it crosses each layer between.

    A small Sugiyama layout: layers by longest path (a leaf sits just above its first user), a
    dummy point per layer an edge skips, barycentre sweeps to order each layer, then each box
    pulled towards the mean of its neighbours without overlapping the next one.
    """
    n = len(nodes)
    preds: list[list[int]] = [[] for _ in range(n)]
    succs: list[list[int]] = [[] for _ in range(n)]
    for src, dst, _ in edges:
        preds[dst].append(src)
        succs[src].append(dst)
    # nodes are in forward order, so inputs come first
    for i, node in enumerate(nodes):
        node.layer = 1 + max((nodes[p].layer for p in preds[i]), default=-1)
    for i in reversed(range(n)):
        if not preds[i] and succs[i]:
            nodes[i].layer = min(nodes[s].layer for s in succs[i]) - 1
    # Points: real nodes, then one dummy per layer skipped by an edge.
    layer = [node.layer for node in nodes]
    width = [node.width for node in nodes]
    up: list[list[int]] = [list(p) for p in preds]
    down: list[list[int]] = [list(s) for s in succs]
    chains: list[list[int]] = []  # per edge, the dummies it passes through
    for src, dst, _ in edges:
        chain, prev = [], src
        for lay in range(nodes[src].layer + 1, nodes[dst].layer):
            layer.append(lay)
            width.append(0.0)
            up.append([prev])
            down.append([])
            down[prev].append(len(layer) - 1)
            chain.append(len(layer) - 1)
            prev = len(layer) - 1
        if chain:
            down[prev].append(dst)
            up[dst].append(prev)
            up[dst].remove(src)
            down[src].remove(dst)
        chains.append(chain)
    rows: list[list[int]] = [[] for _ in range(max(layer) + 1)]
    for point in range(len(layer)):
        rows[layer[point]].append(point)
    pos = {p: i for row in rows for i, p in enumerate(row)}

    def sweep(row: list[int], neighbours: list[list[int]]) -> None:
        def key(p: int) -> tuple[float, int]:
            near = neighbours[p]
            return (sum(pos[q] for q in near) / len(near) if near else pos[p], pos[p])

        row.sort(key=key)
        for i, p in enumerate(row):
            pos[p] = i

    for _ in range(4):
        for row in rows[1:]:
            sweep(row, up)
        for row in reversed(rows[:-1]):
            sweep(row, down)
    x = [0.0] * len(layer)
    for row in rows:
        at = 0.0
        for p in row:
            x[p] = at + width[p] / 2
            at += width[p] + GAP
    for _ in range(8):
        for row, neighbours in [(r, up) for r in rows[1:]] + [(r, down) for r in rows[::-1]]:
            wanted = [
                sum(x[q] for q in neighbours[p]) / len(neighbours[p]) if neighbours[p] else x[p]
                for p in row
            ]
            _place(row, wanted, width, x)
    left = min(x[p] - width[p] / 2 for p in range(len(layer)))
    for i, node in enumerate(nodes):
        node.x = x[i] - left + MARGIN
    return [[x[d] - left + MARGIN for d in chain] for chain in chains]


def _place(row: list[int], wanted: list[float], width: list[float], x: list[float]) -> None:
    """x of a layer's points, as near their wanted x as the order and the gaps allow."""
    gap = [(width[a] + width[b]) / 2 + GAP for a, b in zip(row, row[1:], strict=False)]
    lo = list(wanted)  # pushed right only
    for i in range(1, len(row)):
        lo[i] = max(lo[i], lo[i - 1] + gap[i - 1])
    hi = list(wanted)  # pushed left only
    for i in reversed(range(len(row) - 1)):
        hi[i] = min(hi[i], hi[i + 1] - gap[i])
    for i, p in enumerate(row):
        x[p] = (lo[i] + hi[i]) / 2  # both keep the gaps, so their mean does too


# --- building the lesson ----------------------------------------------------------------------


def build_lesson(
    output: Tensor, title: str | None = None, names: dict[int, str] | None = None
) -> Lesson:
    """Record the forward and backward steps of a scalar output's graph (runs backward).

    Backward runs once as usual (`output.backward(retain_graph=True)`), so afterwards every
    .grad is what a plain backward() leaves and the graph can still be drawn or walked again.
    The per-step gradients are taken by applying each op's VJP along the same graph first.
    names: id(tensor) -> label for leaves (`viz.to_html` makes it from `params`); other tensors
    are labelled with their `.name`.
    """
    if not isinstance(output, Tensor):
        raise TypeError(f"to_html: expected a Tensor, got {type(output).__name__}")
    if output.size != 1:
        raise ValueError(
            f"to_html: the output must be a scalar (one element) to run backward from; "
            f"got shape {output.shape}"
        )
    if output.op is None or not output.requires_grad:
        raise ValueError(
            f"to_html: the output (shape {output.shape}) has no graph: it is a leaf or was "
            "computed without a tensor that requires grad (or under no_grad())"
        )
    names = names or {}
    order = _walk(output)
    index = {id(t): i for i, t in enumerate(order)}
    nodes = []
    for i, t in enumerate(order):
        label = _label(t, names)
        if t.op is not None:
            kind, head, sub = "op", t.op.name, f"{label if t.name else ''} {_shape(t)}".strip()
        else:
            kind, head, sub = ("param" if t.requires_grad else "const"), label, _shape(t)
        width = max(len(head), len(sub)) * CHAR_W + 16
        nodes.append(Node(f"n{i}", kind, head, sub, width=width))
    edges = [
        (index[id(p)], index[id(t)], slot)
        for t in order
        if t.op is not None
        for slot, p in enumerate(t.op.inputs)
    ]
    lesson = Lesson(
        title or f"Forward and backward through {_label(output, names)}", nodes, edges, [], index
    )
    lesson.steps.append(_start_step(order, names))
    docs: dict[type, _OpDoc | None] = {}
    ops = [t for t in order if t.op is not None]
    for k, t in enumerate(ops, 1):
        doc = docs.setdefault(type(t.op), _op_doc(type(t.op)))
        lesson.steps.append(_forward_step(lesson, t, k, len(ops), doc, names))
    priors = {id(t): t.grad for t in order if t.op is None and t.requires_grad}
    lesson.steps += _backward_steps(lesson, order, docs, names, priors)
    output.backward(retain_graph=True)
    return lesson


def _in_edges(lesson: Lesson, t: Tensor) -> list[int]:
    target = lesson._index[id(t)]
    return [i for i, (_, dst, _) in enumerate(lesson.edges) if dst == target]


def _out_edges(lesson: Lesson, t: Tensor) -> list[int]:
    source = lesson._index[id(t)]
    return [i for i, (src, _, _) in enumerate(lesson.edges) if src == source]


def _formulas(doc: _OpDoc | None) -> list[Formula]:
    if doc is None:
        return []
    found = [Formula(Text("forward", "前向"), doc.forward, latex(doc.forward))]
    if doc.vjp:
        found.append(Formula("VJP", doc.vjp, latex(doc.vjp)))
    return found


def _badge(doc: _OpDoc | None) -> Words:
    if not doc or not doc.sections:
        return ""
    return Text(f"notes {', '.join(doc.sections)}", f"笔记 {'、'.join(doc.sections)}")


def _inputs(fn: Function, names: dict[int, str]) -> list[Row]:
    args = _argument_names(fn, len(fn.inputs))
    return [
        Row(f"{a} = {_label(p, names)} {_shape(p)}", fmt(p.data))
        for a, p in zip(args, fn.inputs, strict=True)
    ]


def _here(fn: Function, names: dict[int, str], gradient: bool) -> Text:
    args = _argument_names(fn, len(fn.inputs))
    pairs = [f"{a} = {_label(t, names)}" for a, t in zip(args, fn.inputs, strict=True)]
    return Text(
        f"Here {', '.join(pairs)}" + ("; g is the gradient arriving." if gradient else "."),
        f"这里 {'，'.join(pairs)}" + ("；g 是到达的梯度。" if gradient else "。"),
    )


def _start_step(order: list[Tensor], names: dict[int, str]) -> Step:
    ops = sum(t.op is not None for t in order)
    leaves = [t for t in order if t.op is None]
    rows = [
        Row(
            f"{_label(t, names)} {_shape(t)} {t.dtype}",
            fmt(t.data),
            "" if t.requires_grad else Text("constant: receives no gradient", "常量：不接收梯度"),
        )
        for t in leaves
    ]
    return Step(
        "start",
        Text(
            f"The graph: {ops} ops, {len(leaves)} leaves",
            f"计算图：{ops} 个运算，{len(leaves)} 个叶子",
        ),
        text=[
            Text(
                "The forward pass recorded one box per op (blue); the leaves are the parameters "
                "and inputs that require grad (filled) and constants (dashed). Data flows down.",
                "前向传播为每个运算记录了一个方框（蓝色）；叶子是需要梯度的参数和输入（实心）以及"
                "常量（虚线）。数据自上而下流动。",
            ),
            Text(
                "Next (or the right arrow key) runs the forward pass one op at a time, then the "
                "backward pass from the output back up to the leaves. Click a formula to copy its "
                "LaTeX; #step=N in the address opens step N.",
                "“下一步”（或右方向键）逐个运算执行前向传播，然后从输出向上反向传播到叶子。点击"
                "公式复制它的 LaTeX；地址中的 #step=N 打开第 N 步。",
            ),
        ],
        blocks=[(Text("Leaves", "叶子"), rows)],
    )


def _forward_step(
    lesson: Lesson, t: Tensor, k: int, total: int, doc: _OpDoc | None, names: dict[int, str]
) -> Step:
    fn = t.op
    step = Step(
        "forward",
        Text(
            f"Forward {k} of {total}: {fn.name} \u2192 {_label(t, names)}",
            f"前向 {k}/{total}：{fn.name} \u2192 {_label(t, names)}",
        ),
        badge=_badge(doc),
        node=lesson.node_of(t),
        edges=_in_edges(lesson, t),
        formulas=_formulas(doc),
        text=[_here(fn, names, gradient=False)] + (doc.notes if doc else []),
        blocks=[
            (Text("Inputs", "输入"), _inputs(fn, names)),
            (
                Text("Output", "输出"),
                [Row(f"{_label(t, names)} {_shape(t)} {t.dtype}", fmt(t.data))],
            ),
        ],
    )
    if doc is None:
        step.text.insert(
            0,
            Text(
                f"{fn.name} has no formula comment in its code.",
                f"{fn.name} 的代码里没有公式注释。",
            ),
        )
    return step


def _backward_steps(
    lesson: Lesson,
    order: list[Tensor],
    docs: dict[type, _OpDoc | None],
    names: dict[int, str],
    priors: dict[int, np.ndarray | None],
) -> list[Step]:
    """One step per op from the output back (the reverse of the forward order), then the leaves.

    `arrived` collects, per tensor, each consumer's contribution (who sent it, the array), so a
    tensor used twice shows both terms before their sum is passed on (notes 10.2).
    """
    output = order[-1]
    arrived: dict[int, list[tuple[str, np.ndarray]]] = {
        id(output): [("the seed dL/dL = 1", np.ones_like(output.data))]
    }
    ops = [t for t in reversed(order) if t.op is not None and t.requires_grad]
    steps = []
    for k, t in enumerate(ops, 1):
        terms = arrived.pop(id(t), None)
        if terms is None:
            continue  # no gradient reached this op
        fn, doc = t.op, docs[type(t.op)]
        g = _total(terms)
        input_grads = fn.backward(g)
        name = _label(t, names)
        step = Step(
            "backward",
            Text(
                f"Backward {k} of {len(ops)}: {fn.name} \u2192 {name}",
                f"反向 {k}/{len(ops)}：{fn.name} \u2192 {name}",
            ),
            badge=_badge(doc),
            node=lesson.node_of(t),
            # the edges the gradients leave by, and those several contributions arrived by
            edges=_in_edges(lesson, t) + (_out_edges(lesson, t) if len(terms) > 1 else []),
            formulas=_sum_formula(terms) + _formulas(doc),
            text=[_here(fn, names, gradient=True)],
            blocks=[
                (
                    Text(
                        f"Gradient arriving: g = {_d(name)} {_shape(t)}",
                        f"到达的梯度：g = {_d(name)} {_shape(t)}",
                    ),
                    _terms(terms, g),
                )
            ],
        )
        leaving = []
        args = _argument_names(fn, len(fn.inputs))
        for a, p, pg in zip(args, fn.inputs, input_grads, strict=True):
            label = f"d{a} = {_d(_label(p, names))} {_shape(p)}"
            if pg is None or not p.requires_grad:
                leaving.append(Row(label, "", Text("a constant: no gradient", "常量：没有梯度")))
                continue
            arrived.setdefault(id(p), []).append((f"{fn.name} \u2192 {name}", pg))
            to = Text("a leaf: added to its .grad", "叶子：加到它的 .grad 上")
            if p.op is None:
                step.marked.append(lesson.node_of(p))
            else:
                where = f"{p.op.name} \u2192 {_label(p, names)}"
                to = Text(f"on to {where}", f"继续传给 {where}")
            uses = len(arrived[id(p)])
            if uses > 1:
                to = Text(
                    to.en + f" (contribution {uses}: it is used more than once)",
                    to.zh + f"（第 {uses} 份贡献：它被使用了不止一次）",
                )
            leaving.append(Row(label, fmt(pg), to))
        step.blocks.append((Text("Gradients leaving", "离开的梯度"), leaving))
        step.blocks.append(
            (
                Text("Inputs (saved by the forward pass)", "输入（前向传播保存的）"),
                _inputs(fn, names),
            )
        )
        steps.append(step)
    steps.append(_grads_step(lesson, order, arrived, names, priors))
    return steps


def _total(terms: list[tuple[str, np.ndarray]]) -> np.ndarray:
    g = terms[0][1]
    for _, term in terms[1:]:
        g = g + term  # in arrival order, as the backward loop adds them
    return g


def _terms(terms: list[tuple[str, np.ndarray]], g: np.ndarray) -> list[Row]:
    def source(src: str) -> Text:
        return Text(f"from {src}", f"来自 {src}")

    if len(terms) == 1:
        return [Row("g", fmt(g), source(terms[0][0]))]
    rows = [Row(f"g{i}", fmt(term), source(src)) for i, (src, term) in enumerate(terms, 1)]
    plus = " + ".join(f"g{i}" for i in range(1, len(terms) + 1))
    several = Text(
        "used by several ops: the contributions add (10.2)", "被多个运算使用：贡献相加（10.2）"
    )
    rows.append(Row(f"g = {plus}", fmt(g), several))
    return rows


def _sum_formula(terms: list[tuple[str, np.ndarray]]) -> list[Formula]:
    if len(terms) == 1:
        return []
    n = range(1, len(terms) + 1)
    text = "g = " + " + ".join(f"g{i}" for i in n)
    return [Formula(Text("sum", "求和"), text, "g = " + " + ".join(f"g_{{{i}}}" for i in n))]


def _grads_step(
    lesson: Lesson,
    order: list[Tensor],
    arrived: dict[int, list[tuple[str, np.ndarray]]],
    names: dict[int, str],
    priors: dict[int, np.ndarray | None],
) -> Step:
    rows, marked = [], []
    for t in order:
        terms = arrived.get(id(t))
        if t.op is not None or not terms:
            continue
        marked.append(lesson.node_of(t))
        g = _total(terms)
        label = f"{_label(t, names)}.grad {_shape(t)}"
        if len(terms) > 1:  # each contribution, then their sum
            rows += _terms(terms, g)[:-1]
            label += " = " + " + ".join(f"g{i}" for i in range(1, len(terms) + 1))
        had = Text("added to the .grad it already had", "加到它原有的 .grad 上")
        rows.append(Row(label, fmt(g), "" if priors.get(id(t)) is None else had))
    return Step(
        "grads",
        Text("The leaves' gradients", "叶子的梯度"),
        text=[
            Text(
                "Every parameter now holds dL/d(parameter) in .grad, the same shape as the "
                "parameter: what an optimiser step uses.",
                "每个参数的 .grad 里现在是 dL/d(参数)，形状与参数相同："
                "优化器的一步更新用的就是它。",
            )
        ],
        blocks=[("dL/d(leaf)", rows)],
        marked=marked,
    )


# --- the page ---------------------------------------------------------------------------------


def write_lesson(lesson: Lesson, path: str | Path) -> Path:
    """Write the lesson as one HTML file (UTF-8, `\\n` line ends, no URL of any kind)."""
    path = Path(path)
    title = lesson.title if isinstance(lesson.title, Text) else Text(lesson.title, lesson.title)
    page = Template((PAGE_DIR / "page.html").read_text(encoding="utf-8")).substitute(
        title=html.escape(title.en),
        title_en=html.escape(title.en, quote=True),
        title_zh=html.escape(title.zh, quote=True),
        heading=words_html(title),
        css=(PAGE_DIR / "lesson.css").read_text(encoding="utf-8").strip(),
        js=(PAGE_DIR / "lesson.js").read_text(encoding="utf-8").strip(),
        svg=_svg(lesson),
        steps="\n".join(_step_html(i, s) for i, s in enumerate(lesson.steps)),
        last=len(lesson.steps) - 1,
    )
    path.write_text(page, encoding="utf-8", newline="\n")
    return path


def _num(v: float) -> str:
    return f"{v:.1f}".removesuffix(".0")


def _svg(lesson: Lesson) -> str:
    chains = _layout(lesson.nodes, lesson.edges)
    layers = max(node.layer for node in lesson.nodes) + 1
    width = max(node.x + node.width / 2 for node in lesson.nodes) + MARGIN
    height = layers * LAYER_H - (LAYER_H - NODE_H) + 2 * MARGIN

    def top(layer: int) -> float:
        return MARGIN + layer * LAYER_H

    # One arrowhead per edge colour (plain, forward, gradient); the CSS picks one per state.
    markers = "".join(
        f'<marker id="{name}" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
        'markerHeight="7" markerUnits="userSpaceOnUse" orient="auto-start-reverse">'
        '<path d="M0,0 L10,5 L0,10 z"/></marker>'
        for name in ("arrow", "arrow-forward", "arrow-backward")
    )
    parts = [
        f'<svg id="graph" viewBox="0 0 {_num(width)} {_num(height)}" width="{_num(width)}" '
        f'height="{_num(height)}" role="img" aria-label="computation graph">',
        f"<defs>{markers}</defs>",
    ]
    fan_in = Counter(dst for _, dst, _ in lesson.edges)
    for i, ((src, dst, slot), chain) in enumerate(zip(lesson.edges, chains, strict=True)):
        a, b = lesson.nodes[src], lesson.nodes[dst]
        # each input enters at its own point along the top, in input order (a left of b)
        inputs = fan_in[dst]
        port = b.x + (slot - (inputs - 1) / 2) * min(14.0, b.width / (inputs + 1))
        points = [(a.x, top(a.layer) + NODE_H)]
        for lay, x in zip(range(a.layer + 1, b.layer), chain, strict=True):
            points += [(x, top(lay)), (x, top(lay) + NODE_H)]
        points.append((port, top(b.layer) - 2))
        d = f"M{_num(points[0][0])},{_num(points[0][1])}"
        for k in range(1, len(points)):
            (x0, y0), (x1, y1) = points[k - 1], points[k]
            if k % 2:  # from the bottom of one layer to the top of the next: a smooth S
                mid = (y0 + y1) / 2
                d += f" C{_num(x0)},{_num(mid)} {_num(x1)},{_num(mid)} {_num(x1)},{_num(y1)}"
            else:  # straight down through a layer the edge skips
                d += f" L{_num(x1)},{_num(y1)}"
        parts.append(f'<path class="edge" id="e{i}" d="{d}"/>')
    for node in lesson.nodes:
        x, y = node.x - node.width / 2, top(node.layer)
        output = " output" if node is lesson.nodes[-1] else ""
        rx = 6 if node.kind == "op" else NODE_H / 2
        parts.append(
            f'<g class="node {node.kind}{output}" id="{node.id}">'
            f'<rect x="{_num(x)}" y="{_num(y)}" width="{_num(node.width)}" height="{NODE_H}" '
            f'rx="{_num(rx)}"/>'
            f'<text x="{_num(node.x)}" y="{_num(y + 13)}" class="head">'
            f"{html.escape(node.title)}</text>"
            f'<text x="{_num(node.x)}" y="{_num(y + 26)}">{html.escape(node.subtitle)}</text>'
            "</g>"
        )
    parts.append("</svg>")
    return "\n".join(parts)


def words_html(words: Words) -> str:
    """HTML of a sentence: one span per language (the switch hides one), or the shared text."""
    if isinstance(words, Text):
        return (
            f'<span lang="en" data-lang="en">{html.escape(words.en)}</span>'
            f'<span lang="zh" data-lang="zh">{html.escape(words.zh)}</span>'
        )
    return html.escape(words)


def _step_html(i: int, step: Step) -> str:
    e = html.escape
    badge = f' <span class="badge">{words_html(step.badge)}</span>' if step.badge else ""
    parts = [
        f'<section class="step {step.phase}" id="step-{i}" data-step="{i}" '
        f'data-phase="{e(step.phase)}" data-node="{step.node or ""}" '
        f'data-edges="{" ".join(str(k) for k in step.edges)}" '
        f'data-marked="{" ".join(step.marked)}" hidden>',
        f"<h2>{words_html(step.title)}{badge}</h2>",
    ]
    for f in step.formulas:
        parts.append(
            f'<p class="formula" data-latex="{e(f.latex)}" title="click to copy the LaTeX">'
            f'<span class="tag">{words_html(f.kind)}</span><code>{e(f.text)}</code></p>'
        )
    parts += [f"<p>{words_html(t)}</p>" for t in step.text]
    for section, words in step.quotes:
        parts.append(
            f'<blockquote class="notes"><div class="source">'
            f"{words_html(Text(f'The notes, {section}', f'笔记原文，{section}'))}</div>"
            f"{words_html(words)}</blockquote>"
        )
    for heading, rows in step.blocks:
        parts.append(f"<h3>{words_html(heading)}</h3>")
        for row in rows:
            value = f"<pre>{e(row.value)}</pre>" if row.value else ""
            note = f'<div class="note">{words_html(row.note)}</div>' if row.note else ""
            parts.append(
                f'<div class="row"><div class="label">{e(row.label)}</div>{value}{note}</div>'
            )
    parts.append("</section>")
    return "\n".join(parts)
