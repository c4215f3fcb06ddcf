"""The four experiments of the lab, each a function that returns its figures as plain data.

Every figure keeps the token ids it was computed on (results.json), so anyone can recompute it.
The model under test is a `Subject`: the real pretrained model when one is given or installed,
else the demo GPT, trained here on the Python standard library's source (characters).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

import autograd
import nn
from autograd import no_grad
from models.architectures.gpt import GPT, GPTConfig
from models.lab.measure import (
    Probe,
    attribute,
    blocks,
    entropy,
    log_probs,
    probing,
    score_stats,
)
from models.training.data import get_batch, prepare_corpus
from nn.lora import attention_projections, lora_modules

# --- the model under test -----------------------------------------------------------------------


@dataclass
class Subject:
    """The model the experiments run on, its tokenizer, and where it came from."""

    name: str
    model: Any
    tokenizer: Any
    kind: str  # "pretrained" or "demo"
    source: str

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self.tokenizer.encode(text), dtype=np.int64)

    def decode(self, ids: Any) -> str:
        return self.tokenizer.decode([int(i) for i in ids])

    def token(self, token_id: int) -> str:
        """One token as text; a piece of a character (a byte-level token of a CJK character,
        notes 12.5) shows as its id, since alone it decodes to U+FFFD."""
        text = self.decode([token_id])
        return f"<#{int(token_id)}>" if "\ufffd" in text else text

    def can_encode(self, text: str) -> bool:
        try:
            return self.decode(self.encode(text)) == text
        except (KeyError, ValueError):
            return False


# --- 1. score scale (notes 7.1, 7.3) ------------------------------------------------------------

# The demo GPT of the scale experiment: the README demo's shape with 2 layers (d_k = 128 / 4 = 32,
# so 1/sqrt(d_k) and 1/d_k differ by a factor 5.7), small enough for three runs in a minute or two.
DEMO = {
    "n_layer": 2,
    "n_head": 4,
    "n_embd": 128,
    "block_size": 64,
    "batch_size": 16,
    "steps": 200,
    "lr": 3e-3,
    "seed": 1337,
    "eval_every": 25,
}
SCALES = {"1/sqrt(d_k)": lambda d: d**-0.5, "1": lambda d: 1.0, "1/d_k": lambda d: 1.0 / d}


def demo_corpus() -> Any:
    """The demo's corpus: the stdlib modules of models.training.data, as characters."""
    return prepare_corpus()


def attention_entropy(model: Any, x: np.ndarray) -> list[float]:
    """Per layer: the mean entropy (nats) of the attention rows of every head and position."""
    probe = Probe(model)
    with no_grad(), probing(model, probe):
        model(x)
    return [float(entropy(probe.weights_of[i].data).mean()) for i in sorted(probe.weights_of)]


def qk_gradient_norms(model: Any) -> tuple[float, float]:
    """The norms of the gradients that reached W_Q and W_K, over all layers (after a backward)."""
    q2 = k2 = 0.0
    for block in blocks(model):
        attn = block.attn
        if hasattr(attn, "c_attn"):  # nn.Attention's fused c_attn: columns [W_Q | W_K | W_V]
            width = attn.n_head * attn.head_dim
            g = attn.c_attn.weight.grad
            gq, gk = g[:, :width], g[:, width : 2 * width]
        else:  # the Llama family's W_Q and W_K of their own
            gq, gk = attn.q_proj.weight.grad, attn.k_proj.weight.grad
        q2 += float(np.sum(gq.astype(np.float64) ** 2))
        k2 += float(np.sum(gk.astype(np.float64) ** 2))
    return q2**0.5, k2**0.5


