"""The notes' chapter 11 worked example, built from the engine's own ops and run end to end.

One causal attention head + output projection + residual + vocabulary head (no positions, no
LayerNorm, no FFN), vocabulary A, B, C, input "A B", target C at the last position only, d_k = 1,
24 parameter elements (E 3x2, W_Q 2x1, W_K 2x1, W_V 2x2, W_O 2x2, U 2x3). One step of plain
gradient descent with lr 0.1, then the forward pass again (notes 11.1-11.7).

    python -m models.worked_example              # the notes' tables: forward, gradients, update
    python -m models.worked_example --explain    # step by step, with the graph and backward trace
    python -m models.worked_example --graph g.svg  # also draw the graph (needs Graphviz `dot`)
    python -m models.worked_example --html lesson.html  # the interactive page, one offline file

Every tensor carries the notes' name (X, Q, K, V, S0, S, A, Z, R, h, logits, L), so the graph and
the backward trace read like the notes. Everything is float64; the tables print 6 decimals as the
notes do, the program keeps the unrounded values (11.7).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import autograd
import autograd.functional as F
from autograd import Tensor
from autograd.viz import render, to_dot
from autograd.viz.lesson import Formula, Row, Step, Text, build_lesson, write_lesson

VOCAB = ("A", "B", "C")
INPUT_IDS = np.array([0, 1])  # the prefix "A B"
TARGET_ID = 2  # the next token is C; only the last position has a loss
D_K = 1
LR = 0.1
EPS = 1e-5  # central-difference step of notes 11.7

PARAMETER_NAMES = ("E", "W_Q", "W_K", "W_V", "W_O", "U")
LESSON_TITLE = Text(
    "Notes ch. 11, op by op: forward, backward, one update",
    "笔记第 11 章，逐个运算：前向、反向、一次更新",
)

# The notes' own words for the lesson's steps (ch. 11, quoted from the Chinese text; the numbers
# on the page are the program's): (phase, the step's tensor or None, section, English, Chinese).
NOTES_WORDS = [
    (
        "start",
        None,
        "11.1",
        "To carry the numbers to the end, this chapter uses a small model: single-head causal "
        "attention + output projection + residual + vocabulary output. It leaves out positional "
        "encoding, normalisation and the FFN, so it is not a full GPT. The toy vocabulary has only "
        "A, B, C; the training input prefix is A, B and the correct next token is C. Only the last "
        "position has a loss. No biases, E and U not shared: 6 + 2 + 2 + 4 + 4 + 6 = 24 parameter "
        "elements.",
        "为了把数值算到底，本章使用单头因果注意力＋输出投影＋残差＋词表输出的小模型。它"
        "省略位置编码、"
        "归一化和 FFN，因而不是完整 GPT。玩具词表只有 A、B、C。训练样本的输入前缀是 A、B"
        "，正确下一个 "
        "Token 为 C。只对最后位置计损失。没有偏置，不共享 E 与 U。共有 6 + 2 + 2 + 4 + 4"
        " + 6 = 24 个"
        "参数元素。C 的嵌入行暂时未被输入查到。",
    ),
    (
        "forward",
        "S",
        "11.2",
        "Since sqrt(d_k) = 1, the dot-product scores and the masked result are S0 = [[0,"
        " 0], [1, 0]] "
        "and S = [[0, -inf], [1, 0]].",
        "因为 √d_k = 1，点积分数与加掩码结果分别为：S0 = [[0, 0], [1, 0]]，S = [[0, -∞], [1, 0]]。",
    ),
    (
        "forward",
        "Z",
        "11.2",
        "The second position actually reads A's content and its own. This preference is only what "
        "the given parameters produce; it does not yet represent any knowledge of language.",
        "第 2 个位置实际读取了 A 的内容和自己的内容。这里的偏好只是指定参数产生的结果，尚未代表任何"
        "语言知识。",
    ),
    (
        "forward",
        "h",
        "11.3",
        "From R = X + Z W_O, take the last row: h = (a, 1 + c) ≈ (0.731059, 1.268941).",
        "由 R = X + Z W_O，取最后一行：h = (a, 1 + c) ≈ (0.731059, 1.268941)。",
    ),
    (
        "forward",
        "L",
        "11.3",
        "The most probable token is B, but the target is C, so L = -ln p_C ≈ 2.541928. The "
        "prediction function is not skipped: the probabilities are computed from h, U and the "
        "softmax, not given out of thin air.",
        "概率最大的是 B，但目标是 C，因此 L = − ln p_C ≈ 2.541928。没有跳过“预测函数”："
        "概率由 h、U、"
        "Softmax 明确算出，而不是凭空给定。",
    ),
    (
        "backward",
        "L",
        "11.4",
        "First: dℓ = p - (0, 0, 1) ≈ (0.339660, 0.581626, -0.921286).",
        "先求：ℓ̄ = p − (0, 0, 1) ≈ (0.339660, 0.581626, −0.921286)。",
    ),
    (
        "backward",
        "logits",
        "11.4",
        "Then: dh = dℓ Uᵀ ≈ (1.260945, 0.581626).",
        "再求：h̄ = ℓ̄ Uᵀ ≈ (1.260945, 0.581626)。",
    ),
    (
        "backward",
        "h",
        "11.4",
        "Only the last position has a loss, so the first row of dR is zero and the second is dh.",
        "只有最后位置计损失，故 R̄ 第一行为零，第二行为 h̄。",
    ),
    (
        "backward",
        "A",
        "11.4",
        "The first term of the second row's softmax score gradient is "
        "dS21 = a (1.260945 - a 1.260945 - c 0.581626) ≈ 0.133562; the other is about -0.133562. "
        "The first row has a single allowed position: its softmax is always 1, so the first row's "
        "score gradient is zero.",
        "第二行 Softmax 的分数梯度第 1 项是 S̄21 = a (1.260945 − a 1.260945 − c 0.581626"
        ") ≈ 0.133562。"
        "另一项约为 −0.133562。第一行只有一个允许位置，其 Softmax 恒为 1，不随唯一有限分"
        "数变化，所以"
        "第一行分数梯度为零。",
    ),
    (
        "backward",
        "S",
        "11.4",
        "This is the bridge the original Q&A lacked: the target's error first affects the "
        "vocabulary scores, then h, then the mixing proportions, and only then says how the "
        "matching scores should locally change.",
        "这正是原问答中缺少的中间桥梁：目标错误先影响词表分数，再影响 h，再影响内容混合比例，最后才"
        "给出匹配分数应怎样局部调整。",
    ),
    (
        "grads",
        None,
        "11.5",
        "Adding the residual, Q, K and V paths' gradients into the input gives dE. C never appears "
        "as an input and no weights are shared, so C's input embedding row has zero gradient; but "
        "U's column for C has a non-zero one: a token's input role and output role are distinct.",
        "把残差、Q、K、V 路径梯度加到输入，得到 Ē。C 没有作为输入出现，且本例不共享权重，因此 C 的"
        "输入嵌入行梯度为零；但 U 中 C 对应的输出列有非零梯度。这清楚地区分了“同一个 Token 的输入"
        "角色与输出角色”。",
    ),
    (
        "update",
        None,
        "11.6",
        "Learning rate η = 0.1; every matrix is updated at once with the gradient computed at the "
        "old parameters. W_Q's second element goes from 1 to about 0.986644, U's second row, "
        "column C from 0 to about 0.116906. The target's probability rises but is still not the "
        "largest; the attention on the first position even goes down.",
        "学习率取 η = 0.1，对所有矩阵同时使用旧参数处算出的梯度。例如 W_Q 第二元素从 1 变成约 "
        "0.986644，U 第二行 C 列从 0 变成约 0.116906。正确目标概率提高，但仍不是最大项；"
        "一次更新不必"
        "立刻预测正确。注意力给第一个位置的比例反而下降。",
    ),
]


def initial_parameters() -> dict[str, np.ndarray]:
    """The notes' initial values (11.1), as fresh float64 arrays."""
    return {
        "E": np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]),
        "W_Q": np.array([[0.0], [1.0]]),
        "W_K": np.array([[1.0], [0.0]]),
        "W_V": np.eye(2),
        "W_O": np.eye(2),
        "U": np.array([[1.0, 0.0, -1.0], [0.0, 1.0, 0.0]]),
    }


