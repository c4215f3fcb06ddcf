"""Turning a results dict into a plain-text table, the README's markdown section and a PNG."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks.configs import FLOPS_FORMULA
from benchmarks.timing import MEMORY_METHOD


def _ms(stats: dict[str, Any] | None) -> str:
    if stats is None:
        return "-"
    return f"{stats['median_ms']:.3g} ({stats['min_ms']:.3g}-{stats['max_ms']:.3g})"


def _num(value: float | None, fmt: str = ".3g", suffix: str = "") -> str:
    return "-" if value is None else f"{value:{fmt}}{suffix}"


def _tables(results: dict[str, Any]) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, headers, rows) for each suite that ran."""
    tables = []
    suites = results["suites"]
    if "train" in suites:
        tables.append(_train_table(suites["train"]))
    if "generate" in suites:
        rows = []
        for r in suites["generate"]:
            v = r["variants"]
            rows.append(
                [
                    r["name"],
                    _ms(v["numba cached"]),
                    _ms(v["numba uncached"]),
                    _ms(v["numpy cached"]),
                    _ms(v.get("torch cached")),
                    _ms(v.get("torch uncached")),
                    f"{r['ratios']['cache_speedup']:.1f}x",
                    _num(r["ratios"].get("vs_torch"), ".2f"),
                    f"{v['numba cached']['tokens_per_s']:.0f}",
                ]
            )
        headers = [
            "context",
            "cached ms/token",
            "uncached ms/token",
            "numpy-ref cached",
            "torch cached",
            "torch uncached",
            "cache speedup",
            "glassgrad/torch (cached)",
            "tokens/s cached",
        ]
        tables.append(("Decode step, batch 1 (glassgrad = Numba kernels)", headers, rows))
    if suites.get("ddp"):
        rows = []
        for r in suites["ddp"]:
            for name, v in r["variants"].items():
                rows.append(
                    [
                        f"{r['name']}, {name}",
                        f"{v['median_ms']:.1f}",
                        f"{v['allreduce_ms']:.2f}",
                        f"{v['tokens_per_s']:,.0f}",
                        f"{r['ratios']['scaling_efficiency']:.2f}" if name != "1 rank" else "",
                    ]
                )
        headers = ["config, ranks", "ms/step", "Allreduce ms", "tokens/s", "scaling efficiency"]
        tables.append(
            ("Data-parallel training over MPI (1 BLAS + 1 Numba thread per rank)", headers, rows)
        )
    if suites.get("tokenizer"):
        rows = []
        for r in suites["tokenizer"]:
            v, params = r["variants"]["python"], r["params"]
            detail = f"vocab {params['vocab_size']}"
            if "tokens" in params:
                detail += f", {params['tokens']:,} tokens ({params['bytes_per_token']:.2f} B/token)"
            speed = _num(v.get("mb_per_s"), ".2f")
            rows.append([r["name"], f"{params['corpus_bytes']:,}", _ms(v), speed, detail])
        headers = ["task", "corpus bytes", "ms", "MB/s", "result"]
        tables.append(("Tokenizer: byte-level BPE (pure Python)", headers, rows))
    for suite, title in (
        ("ops", "Ops, forward + backward"),
        ("kernels", "Kernels: Numba vs numpy reference"),
    ):
        if suite not in suites:
            continue
        rows = []
        for r in suites[suite]:
            v, first = r["variants"], r.get("first_call", {})
            shape = r["params"].get("shape") or r["params"].get("shape (B,H,T,D)")
            rows.append(
                [
                    r["name"],
                    str(shape or r["params"].get("shapes", "")).replace(" ", ""),
                    _ms(v["numba"]),
                    _ms(v.get("numpy")),
                    _ms(v.get("torch")),
                    _num(r["ratios"].get("speedup_vs_numpy"), ".2f", "x"),
                    _num(r["ratios"].get("vs_torch"), ".2f"),
                    _num(first.get("compile_s"), ".2f"),
                    _num(first.get("cached_load_s"), ".3f"),
                ]
            )
        headers = [
            "op" if suite == "ops" else "kernel",
            "shape",
            "glassgrad ms" if suite == "ops" else "numba ms",
            "numpy-ref ms",
            "torch ms",
            "vs numpy-ref",
            "glassgrad/torch",
            "compile s",
            "cached load s",
        ]
        if suite == "ops":
            headers, rows = headers[:-2], [row[:-2] for row in rows]
        tables.append((title, headers, rows))
    return tables


