"""Every sentence the track prints, in English and Chinese: `say(key, lang, **values)`."""

from __future__ import annotations

import locale
import os

LANGS = ("en", "zh")

MESSAGES: dict[str, dict[str, str]] = {
    # --- grading ---
    "pass": {"en": "exercise {n} ({title}): PASS", "zh": "练习 {n}（{title}）：通过"},
    "fail": {"en": "exercise {n} ({title}): FAIL", "zh": "练习 {n}（{title}）：未通过"},
    "missing_file": {
        "en": "{file} is missing from the workspace (run `start` first)",
        "zh": "工作区里没有 {file}（请先运行 `start`）",
    },
    "missing_function": {
        "en": "{file} defines no function {name}",
        "zh": "{file} 中没有定义函数 {name}",
    },
    "import_error": {
        "en": "{file} cannot be imported: {error}",
        "zh": "无法导入 {file}：{error}",
    },
    "stub": {
        "en": "{name} is not written yet (it raises NotImplementedError)",
        "zh": "{name} 还没有写（它抛出 NotImplementedError）",
    },
    "raised": {"en": "{name} raised {error}", "zh": "{name} 抛出了 {error}"},
    "changed_input": {
        "en": "{name} changed its argument {n} ({arg}) in place: {rule}",
        "zh": "{name} 原地修改了它的第 {n} 个参数（{arg}）：{rule}",
    },
    "rule_vjp": {
        "en": "a VJP must leave its inputs alone",
        "zh": "VJP 不能改动它的输入",
    },
    "rule_step": {
        "en": "the optimizer step must return new arrays (p, m, v) and leave the ones it was "
        "given alone",
        "zh": "优化器的一步必须返回新的数组 (p, m, v)，不能改动传给它的数组",
    },
    "returned_none": {
        "en": "{name} returned None: a `return` is missing (or returns nothing)",
        "zh": "{name} 返回了 None：缺少 `return`（或 return 后面没有值）",
    },
    "earlier_exercise": {
        "en": "the cause is likely exercise {n} ({title}): this file imports your {names} from "
        "{file}, and exercise {n} does not pass (`python -m models.learn check {dir} {n}`)",
        "zh": "原因很可能在练习 {n}（{title}）：这个文件从 {file} 导入了你的 {names}，而练习 {n} "
        "没有通过（`python -m models.learn check {dir} {n}`）",
    },
    "case": {
        "en": "failing case: {case} (inputs {shapes})",
        "zh": "未通过的用例：{case}（输入 {shapes}）",
    },
    "probe": {
        "en": "{name}{args}: {part} differs; worst element {index}: expected {expected:.10g}, "
        "got {got:.10g}",
        "zh": "{name}{args}：{part}不对；最差元素 {index}：应为 {expected:.10g}，得到 {got:.10g}",
    },
    "shape": {
        "en": "{name}{args}: {part} has shape {got}, expected {expected}",
        "zh": "{name}{args}：{part} 的形状是 {got}，应为 {expected}",
    },
    "diagnosis": {"en": "diagnosis: {text}", "zh": "诊断：{text}"},
    # --- diagnoses of classic mistakes ---
    "d_sign": {"en": "{part} has the wrong sign", "zh": "{part} 的符号反了"},
    "d_factor": {
        "en": "{part} is off by a constant factor {factor:.6g}",
        "zh": "{part} 差一个常数因子 {factor:.6g}",
    },
    "d_missing_mean": {
        "en": "{part} is missing 1/N (N = {value}): the loss is the mean over the N kept rows, "
        "so every kept row's gradient is divided by N",
        "zh": "{part} 缺少 1/N（N = {value}）：损失是 N 个保留行的平均，所以每个保留行的梯度都要"
        "除以 N",
    },
    "d_missing_scale": {
        "en": "{part} is missing 1/√d (d = {value}): the scores are q kᵀ / √d, so dS carries "
        "the 1/√d into dq and dk (notes 10.7)",
        "zh": "{part} 缺少 1/√d（d = {value}）：分数是 q kᵀ / √d，所以 dS 要把 1/√d 带进 dq 与 dk"
        "（笔记 10.7）",
    },
    "d_swapped": {
        "en": "the two gradients are swapped: return (dA, dB) in the inputs' order, dA = g Bᵀ "
        "first, then dB = Aᵀ g",
        "zh": "两个梯度的顺序反了：按输入的顺序返回 (dA, dB)，先 dA = g Bᵀ，再 dB = Aᵀ g",
    },
    "d_unbroadcast_wrong_axes": {
        "en": "the wrong axes were summed: numpy lines shapes up from the right, so the axes "
        "broadcasting added are the first lead = grad.ndim - len(shape), and shape's axis i is "
        "grad's axis lead + i",
        "zh": "求和的轴不对：numpy 从右边对齐形状，所以广播添加的是前 lead = grad.ndim - len(shape)"
        " 个轴，shape 的第 i 个轴是 grad 的第 lead + i 个轴",
    },
    "d_keepdims_dropped": {
        "en": "{part} has the right numbers but lost its size-1 axes: keep the summed axes "
        "(keepdims=True, or reshape to the input's shape)",
        "zh": "{part} 的数值对，但丢了长度为 1 的轴：保留求和的轴（keepdims=True，或 reshape 回"
        "输入的形状）",
    },
    "d_reduced_axes_not_put_back": {
        "en": "the reduced axes were not put back: without keepdims, g lacks the summed axes; "
        "reshape g with size 1 on them before broadcasting it to the input's shape",
        "zh": "没有把被归约的轴放回去：没有 keepdims 时 g 缺少被求和的轴；先把这些轴以长度 1 "
        "reshape 回去，再广播到输入的形状",
    },
    "d_softmax_wrong_axis": {
        "en": "the sum runs over the wrong axis: softmax normalises each row over the last axis, "
        "so sum(a g) is over axis=-1 (keepdims=True)",
        "zh": "求和的轴不对：softmax 沿最后一个轴对每一行归一化，所以 sum(a g) 沿 axis=-1"
        "（keepdims=True）",
    },
    "d_softmax_whole_array": {
        "en": "the sum runs over the whole array: softmax and log-softmax normalise each row "
        "on its own (axis=-1, keepdims=True)",
        "zh": "求和遍及整个数组：softmax 与 log-softmax 对每一行分别归一化（axis=-1，"
        "keepdims=True）",
    },
    "d_ln_no_xhat_term": {
        "en": "the term from the variance is missing: dx = (u - mean(u) - xhat * mean(u xhat)) "
        "/ s; the variance depends on every x of the row too (notes 10.8)",
        "zh": "缺少来自方差的那一项：dx = (u - mean(u) - x̂ mean(u x̂)) / s；方差同样依赖同一行的"
        "每个 x（笔记 10.8）",
    },
    "d_ln_no_mean_term": {
        "en": "the term from the mean is missing: dx = (u - mean(u) - xhat * mean(u xhat)) / s; "
        "the mean depends on every x of the row too (notes 10.8)",
        "zh": "缺少来自均值的那一项：dx = (u - mean(u) - x̂ mean(u x̂)) / s；均值同样依赖同一行的"
        "每个 x（笔记 10.8）",
    },
    "d_ln_eps_outside_sqrt": {
        "en": "eps is outside the square root: s = sqrt(var + eps), as in the forward pass",
        "zh": "eps 放在了平方根外面：s = sqrt(var + eps)，与前向传播一致",
    },
    "d_gather_axis": {
        "en": "the gather's axis was ignored (the last axis used): index runs along `axis`; "
        "put it in the coordinates at that axis",
        "zh": "忽略了 gather 的轴（用了最后一个轴）：index 沿 `axis` 取值；把它放进该轴的坐标",
    },
    "d_mask_times_zero": {
        "en": "the scores were masked by multiplying by 0: a score of 0 still gets weight "
        "(e^0 = 1); a forbidden score must be -inf (np.where(allowed, s, -np.inf))",
        "zh": "用乘以 0 来做掩码：分数 0 仍然有权重（e^0 = 1）；禁止位置的分数必须是 -inf"
        "（np.where(allowed, s, -np.inf)）",
    },
    "d_dot_t_on_4d": {
        "en": ".T on a 4-D array reverses all four axes (B, H, T, D -> D, T, H, B): transpose "
        "only the last two with x.swapaxes(-1, -2)",
        "zh": "对四维数组用 .T 会反转全部四个轴（B, H, T, D -> D, T, H, B）：只转置最后两个轴，"
        "用 x.swapaxes(-1, -2)",
    },
    "d_decay_after_step": {
        "en": "the decay was applied after the Adam step: decay p first, p *= 1 - lr * "
        "weight_decay, then take the step from the decayed p",
        "zh": "衰减放在了 Adam 更新之后：应先衰减 p，p *= 1 - lr * weight_decay，再从衰减后的 p "
        "做更新",
    },
    "d_transposed": {
        "en": "{part} is transposed (swap the factors' order and transposes: dA = g Bᵀ, not Bᵀ g "
        "or g B)",
        "zh": "{part} 转置了（检查乘法顺序与转置：dA = g Bᵀ，不是 Bᵀ g 或 g B）",
    },
    "d_not_summed": {
        "en": "the broadcast was not summed back: {part} must have the input's shape; sum over "
        "the dimensions broadcasting added or stretched",
        "zh": "广播没有求和回去：{part} 必须与输入同形状；对广播添加或拉伸的维度求和",
    },
    "d_softmax_no_diagonal": {
        "en": "the softmax Jacobian's diagonal term is missing: dx = a * (g - sum(a g)), the "
        "a * g part comes from delta_jk",
        "zh": "缺少 softmax Jacobian 的对角项：dx = a * (g - sum(a g))，其中 a * g 来自 δ_jk",
    },
    "d_softmax_only_diagonal": {
        "en": "only the softmax Jacobian's diagonal term: the rank-one term -a * sum(a g) "
        "(every entry of the row competes) is missing",
        "zh": "只有 softmax Jacobian 的对角项：缺少秩一项 -a * sum(a g)（同一行的候选相互竞争）",
    },
    "d_not_accumulated": {
        "en": "repeated indices are not accumulated: an id used twice must receive the sum "
        "(dE[idx] += g keeps only the last write; use np.add.at)",
        "zh": "重复的索引没有累加：出现两次的 id 必须收到两份之和（dE[idx] += g 只保留最后一次写"
        "入；请用 np.add.at）",
    },
    "d_mask_gradient": {
        "en": "the mask's positions were given gradient: scores outside the allowed set are "
        "-inf, their weights 0, their gradient 0 (notes 7.4, 10.6)",
        "zh": "掩码位置得到了梯度：允许集合之外的分数是 -inf，权重为 0，梯度为 0（笔记 7.4、10.6）",
    },
    "d_ties_not_split": {
        "en": "ties: every tied maximum got the whole gradient; they must share it evenly",
        "zh": "并列：每个并列的最大值都得到了全部梯度；它们应当平分",
    },
    "d_ties_first_only": {
        "en": "ties: only one of the tied maxima got the gradient; they must share it evenly",
        "zh": "并列：只有一个并列的最大值得到了梯度；它们应当平分",
    },
    "d_tanh_twice": {
        "en": "tanh applied to y again: y is already tanh(x), so dx = g (1 - y²)",
        "zh": "对 y 又取了一次 tanh：y 已经是 tanh(x)，所以 dx = g (1 - y²)",
    },
    "d_log_softmax_no_sum": {
        "en": "log_softmax: the sum over the row is missing: dx = g - softmax(x) * sum(g), "
        "not g - softmax(x) * g",
        "zh": "log_softmax：缺少对整行的求和：dx = g - softmax(x) * sum(g)，不是 "
        "g - softmax(x) * g",
    },
    "d_ignored_rows": {
        "en": "rows whose target is ignore_index got gradient (they are not in the loss)",
        "zh": "目标为 ignore_index 的行得到了梯度（它们不在损失里）",
    },
    "d_mean_over_all_rows": {
        "en": "the mean divides by all rows: it is over the kept rows only",
        "zh": "平均除以了全部行数：应只对保留的行取平均",
    },
    "d_constant_statistics": {
        "en": "mean and variance were treated as constants: they depend on every x of the row, "
        "which adds -mean(u) - xhat * mean(u xhat) (notes 10.8)",
        "zh": "把均值和方差当成了常数：它们依赖同一行的每个 x，因而多出 -mean(u) - x̂ mean(u x̂) "
        "两项（笔记 10.8）",
    },
    "d_no_bias_correction": {
        "en": "no bias correction: divide m by 1 - b1^t and v by 1 - b2^t",
        "zh": "没有偏差修正：m 要除以 1 - b1ᵗ，v 要除以 1 - b2ᵗ",
    },
    "d_l2_decay": {
        "en": "the weight decay went into the gradient (Adam's L2): AdamW decays p directly, "
        "p *= 1 - lr * weight_decay",
        "zh": "权重衰减被加进了梯度（Adam 的 L2）：AdamW 直接衰减 p，p *= 1 - lr * weight_decay",
    },
    "d_decay_without_lr": {
        "en": "the decay is not scaled by lr: p *= 1 - lr * weight_decay",
        "zh": "衰减没有乘以 lr：p *= 1 - lr * weight_decay",
    },
    "d_eps_inside_sqrt": {
        "en": "eps is inside the square root: sqrt(v_hat) + eps",
        "zh": "eps 放进了平方根里：应为 sqrt(v_hat) + eps",
    },
    "d_loop_not_accumulated": {
        "en": "a tensor used twice kept only one contribution: gradients of all branches add "
        "(notes 10.2)",
        "zh": "被使用两次的张量只保留了一份贡献：所有分支的梯度相加（笔记 10.2）",
    },
    "d_loop_order": {
        "en": "an op ran backward before all its output's gradient had arrived: visit the "
        "tensors in topological order, every consumer before what it consumes",
        "zh": "某个运算在它输出的梯度全部到达之前就执行了 backward：按拓扑序访问张量，使用者在"
        "被使用者之前",
    },
    "d_loop_twice": {
        "en": "an op's backward ran more than once in one pass (once per path): the result can "
        "be right, but the cost grows with the number of paths; accumulate, then run it once",
        "zh": "同一次反向传播中某个运算的 backward 运行了不止一次（每条路径一次）：结果可能正确，"
        "但代价随路径数增长；先累加，再只运行一次",
    },
    "d_leaf_overwritten": {
        "en": "a leaf's .grad was overwritten by a second backward: it must accumulate (+=)",
        "zh": "第二次 backward 覆盖了叶子的 .grad：应当累加（+=）",
    },
    "loop_probe": {
        "en": "{probe}: expected x.grad = {expected}, got {got}",
        "zh": "{probe}：x.grad 应为 {expected}，得到 {got}",
    },
    # --- capstone ---
    "capstone": {"en": "capstone", "zh": "综合练习"},
    "capstone_no_hint": {
        "en": "the capstone has no code of its own: it runs your ten pieces together (hints and "
        "solutions are per exercise, 1-10)",
        "zh": "综合练习没有自己的代码：它把你的十个部件一起运行（提示与答案按练习给出，1-10）",
    },
    "capstone_needs": {
        "en": "the capstone runs every piece at once: pass exercises {missing} first",
        "zh": "综合练习同时运行所有部件：请先通过练习 {missing}",
    },
    "capstone_ch11": {
        "en": "notes ch. 11 on your pieces: L {before:.6f} -> {after:.6f} after one step (the "
        "notes: 2.541928 -> 1.761382)",
        "zh": "用你的部件运行笔记第 11 章：一步之后 L {before:.6f} -> {after:.6f}（笔记："
        "2.541928 -> 1.761382）",
    },
    "capstone_demo_gpt": {
        "en": "the demo GPT (models.train's defaults)",
        "zh": "演示 GPT（models.train 的默认设置）",
    },
    "capstone_other_gpt": {"en": "a GPT of other settings", "zh": "另一种设置的 GPT"},
    "capstone_gpt_header": {
        "en": "{what}: {model}, {params:,} parameters; {source}, {tokenizer} tokenizer; batches "
        "of {batch} x {block}; AdamW, lr {lr} after {warmup} warmup steps, cosine over {total}; "
        "gradients clipped at {clip}; float64, eager. Its first {steps} steps on your pieces "
        "beside glassgrad's own:",
        "zh": "{what}：{model}，{params:,} 个参数；{source}，{tokenizer} 分词器；批次 {batch} x "
        "{block}；AdamW，学习率 {lr}，预热 {warmup} 步，余弦衰减共 {total} 步；梯度裁剪到 {clip}；"
        "float64，即时执行。用你的部件与 glassgrad 自己的并排训练前 {steps} 步：",
    },
    "capstone_gpt_columns": {
        "en": "   step  your loss         glassgrad's loss  difference",
        "zh": "    步   你的损失          glassgrad 的损失  差",
    },
    "capstone_gpt": {
        "en": "{what}, {params:,} parameters, trained {steps} steps on your pieces: its losses "
        "equal glassgrad's to {worst:.1e} (float64; bar {bar:.0e}); loss {first:.6f} -> "
        "{last:.6f}",
        "zh": "{what}，{params:,} 个参数，用你的部件训练 {steps} 步：损失与 glassgrad 的相差 "
        "{worst:.1e}（float64；要求 {bar:.0e}）；损失 {first:.6f} -> {last:.6f}",
    },
    "capstone_gpt_diverged": {
        "en": "the first step that differs is {step}: your loss {got:.12g}, glassgrad's "
        "{expected:.12g} (difference {diff:.1e}, bar {bar:.0e})",
        "zh": "第一个不同的步是第 {step} 步：你的损失 {got:.12g}，glassgrad 的 {expected:.12g}"
        "（相差 {diff:.1e}，要求 {bar:.0e}）",
    },
    "capstone_gpt_raised": {
        "en": "step {step} of the demo GPT raised {error}",
        "zh": "演示 GPT 的第 {step} 步抛出了 {error}",
    },
    "capstone_cause": {
        "en": "likely cause: exercise {n} ({title}): its pieces alone, the rest glassgrad's, "
        "move glassgrad's number there by {effect:.1e}",
        "zh": "可能的原因：练习 {n}（{title}）：只换上它的部件（其余用 glassgrad 的），glassgrad 的"
        "数值在这里就偏离 {effect:.1e}",
    },
    "capstone_cause_raises": {
        "en": "likely cause: exercise {n} ({title}): its pieces alone, the rest glassgrad's, "
        "raise there",
        "zh": "可能的原因：练习 {n}（{title}）：只换上它的部件（其余用 glassgrad 的），这里就会"
        "抛出异常",
    },
    "capstone_cause_grown": {
        "en": " (under the bar in one step, the difference grew over the steps before; the next "
        "most, exercise {n}, moves it by {effect:.1e})",
        "zh": "（单步未超出要求，差异是之前许多步累积的；影响第二大的练习 {n} 偏离 {effect:.1e}）",
    },
    # --- the CLI ---
    "started": {
        "en": "wrote {count} exercises to {dir}; read {dir}/README.md, then "
        "`python -m models.learn check {dir} 1`",
        "zh": "已将 {count} 个练习写入 {dir}；先读 {dir}/README.md，然后运行 "
        "`python -m models.learn check {dir} 1`",
    },
    "exists": {
        "en": "{path} exists: not overwritten (your work is kept)",
        "zh": "{path} 已存在：未覆盖（保留你的代码）",
    },
    "hint": {"en": "hint {level} of 3 for exercise {n}:", "zh": "练习 {n} 的提示（{level}/3）："},
    "no_more_hints": {
        "en": "that was the last hint; `python -m models.learn solution {dir} {n}` shows "
        "glassgrad's own code",
        "zh": "这是最后一条提示；`python -m models.learn solution {dir} {n}` 会显示 "
        "glassgrad 自己的代码",
    },
    "solution_locked": {
        "en": "exercise {n}'s solution opens after you pass it or read its last hint "
        "(`hint DIR {n}` three times)",
        "zh": "练习 {n} 的答案在你通过它或读完最后一条提示（`hint DIR {n}` 三次）之后开放",
    },
    "solution_reference": {
        "en": "# the reference solution, in your file's signature",
        "zh": "# 参考答案，与你的文件同一签名",
    },
    "solution_engine": {
        "en": "# glassgrad's own code ({where})",
        "zh": "# glassgrad 自己的代码（{where}）",
    },
    "status_line": {
        "en": "{mark} {n:>2}. {title} (notes {sections}){extra}",
        "zh": "{mark} {n:>2}. {title}（笔记 {sections}）{extra}",
    },
    "status_hints": {"en": ", {count} hint(s) read", "zh": "，已读 {count} 条提示"},
    "status_summary": {
        "en": "{passed} of {total} passed",
        "zh": "已通过 {passed} / {total}",
    },
    "not_a_workspace": {
        "en": "{dir} is not a workspace (no .learn.json): run `python -m models.learn start {dir}`",
        "zh": "{dir} 不是工作区（没有 .learn.json）：请运行 `python -m models.learn start {dir}`",
    },
    "unknown_exercise": {
        "en": "no exercise {n}: exercises are 1-{last}, {capstone} is the capstone",
        "zh": "没有练习 {n}：练习为 1-{last}，{capstone} 是综合练习",
    },
}


def say(key: str, lang: str, **values) -> str:
    return MESSAGES[key][lang].format(**values)


def default_lang() -> str:
    """zh when the locale (LC_ALL, LC_MESSAGES, LANG, or Python's) is Chinese, else en."""
    for name in ("LC_ALL", "LC_MESSAGES", "LANG"):
        if os.environ.get(name):
            return "zh" if os.environ[name].lower().startswith("zh") else "en"
    found = locale.getlocale()[0] or ""
    return "zh" if found.lower().startswith(("zh", "chinese")) else "en"
