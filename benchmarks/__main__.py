"""`python -m benchmarks` / `glassgrad-bench`: honest figures for this machine in one command.

    python -m benchmarks                       # ops, kernels, train, generate on tiny, mid, small
    python -m benchmarks --suite ddp           # training tokens/s at 1 and 2 MPI ranks
    python -m benchmarks --suite tokenizer     # BPE: train 1,000 merges, encode the demo corpus
    python -m benchmarks --suite llm           # SmolLM2-135M's shape: prefill, decode vs HF
    python -m benchmarks --quick               # small shapes, < 1 minute (the test suite runs it)
    python -m benchmarks --suite train --config V65/T128/L4/H4/C128/B16 --threads 2
    python -m benchmarks --json out.json --markdown docs/benchmarks.md --plot bench.png

OpenBLAS tuning variables (OPENBLAS_CORETYPE, OPENBLAS_L2_SIZE) force a kernel when numpy loads
OpenBLAS, too late to undo in-process. Run as a command, the runner therefore re-executes itself
once without them (reported in the header); --keep-blas-env keeps them and only warns.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys

from benchmarks.system import BLAS_ENV_VARS, blas_env_warning

_REEXEC_MARK = "GLASSGRAD_BENCH_REEXEC_FROM"  # the removed variables, for the report header


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="glassgrad benchmarks: ops, kernels, training step and generation, each "
        "against the numpy reference path and (if installed) PyTorch CPU.",
    )
    parser.add_argument(
        "--suite",
        action="append",
        choices=("ops", "kernels", "train", "generate", "ddp", "tokenizer", "llm"),
        help="suite to run (repeatable; default: ops, kernels, train, generate; ddp, tokenizer "
        "and llm (benchmarks.llm: its own table, fresh processes) on request)",
    )
    parser.add_argument(
        "--config",
        action="append",
        help="training config: tiny, mid, small or V../T../L../H../C../B.. (repeatable; default: "
        "tiny mid small; quick: tiny). ops and generate use the last one.",
    )
    parser.add_argument("--quick", action="store_true", help="small shapes, finishes in < 1 min")
    parser.add_argument("--reps", type=int, help="timed repetitions per variant (7; quick 3)")
    parser.add_argument("--threads", type=int, help="threads for BLAS, Numba and torch")
    parser.add_argument("--no-torch", action="store_true", help="skip the PyTorch columns")
    parser.add_argument("--json", metavar="FILE", help="write all results as JSON")
    parser.add_argument(
        "--markdown",
        metavar="FILE",
        nargs="?",
        const="-",
        help="write the README results section (to stdout without FILE)",
    )
    parser.add_argument("--plot", metavar="FILE", help="write a PNG (time vs context / config)")
    parser.add_argument(
        "--keep-blas-env",
        action="store_true",
        help=f"do not re-execute without {' / '.join(BLAS_ENV_VARS)} (only warn)",
    )
    parser.add_argument(
        "--render",
        metavar="FILE",
        help="run nothing: re-render the table / --markdown / --plot from a saved --json FILE",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    # internal: the second process that times the PyTorch variants (see runner.run_benchmarks)
    parser.add_argument("--torch-only", action="store_true", help=argparse.SUPPRESS)
    return parser


def _reexec_without_blas_env(argv: list[str]) -> None:
    """Replace this process by `python -m benchmarks argv` without the OpenBLAS variables."""
    removed = {name: os.environ[name] for name in BLAS_ENV_VARS if os.environ.get(name)}
    if not removed or _REEXEC_MARK in os.environ:
        return
    env = {k: v for k, v in os.environ.items() if k not in removed}
    env[_REEXEC_MARK] = json.dumps(removed)
    print(f"benchmarks: re-executing without {', '.join(removed)}", file=sys.stderr, flush=True)
    os.execve(sys.executable, [sys.executable, "-m", "benchmarks", *argv], env)


def main(argv: list[str] | None = None) -> int:
    """Entry point. argv None means a real command line (sys.argv), which may re-execute."""
    command_line = argv is None
    argv = sys.argv[1:] if argv is None else list(argv)
    args = _parser().parse_args(argv)
    if command_line and not args.keep_blas_env:
        _reexec_without_blas_env(argv)
    warning = blas_env_warning()
    if warning:
        print(warning, file=sys.stderr)

    # Heavy imports only after the environment is settled.
    from benchmarks.configs import parse_config
    from benchmarks.runner import DEFAULT_SUITES, run_benchmarks

    if args.suite and "llm" in args.suite:  # its own fresh processes and table
        from benchmarks import llm

        llm.main(["--threads", str(args.threads or 2), "--reps", str(args.reps or 3)])
        args.suite = [s for s in args.suite if s != "llm"]
        if not args.suite:
            return 0
    if args.render:
        with open(args.render, encoding="utf-8") as f:
            results = json.load(f)
        _write_outputs(results, args, results.get("command", "python -m benchmarks"))
        return 0
    try:
        configs = [parse_config(c) for c in args.config] if args.config else None
        log = (lambda _msg: None) if args.quiet else (lambda msg: print(msg, file=sys.stderr))
        results = run_benchmarks(
            args.suite or DEFAULT_SUITES,
            configs=configs,
            quick=args.quick,
            reps=args.reps,
            threads=args.threads,
            use_torch=not args.no_torch,
            log=log,
            reexec_from=json.loads(os.environ.get(_REEXEC_MARK, "{}")),
            torch_only=args.torch_only,
        )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    argv_shown = shlex.join(a for a in argv if a != "--quiet")
    results["command"] = f"python -m benchmarks {argv_shown}".strip()
    if args.torch_only:
        from benchmarks import report

        report.write_json(results, args.json)
        return 0
    _write_outputs(results, args, results["command"])
    return 0


def _write_outputs(results: dict, args: argparse.Namespace, command: str) -> None:
    from benchmarks import report

    print(report.text_report(results))
    if args.json and not args.render:
        report.write_json(results, args.json)
    if args.plot:
        report.write_plot(results, args.plot)
    if args.markdown:
        text = report.markdown_report(results, command)
        if args.markdown == "-":
            print(text)
        else:
            with open(args.markdown, "w", encoding="utf-8") as f:
                f.write(text)


if __name__ == "__main__":
    sys.exit(main())
