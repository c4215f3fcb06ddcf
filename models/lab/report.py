"""The lab's output: PNG plots, results.json, and one self-contained bilingual HTML report.

The page follows the lesson page's approach (autograd/viz/lesson.py): every sentence is a `Text`
(English, Chinese), both are written into the page, and a switch shows one (`#lang=zh` in the
address; the default is --lang). Plots are embedded as data: URIs, so the file needs no network
and no other file. The sentences that state a result are built from the figures themselves.
"""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path
from typing import Any

import numpy as np

from autograd.viz.lesson import Text, Words, words_html


def _label(token: str, token_id: int) -> str:
    """A token as a plot label: its text, or its id where the plot's font has no glyph (CJK)."""
    if token.strip() and all(ord(c) < 0x2E80 for c in token):
        return repr(token)[1:-1]
    return f"#{token_id}"


# --- plots ----------------------------------------------------------------------------------------


def plot_all(results: dict[str, Any], out: Path) -> dict[str, str]:
    """Write each experiment's PNG into out; return {experiment: file name}."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = {}
    for name, plot in (
        ("scale", _plot_scale),
        ("scale_training", _plot_training),
        ("medical", _plot_medical),
        ("attribution", _plot_attribution),
        ("progress", _plot_progress),
    ):
        key = "scale" if name == "scale_training" else name
        data = results.get(key)
        if not data or data.get("skipped") or (name == "scale_training" and "training" not in data):
            continue
        fig = plot(plt, data)
        # a fixed layout: matplotlib's automatic ones cost seconds per figure on a busy machine
        fig.subplots_adjust(left=0.07, right=0.98, bottom=0.14, top=0.88, wspace=0.3, hspace=0.45)
        fig.savefig(out / f"{name}.png", dpi=80)
        plt.close(fig)
        files[name] = f"{name}.png"
    return files


def _plot_scale(plt: Any, data: dict) -> Any:
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for i, entry in enumerate(data["models"]):
        heads = entry["heads"]
        x = np.array([h["layer"] for h in heads]) + (i - len(data["models"]) / 2) * 0.08
        ratio = [h["score_sd"] / h["sqrt_dk"] for h in heads]
        left.scatter(x, ratio, s=12, label=entry["model"])
        right.scatter(x, [h["entropy"] for h in heads], s=12, label=entry["model"])
    left.axhline(1.0, color="grey", lw=0.8, ls="--")
    left.set(xlabel="layer", ylabel="SD(q.k) / sqrt(d_k)  (one dot per head)", yscale="log")
    left.set_title("raw score scale vs the notes' sqrt(d_k) (7.1)")
    right.set(xlabel="layer", ylabel="mean attention-row entropy (nats)")
    right.set_title("how spread the attention rows are (7.3)")
    left.legend(fontsize=7)
    return fig


def _plot_training(plt: Any, data: dict) -> Any:
    runs = data["training"]["runs"]
    fig, axes = plt.subplots(1, 4, figsize=(16, 3.6))
    for scale, c in runs.items():
        axes[0].plot(c["loss"], lw=0.8, label=f"scale {scale}")
        steps = [e[0] for e in c["entropy"]]
        axes[1].plot(steps, [np.mean(e[1]) for e in c["entropy"]], marker=".", label=scale)
        axes[2].plot(c["grad_wq"], lw=0.8, label=scale)
        axes[3].plot(c["grad_wk"], lw=0.8, label=scale)
    axes[0].set(xlabel="step", ylabel="training loss (nats/char)", title="loss")
    axes[1].set(xlabel="step", ylabel="nats", title="attention entropy (held-out)")
    axes[1].ticklabel_format(axis="y", useOffset=False)
    axes[2].set(xlabel="step", ylabel="||dL/dW_Q||", yscale="log", title="gradient reaching W_Q")
    axes[3].set(xlabel="step", ylabel="||dL/dW_K||", yscale="log", title="gradient reaching W_K")
    axes[0].legend(fontsize=8)
    return fig


def _plot_medical(plt: Any, data: dict) -> Any:
    prompts = data["prompts"]
    fig, axes = plt.subplots(1, len(prompts) + 1, figsize=(15, 4))
    for ax, (lang, p) in zip(axes, prompts.items(), strict=False):
        top = p["top"]
        ax.barh(range(len(top))[::-1], [t["p"] for t in top])
        ax.set_yticks(range(len(top))[::-1], [_label(t["token"], t["id"]) for t in top])
        ax.set(xlabel="p(next token)", title=f"after the {lang} prompt (top 10)")
    kv = data["kv_cache"]
    axes[-1].plot(np.array(kv["seconds_with_cache"]) * 1e3, marker=".", label="with KV cache")
    axes[-1].plot(np.array(kv["seconds_without_cache"]) * 1e3, marker=".", label="without")
    axes[-1].set(xlabel="new token", ylabel="ms per token", title="KV cache (12.4)")
    axes[-1].legend()
    return fig


def _plot_attribution(plt: Any, data: dict) -> Any:
    """Three panels, one dot per head and case: does a large weight (or a large first-order
    attribution) go with a large measured effect?"""
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    pairs = [
        ("attention", "edge_ablation"),
        ("gradient_attribution", "edge_ablation"),
        ("attention", "head_ablation"),
    ]
    for case, marker in zip(data["cases"], "o^sDv", strict=False):
        for ax, (x, y) in zip(axes, pairs, strict=True):
            heads = case["heads"]
            ax.scatter(
                [h[x] for h in heads],
                [h[y] for h in heads],
                s=14,
                marker=marker,
                alpha=0.7,
                label=case["name"],
            )
    for ax, (x, y) in zip(axes, pairs, strict=True):
        ax.axhline(0, color="grey", lw=0.6)
        ax.set(xlabel=x.replace("_", " "), ylabel=f"{y.replace('_', ' ')} (change of log p)")
    axes[0].legend(fontsize=8)
    axes[0].set_title("one dot per head", loc="left")
    return fig


def _plot_progress(plt: Any, data: dict) -> Any:
    c = data["curves"]
    fig, axes = plt.subplots(1, 4, figsize=(15, 3.4))
    for ax, key, title in zip(
        axes,
        ("loss", "p_target", "accuracy", "attention"),
        ("loss", "p(target)", "accuracy", "attention on the source"),
        strict=True,
    ):
        ax.plot(c[key], marker=".")
        ax.set(xlabel="LoRA step", title=title)
    return fig


# --- the report's sentences -------------------------------------------------------------------


def _q(values: Any, f: str = ".3g") -> str:
    return format(float(values), f)


def scale_texts(data: dict, subject: str) -> list[tuple[str, Words]]:
    """(kind, words) rows: the figures, then what they show."""
    rows: list[tuple[str, Words]] = []
    for entry in data["models"]:
        ratio = np.array([h["score_sd"] / h["sqrt_dk"] for h in entry["heads"]])
        ent = np.array([h["entropy"] for h in entry["heads"]])
        n = len(entry["token_ids"])
        rows.append(
            (
                "figure",
                Text(
                    f"{entry['model']} ({len(ratio)} heads, {n} tokens of {entry['text']}): "
                    f"SD(q.k)/sqrt(d_k) median {_q(np.median(ratio))}, range {_q(ratio.min())} to "
                    f"{_q(ratio.max())}; {int((ratio > 2).sum())} heads above 2; mean row "
                    f"entropy {_q(ent.mean())} nats (uniform over the prefix: "
                    f"{_q(np.mean(np.log(np.arange(1, n + 1))))}).",
                    f"{entry['model']}（{len(ratio)} 个头，{entry['text']} 的 {n} 个 Token）："
                    f"SD(q·k)/√d_k 中位数 {_q(np.median(ratio))}，范围 {_q(ratio.min())} 至 "
                    f"{_q(ratio.max())}；{int((ratio > 2).sum())} 个头大于 2；行熵均值 "
                    f"{_q(ent.mean())} nats（对前缀均匀分布时为 "
                    f"{_q(np.mean(np.log(np.arange(1, n + 1))))}）。",
                ),
            )
        )
    training = data.get("training")
    if training:
        for scale, c in training["runs"].items():
            last = np.mean(c["loss"][-20:])
            ent = np.mean(c["entropy"][-1][1])
            rows.append(
                (
                    "figure",
                    Text(
                        f"demo GPT, scores x {scale}: loss {_q(c['loss'][0])} -> {_q(last)} "
                        f"(mean of the last 20 steps), held-out {_q(c['val_loss'])}; final attention "
                        f"entropy {_q(ent)} nats; median ||dL/dW_Q|| {_q(np.median(c['grad_wq']))}, "
                        f"||dL/dW_K|| {_q(np.median(c['grad_wk']))}; {_q(c['seconds'], '.0f')} s.",
                        f"演示 GPT，分数乘 {scale}：损失 {_q(c['loss'][0])} -> {_q(last)}"
                        f"（最后 20 步均值），验证集 {_q(c['val_loss'])}；最终注意力熵 {_q(ent)} nats；"
                        f"‖dL/dW_Q‖ 中位数 {_q(np.median(c['grad_wq']))}，‖dL/dW_K‖ "
                        f"{_q(np.median(c['grad_wk']))}；用时 {_q(c['seconds'], '.0f')} 秒。",
                    ),
                )
            )
    if training:
        runs = training["runs"]
        final = {k: np.mean(c["loss"][-20:]) for k, c in runs.items()}
        ent = {k: np.mean(c["entropy"][-1][1]) for k, c in runs.items()}
        gq = {k: np.median(c["grad_wq"]) for k, c in runs.items()}
        order = [f"x {k}" for k in sorted(final, key=final.get)]
        by_entropy = [f"x {k}" for k in sorted(ent, key=ent.get)]
        base = "1/sqrt(d_k)"
        rows.append(
            (
                "figure",
                Text(
                    f"In this run the final training loss (scores x factor) ranks {' < '.join(order)}; the final "
                    f"attention entropy ranks {' < '.join(by_entropy)}; the median "
                    f"gradient reaching W_Q is {gq['1'] / gq[base]:.2f}x the 1/sqrt(d_k) run's "
                    f"with scale 1 and {gq['1/d_k'] / gq[base]:.2f}x with 1/d_k.",
                    f"本次运行中（分数 x 系数），最终训练损失的顺序为 {' < '.join(order)}；最终注意力熵的顺序为 "
                    f"{' < '.join(by_entropy)}；到达 W_Q 的梯度中位数在系数为 1 时"
                    f"是 1/√d_k 那次的 {gq['1'] / gq[base]:.2f} 倍，系数为 1/d_k 时是 "
                    f"{gq['1/d_k'] / gq[base]:.2f} 倍。",
                ),
            )
        )
    rows.append(
        (
            "shows",
            Text(
                "What it shows: for trained heads the raw scores' spread is a measured number per "
                "head, and the figures above say how far it is from sqrt(d_k); the assumption of "
                "7.1 (independent, unit-variance q_r, k_r) is a statement about scale, and a "
                "trained model need not satisfy it. The three trainings change only the factor "
                "in front of q.k, with the same seed, batches and steps. What it does not show: "
                "a cause. One small model, one seed, a few hundred steps; AdamW rescales each "
                "parameter's step, so a smaller gradient through a sharp softmax (7.3) need not "
                "mean slower learning; a different learning rate could reorder the runs.",
                "说明了什么：训练后每个头原始分数的离散程度是可测的数，上面的数字给出它与 √d_k 的差距；"
                "7.1 的假设（q_r、k_r 独立、方差为 1）是关于尺度的说明，训练后的模型不必满足。三次训练"
                "只改变 q·k 前的系数，种子、批次、步数相同。不能说明什么：因果。只有一个小模型、一个种子、"
                "几百步；AdamW 会按参数重新缩放步长，所以经过尖锐 Softmax 的梯度变小（7.3）"
                "不必意味着学得更慢；换一个学习率，三次训练的顺序可能改变。",
            ),
        )
    )
    return rows


def medical_texts(data: dict, subject: str) -> list[tuple[str, Words]]:
    if data.get("skipped"):
        return [
            (
                "shows",
                Text(
                    f"Not run: {data['skipped']} (the demo GPT read only Python source). Run "
                    "with --model pointing at a pretrained model.",
                    f"未运行：{subject} 的词表无法拼写这两个提示（演示 GPT 只读过 Python 源码）。"
                    "请用 --model 指定一个预训练模型。",
                ),
            )
        ]
    rows: list[tuple[str, Words]] = []
    for lang, p in data["prompts"].items():
        top = ", ".join(f"{t['token']!r} {t['p']:.3f}" for t in p["top"][:5])
        rows.append(
            (
                "figure",
                Text(
                    f"{lang}: {p['prompt']!r} is {len(p['token_ids'])} tokens {p['tokens']}. "
                    f"Next token, top 5: {top}. The answer {p['answer']!r} "
                    f"({len(p['answer_ids'])} tokens): its first token has p = "
                    f"{p['p_answer_first_token']:.2e} (rank {p['rank_answer_first_token']}), the "
                    f"whole answer log p = {p['log_p_answer']:.2f}.",
                    f"{lang}：{p['prompt']!r} 是 {len(p['token_ids'])} 个 Token {p['tokens']}。"
                    f"下一个 Token 前 5：{top}。答案 {p['answer']!r}（{len(p['answer_ids'])} 个 "
                    f"Token）：第一个 Token 的 p = {p['p_answer_first_token']:.2e}"
                    f"（第 {p['rank_answer_first_token']} 名），整个答案 log p = "
                    f"{p['log_p_answer']:.2f}。",
                ),
            )
        )
        lines = [
            f"{q['position']:>3} {q['token']!r:>12} -> top {q['top'][0]['token']!r} "
            f"{q['top'][0]['p']:.3f}"
            + ("" if q["next_actual"] is None else f"; p(next in prompt {q['next_actual']!r}) ")
            + ("" if q["p_next_actual"] is None else f"{q['p_next_actual']:.3f}")
            for q in p["positions"]
        ]
        rows.append(("code", "\n".join(lines)))
        for c in p["continuations"]:
            rows.append(
                (
                    "code",
                    f"[{lang}, {c['decoding']}, sample {c['sample']}, stop: {c['stop']}] "
                    f"{p['prompt']}|{c['text']}",
                )
            )
    n = len(data["prompts"]["zh"]["token_ids"])
    kv = data["kv_cache"]
    with_, without = np.median(kv["seconds_with_cache"]), np.median(kv["seconds_without_cache"])
    rows.append(
        (
            "figure",
            Text(
                f"KV cache: {len(kv['token_ids'])} greedy tokens, median {with_ * 1e3:.0f} ms "
                f"per token with the cache, {without * 1e3:.0f} ms without (the whole prefix "
                f"again); the same tokens: {kv['same_tokens']}.",
                f"KV Cache：贪心生成 {len(kv['token_ids'])} 个 Token，有缓存时每个 Token 中位数 "
                f"{with_ * 1e3:.0f} ms，无缓存（每次重算整个前缀）{without * 1e3:.0f} ms；"
                f"两者 Token 相同：{kv['same_tokens']}。",
            ),
        )
    )
    rows.append(
        (
            "shows",
            Text(
                f"What it shows: what {subject} actually predicts after the notes' sentence: the "
                "figures above are the result, whatever they are. The notes' '黑便' was a "
                "hypothetical path (12.3); the rank and probability of its first token say how "
                f"far this model is from it. The prompt is {n} of this model's tokens, not the "
                "notes' five toy positions (12.5: tokens are not characters or words). What it "
                "does not show: that the model knows or does not know the pharmacology; one small "
                "model, prompted as plain text without a chat template, is measured here, not a "
                "medical system.",
                f"说明了什么：{subject} 在笔记这句话之后实际预测什么，上面的数字就是结果，无论是什么。"
                "笔记中的“黑便”只是假设的路径（12.3）；它第一个 Token 的名次与概率说明这个模型离它多远。"
                f"这句提示是该模型的 {n} 个 Token，并不是笔记玩具切分的五个位置（12.5：Token 不等于字或词）。"
                "不能说明什么：模型“懂不懂”药理；这里测的是一个以纯文本（不加聊天模板）提示的小模型，不是医疗系统。",
            ),
        )
    )
    return rows


def attribution_texts(data: dict, subject: str) -> list[tuple[str, Words]]:
    rows: list[tuple[str, Words]] = []
    for case in data["cases"]:
        heads = case["heads"]
        by_att = max(heads, key=lambda h: h["attention"])
        by_edge = max(heads, key=lambda h: abs(h["edge_ablation"]))
        by_head = max(heads, key=lambda h: abs(h["head_ablation"]))
        r = case["rank_correlations"]
        source = case["tokens"][case["source_position"]]
        rows.append(
            (
                "figure",
                Text(
                    f"{case['name']}: {case['prompt']!r} -> {case['target_token']!r} (id "
                    f"{case['target_id']}, log p {case['log_prob']:.3f}), source token "
                    f"{source!r} at position {case['source_position']}. Largest attention on it: "
                    f"layer {by_att['layer']} head {by_att['head']} ({by_att['attention']:.3f}; "
                    f"removing that edge changes log p by {by_att['edge_ablation']:+.4f}). "
                    f"Largest edge effect: layer {by_edge['layer']} head {by_edge['head']} "
                    f"({by_edge['edge_ablation']:+.4f}, attention {by_edge['attention']:.3f}). "
                    f"Largest head effect: layer {by_head['layer']} head {by_head['head']} "
                    f"({by_head['head_ablation']:+.4f}). Spearman: attention vs |edge effect| "
                    f"{r['attention_vs_abs_edge_ablation']:.2f}, |gradient attribution| vs "
                    f"|edge effect| {r['abs_gradient_attribution_vs_abs_edge_ablation']:.2f}, "
                    f"attention vs |head effect| {r['attention_vs_abs_head_ablation']:.2f}.",
                    f"{case['name']}：{case['prompt']!r} -> {case['target_token']!r}（id "
                    f"{case['target_id']}，log p {case['log_prob']:.3f}），来源 Token {source!r} "
                    f"在位置 {case['source_position']}。对它注意力最大的是第 {by_att['layer']} 层"
                    f"第 {by_att['head']} 头（{by_att['attention']:.3f}；去掉这条边 log p 变化 "
                    f"{by_att['edge_ablation']:+.4f}）。去边影响最大的是第 {by_edge['layer']} 层"
                    f"第 {by_edge['head']} 头（{by_edge['edge_ablation']:+.4f}，注意力 "
                    f"{by_edge['attention']:.3f}）。去头影响最大的是第 {by_head['layer']} 层"
                    f"第 {by_head['head']} 头（{by_head['head_ablation']:+.4f}）。Spearman 秩相关："
                    f"注意力与 |去边影响| {r['attention_vs_abs_edge_ablation']:.2f}，"
                    f"|梯度归因| 与 |去边影响| "
                    f"{r['abs_gradient_attribution_vs_abs_edge_ablation']:.2f}，注意力与 |去头影响| "
                    f"{r['attention_vs_abs_head_ablation']:.2f}。",
                ),
            )
        )
    rows.append(
        (
            "shows",
            Text(
                "What it shows: per head, three different numbers, measured on the same forward: "
                "the weight itself, its first-order effect (weight x derivative, from the "
                "engine's backward) and the effect of actually removing it. Where the rank "
                "correlations are far from 1, a large weight did not mean a large dependence, "
                "as 13.3 says. What it does not show: a circuit. Removing one edge or one head "
                "at one position is one intervention among many (other heads, the residual "
                "stream and later layers compensate or add up); three prompts are examples, not "
                "a population.",
                "说明了什么：对每个头，在同一次前向上测得三个不同的数：权重本身、它的一阶效应（权重乘导数，"
                "由引擎的反向传播算出）、以及真正去掉它的效应。秩相关离 1 越远，越说明大的注意力权重不等于"
                "大的依赖，正如 13.3 所说。不能说明什么：某个“回路”。在一个位置去掉一条边或一个头只是众多"
                "干预之一（其他头、残差流和后续层会补偿或叠加）；三个提示只是例子，不是总体。",
            ),
        )
    )
    return rows


def progress_texts(data: dict, subject: str) -> list[tuple[str, Words]]:
    c = data["curves"]
    names = ", ".join(f"{e['prompt']!r} -> {e['target_token']!r}" for e in data["examples"])
    return [
        (
            "figure",
            Text(
                f"{subject}, LoRA (rank {data['settings']['rank']}, lr "
                f"{data['settings']['lora_lr']}) on: {names}. Over {data['steps']} steps: loss "
                f"{c['loss'][0]:.3f} -> {c['loss'][-1]:.3f}, p(target) {c['p_target'][0]:.3f} -> "
                f"{c['p_target'][-1]:.3f}, accuracy {c['accuracy'][0]:.2f} -> "
                f"{c['accuracy'][-1]:.2f}, attention on the source {c['attention'][0]:.4f} -> "
                f"{c['attention'][-1]:.4f}. The loss fell in {data['loss_falls']} steps; in "
                f"{data['loss_falls_attention_falls']} of them the attention on the source fell "
                f"too, in {data['loss_falls_accuracy_not_up']} the accuracy did not rise.",
                f"{subject}，LoRA（秩 {data['settings']['rank']}，学习率 "
                f"{data['settings']['lora_lr']}），样本：{names}。{data['steps']} 步中：损失 "
                f"{c['loss'][0]:.3f} -> {c['loss'][-1]:.3f}，p(目标) {c['p_target'][0]:.3f} -> "
                f"{c['p_target'][-1]:.3f}，准确率 {c['accuracy'][0]:.2f} -> "
                f"{c['accuracy'][-1]:.2f}，对来源的注意力 {c['attention'][0]:.4f} -> "
                f"{c['attention'][-1]:.4f}。损失在 {data['loss_falls']} 步下降；其中 "
                f"{data['loss_falls_attention_falls']} 步对来源的注意力也下降，"
                f"{data['loss_falls_accuracy_not_up']} 步准确率没有上升。",
            ),
        ),
        (
            "shows",
            Text(
                "What it shows: whether, in this run, lowering the loss went with more attention "
                "on the word the answer depends on (11.6 found one step where it did not), and "
                "how often the loss fell while the discrete accuracy stood still (exercise 6). "
                "What it does not show: that attention must fall, or must rise; the attention "
                "here is an average over every head and layer, the examples are few, and the "
                "adapter can raise the target's probability through any path (values, the MLP "
                "input, the output scores), as 11.6 says.",
                "说明了什么：在这次运行中，降低损失是否伴随着对答案所依赖的词的更多注意力（11.6 "
                "中有一步并非如此），以及损失下降而离散准确率不变的次数（练习 6）。不能说明什么："
                "注意力必然下降或必然上升；这里的注意力是所有层与头的平均，样本很少，适配器可以经由任何"
                "路径（Value、MLP 输入、输出打分）提高目标概率，正如 11.6 所说。",
            ),
        ),
    ]


# --- the page ---------------------------------------------------------------------------------

CLAIMS = {  # (section, the notes' words, an English rendering)
    "scale": (
        "7.1, 7.3",
        "这是说明尺度的理想化假设，不是训练后 Q/K 的已证事实。……因而过尖锐的注意力 Softmax "
        "可能使经过它传回的梯度变小。缩放帮助控制进入 Softmax 的分数尺度。",
        "An idealised assumption that explains the scale, not a proven fact about trained Q/K. "
        "... So an over-sharp attention softmax may shrink the gradients that pass back through "
        "it. Scaling helps control the scale of the scores entering the softmax.",
    ),
    "medical": (
        "12.3",
        "这只是可能的选择路径；没有给真实模型运行结果。",
        "This is only a possible path of choices; no real model's output is given.",
    ),
    "attribution": (
        "13.3",
        "较大注意力系数表示该头对某个 Value 使用了较大系数；它不直接量化最终答案受该词影响多少。"
        "……不能在未测真实模型时声称某个头已经学到这个关系。",
        "A large attention weight says the head used that Value with a large coefficient; it does "
        "not measure how much the final answer depends on that word. ... No head may be said to "
        "have learned the relation without testing a real model.",
    ),
    "progress": (
        "11.6, 14.3 exercise 6",
        "注意力给第一个位置的比例反而下降，说明“学习进步”等于“所有看起来相关的注意力都应上升”是"
        "不成立的。……最小化 L 不等于每次都能提高准确率。",
        "The attention on the first position fell: 'learning progress' is not 'every attention "
        "that looks relevant goes up'. ... Minimising L does not mean every step raises accuracy.",
    ),
}

TITLES = {
    "scale": Text("1. Score scale", "1. 分数尺度"),
    "medical": Text("2. The medical sentence", "2. 医学句子"),
    "attribution": Text("3. Attention is not attribution", "3. 注意力不是归因"),
    "progress": Text("4. Progress without attention", "4. 没有注意力上升的进步"),
}

METHODS = {
    "scale": Text(
        "Each attention layer runs its explicit path (nn.Attention.probe): q.k is read after "
        "rotary and before the scale; score_sd is its standard deviation over every allowed "
        "(query, key) pair, entropy the attention rows' mean entropy in nats. Then the demo GPT "
        "is trained three times with the factor of q.k set to 1/sqrt(d_k), 1 and 1/d_k "
        "(nn.Attention.score_scale), the same seed, batches and steps, the compiled step, AdamW "
        "without clipping; per step the loss and the gradient norms reaching W_Q and W_K, every "
        "few steps the attention entropy on fixed held-out text.",
        "每个注意力层走显式路径（nn.Attention.probe）：在旋转位置之后、缩放之前读取 q·k；score_sd "
        "是它在所有允许的（query, key）对上的标准差，entropy 是注意力各行熵（nats）的平均。然后把"
        "演示 GPT 训练三次，q·k 的系数分别为 1/√d_k、1、1/d_k（nn.Attention.score_scale），种子、批次、"
        "步数相同，使用编译的训练步，AdamW 不裁剪梯度；每步记录损失和到达 W_Q、W_K 的梯度范数，每隔"
        "几步在固定的验证文本上记录注意力熵。",
    ),
    "medical": Text(
        "The prompt and an English rendering go through the model once: the next-token "
        "distribution at every position (top 5) and at the last (top 10), the probability of "
        "the notes' answer by the chain rule over its tokens; then continuations: greedy, and "
        "sampled at several temperatures with top-k / top-p, each stopping at EOS or a length "
        "limit; then time per greedy token with the KV cache and without it.",
        "把提示和英文译句各送入模型一次：每个位置的下一 Token 分布（前 5）和最后位置的分布（前 10），"
        "以及按链式法则在答案各 Token 上算出的笔记答案的概率；然后续写：贪心，以及在几个温度下配合 "
        "top-k / top-p 采样，各自在 EOS 或长度上限处停止；最后比较有无 KV Cache 时每个贪心 Token "
        "的用时。",
    ),
    "attribution": Text(
        "For each prompt with a known dependency, one forward on the explicit attention path "
        "keeps every layer's weights A in the graph; one backward of log p(target) gives d log p "
        "/ dA; gradient_attribution = A x d log p / dA at (last position, source). Then forward "
        "re-runs, batched, one edit per row: that one weight set to 0 and its row renormalised "
        "(edge_ablation), or the head's output at the last position zeroed (head_ablation); "
        "each is the change in log p(target).",
        "对每个已知依赖的提示，在显式注意力路径上做一次前向，把每层权重 A 留在计算图中；对 log p(目标) "
        "做一次反向，得到 d log p / dA；gradient_attribution = A × d log p / dA，取（最后位置，来源）。"
        "然后分批重跑前向，每行一个干预：把这一条权重设为 0 并重新归一化该行（edge_ablation），或把该头"
        "在最后位置的输出置零（head_ablation）；记录 log p(目标) 的变化。",
    ),
    "progress": Text(
        "A short LoRA fine-tune (rank 8 on the attention projections) towards each example's "
        "target token. Before each update, on the same forward: the loss, the target's "
        "probability, accuracy (greedy token = target), and the attention from the predicting "
        "position to the source token, averaged over every layer and head.",
        "一次短的 LoRA 微调（注意力投影上秩 8），目标是每个样本的目标 Token。每次更新前，在同一次前向上"
        "记录：损失、目标概率、准确率（贪心 Token = 目标），以及预测位置对来源 Token 的注意力（所有层与头"
        "的平均）。",
    ),
}

TEXTS = {
    "scale": scale_texts,
    "medical": medical_texts,
    "attribution": attribution_texts,
    "progress": progress_texts,
}

CSS = """
body { font: 15px/1.5 system-ui, sans-serif; max-width: 1100px; margin: 0 auto; padding: 0 16px;
  color: #222; }
header { display: flex; gap: 16px; align-items: center; justify-content: space-between; }
html[data-ui="en"] [data-lang="zh"], html[data-ui="zh"] [data-lang="en"] { display: none; }
#languages button { padding: 4px 10px; border: 1px solid #1f6fb4; background: #fff; }
#languages button[aria-pressed="true"] { background: #1f6fb4; color: #fff; }
blockquote { border-left: 4px solid #c8a04a; margin: 8px 0; padding: 4px 12px; background: #fbf7ec; }
.figure { background: #f3f6fa; padding: 6px 10px; border-radius: 4px; }
.shows { border-left: 4px solid #1f6fb4; padding-left: 10px; }
pre { white-space: pre-wrap; background: #f6f6f6; padding: 6px; font-size: 13px; }
img { max-width: 100%; }
"""

JS = """
(function () {
  const root = document.documentElement;
  function setLang(lang) {
    root.dataset.ui = lang; root.lang = lang;
    for (const b of document.querySelectorAll("[data-set-lang]"))
      b.setAttribute("aria-pressed", String(b.dataset.setLang === lang));
  }
  const asked = /lang=(en|zh)/.exec(location.hash);
  setLang(asked ? asked[1] : root.dataset.ui);
  document.addEventListener("click", (event) => {
    const button = event.target.closest("[data-set-lang]");
    if (button) { setLang(button.dataset.setLang); history.replaceState(null, "", "#lang=" +
      button.dataset.setLang); }
  });
})();
"""


def write_html(results: dict[str, Any], plots: dict[str, str], out: Path, lang: str) -> Path:
    subject = results["model"]["name"]
    parts = [
        f'<!DOCTYPE html>\n<html lang="{lang}" data-ui="{lang}">\n<head>\n<meta charset="utf-8">',
        "<title>glassgrad lab: the notes, measured</title>",
        f"<style>{CSS}</style>\n</head>\n<body>\n<header>",
        "<h1>"
        + words_html(Text("The notes, measured", "笔记中的论断，实测"))
        + "</h1>"
        + '<span id="languages" role="group" aria-label="language / 语言">'
        + '<button type="button" data-set-lang="en" lang="en">English</button>'
        + '<button type="button" data-set-lang="zh" lang="zh">中文</button></span>',
        "</header>",
        "<p>"
        + words_html(
            Text(
                f"Model under test: {subject} ({results['model']['kind']}; "
                f"{results['model']['source']}). {results['model']['why']} "
                f"Command: {results['command']}",
                f"被测模型：{subject}（{results['model']['kind']}；{results['model']['source']}）。"
                f"{results['model']['why_zh']} 命令：{results['command']}",
            )
        )
        + "</p>",
    ]
    for name in ("scale", "medical", "attribution", "progress"):
        if name not in results:
            continue
        section, zh, en = CLAIMS[name]
        parts.append(f'<section id="{name}"><h2>{words_html(TITLES[name])}</h2>')
        parts.append(
            f"<blockquote><p>{html.escape(zh)} <small>(notes {section})</small></p>"
            f'<p lang="en" data-lang="en"><em>{html.escape(en)}</em></p></blockquote>'
        )
        parts.append(f"<p>{words_html(METHODS[name])}</p>")
        for key in (name, f"{name}_training"):
            if key in plots:
                data = base64.b64encode((out / plots[key]).read_bytes()).decode("ascii")
                parts.append(f'<img alt="{key}" src="data:image/png;base64,{data}">')
        for kind, words in TEXTS[name](results[name], subject):
            if kind == "code":
                parts.append(f"<pre>{html.escape(words)}</pre>")
            else:
                parts.append(f'<p class="{kind}">{words_html(words)}</p>')
        parts.append("</section>")
    parts.append(f"<script>{JS}</script>\n</body>\n</html>\n")
    path = out / "report.html"
    path.write_text("\n".join(parts), encoding="utf-8")
    return path


def write_json(results: dict[str, Any], out: Path) -> Path:
    path = out / "results.json"
    path.write_text(json.dumps(results, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    return path