@dataclass
class ForwardPass:
    """The named intermediate tensors of one forward pass (notes 11.2-11.3)."""

    X: Tensor
    Q: Tensor
    K: Tensor
    V: Tensor
    S0: Tensor
    S: Tensor
    A: Tensor
    Z: Tensor
    R: Tensor
    h: Tensor
    logits: Tensor
    L: Tensor

    def probabilities(self) -> np.ndarray:
        """p = softmax(logits) of the last position (shape (3,)), outside the graph."""
        with autograd.no_grad():
            return F.softmax(self.logits.detach()).data[0]


class WorkedExample:
    """The ch. 11 model; parameters are float64 leaf Tensors named like the notes."""

    def __init__(self, parameters: dict[str, np.ndarray] | None = None) -> None:
        values = initial_parameters() if parameters is None else parameters
        missing = set(PARAMETER_NAMES) - set(values)
        if missing:
            raise KeyError(f"WorkedExample: missing parameters {sorted(missing)}")
        self.params = {
            name: Tensor(values[name], requires_grad=True, dtype=np.float64, name=name)
            for name in PARAMETER_NAMES
        }

    def named_parameters(self) -> list[tuple[str, Tensor]]:
        return list(self.params.items())

    def zero_grad(self) -> None:
        for p in self.params.values():
            p.grad = None

    def forward(self, ids: np.ndarray = INPUT_IDS, target: int = TARGET_ID) -> ForwardPass:
        p = self.params

        def named(t: Tensor, name: str) -> Tensor:
            t.name = name
            return t

        X = named(F.embedding(p["E"], ids), "X")  # rows of E for A, B (11.2)
        Q = named(X @ p["W_Q"], "Q")
        K = named(X @ p["W_K"], "K")
        V = named(X @ p["W_V"], "V")
        scale = Tensor(math.sqrt(D_K), dtype=np.float64, name="sqrt(d_k)")
        S0 = named(named(Q @ named(K.T, "K^T"), "Q K^T") / scale, "S0")
        n = len(ids)
        allowed = np.tril(np.ones((n, n), dtype=bool))  # causal: position i reads j <= i (7.4)
        blocked = Tensor(-np.inf, dtype=np.float64, name="-inf")  # notes' shorthand for a_ij = 0
        S = named(autograd.where(allowed, S0, blocked), "S")
        A = named(F.softmax(S, axis=-1), "A")
        Z = named(A @ V, "Z")
        R = named(X + named(Z @ p["W_O"], "Z W_O"), "R")  # residual (11.3)
        h = named(R[-1:], "h")  # only the last position predicts; (1, 2) keeps it a row
        logits = named(h @ p["U"], "logits")
        L = named(F.cross_entropy(logits, np.array([target])), "L")  # -ln p_C
        return ForwardPass(X, Q, K, V, S0, S, A, Z, R, h, logits, L)

    def loss(self) -> float:
        """L at the current parameters, without building a graph."""
        with autograd.no_grad():
            return self.forward().L.item()

    def step(self, lr: float = LR) -> None:
        """theta <- theta - lr * grad for all parameters at once (11.6: old gradients only)."""
        with autograd.no_grad():
            for name, p in self.params.items():
                if p.grad is None:
                    raise RuntimeError(f"WorkedExample.step: {name} has no gradient; run backward")
                p.data = p.data - lr * p.grad