# The train table's variant columns, in order (those that ran are shown).
TRAIN_COLUMNS = (
    "glassgrad",
    "glassgrad eager",
    "glassgrad, torch imported first",
    "torch",
    "torch.compile",
    "jax",
    "glassgrad eager, in-process",
)


def _train_table(records: list[dict[str, Any]]) -> tuple[str, list[str], list[list[str]]]:
    present = [c for c in TRAIN_COLUMNS if any(c in r["variants"] for r in records)]
    rows = []
    for r in records:
        v = r["variants"]
        gg, torch = v["glassgrad"], v.get("torch")
        row = [f"{r['name']} {r['params']['config']}"]
        row += [_ms(v.get(c)) for c in present]
        row += [
            _num(r["ratios"].get("vs_torch"), ".2f"),
            f"{gg['gflops']:.1f} ({100 * gg['frac_of_sgemm_peak']:.0f} %)",
            f"{gg['peak_mb']:.0f} / " + _num(torch["peak_mb"] if torch else None, ".0f"),
            " / ".join(_num(v[c].get("loss0"), ".4f") for c in present if "loss0" in v[c]),
            f"{gg['warmup_s']:.2f}",
        ]
        rows.append(row)
    headers = ["config"] + [f"{c} ms" for c in present]
    headers += [
        "glassgrad/torch",
        "glassgrad GFLOP/s (of sgemm peak)",
        "peak MiB gg / torch",
        "step-0 loss (same order)",
        "glassgrad first step s",
    ]
    title = (
        "Training step (forward, loss, backward, AdamW, zero_grad); each framework in fresh "
        "processes of its own, alternating"
    )
    return title, headers, rows


def _header_lines(results: dict[str, Any]) -> list[str]:
    env = results["environment"]
    blas = "; ".join(
        f"{b['internal_api']} {b['version']} ({b['architecture']} kernel, "
        f"{b['num_threads']} threads)"
        for b in env["blas"]
        if b["user_api"] == "blas"
    )
    forced = {k: v for k, v in env["blas_env"].items() if v}
    removed = env["blas_env_removed_by_reexec"]
    t = env["threads"]
    sg = results["sgemm"]
    lines = [
        f"date: {env['date']}",
        f"CPU: {env['cpu']} ({env['logical_cpus']} logical CPUs)",
        f"BLAS: {blas or 'none found'}"
        + (f"; forced by {forced}" if forced else "; OPENBLAS_CORETYPE unset")
        + (f" (re-executed without {removed})" if removed else ""),
        f"threads: BLAS {t['blas']}, Numba {t['numba']}, torch {t['torch'] or '-'}; load "
        f"average (1 min) {_num(env['load_average_1min'], '.1f')} at start, "
        f"{_num(env.get('load_average_1min_at_end'), '.1f')} at end",
        f"versions: Python {env['python']}, numpy {env['numpy']}, numba {env['numba']}, "
        f"torch {env['torch'] or 'not installed (torch columns skipped)'}",
        f"sgemm peak: {sg['gflops']:.1f} GFLOP/s (float32 {sg['n']}^3 np.matmul, best of "
        f"{sg['reps']})",
        f"method: float32; warm-up timed separately; {results['reps']} alternating repetitions; "
        "median (min-max)"
        + ("; PyTorch timed in a separate process" if results["torch_used"] else "")
        + ("; QUICK mode (small shapes)" if results["quick"] else ""),
    ]
    return lines


def _notes() -> list[str]:
    return [
        f"FLOPs: {FLOPS_FORMULA}.",
        f"Peak memory: {MEMORY_METHOD}, one extra call per variant; in the training table "
        "(fresh processes): the process's peak RSS (VmHWM) minus its RSS after the imports, i.e. "
        "the model, optimizer state, activations / arena and JIT code, median over the rounds.",
        "Training step: each framework runs in fresh processes of its own (benchmarks/"
        "train_worker.py), alternating, 3 rounds of 3 warm-up + 10 timed steps; the median is "
        "over all timed steps, the range over the rounds' medians. glassgrad is the compiled "
        "step (autograd.compile, default fusion, as in models.train); 'in-process' "
        "is the eager step timed "
        "inside the runner itself (a warm heap), kept for comparison.",
        "glassgrad/torch < 1 means glassgrad is faster; vs numpy-ref = numpy-reference time / "
        "Numba time.",
        "Compile / cached load: first call minus second call of each Numba kernel in a fresh "
        "process (empty cache, then the cache it wrote); a jitted helper shared by several "
        "kernels is counted in the first one probed; the first kernel also starts the thread "
        "pool.",
        "Load average: other processes sharing the cores inflate every figure, the parallel "
        "Numba kernels (a barrier per call) most.",
        "Decode: time of the step that produces token t+1 from t tokens; cached = one position "
        "through the KV cache, uncached = the whole context again.",
        "PyTorch runs in its own process with the same shapes, threads and repetitions: Numba "
        "and PyTorch each load an OpenMP runtime named libgomp.so.1, and in one process they "
        "share the first one loaded and slow each other (a Numba LayerNorm 0.18 -> 2.5 ms, "
        "torch's attention 12 -> 36 ms, measured here).",
    ]


