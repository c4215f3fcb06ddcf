"""Pictures of the computation graph: Graphviz DOT text, SVG/PNG through the `dot` program, and
`to_html`: an interactive page that steps through the forward and the backward pass.

>>> import numpy as np
>>> from autograd import Tensor
>>> w = Tensor(np.ones((2, 3)), requires_grad=True, dtype=np.float64, name="w")
>>> y = (w * 2).sum()
>>> print(to_dot(y))  # doctest: +NORMALIZE_WHITESPACE
digraph autograd {
  rankdir=BT;
  node [fontname="Helvetica", fontsize=10];
  n0 [label="Sum\\n() float64", shape=box, style=filled, fillcolor=lightsteelblue, peripheries=2];
  n1 [label="Mul\\n(2, 3) float64", shape=box, style=filled, fillcolor=lightsteelblue];
  n2 [label="w\\n(2, 3) float64", style=filled, fillcolor=wheat];
  n3 [label="constant\\n() float64", style=dashed];
  n1 -> n0;
  n2 -> n1;
  n3 -> n1;
}

Nodes are the leaves (parameters and inputs that require grad: filled; constants: dashed) and the
ops (boxes: the op's name, then the name, shape and dtype of the tensor it produced). Edges run
from an op's inputs to the op, so with `rankdir=BT` the output sits at the top.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from autograd.tensor import Tensor
from autograd.viz.lesson import build_lesson, write_lesson

_OP_STYLE = "shape=box, style=filled, fillcolor=lightsteelblue"
_PARAM_STYLE = "style=filled, fillcolor=wheat"
_CONST_STYLE = "style=dashed"


def _param_names(params: Any, caller: str = "to_dot") -> dict[int, str]:
    """id(tensor) -> name, from a mapping name -> Tensor or anything with named_parameters()."""
    if params is None:
        return {}
    if hasattr(params, "named_parameters"):
        params = dict(params.named_parameters())
    if not isinstance(params, Mapping):
        raise TypeError(
            f"{caller}: params must be a dict of name -> Tensor or an object with "
            f"named_parameters() (a Module), got {type(params).__name__}"
        )
    names = {}
    for name, tensor in params.items():
        if not isinstance(tensor, Tensor):
            raise TypeError(
                f"{caller}: params[{name!r}] is a {type(tensor).__name__}, not a Tensor"
            )
        names[id(tensor)] = str(name)
    return names


def _quote(text: str) -> str:
    """A DOT string literal; `\\n` in the result is DOT's line break inside a label."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + escaped.replace("\n", "\\n") + '"'


def to_dot(tensor: Tensor, params: Any = None) -> str:
    """The graph that produced `tensor`, as Graphviz DOT text (deterministic node numbering).

    params: a dict name -> Tensor (e.g. `dict(model.named_parameters())`) or a Module; leaves
    found there are labelled with their parameter names, other tensors with `tensor.name`.
    Call it before `backward()` (or use `backward(retain_graph=True)`): backward releases the
    graph it walks.
    """
    if not isinstance(tensor, Tensor):
        raise TypeError(f"to_dot: expected a Tensor, got {type(tensor).__name__}")
    names = _param_names(params)
    ids: dict[int, str] = {}
    nodes: list[str] = []
    edges: list[str] = []

    def node_id(t: Tensor) -> tuple[str, bool]:
        """The node of t, and whether it is new (its inputs still to be visited)."""
        key = id(t)
        if key in ids:
            return ids[key], False
        ids[key] = f"n{len(ids)}"
        name = names.get(key) or t.name
        fn = t.op
        if fn is not None and getattr(fn, "inputs", None) is None:
            raise RuntimeError(
                f"to_dot: the graph through {fn.name} (output shape {t.shape}) was released "
                "by backward(); draw it before backward() or pass retain_graph=True"
            )
        if fn is not None:
            title, style = (f"{fn.name}\n{name}" if name else fn.name), _OP_STYLE
        elif t.requires_grad:
            title, style = name or "input", _PARAM_STYLE
        else:
            title, style = name or "constant", _CONST_STYLE
        label = _quote(f"{title}\n{t.shape} {t.dtype}")
        root = ", peripheries=2" if t is tensor else ""  # the output gets a double border
        nodes.append(f"{ids[key]} [label={label}, {style}{root}];")
        return ids[key], True

    # Depth-first with an explicit stack (a long chain must not hit the recursion limit); each
    # op's edges are written when its inputs have been numbered, in input order.
    node_id(tensor)
    stack = [tensor]
    while stack:
        t = stack.pop()
        fn = t.op
        if fn is None:
            continue
        target = ids[id(t)]
        new_inputs = []
        for parent in fn.inputs:
            parent_id, is_new = node_id(parent)
            edges.append(f"{parent_id} -> {target};")
            if is_new:
                new_inputs.append(parent)
        stack.extend(reversed(new_inputs))
    lines = ["digraph autograd {", "  rankdir=BT;", '  node [fontname="Helvetica", fontsize=10];']
    lines += ["  " + n for n in nodes]
    lines += ["  " + e for e in edges]
    lines.append("}")
    return "\n".join(lines)


def render(tensor: Tensor, path: str | Path, params: Any = None) -> Path:
    """Draw the graph of `tensor` into `path` with Graphviz; the format comes from the suffix.

    Needs the Graphviz `dot` program on PATH (`apt-get install graphviz`, `brew install
    graphviz`); without it, raises RuntimeError (the DOT text of `to_dot` still works anywhere).
    """
    path = Path(path)
    fmt = path.suffix.lstrip(".").lower()
    if fmt not in ("svg", "png", "pdf"):
        raise ValueError(
            f"render: cannot tell the format from {str(path)!r}; use .svg, .png or .pdf"
        )
    dot = shutil.which("dot")
    if dot is None:
        raise RuntimeError(
            "render: the Graphviz program 'dot' was not found on PATH; install Graphviz "
            "(apt-get install graphviz / brew install graphviz) or use autograd.viz.to_dot() "
            "and open the text in any Graphviz viewer"
        )
    text = to_dot(tensor, params)
    done = subprocess.run(
        [dot, f"-T{fmt}", "-o", str(path)], input=text.encode(), capture_output=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"render: 'dot -T{fmt}' failed with exit code {done.returncode}: "
            f"{done.stderr.decode(errors='replace').strip()}"
        )
    return path


def to_html(output: Tensor, path: str | Path, title: str | None = None, params: Any = None) -> Path:
    """Write a self-contained HTML lesson on the graph of the scalar `output` to `path`.

    The page shows the graph (one box per op, leaves with their shapes) and steps through the
    forward pass, then the backward pass: each op's formula and VJP from its code comment, its
    inputs, output, the gradient arriving and the gradients leaving (`#step=N` opens step N).
    It runs `output.backward(retain_graph=True)` itself, so .grad afterwards is what a plain
    backward() leaves (accumulated onto any earlier .grad) and the graph is kept. One file with
    inline SVG, CSS and JS: it opens from disk, offline. params: as for `to_dot`.
    """
    lesson = build_lesson(output, title=title, names=_param_names(params, "to_html"))
    return write_lesson(lesson, path)