def central_difference_check(model: WorkedExample, eps: float = EPS) -> tuple[float, str]:
    """Max |analytic - numeric| over all 24 parameter elements, and where it occurs (11.7).

    The analytic gradients are the .grad arrays already on the parameters; numeric ones are
    (L(theta + eps e_r) - L(theta - eps e_r)) / (2 eps), one element at a time.
    Written out here rather than calling autograd.gradcheck, so that the notes' 11.7 procedure
    (a fixed eps, the absolute difference the notes print) reads as one loop; tests use gradcheck.
    """
    worst, where = -1.0, ""
    for name, p in model.named_parameters():
        if p.grad is None:
            raise RuntimeError(f"central_difference_check: {name} has no gradient; run backward")
        for index in np.ndindex(p.shape):
            original = p.data[index]
            p.data[index] = original + eps
            plus = model.loss()
            p.data[index] = original - eps
            minus = model.loss()
            p.data[index] = original
            diff = abs(p.grad[index] - (plus - minus) / (2 * eps))
            if diff > worst:
                worst, where = diff, f"{name}{list(index)}"
    return worst, where


@dataclass
class Results:
    """Every number the notes print in ch. 11, unrounded."""

    before: ForwardPass
    p_before: np.ndarray
    grads: dict[str, np.ndarray]
    dlogits: np.ndarray
    dh: np.ndarray
    dZ: np.ndarray
    dA: np.ndarray
    dS: np.ndarray
    updated: dict[str, np.ndarray]
    after: ForwardPass
    p_after: np.ndarray
    max_abs_diff: float
    worst_element: str