def train_demo(corpus: Any, scale: str, settings: dict[str, Any]) -> tuple[GPT, GPT, dict]:
    """The demo GPT trained with the scores scaled by SCALES[scale]: same seed, batches and steps
    for every scale, AdamW without clipping (so the gradient norms are the raw ones), the compiled
    step. Returns the model at initialisation (a copy), trained, and the curves per step."""
    s = settings
    config = GPTConfig(
        vocab_size=corpus.tokenizer.vocab_size,
        block_size=s["block_size"],
        n_layer=s["n_layer"],
        n_head=s["n_head"],
        n_embd=s["n_embd"],
    )

    def build() -> GPT:
        model = GPT(config, rng=np.random.default_rng(s["seed"]))
        for block in blocks(model):
            block.attn.score_scale = SCALES[scale](block.attn.head_dim)
        return model

    initial, model = build(), build()
    optimizer = nn.optim.AdamW(model.parameters(), lr=s["lr"], weight_decay=0.1)

    @autograd.compile
    def step(x: np.ndarray, y: np.ndarray) -> Any:
        optimizer.zero_grad()
        _, loss = model(x, y)
        loss.backward()
        optimizer.step()
        return loss

    probe_x, _ = get_batch(corpus.val, 8, s["block_size"], s["seed"], 0)  # fixed held-out text
    curves: dict[str, list] = {"loss": [], "grad_wq": [], "grad_wk": [], "entropy": []}
    for i in range(s["steps"]):
        if i % s["eval_every"] == 0:
            curves["entropy"].append([i, attention_entropy(model, probe_x)])
        x, y = get_batch(corpus.train, s["batch_size"], s["block_size"], s["seed"], i)
        curves["loss"].append(float(step(x, y).item()))
        wq, wk = qk_gradient_norms(model)
        curves["grad_wq"].append(wq)
        curves["grad_wk"].append(wk)
    curves["entropy"].append([s["steps"], attention_entropy(model, probe_x)])
    with no_grad():
        _, val = model(*get_batch(corpus.val, 32, s["block_size"], s["seed"], 1))
    curves["val_loss"] = float(val.item())
    return initial, model, curves


def scale_experiment(
    subject: Subject,
    texts: dict[str, str],
    corpus: Any,
    demo: tuple[GPT, GPT, dict],
    settings: dict,
) -> dict[str, Any]:
    """Score SD vs sqrt(d_k) and entropy per head: the model under test (and its architecture at
    a random initialisation, when it is pretrained) on real text, and the demo GPT at
    initialisation and trained; then the three demo runs' curves."""
    models = []

    def add(label: str, model: Any, ids: np.ndarray, text: str) -> None:
        models.append(
            {"model": label, "text": text, "token_ids": [int(i) for i in ids]}
            | {"heads": score_stats(model, ids)}
        )

    if subject.kind == "pretrained":
        for label, text in texts.items():
            ids = subject.encode(text)[: settings["scale_tokens"]]
            add(f"{subject.name}, {label}", subject.model, ids, label)
        fresh = type(subject.model)(subject.model.config, rng=np.random.default_rng(0))
        ids = subject.encode(next(iter(texts.values())))[: settings["scale_tokens"]]
        add(f"{subject.name} architecture, random init", fresh, ids, next(iter(texts)))
    initial, trained, _ = demo
    ids = corpus.val[: settings["block_size"]]
    add("demo GPT, initialisation", initial, ids, "stdlib")
    add("demo GPT, trained", trained, ids, "stdlib")
    return {"models": models}


def scale_training(corpus: Any, settings: dict[str, Any]) -> tuple[dict, tuple]:
    """The three runs of the demo GPT; the 1/sqrt(d_k) one is the demo GPT of the other figures."""
    runs, first = {}, None
    for scale in SCALES:
        start = time.perf_counter()
        initial, trained, curves = train_demo(corpus, scale, settings)
        curves["seconds"] = time.perf_counter() - start
        runs[scale] = curves
        first = first or (initial, trained, curves)
    return {"settings": settings, "runs": runs}, first


# --- 2. the medical sentence (notes 12.1-12.5) --------------------------------------------------

