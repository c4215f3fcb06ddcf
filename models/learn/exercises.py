"""The track: ten exercises in the notes' order, and the capstone.

Each exercise names the functions the learner writes (their signatures and shapes), the notes'
section, the statement and a ladder of three hints in both languages (the notes' formula, the
shape argument, pseudo-code), and glassgrad's own code that does the same job (`solution N`
prints it). How each function is plugged into the engine is models/learn/plug.py; how it is graded
and diagnosed is models/learn/grader.py.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Function:
    name: str
    signature: str  # the def line's arguments
    shapes: str  # one line: what the arguments and the result are (formulas, language-neutral)


@dataclass(frozen=True)
class Exercise:
    number: int
    slug: str  # the workspace file is exNN_<slug>.py
    sections: str  # the notes' sections
    title: dict[str, str]
    statement: dict[str, str]
    hints: dict[str, tuple[str, str, str]]
    functions: tuple[Function, ...]
    engine: tuple[str, ...]  # glassgrad's own code: "module:qualname"
    imports: str = ""  # what the stub imports

    @property
    def module(self) -> str:
        return f"ex{self.number:02d}_{self.slug}"

    @property
    def file(self) -> str:
        return self.module + ".py"


EXERCISES: tuple[Exercise, ...] = (
    Exercise(
        1,
        "unbroadcast",
        "10.2, 10.5",
        {"en": "Unbroadcast: the VJP of broadcasting", "zh": "反广播：广播的 VJP"},
        {
            "en": "numpy broadcasting lets b (3,) be added to a (2, 3): b is used once per row. "
            "The gradient of b is then the sum of the gradients of all its uses (10.2: branches "
            "add). Write unbroadcast(grad, shape): sum grad back to `shape`, over the dimensions "
            "broadcasting added in front and those it stretched from size 1. Every binary op of "
            "the engine (+, -, *, /) then runs on it.",
            "zh": "numpy 的广播让 b (3,) 可以加到 a (2, 3) 上：b 在每一行各被使用一次。b 的梯度就是"
            "它所有使用处梯度之和（10.2：分支贡献相加）。写 unbroadcast(grad, shape)：把 grad 沿"
            "广播在前面添加的维度、以及从 1 拉伸的维度求和，回到 shape。引擎的所有二元运算"
            "（+、-、*、/）随后都用它。",
        },
        {
            "en": (
                "Notes 10.2: if a variable is used by several branches, the gradients of all "
                "branches add. Broadcasting is such a use: each copy is a branch.",
                "grad has ndim >= len(shape). The first grad.ndim - len(shape) axes were added "
                "in front: sum them away. Of the rest, an axis where shape has 1 but grad has "
                "more was stretched: sum it with keepdims (or sum, then reshape to shape).",
                "lead = grad.ndim - len(shape)\n"
                "stretched = axes lead + i where shape[i] == 1 and grad.shape[lead + i] != 1\n"
                "return grad.sum(axis=(0..lead-1) + stretched).reshape(shape)",
            ),
            "zh": (
                "笔记 10.2：若一个变量被多处分支使用，来自所有分支的梯度相加。广播正是这样的使用："
                "每个副本是一条分支。",
                "grad 的维数 >= len(shape)。前 grad.ndim - len(shape) 个轴是广播在前面添加的：求和"
                "消去。其余轴中，shape 为 1 而 grad 大于 1 的轴是被拉伸的：对它求和并保持维度"
                "（或求和后 reshape 回 shape）。",
                "lead = grad.ndim - len(shape)\n"
                "stretched = 满足 shape[i] == 1 且 grad.shape[lead + i] != 1 的轴 lead + i\n"
                "return grad.sum(axis=(0..lead-1) + stretched).reshape(shape)",
            ),
        },
        (Function("unbroadcast", "grad, shape", "grad (...broadcast shape) -> array of shape"),),
        ("autograd.tensor:unbroadcast",),
        "import numpy as np\n",
    ),
    Exercise(
        2,
        "matmul",
        "10.4",
        {"en": "Matmul's VJP", "zh": "矩阵乘法的 VJP"},
        {
            "en": "C = A B with A (n, k), B (k, m). Given g = dL/dC (n, m), return (dA, dB). "
            "Every 2-D product of the engine (x @ W, and every nn.Linear) then runs on it.",
            "zh": "C = A B，A (n, k)，B (k, m)。已知 g = dL/dC (n, m)，返回 (dA, dB)。引擎中所有"
            "二维矩阵乘法（x @ W，以及所有 nn.Linear）随后都用它。",
        },
        {
            "en": (
                "Notes 10.4: for l = h U + b,  dU = h^T dl,  dh = dl U^T.",
                "dA must have A's shape (n, k): the only product of g (n, m) and B (k, m) "
                "that gives (n, k) is g B^T. dB (k, m): A^T (k, n) times g (n, m).",
                "return g @ b.T, a.T @ g",
            ),
            "zh": (
                "笔记 10.4：ℓ = h U + b 时，Ū = hᵀ ℓ̄，h̄ = ℓ̄ Uᵀ。",
                "dA 必须与 A 同形状 (n, k)：由 g (n, m) 与 B (k, m) 得到 (n, k) 的唯一乘法是 "
                "g Bᵀ。dB (k, m)：Aᵀ (k, n) 乘 g (n, m)。",
                "return g @ b.T, a.T @ g",
            ),
        },
        (Function("matmul_backward", "a, b, g", "a (n, k), b (k, m), g (n, m) -> (da, db)"),),
        ("autograd.ops:MatMul", "autograd.functional:Linear"),
    ),
    Exercise(
        3,
        "elementwise",
        "10.1, 10.2",
        {
            "en": "Elementwise ops and reductions, max with ties",
            "zh": "逐元素运算与归约，max 的并列",
        },
        {
            "en": "Four local rules. div_backward(a, b, g): out = a / b (a, b, g of one shape; the "
            "engine unbroadcasts after you). tanh_backward(y, g): y = tanh(x), given the output "
            "y. sum_backward(g, shape, axes, keepdims): out = a.sum(axes) for a of `shape`. "
            "max_backward(a, g, axes, keepdims): out = a.max(axes); where several elements tie "
            "for the maximum, they share g evenly (a k-way tie gives each g / k).",
            "zh": "四条局部规则。div_backward(a, b, g)：out = a / b（a、b、g 同形状；引擎随后替你"
            "反广播）。tanh_backward(y, g)：y = tanh(x)，给的是输出 y。"
            "sum_backward(g, shape, axes, keepdims)：out = a.sum(axes)，a 的形状为 shape。"
            "max_backward(a, g, axes, keepdims)：out = a.max(axes)；若多个元素并列最大，它们平分 "
            "g（k 个并列各得 g / k）。",
        },
        {
            "en": (
                "d(a/b) = da / b - a db / b^2;  d tanh x = (1 - tanh^2 x) dx;  every summed "
                "element gets g;  only the maximum changes the max (10.1: local derivatives).",
                "sum/max: g has the reduced shape (the axes removed unless keepdims): put them "
                "back as size-1 axes, then broadcast to `shape`. max: winners = (a == a.max("
                "axes, keepdims=True)); the share of each winner is 1 / (number of winners).",
                "div: return g / b, -g * a / b**2\ntanh: return g * (1 - y * y)\n"
                "sum: g = g.reshape(shape with 1 on axes) if not keepdims; "
                "return np.broadcast_to(g, shape).copy()\n"
                "max: w = a == a.max(axes, keepdims=True); return w / w.sum(axes, keepdims=True)"
                " * sum_backward(g, a.shape, axes, keepdims)",
            ),
            "zh": (
                "d(a/b) = da / b - a db / b²；d tanh x = (1 - tanh² x) dx；被求和的每个元素都得到 "
                "g；只有最大值会改变 max（10.1：局部导数）。",
                "sum/max：g 是归约后的形状（除非 keepdims，被归约的轴已去掉）：先把这些轴放回为长度"
                " 1，再广播到 shape。max：winners = (a == a.max(axes, keepdims=True))；每个最大值分"
                "得 1 / (最大值个数)。",
                "div: return g / b, -g * a / b**2\ntanh: return g * (1 - y * y)\n"
                "sum: 若非 keepdims，g = g.reshape(在 axes 上为 1 的 shape)；"
                "return np.broadcast_to(g, shape).copy()\n"
                "max: w = a == a.max(axes, keepdims=True); return w / w.sum(axes, keepdims=True)"
                " * sum_backward(g, a.shape, axes, keepdims)",
            ),
        },
        (
            Function("div_backward", "a, b, g", "a, b, g of one shape -> (da, db)"),
            Function("tanh_backward", "y, g", "y = tanh(x), g of one shape -> dx"),
            Function(
                "sum_backward",
                "g, shape, axes, keepdims",
                "g (reduced), shape of a, axes: tuple of non-negative ints -> da of shape",
            ),
            Function(
                "max_backward",
                "a, g, axes, keepdims",
                "a, g (reduced), axes: tuple of non-negative ints -> da of a.shape",
            ),
        ),
        ("autograd.ops:Div", "autograd.ops:Tanh", "autograd.ops:Sum", "autograd.ops:Max"),
        "import numpy as np\n",
    ),
    Exercise(
        4,
        "backward_loop",
        "10.2",
        {"en": "The backward loop itself", "zh": "反向传播循环本身"},
        {
            "en": "Write run_backward(root, grad): visit root's graph from the output back to the "
            "leaves and leave in every leaf's .grad its gradient. A tensor t has t.op (the "
            "Function that made it, None for a leaf), t.op.inputs (its input tensors), "
            "t.op.backward(g) (one gradient per input, None for an input that gets none), "
            "t.requires_grad and t.grad. A tensor used twice receives the sum of both "
            "contributions; a leaf's .grad accumulates over backward calls (+=). From now on "
            "every loss.backward() of the engine runs your loop.",
            "zh": "写 run_backward(root, grad)：从输出沿计算图回到叶子，把每个叶子的梯度留在它的 "
            ".grad 中。张量 t 有 t.op（产生它的 Function，叶子为 None）、t.op.inputs（它的输入"
            "张量）、t.op.backward(g)（每个输入一个梯度，无梯度的输入为 None）、t.requires_grad "
            "和 t.grad。被使用两次的张量收到两份贡献之和；叶子的 .grad 在多次 backward 之间累加"
            "（+=）。此后引擎的每个 loss.backward() 都运行你的循环。",
        },
        {
            "en": (
                "Notes 10.2: if a variable is used by several branches, the gradients of all "
                "branches add. So a tensor's op may run backward only once every consumer has "
                "sent its contribution.",
                "Order the tensors so that each comes after every tensor that consumes it: the "
                "reverse of a depth-first post-order from root (a topological order). Keep the "
                "pending gradients in a dict keyed by id(tensor), and add into it.",
                "order = reversed post-order of a DFS from root over t.op.inputs\n"
                "pending = {id(root): grad}\nfor t in order:\n    g = pending.pop(id(t))\n"
                "    if t.op is None: t.grad = g if t.grad is None else t.grad + g\n"
                "    else: for p, gp in zip(t.op.inputs, t.op.backward(g)): "
                "pending[id(p)] += gp  (skip None and not p.requires_grad)",
            ),
            "zh": (
                "笔记 10.2：若一个变量被多处分支使用，来自所有分支的梯度相加。所以一个张量的 op "
                "只有在所有使用它的运算都送来贡献之后，才能执行 backward。",
                "把张量排序，使每个张量排在所有使用它的张量之后：从 root 做深度优先后序遍历再反转"
                "（拓扑序）。用以 id(tensor) 为键的字典保存待处理的梯度，并在其中相加。",
                "order = 从 root 沿 t.op.inputs 做 DFS 后序，再反转\n"
                "pending = {id(root): grad}\nfor t in order:\n    g = pending.pop(id(t))\n"
                "    若 t.op is None：t.grad = g if t.grad is None else t.grad + g\n"
                "    否则：for p, gp in zip(t.op.inputs, t.op.backward(g))："
                "pending[id(p)] += gp（跳过 None 与 not p.requires_grad）",
            ),
        },
        (Function("run_backward", "root, grad", "root: Tensor, grad: array of root's shape"),),
        ("autograd.tensor:_topological_order", "autograd.tensor:run_backward"),
    ),
    Exercise(
        5,
        "softmax",
        "7.3, 10.6",
        {"en": "Softmax", "zh": "Softmax"},
        {
            "en": "a = softmax(x) over the last axis. Given the output a and g = dL/da (same "
            "shape), return dL/dx. Masked entries (x = -inf) have a = 0 and must get 0.",
            "zh": "a = softmax(x)，沿最后一个轴。已知输出 a 与 g = dL/da（同形状），返回 dL/dx。"
            "被掩码的位置（x = -inf）a = 0，梯度必须为 0。",
        },
        {
            "en": (
                "Notes 7.3: da_j/dx_k = a_j (delta_jk - a_k). Notes 10.6: "
                "dS_ij = a_ij (dA_ij - sum_r a_ir dA_ir).",
                "The Jacobian has a diagonal part diag(a) and a rank-one part -a a^T: applied "
                "to g they give a * g and -a * sum(a * g). The sum is over the last axis, kept "
                "as a size-1 axis so that it broadcasts back.",
                "return a * (g - (a * g).sum(axis=-1, keepdims=True))",
            ),
            "zh": (
                "笔记 7.3：∂a_j/∂x_k = a_j (δ_jk - a_k)。笔记 10.6："
                "S̄_ij = a_ij (Ā_ij - Σ_r a_ir Ā_ir)。",
                "Jacobian 由对角部分 diag(a) 与秩一部分 -a aᵀ 组成：作用在 g 上分别给出 a * g 与 "
                "-a * sum(a * g)。求和沿最后一个轴，保留为长度 1 的轴以便广播回去。",
                "return a * (g - (a * g).sum(axis=-1, keepdims=True))",
            ),
        },
        (Function("softmax_backward", "a, g", "a = softmax(x) (..., n), g (..., n) -> dx"),),
        ("autograd.functional:Softmax", "autograd.kernels.softmax:softmax_backward_numpy"),
    ),
    Exercise(
        6,
        "cross_entropy",
        "9.2, 10.3",
        {"en": "Log-softmax and cross-entropy", "zh": "Log-softmax 与交叉熵"},
        {
            "en": "log_softmax_backward(y, g): y = log_softmax(x) over the last axis; return "
            "dL/dx. cross_entropy_backward(logits, targets, ignore_index): L = the mean over the "
            "rows whose target is not ignore_index of -log softmax(logits)[target]; logits "
            "(N, V), targets (N,) ints; return dL/dlogits (N, V) (rows with an ignored target "
            "get 0; if every row is ignored, all 0).",
            "zh": "log_softmax_backward(y, g)：y = log_softmax(x)，沿最后一个轴；返回 dL/dx。"
            "cross_entropy_backward(logits, targets, ignore_index)：L 是目标不等于 ignore_index "
            "的各行上 -log softmax(logits)[target] 的平均；logits (N, V)，targets (N,) 为整数；"
            "返回 dL/dlogits (N, V)（目标被忽略的行为 0；全部被忽略时全为 0）。",
        },
        {
            "en": (
                "Notes 10.3: L = -l_y + ln sum_r e^(l_r), so dl_j = p_j - 1[j = y]. "
                "log_softmax: y = x - logsumexp(x), dx = g - softmax(x) sum(g).",
                "The mean over n kept rows divides every kept row's gradient by n. softmax(x) "
                "is exp(y) when you have y. Subtract 1 only at (row, target) of kept rows.",
                "log_softmax: return g - np.exp(y) * g.sum(-1, keepdims=True)\n"
                "cross_entropy: p = softmax(logits); p[kept rows, targets] -= 1; "
                "return p * kept[:, None] / max(n_kept, 1)",
            ),
            "zh": (
                "笔记 10.3：L = -ℓ_y + ln Σ_r e^(ℓ_r)，故 ℓ̄_j = p_j - 1[j = y]。"
                "log_softmax：y = x - logsumexp(x)，dx = g - softmax(x) sum(g)。",
                "对 n 个保留行取平均，会把每个保留行的梯度除以 n。已知 y 时 softmax(x) 就是 "
                "exp(y)。只在保留行的 (行, 目标) 位置减 1。",
                "log_softmax: return g - np.exp(y) * g.sum(-1, keepdims=True)\n"
                "cross_entropy: p = softmax(logits); p[保留行, targets] -= 1; "
                "return p * kept[:, None] / max(n_kept, 1)",
            ),
        },
        (
            Function("log_softmax_backward", "y, g", "y = log_softmax(x) (..., n), g -> dx"),
            Function(
                "cross_entropy_backward",
                "logits, targets, ignore_index=-100",
                "logits (N, V), targets (N,) int -> dlogits (N, V)",
            ),
        ),
        (
            "autograd.functional:LogSoftmax",
            "autograd.kernels.softmax:log_softmax_backward_numpy",
            "autograd.functional:CrossEntropy",
        ),
        "import numpy as np\n",
    ),
    Exercise(
        7,
        "layer_norm",
        "8.4, 10.8",
        {"en": "LayerNorm", "zh": "LayerNorm"},
        {
            "en": "y = (x - mean) / sqrt(var + eps) * w + b over the last axis, population "
            "variance; x (..., C), w and b (C,). Given g = dL/dy, return (dx, dw, db).",
            "zh": "y = (x - mean) / sqrt(var + eps) * w + b，沿最后一个轴，总体方差；x (..., C)，"
            "w 与 b (C,)。已知 g = dL/dy，返回 (dx, dw, db)。",
        },
        {
            "en": (
                "Notes 10.8: s = sqrt(v + eps), xhat = (x - mu) / s, u = g * w: "
                "dx = (u - mean(u) - xhat mean(u xhat)) / s;  dw = g xhat, db = g, summed over "
                "rows.",
                "mean and var depend on every x of the row: that is where mean(u) and "
                "xhat mean(u xhat) come from. dw and db have shape (C,): sum over every leading "
                "axis.",
                "mu = x.mean(-1, keepdims=True); s = sqrt(((x-mu)**2).mean(-1, keepdims=True) + eps)"
                "\nxhat = (x - mu) / s; u = g * w\n"
                "dx = (u - u.mean(-1, keepdims=True) - xhat * (u * xhat).mean(-1, keepdims=True))"
                " / s\ndw = (g * xhat) summed over rows; db = g summed over rows",
            ),
            "zh": (
                "笔记 10.8：s = √(v + ε)，x̂ = (x - μ) / s，u = g ⊙ γ："
                "x̄ = [u - mean(u) - x̂ mean(u ⊙ x̂)] / s；γ̄ = g ⊙ x̂，β̄ = g，多行时相加。",
                "均值与方差依赖同一行的每个 x：mean(u) 与 x̂ mean(u x̂) 两项由此而来。dw 与 db 的"
                "形状为 (C,)：对所有前导轴求和。",
                "mu = x.mean(-1, keepdims=True); s = sqrt(((x-mu)**2).mean(-1, keepdims=True) + eps)"
                "\nxhat = (x - mu) / s; u = g * w\n"
                "dx = (u - u.mean(-1, keepdims=True) - xhat * (u * xhat).mean(-1, keepdims=True))"
                " / s\ndw = (g * xhat) 对各行求和; db = g 对各行求和",
            ),
        },
        (
            Function(
                "layer_norm_backward",
                "x, w, g, eps",
                "x (..., C), w (C,), g (..., C), eps: float -> (dx, dw, db)",
            ),
        ),
        ("autograd.functional:LayerNorm", "autograd.kernels.layernorm:layer_norm_backward_numpy"),
        "import numpy as np\n",
    ),
    Exercise(
        8,
        "embedding",
        "2.1, 10.9",
        {"en": "Embedding and gather with repeated ids", "zh": "嵌入查表、gather 与重复的 id"},
        {
            "en": "X = E[idx]: the rows of E (V, C) for integer ids idx of any shape. Given "
            "g = dL/dX (idx.shape + (C,)), return dE (V, C). An id that occurs several times "
            "receives the sum of the gradients of all its occurrences. gather_backward(index, g, shape, "
            "axis): out = np.take_along_axis(x, index, axis) for x of `shape`, index and g of one "
            "shape (equal to x's except along axis); return dx: again, a repeated index adds.",
            "zh": "X = E[idx]：按任意形状的整数 id 取 E (V, C) 的行。已知 g = dL/dX（形状 "
            "idx.shape + (C,)），返回 dE (V, C)。出现多次的 id 收到它所有出现处梯度之和。"
            "gather_backward(index, g, shape, axis)：out = np.take_along_axis(x, index, axis)，x 的形状为 "
            "shape，index 与 g 同形状（除 axis 外与 x 相同）；返回 dx：同样，重复的索引相加。",
        },
        {
            "en": (
                "Notes 10.9: dE[w, :] = sum over i with t_i = w of dX[i, :]. gather is the same "
                "along any axis: dx[..., index[..., j], ...] += g[..., j, ...].",
                "Flatten idx to (n,) and g to (n, C). dE[idx] += g does NOT add repeats (numpy "
                "buffers the fancy index: the last write wins); np.add.at does. gather: the full "
                "coordinates of g's elements are np.indices(g.shape) with index put in along "
                "axis; np.put_along_axis does not add repeats either.",
                "dE = np.zeros((vocab_size, C)); np.add.at(dE, idx.ravel(), g.reshape(-1, C)); "
                "return dE\ngather: coords = list(np.indices(g.shape, sparse=True)); "
                "coords[axis] = index; dx = np.zeros(shape); np.add.at(dx, tuple(coords), g)",
            ),
            "zh": (
                "笔记 10.9：Ē_{w,:} = Σ_{i: t_i = w} X̄_{i,:}。gather 沿任意轴都一样："
                "dx[..., index[..., j], ...] += g[..., j, ...]。",
                "把 idx 展平为 (n,)，g 展平为 (n, C)。dE[idx] += g 不会累加重复的 id（numpy 对花式"
                "索引做缓冲：最后一次写入生效）；np.add.at 会。gather：g 中元素的完整坐标是 "
                "np.indices(g.shape)，并在 axis 上换成 index；np.put_along_axis 同样不会累加重复。",
                "dE = np.zeros((vocab_size, C)); np.add.at(dE, idx.ravel(), g.reshape(-1, C)); "
                "return dE\ngather: coords = list(np.indices(g.shape, sparse=True)); "
                "coords[axis] = index; dx = np.zeros(shape); np.add.at(dx, tuple(coords), g)",
            ),
        },
        (
            Function(
                "embedding_backward",
                "idx, g, vocab_size",
                "idx int (...), g (..., C), vocab_size: int -> dE (vocab_size, C)",
            ),
            Function(
                "gather_backward",
                "index, g, shape, axis",
                "index int and g of one shape, shape of x, axis >= 0 -> dx of shape",
            ),
        ),
        (
            "autograd.functional:Embedding",
            "autograd.kernels.embedding:embedding_backward_numpy",
            "autograd.functional:Gather",
        ),
        "import numpy as np\n",
    ),
    Exercise(
        9,
        "attention",
        "7.4, 10.5-10.7",
        {"en": "Causal attention's backward", "zh": "因果注意力的反向传播"},
        {
            "en": "O = softmax(S) V with S = Q K^T / sqrt(D) on the allowed set (allowed: a "
            "boolean (Tq, Tk) array, the causal mask j <= i or any other; S = -inf elsewhere). "
            "q (B, H, Tq, D), k (B, H, Tk, D), v (B, H, Tk, Dv), g = dL/dO (B, H, Tq, Dv). "
            "Return (dq, dk, dv). Recompute A from q and k (the engine keeps only O).",
            "zh": "O = softmax(S) V，S = Q Kᵀ / √D 只在允许集合上（allowed：布尔数组 (Tq, Tk)，因果"
            "掩码 j <= i 或其他；其余位置 S = -inf）。q (B, H, Tq, D)，k (B, H, Tk, D)，"
            "v (B, H, Tk, Dv)，g = dL/dO (B, H, Tq, Dv)。返回 (dq, dk, dv)。由 q 与 k 重新算出 A"
            "（引擎只保存 O）。",
        },
        {
            "en": (
                "Notes 10.5: dV = A^T dZ, dA = dZ V^T. 10.6: dS_ij = a_ij (dA_ij - sum_r a_ir "
                "dA_ir), and 0 at forbidden positions. 10.7: dQ = dS K / sqrt(d_k), "
                "dK = dS^T Q / sqrt(d_k).",
                "Transpose only the last two axes (x.swapaxes(-1, -2)): the batch and head axes "
                "stay. A is 0 off the allowed set, so dS = A * (...) is 0 there by itself; the "
                "mask must be in the recomputed scores.",
                "s = where(allowed, q @ k^T / sqrt(D), -inf); a = softmax(s)\n"
                "dv = a^T @ g; da = g @ v^T; ds = softmax_backward(a, da) / sqrt(D)\n"
                "return ds @ k, ds^T @ q, dv",
            ),
            "zh": (
                "笔记 10.5：V̄ = Aᵀ Z̄，Ā = Z̄ Vᵀ。10.6：S̄_ij = a_ij (Ā_ij - Σ_r a_ir Ā_ir)，禁止位置"
                "为 0。10.7：Q̄ = S̄ K / √d_k，K̄ = S̄ᵀ Q / √d_k。",
                "只转置最后两个轴（x.swapaxes(-1, -2)）：批与头的轴不动。A 在允许集合之外为 0，所以 "
                "dS = A * (...) 在那里自然为 0；掩码必须放在重新计算的分数里。",
                "s = where(allowed, q @ kᵀ / √D, -inf); a = softmax(s)\n"
                "dv = aᵀ @ g; da = g @ vᵀ; ds = softmax_backward(a, da) / √D\n"
                "return ds @ k, dsᵀ @ q, dv",
            ),
        },
        (
            Function(
                "attention_backward",
                "q, k, v, g, allowed",
                "q (B,H,Tq,D), k (B,H,Tk,D), v (B,H,Tk,Dv), g (B,H,Tq,Dv), allowed bool (Tq,Tk)"
                " -> (dq, dk, dv)",
            ),
        ),
        ("autograd.functional:_attention_vjp", "autograd.functional:MaskedAttention"),
        "import math\n\nimport numpy as np\n\n"
        "from ex05_softmax import softmax_backward  # yours, from exercise 5\n",
    ),
    Exercise(
        10,
        "adamw",
        "10.1",
        {"en": "The AdamW step", "zh": "AdamW 的一步更新"},
        {
            "en": "One AdamW step for one parameter p with gradient g. m, v: the moment "
            "estimates (zeros before step 1); t: the step number from 1; betas = (b1, b2). "
            "Return the new (p, m, v) as new arrays. Decoupled weight decay: p shrinks by "
            "lr * weight_decay * p, the decay never enters m or v.",
            "zh": "参数 p、梯度 g 的一步 AdamW。m、v：矩估计（第 1 步之前为 0）；t：从 1 开始的步数；"
            "betas = (b1, b2)。以新数组返回新的 (p, m, v)。解耦的权重衰减：p 缩小 "
            "lr * weight_decay * p，衰减不进入 m 或 v。",
        },
        {
            "en": (
                "Notes 10.1: gradient descent is the update rule; Adam-type methods adjust it "
                "with the gradients' history. m = b1 m + (1 - b1) g, v = b2 v + (1 - b2) g^2, "
                "bias-corrected by 1 - b^t.",
                "Everything is elementwise, p, g, m, v of one shape. The decay multiplies p by "
                "(1 - lr * weight_decay) before the Adam step; eps is added after the sqrt.",
                "p = p * (1 - lr * wd); m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g*g\n"
                "p = p - lr * (m / (1 - b1**t)) / (sqrt(v / (1 - b2**t)) + eps)\n"
                "return p, m, v",
            ),
            "zh": (
                "笔记 10.1：梯度下降是更新规则；Adam 类方法再使用梯度的历史统计量调整更新。"
                "m = b1 m + (1 - b1) g，v = b2 v + (1 - b2) g²，再除以 1 - bᵗ 做偏差修正。",
                "全部是逐元素运算，p、g、m、v 形状相同。衰减在 Adam 更新之前把 p 乘以 "
                "(1 - lr * weight_decay)；eps 加在开方之后。",
                "p = p * (1 - lr * wd); m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g*g\n"
                "p = p - lr * (m / (1 - b1**t)) / (sqrt(v / (1 - b2**t)) + eps)\n"
                "return p, m, v",
            ),
        },
        (
            Function(
                "adamw_step",
                "p, g, m, v, t, lr, betas, eps, weight_decay",
                "p, g, m, v of one shape; t >= 1 -> (p, m, v)",
            ),
        ),
        ("nn.optim:Adam._update",),
        "import numpy as np\n",
    ),
)

BY_NUMBER = {e.number: e for e in EXERCISES}
CAPSTONE = len(EXERCISES) + 1  # `check DIR 11` (or `capstone`): every piece at once