def run(trace: bool = False) -> tuple[WorkedExample, Results]:
    """Forward, backward (optionally traced), gradient check, update, forward again."""
    model = WorkedExample()
    before = model.forward()
    for t in (before.logits, before.h, before.Z, before.A, before.S):
        t.retain_grad()  # keep the intermediate gradients the notes print (11.4)
    before.L.backward(trace=trace)
    grads = {name: p.grad.copy() for name, p in model.named_parameters()}
    max_abs_diff, worst = central_difference_check(model)
    model.step(LR)
    updated = {name: p.data.copy() for name, p in model.named_parameters()}
    with autograd.no_grad():
        after = model.forward()
    results = Results(
        before=before,
        p_before=before.probabilities(),
        grads=grads,
        dlogits=before.logits.grad[0],
        dh=before.h.grad[0],
        dZ=before.Z.grad,
        dA=before.A.grad,
        dS=before.S.grad,
        updated=updated,
        after=after,
        p_after=after.probabilities(),
        max_abs_diff=max_abs_diff,
        worst_element=worst,
    )
    return model, results


# --- printing ---------------------------------------------------------------------------------


def fmt(values: np.ndarray | float) -> str:
    """An array or number with the notes' 6 decimals (-inf stays -inf)."""
    return np.array2string(
        np.asarray(values, dtype=np.float64), precision=6, floatmode="fixed", separator=", "
    )


def _show(name: str, values: np.ndarray | float, indent: str = "  ") -> None:
    text = fmt(values)
    pad = " " * len(f"{indent}{name} = ")
    print(f"{indent}{name} = " + text.replace("\n", "\n" + pad))