MEDICAL = {
    "zh": ("患者服用华法林后出现", "黑便"),
    "en": ("After taking warfarin, the patient developed", " black stools"),
}
DECODING = [  # (label, temperature, top_k, top_p)
    ("greedy", 0.0, None, None),
    ("T=0.7, top-k 50", 0.7, 50, None),
    ("T=1.0, top-p 0.9", 1.0, None, 0.9),
    ("T=1.5", 1.5, None, None),
]


def top_tokens(subject: Subject, logp: np.ndarray, k: int) -> list[dict[str, Any]]:
    order = np.argsort(-logp)[:k]
    return [{"id": int(i), "token": subject.token(i), "p": float(np.exp(logp[i]))} for i in order]


def sequence_log_prob(subject: Subject, prompt_ids: np.ndarray, answer_ids: np.ndarray) -> float:
    """log p(answer | prompt) by the chain rule: one forward over prompt + answer."""
    ids = np.concatenate([prompt_ids, answer_ids])
    with no_grad():
        logits, _ = subject.model(ids[None, :-1], all_logits=True)
    logp = log_probs_all(logits.data[0])
    rows = np.arange(len(prompt_ids) - 1, len(ids) - 1)
    return float(logp[rows, ids[rows + 1]].sum())


def log_probs_all(logits: np.ndarray) -> np.ndarray:
    """log softmax of each row of (T, V) logits, in float64."""
    x = logits.astype(np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def medical_experiment(subject: Subject, settings: dict[str, Any]) -> dict[str, Any]:
    """Next-token distributions at every position, decoding rules, stopping, the KV cache."""
    if not all(subject.can_encode(p + a) for p, a in MEDICAL.values()):
        return {"skipped": f"{subject.name}'s vocabulary cannot spell the prompts"}
    out: dict[str, Any] = {"prompts": {}}
    rng = np.random.default_rng(settings["seed"])
    eos = set(subject.model.config.eos_token_ids)
    for lang, (prompt, answer) in MEDICAL.items():
        ids, answer_ids = subject.encode(prompt), subject.encode(answer)
        with no_grad():
            logits, _ = subject.model(ids[None], all_logits=True)
        logp = log_probs_all(logits.data[0])
        positions = []
        for i in range(len(ids)):
            actual = int(ids[i + 1]) if i + 1 < len(ids) else None  # what the prompt has next
            positions.append(
                {
                    "position": i,
                    "token": subject.token(ids[i]),
                    "next_actual": None if actual is None else subject.token(actual),
                    "p_next_actual": None if actual is None else float(np.exp(logp[i, actual])),
                    "top": top_tokens(subject, logp[i], 5),
                }
            )
        last = logp[-1]
        rank = int((last > last[answer_ids[0]]).sum()) + 1
        continuations = []
        for label, temperature, top_k, top_p in DECODING:
            for sample in range(1 if temperature == 0 else settings["samples"]):
                new = subject.model.generate(
                    ids[None], settings["new_tokens"], temperature, top_k, top_p, rng=rng
                )[0, len(ids) :]
                stopped = [j for j, t in enumerate(new) if int(t) in eos]
                new = new[: stopped[0] + 1] if stopped else new
                continuations.append(
                    {
                        "decoding": label,
                        "sample": sample,
                        "token_ids": [int(t) for t in new],
                        "text": subject.decode(new),
                        "stop": "EOS" if stopped else f"length ({settings['new_tokens']} tokens)",
                    }
                )
        out["prompts"][lang] = {
            "prompt": prompt,
            "token_ids": [int(i) for i in ids],
            "tokens": [subject.token(i) for i in ids],
            "answer": answer,
            "answer_ids": [int(i) for i in answer_ids],
            "p_answer_first_token": float(np.exp(last[answer_ids[0]])),
            "rank_answer_first_token": rank,
            "log_p_answer": sequence_log_prob(subject, ids, answer_ids),
            "top": top_tokens(subject, last, 10),
            "positions": positions,
            "continuations": continuations,
        }
    out["kv_cache"] = kv_cache_timing(subject, subject.encode(MEDICAL["zh"][0]), settings)
    return out


def kv_cache_timing(subject: Subject, ids: np.ndarray, settings: dict) -> dict[str, Any]:
    """Seconds per greedy token with the KV cache (one position per token) and without it (the
    whole prefix again per token); the tokens must be the same (notes 12.4)."""
    n, model = settings["timing_tokens"], subject.model
    cached, times_cached = [], []
    caches = model.new_kv_caches(1, len(ids) + n)
    start = time.perf_counter()
    for token in model.stream(ids, caches, n, temperature=0.0):
        now = time.perf_counter()
        cached.append(int(token))
        times_cached.append(now - start)
        start = now
    plain, times_plain, seq = [], [], ids
    for _ in range(len(cached)):
        start = time.perf_counter()
        with no_grad():
            logits, _ = model(seq[None])
        token = int(np.argmax(logits.data[0, -1]))
        times_plain.append(time.perf_counter() - start)
        plain.append(token)
        seq = np.append(seq, token)
    return {
        "prompt_ids": [int(i) for i in ids],
        "token_ids": cached,
        "same_tokens": cached == plain,
        "seconds_with_cache": times_cached,
        "seconds_without_cache": times_plain,
    }


# --- 3. attention is not attribution (notes 13.3) -----------------------------------------------


@dataclass(frozen=True)
class Case:
    """A prompt whose next token (the first of `target`) depends on `source` in the prompt."""

    name: str
    prompt: str
    target: str
    source: str


PRETRAINED_CASES = [
    Case("medical (12.3)", "患者服用华法林后出现", "黑便", "华法林"),
    Case(
        "name to recall",
        "When Mary and John went to the store, John gave a drink to",
        " Mary",
        " Mary",
    ),
    Case("agreement across a clause", "The keys to the old wooden cabinet", " are", " keys"),
]
DEMO_CASES = [  # the demo GPT reads Python source, character by character
    Case("name to recall", "def area(radius):\n    return 3.14 * ", "r", "(r"),
    Case("bracket to close", "    x = f(a[i", "]", "["),
    Case("self to repeat", "    def close(self):\n        ", "s", "(s"),
]


def resolve(subject: Subject, case: Case) -> dict[str, Any]:
    """Token ids of the prompt, the target id (the first token of the target after the prompt)
    and the source position (the token holding the source's last character)."""
    ids = subject.encode(case.prompt)
    full = subject.encode(case.prompt + case.target)
    if len(full) > len(ids) and np.array_equal(full[: len(ids)], ids):
        target_id = int(full[len(ids)])
    else:  # the target merged with the prompt's end: take its own first token
        target_id = int(subject.encode(case.target)[0])
    end = case.prompt.index(case.source) + len(case.source)
    source_position = next(i for i in range(len(ids)) if len(subject.decode(ids[: i + 1])) >= end)
    return {
        "name": case.name,
        "prompt": case.prompt,
        "target": case.target,
        "source": case.source,
        "token_ids": [int(i) for i in ids],
        "tokens": [subject.token(i) for i in ids],
        "source_position": source_position,
        "target_position": len(ids) - 1,
        "target_id": target_id,
        "target_token": subject.token(target_id),
    }


def spearman(x: Any, y: Any) -> float:
    """Spearman's rank correlation (average ranks for ties)."""

    def ranks(v: np.ndarray) -> np.ndarray:
        order = np.argsort(v, kind="stable")
        r = np.empty(len(v))
        r[order] = np.arange(len(v))
        for value in np.unique(v):  # ties share their mean rank
            tied = v == value
            r[tied] = r[tied].mean()
        return r

    rx, ry = ranks(np.asarray(x, float)), ranks(np.asarray(y, float))
    if rx.std() == 0 or ry.std() == 0:
        return float("nan")
    return float(np.corrcoef(rx, ry)[0, 1])


def attribution_experiment(subject: Subject) -> dict[str, Any]:
    cases = []
    for case in PRETRAINED_CASES if subject.kind == "pretrained" else DEMO_CASES:
        if not subject.can_encode(case.prompt + case.target):
            continue
        found = resolve(subject, case)
        measured = attribute(
            subject.model, found["token_ids"], found["source_position"], found["target_id"]
        )
        heads = measured["heads"]
        column = {key: np.array([h[key] for h in heads]) for key in heads[0]}
        found |= {
            "log_prob": measured["log_prob"],
            "heads": heads,
            "rank_correlations": {
                "attention_vs_abs_edge_ablation": spearman(
                    column["attention"], abs(column["edge_ablation"])
                ),
                "abs_gradient_attribution_vs_abs_edge_ablation": spearman(
                    abs(column["gradient_attribution"]), abs(column["edge_ablation"])
                ),
                "attention_vs_abs_head_ablation": spearman(
                    column["attention"], abs(column["head_ablation"])
                ),
            },
        }
        cases.append(found)
    return {"cases": cases}


# --- 4. progress without attention (notes 11.6, exercise 6) -------------------------------------

PRETRAINED_TASK = [PRETRAINED_CASES[0], Case("medical, English", *MEDICAL["en"], " warfarin")]
DEMO_TASK = DEMO_CASES


def progress_experiment(subject: Subject, settings: dict[str, Any]) -> dict[str, Any]:
    """A short LoRA fine-tune towards each example's target; per step (before its update): the
    loss, the targets' mean probability, accuracy (greedy = target), and the attention from the
    predicting position to the source, averaged over every layer and head. The adapters are
    zeroed and taken out afterwards, so the model is the one measured before."""
    model = subject.model
    task = PRETRAINED_TASK if subject.kind == "pretrained" else DEMO_TASK
    examples = [resolve(subject, c) for c in task if subject.can_encode(c.prompt + c.target)]
    nn.apply_lora(model, attention_projections(model), rank=8, alpha=16.0)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = nn.optim.AdamW(params, lr=settings["lora_lr"], weight_decay=0.0)
    curves: dict[str, list] = {"loss": [], "p_target": [], "accuracy": [], "attention": []}
    try:
        for _ in range(settings["lora_steps"] + 1):
            optimizer.zero_grad()
            loss_sum, probs, hits, attention = 0.0, [], [], []
            for ex in examples:
                probe = Probe(model)
                with probing(model, probe):
                    logits, _ = model(np.array(ex["token_ids"])[None])
                    logp = log_probs(logits)[0]
                    loss = -logp[ex["target_id"]] / len(examples)
                loss.backward()
                loss_sum += float(loss.data)
                probs.append(float(np.exp(logp.data[ex["target_id"]])))
                hits.append(int(np.argmax(logp.data)) == ex["target_id"])
                rows = [a.data[0, :, -1, ex["source_position"]] for a in probe.weights_of.values()]
                attention.append(float(np.mean(rows)))
            curves["loss"].append(loss_sum)
            curves["p_target"].append(float(np.mean(probs)))
            curves["accuracy"].append(float(np.mean(hits)))
            curves["attention"].append(float(np.mean(attention)))
            optimizer.step()  # the last one's update is never measured: harmless
    finally:
        for _, lora in lora_modules(model):
            lora.lora_B.data[...] = 0.0  # take the adapters out unchanged
        nn.unload_lora(model)
        model.requires_grad_(True)
    loss, att, acc = (np.array(curves[k]) for k in ("loss", "attention", "accuracy"))
    falls = np.diff(loss) < 0
    return {
        "examples": examples,
        "settings": {k: settings[k] for k in ("lora_steps", "lora_lr")} | {"rank": 8},
        "curves": curves,
        "steps": int(len(falls)),
        "loss_falls": int(falls.sum()),
        "loss_falls_attention_falls": int((falls & (np.diff(att) < 0)).sum()),
        "loss_falls_accuracy_not_up": int((falls & (np.diff(acc) <= 0)).sum()),
    }
