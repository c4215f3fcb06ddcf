"""The benchmark runner: its quick mode end to end (JSON, markdown, plot) and its small parts."""

import itertools
import json
import math
import re
import sys

import numba
import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from autograd.kernels import start_threads
from benchmarks import autodiff_modes, products, timing
from benchmarks.__main__ import main
from benchmarks.configs import STANDARD, parse_config, train_flops
from benchmarks.suites import summarize_targets


def _positive_stats(stats):
    for key in ("warmup_s", "median_ms", "min_ms", "max_ms"):
        assert math.isfinite(stats[key]) and stats[key] > 0, (key, stats)
    assert stats["min_ms"] <= stats["median_ms"] <= stats["max_ms"]
    assert stats["peak_mb"] >= 0


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """One `--quick` run of every suite (one per module: it is the slow part)."""
    out = tmp_path_factory.mktemp("bench")
    paths = {"json": out / "r.json", "md": out / "r.md", "png": out / "r.png"}
    argv = ["--quick", "--quiet", "--threads", "1", "--json", str(paths["json"])]
    argv += ["--markdown", str(paths["md"]), "--plot", str(paths["png"])]
    # --threads changes process-wide settings: put them back for the tests that follow
    start_threads()
    numba_threads = numba.get_num_threads()
    with threadpool_limits(limits=None):  # restores the BLAS limits on exit
        code = main(argv)
    numba.set_num_threads(numba_threads)
    assert code == 0
    return json.loads(paths["json"].read_text()), paths


def test_quick_json_structure(quick_run):
    results, _ = quick_run
    assert results["quick"] is True and results["reps"] == 3
    env = results["environment"]
    assert env["threads"]["blas"] == 1 and env["threads"]["numba"] == 1
    assert any(b["user_api"] == "blas" and b["architecture"] for b in env["blas"])
    assert set(env["blas_env"]) == {"OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"}
    assert results["sgemm"]["gflops"] > 0
    assert set(results["suites"]) == {"ops", "kernels", "train", "generate"}
    for suite, records in results["suites"].items():
        assert records, suite
        for record in records:
            assert record["suite"] == suite
            if suite == "train":  # fresh processes per framework, plus the in-process eager step
                assert {"glassgrad", "glassgrad eager"} <= set(record["variants"])
            else:
                assert {"numba", "numpy"} <= set(record["variants"]) or suite in ("ops", "generate")
            for stats in record["variants"].values():
                _positive_stats(stats)
            if results["torch_used"] and suite != "generate":
                assert "torch" in record["variants"] or record["name"] == "softmax_forward"


def test_quick_train_and_generate_figures(quick_run):
    results, _ = quick_run
    (train,) = results["suites"]["train"]
    assert train["name"] == "tiny"
    gg = train["variants"]["glassgrad"]
    assert gg["gflops"] > 0 and 0 < gg["frac_of_sgemm_peak"]
    assert gg["tokens_per_s"] == pytest.approx(16 * 64 / (gg["median_ms"] / 1e3))
    # every framework starts from the same weights and batch: the same step-0 loss
    losses = [v["loss0"] for v in train["variants"].values() if "loss0" in v]
    assert len(losses) >= 2 and max(losses) - min(losses) < 1e-4
    assert gg["trace_plan_s"] > 0
    contexts = [r["params"]["context"] for r in results["suites"]["generate"]]
    assert contexts == [8, 16, 32]
    for r in results["suites"]["generate"]:
        assert {"numba cached", "numba uncached", "numpy cached", "numpy uncached"} <= set(
            r["variants"]
        )
        assert r["ratios"]["cache_speedup"] > 0
    first = {r["name"]: r.get("first_call") for r in results["suites"]["kernels"]}
    assert first["softmax_forward"]["compile_s"] > 0
    assert first["softmax_forward"]["cached_load_s"] >= 0
    targets = {t["target"] for t in results["targets"]}
    if results["torch_used"]:
        assert "train tiny: glassgrad / torch eager <= 0.8 (fresh processes)" in targets