def print_tables(r: Results) -> None:
    """The notes' ch. 11 numbers, section by section."""
    f = r.before
    print("11.2 lookup, projections, mask")
    for name in ("X", "Q", "K", "V", "S0", "S", "A", "Z"):
        _show(name, getattr(f, name).data)
    print(f"  a = A[2,1] = {f.A.data[1, 0]:.6f}   c = A[2,2] = {f.A.data[1, 1]:.6f}")
    print("11.3 residual, vocabulary scores, loss")
    _show("h", f.h.data[0])
    _show("logits", f.logits.data[0])
    _show("p", r.p_before)
    print(f"  L = -ln p_C = {f.L.item():.6f}")
    print("11.4 from the loss back to the attention scores")
    _show("dL/dlogits", r.dlogits)
    _show("dL/dh", r.dh)
    _show("dL/dS", r.dS)
    print("11.5 parameter gradients")
    for name, grad in r.grads.items():
        _show(f"dL/d{name}", grad)
    print(f"11.6 one joint update, lr {LR}")
    print(f"  W_Q[2] : 1 -> {r.updated['W_Q'][1, 0]:.6f}")
    print(f"  U[2,C] : 0 -> {r.updated['U'][1, 2]:.6f}")
    print("  quantity   before     after")
    rows = [("a21", f.A.data[1, 0], r.after.A.data[1, 0])]
    rows += [(f"p_{v}", r.p_before[i], r.p_after[i]) for i, v in enumerate(VOCAB)]
    rows.append(("L", f.L.item(), r.after.L.item()))
    for label, old, new in rows:
        print(f"  {label:<8} {old:9.6f} {new:9.6f}")
    print("11.7 central differences over all 24 parameter elements (eps 1e-5)")
    print(f"  max |analytic - numeric| = {r.max_abs_diff:.3e} (at {r.worst_element})")


def explain(graph_path: str | None = None) -> Results:
    """Walk through ch. 11: parameters, graph, forward, traced backward, update, re-forward."""
    print("Notes ch. 11, step by step. Model: one causal attention head, output projection,")
    print("residual, vocabulary head; input 'A B', target C at the last position.\n")
    print("Step 0. The 24 parameter elements (11.1)")
    for name, value in initial_parameters().items():
        _show(name, value)
    print("\nStep 1. The forward pass records a graph: one node per op, one per leaf.")
    print("        X = E[A,B]; Q,K,V = X W_Q, X W_K, X W_V; S = mask(Q K^T / sqrt(d_k));")
    print("        A = softmax(S); Z = A V; R = X + Z W_O; h = R[last]; logits = h U;")
    print("        L = -ln softmax(logits)[C].  Graphviz DOT of that graph:\n")
    model = WorkedExample()
    f = model.forward()
    print(to_dot(f.L, params=model))
    if graph_path:
        print(f"\n        (drawn to {render(f.L, graph_path, params=model)})")
    print("\nStep 2. Backward: each op turns dL/d(its output) into dL/d(its inputs) (its VJP).")
    print(
        "        Read the chain of 11.4: L -> logits -> h -> R -> Z -> A -> S -> Q/K/V -> X -> E."
    )
    print("        X is used four times (residual, Q, K, V): its four contributions add up.\n")
    _, results = run(trace=True)
    print("\nStep 3. The numbers, as the notes' tables print them\n")
    print_tables(results)
    print(
        "\nThe target's probability rose but C is still not the most likely token, and the\n"
        "attention on the first position (a21) went down: learning changes content, matching,\n"
        "input representations and output scores together (11.6)."
    )
    return results