def _plain(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(headers)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True))
    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, rows)])


def _markdown_table(headers: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(out)


def _targets_lines(results: dict[str, Any]) -> list[str]:
    lines = []
    for c in results.get("targets", []):
        status = {True: "met", False: "MISSED", None: "not measured"}[c["met"]]
        lines.append(f"{c['target']}: {_num(c['value'], '.3g')} -> {status}")
    return lines


def text_report(results: dict[str, Any]) -> str:
    """The readable plain-text report printed at the end of a run."""
    parts = ["\n".join(_header_lines(results))]
    for title, headers, rows in _tables(results):
        parts.append(f"{title}\n{_plain(headers, rows)}")
    if results.get("targets"):
        parts.append("Targets\n" + "\n".join(_targets_lines(results)))
    parts.append("\n".join(_notes()))
    return "\n\n".join(parts)


def markdown_report(results: dict[str, Any], command: str) -> str:
    """The README's results section."""
    parts = [
        "## Benchmark results",
        f"Produced by `{command}` on the machine described below. To measure yours:\n\n"
        "```\nenv -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python -m benchmarks --markdown "
        "results.md --json results.json --plot results.png\n```\n\n"
        "`--quick` finishes in under a minute; `--threads N` sets BLAS, Numba and PyTorch threads; "
        "`--suite` / `--config` pick what to run (`python -m benchmarks --help`). The PyTorch "
        "columns need torch, an optional extra (the CPU build: `pip install torch --index-url "
        "https://download.pytorch.org/whl/cpu`); without it they are skipped; it is timed in a "
        "process of its own. The runner re-executes itself without the OpenBLAS variables above "
        "(they force a slower kernel) unless given `--keep-blas-env`.",
        "\n".join(f"- {line}" for line in _header_lines(results)),
    ]
    for title, headers, rows in _tables(results):
        parts.append(f"### {title}\n\n{_markdown_table(headers, rows)}")
    if results.get("targets"):
        parts.append("### Targets\n\n" + "\n".join(f"- {t}" for t in _targets_lines(results)))
    parts.append("### Notes\n\n" + "\n".join(f"- {n}" for n in _notes()))
    return "\n\n".join(parts) + "\n"


def write_json(results: dict[str, Any], path: str | Path) -> None:
    Path(path).write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")


def write_plot(results: dict[str, Any], path: str | Path) -> None:
    """PNG: decode ms/token vs context length (left), training ms/step per config (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    suites = results["suites"]
    gen = suites.get("generate", [])
    if gen and suites.get("train"):
        fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    else:  # one panel for the one suite that ran
        fig, axis = plt.subplots(1, 1, figsize=(7, 4.5))
        left = right = axis
    if gen:
        contexts = [r["params"]["context"] for r in gen]
        for variant in gen[0]["variants"]:
            left.plot(
                contexts,
                [r["variants"][variant]["median_ms"] for r in gen],
                marker="o",
                linestyle="-" if "uncached" not in variant else "--",
                label=variant.replace("numba", "glassgrad").replace("numpy", "numpy-ref"),
            )
        left.set_xscale("log", base=2)
        left.set_yscale("log")
        left.set_xlabel("context length (tokens)")
        left.set_ylabel("ms per generated token")
        left.set_title(f"Decode step, {gen[0]['params']['config']}, batch 1")
        left.legend(fontsize=8)
    train = suites.get("train", [])
    if train:
        names = [r["name"] for r in train]
        variants = [v for v in TRAIN_COLUMNS if v in train[0]["variants"]]
        width = 0.8 / len(variants)
        for i, variant in enumerate(variants):
            right.bar(
                [j + i * width for j in range(len(names))],
                [r["variants"][variant]["median_ms"] for r in train],
                width,
                label=variant,
            )
        right.set_xticks([j + width * (len(variants) - 1) / 2 for j in range(len(names))], names)
        right.set_yscale("log")
        right.set_ylabel("ms per training step")
        right.set_title("Training step by config")
        right.legend(fontsize=8)
    env = results["environment"]
    fig.suptitle(f"glassgrad benchmarks, {env['cpu']}, {env['date']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