def test_quick_markdown_and_plot(quick_run):
    _, paths = quick_run
    text = paths["md"].read_text()
    assert text.startswith("## Benchmark results")
    for needle in (
        "CPU:",
        "BLAS:",
        "threads:",
        "sgemm peak",
        "### Training step",
        "6 N + 12 L T C",
    ):
        assert needle in text
    assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_measure_alternates_and_summarises():
    calls = []
    stats = timing.measure({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, 3)
    # warm-up and memory call of a, then of b, then strictly alternating repetitions
    assert calls == ["a", "a", "b", "b", "a", "b", "a", "b", "a", "b"]
    assert set(stats) == {"a", "b"} and stats["a"]["reps"] == 3
    with pytest.raises(ValueError, match="reps"):
        timing.measure({"a": lambda: None}, 0)


def test_peak_memory_sees_an_allocation():
    assert timing.peak_memory_mb(lambda: np.ones(40 * 2**20 // 8).sum()) > 20


def test_parse_config():
    assert parse_config("mid") is STANDARD["mid"]
    c = parse_config("V50/T32/L1/H2/C16/B3")
    assert (c.vocab_size, c.block_size, c.n_layer, c.n_head, c.n_embd, c.batch_size) == (
        50,
        32,
        1,
        2,
        16,
        3,
    )
    with pytest.raises(ValueError, match="V<vocab>"):
        parse_config("huge")
    with pytest.raises(ValueError, match="lacks B"):
        parse_config("V50/T32/L1/H2/C16")
    with pytest.raises(ValueError, match="divisible"):
        parse_config("V50/T32/L1/H3/C16/B1")


def test_train_flops_formula():
    c = STANDARD["tiny"]
    n = 1000
    assert train_flops(c, n) == 16 * 64 * (6 * n + 12 * 2 * 64 * 64)


def test_targets_report_missing_and_met():
    record = {
        "suite": "train",
        "name": "tiny",
        "variants": {"glassgrad": {"median_ms": 1.0}},
        "ratios": {"vs_torch": 1.2},
    }
    checks = {c["target"]: c for c in summarize_targets([record])}
    assert checks["train tiny: glassgrad / torch eager <= 0.8 (fresh processes)"]["met"] is False
    assert checks["train mid: glassgrad / torch eager <= 0.8 (fresh processes)"]["met"] is None


def test_bad_suite_is_a_clear_error(capsys):
    assert main(["--quiet", "--config", "V1/T1"]) == 2
    assert "lacks" in capsys.readouterr().err


def test_step_products_are_the_steps_matrix_flops():
    # the products of all shards = tokens * (6 * the weight matrices + 12 L T C): the FLOP
    # formula without the biases and LayerNorm parameters (which no product multiplies)
    c = parse_config("V11/T16/L2/H2/C8/B4")
    per_layer = 3 + 1 + 4 + 4  # c_attn C x 3C, attn c_proj C x C, c_fc C x 4C, mlp c_proj 4C x C
    matrices = c.n_layer * per_layer * c.n_embd**2 + c.vocab_size * c.n_embd
    tokens = c.batch_size * c.block_size
    assert 2 * _flops(c) == tokens * (6 * matrices + 12 * c.n_layer * c.block_size * c.n_embd)
    # T = 256: the causal products keep 10 of the 16 (64 x 64) blocks of each T x T product
    long = parse_config("V11/T256/L1/H2/C8/B2")
    linear = long.batch_size * long.block_size * 6 * (per_layer * 8**2 + 11 * 8)
    full_attention = long.batch_size * long.block_size * 12 * 256 * 8
    assert 2 * _flops(long) - linear == full_attention * 10 / 16


def _flops(config):
    return sum(count * products.product_flops(a, b, ta, tb)
               for _, count, a, b, ta, tb in products.step_products(config, 2))  # fmt: skip


@pytest.mark.parametrize("whole", [False, True])
def test_step_products_time_on_threads(whole):
    seconds = products.measure_step("numpy", "V11/T16/L1/H2/C8/B4", 2, reps=2, whole=whole)
    assert 0 < seconds < 1
    own = products.measure_step("numpy", "V11/T16/L2/H2/C8/B4", 2, reps=2, whole=whole, own=True)
    assert 0 < own < 1


def test_own_operands_give_each_run_its_arrays():
    # the "own" floor: the same products as many times, each run on arrays no other run reads
    config = parse_config("V11/T16/L2/H2/C8/B4")
    shared, own = (products._operands("numpy", config, 2, own=o) for o in (False, True))
    runs = [(what, len(list(group))) for what, group in itertools.groupby(e[0] for e in own)]
    assert runs == [(what, count) for what, *_, count in shared]
    assert {count for *_, count in own} == {1}
    arrays = [x if x.base is None else x.base for _, *xs, _ in own for x in xs]
    assert len({id(x) for x in arrays}) == len(arrays) == 3 * len(own)


@pytest.mark.parametrize("kind", sorted(autodiff_modes.VARIANTS))
def test_autodiff_modes_variants_run(kind):
    # every variant of benchmarks.autodiff_modes, in-process on a micro config (the timing
    # driver runs each in a fresh process; here: that each call works and reports its figures)
    for variant in autodiff_modes.VARIANTS[kind]:
        figures = autodiff_modes.worker(kind, variant, "V11/T8/L1/H2/C8/B2", reps=1)
        assert figures["variant"] == variant and figures["median_ms"] > 0
        assert figures["parameters"] > 0 and figures["blas"]
        if variant.startswith("compiled"):
            assert figures["arena_peak_live_mib"] <= figures["arena_mib"]


def test_llm_suite_times_a_tiny_llama_in_fresh_processes(capsys):
    # The real run writes a SmolLM2-135M-shaped directory; --tiny runs the same code on a tiny
    # one. The workers are `python -m benchmarks.llm` processes started from the repository root.
    from benchmarks import llm

    frameworks = "glassgrad,glassgrad-compiled,glassgrad-q8_0-int8,hf,llama.cpp"
    argv = ["--tiny", "--rounds", "1", "--reps", "1", "--prompt", "8", "--new", "64"]
    assert llm.main([*argv, "--frameworks", frameworks]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("| glassgrad |"))
    cells = row.strip("| ").split(" | ")
    assert cells[1:3] == ["float32 (as given)", "2"]
    load, prefill, decode, stream, rss = (float(cell) for cell in cells[3:])
    assert load >= 0 and prefill > 0 and decode > 0 and stream >= 0 and rss > 0  # 2 decimals
    assert "memory copy bandwidth of this run" in out
    assert "| glassgrad, compiled decode | float32 (as given) | 2 |" in out
    assert "| glassgrad, compiled decode, Q8_0, int8 activations | q8_0 (as given) | 2 |" in out
    assert "HF transformers" in out or "no HF column" in out


def test_the_real_model_benchmarks_refuse_what_they_cannot_run_at_once(tmp_path, capsys):
    from benchmarks import finetune, llm

    assert not llm.python_has(str(tmp_path / "no-python"), "os")  # no traceback: False
    assert llm.python_has(sys.executable, "os")
    for command, argv, message in (
        (llm.main, ["--model", str(tmp_path / "none.gguf")], "--model .*none.gguf does not exist"),
        (finetune.main, ["--hf-python", str(tmp_path / "py")], "--hf-python .*py cannot import"),
    ):
        with pytest.raises(SystemExit) as exit_:
            command(argv)
        assert exit_.value.code == 2 and re.search(message, capsys.readouterr().err)