def write_lesson_page(path: str | Path) -> Path:
    """The ch. 11 lesson page: every op forward and backward (`autograd.lesson`), then 11.6."""
    model = WorkedExample()
    before = model.forward()
    page = build_lesson(before.L, title=LESSON_TITLE)  # runs backward: parameters get .grad
    page.steps[0].text.insert(
        0,
        Text(
            "The notes' ch. 11 model: vocabulary A, B, C; input 'A B'; target C at the last "
            "position only. The forward steps are 11.2-11.3, the backward steps 11.4-11.5, the "
            "last step 11.6.",
            "笔记第 11 章的模型：词表 A、B、C；输入“A B”；只在最后位置以 C 为目标。前向步骤对应 "
            "11.2-11.3，反向步骤对应 11.4-11.5，最后一步对应 11.6。",
        ),
    )
    p = before.probabilities()
    page.step_of(before.L, "forward").blocks.append(
        (
            Text("The probabilities (11.3)", "概率（11.3）"),
            [Row("p = softmax(logits)", fmt(p), f"p_C = {p[2]:.6f}, so L = -ln p_C")],
        )
    )
    model.step(LR)
    with autograd.no_grad():
        after = model.forward()
    p_after = after.probabilities()
    table = [("a21", before.A.data[1, 0], after.A.data[1, 0])]
    table += [(f"p_{v}", p[i], p_after[i]) for i, v in enumerate(VOCAB)]
    table.append(("L", before.L.item(), after.L.item()))
    lines = [f"{'':<4} {'before':>9} {'after':>9}"]
    lines += [f"{label:<4} {old:9.6f} {new:9.6f}" for label, old, new in table]
    new = {name: t.data for name, t in model.params.items()}
    page.steps.append(
        Step(
            "update",
            Text(
                f"One joint update (lr {LR}), then forward again",
                f"一次联合更新（学习率 {LR}），然后重新前向",
            ),
            badge=Text("notes 11.6", "笔记 11.6"),
            formulas=[
                Formula(
                    Text("update", "更新"),
                    f"theta <- theta - {LR} * dL/dtheta",
                    rf"\theta_{{new}} = \theta_{{old}} - {LR}\, \nabla L(\theta_{{old}})",
                )
            ],
            text=[
                Text(
                    "All 24 parameter elements move at once, each with the gradient it got at "
                    "the old parameters; then the whole forward pass runs again.",
                    "全部 24 个参数元素同时移动，各自使用在旧参数处得到的梯度；然后整个前向传播"
                    "重新运行。",
                )
            ],
            blocks=[
                (
                    Text("Two of the new parameters", "两个新参数"),
                    [
                        Row("W_Q[2]", f"1 \u2192 {new['W_Q'][1, 0]:.6f}"),
                        Row("U[2,C]", f"0 \u2192 {new['U'][1, 2]:.6f}"),
                    ],
                ),
                (Text("The forward pass again", "再次前向"), [Row("", "\n".join(lines))]),
            ],
            marked=[page.node_of(t) for t in model.params.values()],
        )
    )
    page.steps[-1].text.append(
        Text(
            "The target's probability rose but C is still not the most likely token, and the "
            "attention on the first position (a21) went down: learning changes content, "
            "matching, input representations and output scores together.",
            "目标的概率提高了，但 C 仍不是最可能的 Token，注意力给第一个位置的比例（a21）反而"
            "下降：学习同时改变内容、匹配、输入表示和输出打分。",
        )
    )
    tensors = {"S": before.S, "Z": before.Z, "h": before.h, "L": before.L}
    tensors |= {"logits": before.logits, "A": before.A}
    for phase, name, section, en, zh in NOTES_WORDS:
        if name is None:
            step = next(s for s in page.steps if s.phase == phase)
        else:
            step = page.step_of(tensors[name], phase)
        step.quotes.append((section, Text(en, zh)))
    return write_lesson(page, path)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m models.worked_example", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--explain", action="store_true", help="step by step, with graph and backward trace"
    )
    parser.add_argument(
        "--graph", metavar="PATH", help="draw the graph to PATH (.svg/.png/.pdf; needs `dot`)"
    )
    parser.add_argument(
        "--html", metavar="PATH", help="write the interactive lesson page (one offline HTML file)"
    )
    args = parser.parse_args(argv)
    if args.html:
        print(f"lesson written to {write_lesson_page(args.html)}")
        return
    if args.explain:
        explain(args.graph)
        return
    model, results = run()
    print_tables(results)
    if args.graph:
        fresh = WorkedExample()
        print(f"graph drawn to {render(fresh.forward().L, args.graph, params=fresh)}")
    del model


if __name__ == "__main__":
    main()
