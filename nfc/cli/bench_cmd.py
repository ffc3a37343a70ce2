"""`nfc bench`: time one training step in nfc, PyTorch eager, torch.compile and JAX.

    nfc bench examples/mlp.nf                          # nfc vs the baselines, 1 and 2 threads
    nfc bench --all --json bench.jsonl                 # every example model (< 30 min, 2 cores)
    nfc bench lenet5 --frameworks nfc,torch --threads 1 --min-time 2 --set batch=128
    nfc bench examples/mlp.nf --quick                  # a smoke run: small sizes, few steps
    nfc bench resnet18 --profile                       # plus nfc's slowest kernels

One step is forward, loss, backward and the optimizer update on a batch resident in memory.
Every case runs in a fresh process, one after another: nfc's library (compiled cold by the
build pipeline of `nfc compile`, tuned schedules and fusion included: --print-pipeline shows
it, -p and the --no-* flags change it) and the baselines in benchmarks/run_baseline.py,
all from nfc's initial parameters and the same inputs. After warm-up the median of single
steps over at least --min-time seconds counts. The table gives each time, its ratio to nfc's,
the cold compile time and the peak RSS of each process; --json writes one line per case.
A case that fails is reported with its reason and the run goes on. `--model NAME` chooses the
model of a file that defines several, as in `nfc compile`. docs/performance.md has
the method, the machine and the results.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from nfc.cli import UsageError
from nfc.cli.pipeline_args import add_build_pipeline_arguments, add_model_argument, build_flags

#: Minutes `nfc bench --all` may take (under half an hour on a 2-core machine).
ALL_BUDGET_MIN = 29


def add_parser(subparsers: Any) -> None:
    """Register `nfc bench`."""
    p = subparsers.add_parser("bench", help="time training steps against PyTorch and JAX",
                              description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", nargs="*", metavar="MODEL",
                   help="a .nf file or a benchmark name (mlp3, lenet5, ...)")
    p.add_argument("--all", action="store_true", help="every example model")
    p.add_argument("--list", action="store_true", help="list the benchmark models and exit")
    p.add_argument("--threads", default="1,2", help="thread counts (default 1,2)")
    p.add_argument("--frameworks", default="nfc,torch,torch-compile,jax",
                   help="any of nfc,torch,torch-compile,jax (default: all)")
    p.add_argument("--min-time", type=float, default=None, metavar="SEC",
                   help="seconds of timed steps per case (default 1.0; --quick 0.05)")
    p.add_argument("--min-steps", type=int, default=None,
                   help="timed steps per case, at least (default 3)")
    p.add_argument("--warmup", type=float, default=None, metavar="SEC",
                   help="seconds of warm-up steps after the first (default 0.2; --quick 0)")
    p.add_argument("--json", metavar="OUT.jsonl", help="write one JSON line per case")
    p.add_argument("--set", dest="settings", action="append", default=[], metavar="K=V",
                   help="a model param for every model (repeatable)")
    p.add_argument("--quick", action="store_true",
                   help="smoke mode: small sizes, few steps, the library cache allowed")
    p.add_argument("--profile", action="store_true",
                   help="also profile nfc's step and show its slowest kernels")
    p.add_argument("--timeout", type=float, default=None, metavar="SEC",
                   help="seconds one process may take (default 900; --quick 300)")
    p.add_argument("--budget", type=float, default=None, metavar="MIN",
                   help="skip (and report) the cases left after this many minutes; "
                   f"torch.compile on 2 threads runs last (--all: {ALL_BUDGET_MIN}; 0: none)")
    p.add_argument("--seed", type=int, default=0, help="initial parameters and inputs")
    p.add_argument("--keep", metavar="DIR", help="keep libraries and case files in DIR")
    p.add_argument("--report", metavar="IN.jsonl",
                   help="print the tables of an earlier run's --json file (runs nothing)")
    p.add_argument("--markdown", action="store_true",
                   help="with --report: the step-time table in Markdown")
    add_model_argument(p)
    add_build_pipeline_arguments(p, pass_manager=False)
    p.set_defaults(func=run)


def _ints(text: str, what: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise UsageError(f"{what} takes comma-separated integers, got '{text}'") from None
    if not vals or any(v < 1 for v in vals):
        raise UsageError(f"{what} takes positive integers, got '{text}'")
    return vals


def _choose(m: Any, model: str | None) -> Any:
    """`m` with the model `--model` names (the compiler's located errors when the file has
    none of that name, or several and no `--model`), checked here by parsing the file, before
    the worker processes compile it."""
    import dataclasses

    from nfc.frontend import choose_model

    name = choose_model(m.file, model)
    if model is None:
        return m
    return dataclasses.replace(m, model=name, name=m.name if m.twin else name)


def run(args: argparse.Namespace) -> int:
    """Benchmark and print the tables."""
    from nfc.runtime.bench.driver import FRAMEWORKS, BenchOptions, Runner, estimate_seconds
    from nfc.runtime.bench.models import MODELS, UnknownModel, resolve
    from nfc.runtime.bench.worker import case_pipeline
    from nfc.runtime.build import SettingError, parse_settings

    if args.report:
        return _report(args.report, args.markdown)
    if args.list:
        for m in MODELS:
            sizes = ", ".join(f"{k}={v}" for k, v in m.params.items()) or "file defaults"
            print(f"{m.name:<16} {m.path:<34} twin: {m.twin or '-':<16} {sizes}")
        return 0
    if args.all and args.models:
        raise UsageError("give model files or --all, not both")
    if not args.all and not args.models:
        raise UsageError("nothing to benchmark: give a model (.nf file or name) or --all")
    try:
        models = MODELS if args.all else tuple(resolve(s) for s in args.models)
    except UnknownModel as exc:
        raise UsageError(str(exc)) from None
    if args.all and args.model is not None:
        raise UsageError("--model chooses the model of the files given; it does not combine "
                         "with --all")
    models = tuple(_choose(m, args.model) for m in models)
    frameworks = tuple(f.strip() for f in args.frameworks.split(",") if f.strip())
    bad = [f for f in frameworks if f not in FRAMEWORKS]
    if bad or not frameworks:
        raise UsageError(f"unknown framework(s) {', '.join(bad) or '(none)'}; "
                         f"choose from {','.join(FRAMEWORKS)}")
    try:
        params, opt = parse_settings(args.settings)
    except SettingError as exc:
        raise UsageError(str(exc)) from None
    if opt:
        raise UsageError("nfc bench takes model params only: the optimizer is the model's "
                         "(the baselines mirror it)")
    quick = args.quick
    budget = args.budget if args.budget is not None else (ALL_BUDGET_MIN if args.all else None)
    opts = BenchOptions(
        models=tuple(models), frameworks=frameworks, threads=_ints(args.threads, "--threads"),
        min_time=args.min_time if args.min_time is not None else (0.05 if quick else 1.0),
        min_steps=args.min_steps if args.min_steps is not None else 3,
        warmup=args.warmup if args.warmup is not None else (0.0 if quick else 0.2),
        quick=quick, settings=params, seed=args.seed, profile=args.profile,
        timeout=args.timeout if args.timeout is not None else (300.0 if quick else 900.0),
        budget=budget * 60 if budget is not None and budget > 0 else None,
        defer=bool(budget), work_dir=args.keep, pipeline=args.pipeline, **build_flags(args))
    # nfc's pipeline, as its compile worker will build each model (a bad -p fails here)
    pipelines = [case_pipeline({"source": str(m.file), **opts.pipeline_spec()})
                 for m in opts.models]
    if args.print_pipeline:
        print("\n".join(dict.fromkeys(pipelines)))
        return 0
    n_cases = len(opts.models) * len(opts.threads) * len(opts.frameworks)
    est = estimate_seconds(opts)
    print(f"nfc bench: {len(opts.models)} model(s), {n_cases} cases "
          f"({','.join(frameworks)} on {','.join(map(str, opts.threads))} thread(s)); "
          f"estimated {est / 60:.0f} min on an idle 2-core machine"
          + (f"; cases left after {opts.budget / 60:.0f} min are skipped (--budget)"
             if opts.budget else ""), file=sys.stderr)
    out = open(args.json, "w", encoding="utf-8") if args.json else None  # noqa: SIM115
    try:
        records = Runner(opts, out).run()
    finally:
        if out is not None:
            out.close()
    _print_tables(records)
    return 0


def _print_tables(records: list[dict[str, Any]]) -> None:
    from nfc.runtime.bench import report

    print(report.time_table(records))
    print()
    print(report.cost_table(records))
    slow = report.behind_text(records)
    others = any(r["framework"] != "nfc" and r.get("status") == "ok" for r in records)
    if slow:
        print("\nwhere nfc is furthest behind (its time / the fastest other framework's):")
        print(slow)
    elif others:
        print("\nnfc is the fastest in every case that ran")
    prof = report.profile_text(records)
    if prof:
        print("\nnfc's slowest kernels (profiled build):")
        print(prof)


def _report(path: str, markdown: bool) -> int:
    import json

    from nfc.runtime.bench import report

    try:
        with open(path, encoding="utf-8") as fh:
            records = [json.loads(line) for line in fh if line.strip()]
    except (OSError, json.JSONDecodeError) as exc:
        raise UsageError(f"cannot read '{path}': {exc}") from None
    if markdown:
        print(report.markdown(records))
    else:
        _print_tables(records)
    return 0
