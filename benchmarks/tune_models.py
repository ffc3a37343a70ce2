"""Benchmark (not a test): what `nfc tune` gains on this machine.

For the matmul and convolution kernels of the training steps of MLP-3, LeNet-5 and the capsule
network (examples/*.nf), the default schedule's time against the best of a 200-trial genetic
search; then the measured training-step time with default schedules against the step after
`nfc tune` (those kernels plus every other kernel above --min-share, tuned with --rest-trials).

    python benchmarks/tune_models.py                          # about two hours on 2 cores
    python benchmarks/tune_models.py --trials 20 --rest-trials 4 --models mlp   # a smoke run
    python benchmarks/tune_models.py --retime      # re-time default vs tuned kernels afterwards

Results go to a fresh tuning cache (--db, default $TMPDIR/nfc-bench/tune_models.sqlite, reused
on a rerun: the search resumes) and to --out (JSON and a Markdown table).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MODELS = {"mlp": "MLP-3", "lenet5": "LeNet-5", "capsule": "capsule net"}


def kernel_kind(op: Any) -> str | None:
    """`matmul` (codegen's GEMM pattern), `conv` (a sum whose loads index by an output axis
    plus a reduction axis: convolutions and their gradients), else None."""
    from nfc.codegen.space import match_gemm
    from nfc.ir import ComputeOp, Load, index_names

    if not isinstance(op, ComputeOp) or op.reduce != "sum":
        return None
    if match_gemm(op) is not None:
        return "matmul"
    dims, red = {a.name for a in op.dims}, {a.name for a in op.raxes}
    for ld in op.body.walk():
        if isinstance(ld, Load) and any(index_names(x) & dims and index_names(x) & red
                                        for x in ld.indices):
            return "conv"
    return None


def log(text: str) -> None:
    """A timestamped progress line on stderr."""
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def bench_model(name: str, cache: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Tune one model's matmul/conv kernels, then the rest, then time the step both ways."""
    from nfc.runtime.tuning.category import default_category
    from nfc.runtime.tuning.driver import (
        TuneOptions,
        build_model,
        step_samples,
        tune_kernel,
        tune_module,
    )
    from nfc.runtime.tuning.kernels import collect_kernels, schedule_lookup
    from nfc.runtime.tuning.report import Progress

    module = build_model(ROOT / "examples" / f"{name}.nf")
    category = default_category()
    kernels = collect_kernels(module, ["train_step"])
    heavy = [(kernel_kind(k.op), k) for k in kernels if kernel_kind(k.op)]
    opts = TuneOptions(trials=args.trials, patience=10**6, population=args.population,
                       seed=args.seed)
    rows = []
    for n, (kind, k) in enumerate(heavy, 1):
        t0 = time.monotonic()
        res, rejected = tune_kernel(k, cache, category, opts)
        entry = cache.lookup(category, k.key, _default_of(k))
        default = entry.time if entry is not None else res.default_time
        rows.append({"kind": kind, "kernel": k.desc, "calls": k.count, "key": k.key,
                     "default_s": default, "tuned_s": res.time,
                     "speedup": default / res.time if default and res.time else None,
                     "trials": res.evaluated, "measured": res.measured, "failed": res.failed,
                     "rejected": rejected, "schedule": res.schedule})
        log(f"{name} [{n}/{len(heavy)}] {kind} {k.desc}: {_ms(default)} -> {_ms(res.time)} "
            f"({res.evaluated} trials, {res.failed} failed, {time.monotonic() - t0:.0f}s)")
    # `nfc tune` for the whole step: the kernels above replay from the cache
    rest = TuneOptions(trials=args.rest_trials, population=args.population, seed=args.seed,
                       patience=10**6, min_share=args.min_share, order="profile")
    report = tune_module(module, cache, options=rest,
                         progress=Progress(0, args.rest_trials, bar=False, interval=60))
    log(f"{name}: nfc tune done ({report.measured} more measured)")
    lookup = schedule_lookup(module, cache, category)
    samples = step_samples(module, "train_step", lookup, repeats=args.step_repeats)
    step = {f"{which}_{stat.__name__}": stat(v) for which, v in samples.items()
            for stat in (statistics.median, min)}
    log(f"{name}: step (median) {_ms(step['default_median'])} -> {_ms(step['tuned_median'])}"
        f", (min) {_ms(step['default_min'])} -> {_ms(step['tuned_min'])}")
    return {"model": name, "kernels": rows, "step": step, "report": report.to_json()}


def _default_of(k: Any) -> dict[str, Any]:
    from nfc.codegen.kernel_spec import space
    from nfc.runtime.tuning.kernels import kernel_spec

    return space(kernel_spec(k)).default()


def retime(name: str, cache: Any, rounds: int = 5, calls: int = 10) -> list[dict[str, Any]]:
    """Time each matmul/conv kernel's default and cached best schedule again, in this process
    and alternately, keeping the minimum and the median of single calls: the minimum shows
    what a schedule can do on a quiet machine, the median what it did on this one."""
    import numpy as np

    from nfc.codegen.kernel_spec import space
    from nfc.runtime.tuning.category import default_category
    from nfc.runtime.tuning.driver import build_kernel, build_model
    from nfc.runtime.tuning.kernels import collect_kernels, kernel_spec
    from nfc.runtime.tuning.worker import make_inputs

    module = build_model(ROOT / "examples" / f"{name}.nf")
    rows = []
    for k in collect_kernels(module, ["train_step"]):
        kind = kernel_kind(k.op)
        best = cache.best(default_category(), k.key) if kind else None
        if best is None:
            continue
        spec = kernel_spec(k)
        args = make_inputs(spec, 0)
        runs = {"default": build_kernel(spec, space(spec).default()),
                "tuned": build_kernel(spec, best.schedule)}
        times: dict[str, list[float]] = {n: [] for n in runs}
        for _ in range(rounds):
            for n, run in runs.items():
                run(args)
                for _ in range(calls):
                    t0 = time.perf_counter()
                    run(args)
                    times[n].append(time.perf_counter() - t0)
        row = {"kind": kind, "kernel": k.desc}
        for n, ts in times.items():
            row[f"{n}_min"], row[f"{n}_median"] = min(ts), float(np.median(ts))
        rows.append(row)
        log(f"retime {name} {k.desc}: min {_ms(row['default_min'])} -> {_ms(row['tuned_min'])}"
            f", median {_ms(row['default_median'])} -> {_ms(row['tuned_median'])}")
    return rows


def retime_markdown(rows: dict[str, list[dict[str, Any]]]) -> str:
    """The re-timed kernels as a Markdown table."""
    lines = ["Re-timed in one process, alternating (single calls; min | median):", "",
             "| model | kind | kernel | default min | tuned min | speedup (min) | "
             "default median | tuned median | speedup (median) |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for name, rs in rows.items():
        for r in rs:
            lines.append(
                f"| {MODELS[name]} | {r['kind']} | `{r['kernel']}` | {_ms(r['default_min'])} | "
                f"{_ms(r['tuned_min'])} | {r['default_min'] / r['tuned_min']:.2f}x | "
                f"{_ms(r['default_median'])} | {_ms(r['tuned_median'])} | "
                f"{r['default_median'] / r['tuned_median']:.2f}x |")
    return "\n".join(lines)


def _ms(t: float | None) -> str:
    return "-" if t is None else f"{t * 1e3:.3f} ms"


def markdown(results: list[dict[str, Any]], args: argparse.Namespace) -> str:
    """The results as Markdown tables."""
    lines = [f"Kernels ({args.trials} trials each; times are medians of one call):", "",
             "| model | kind | kernel | default | tuned | speedup |",
             "|---|---|---|---:|---:|---:|"]
    for r in results:
        for k in r["kernels"]:
            sp = f"{k['speedup']:.2f}x" if k["speedup"] else "-"
            lines.append(f"| {MODELS[r['model']]} | {k['kind']} | `{k['kernel']}` | "
                         f"{_ms(k['default_s'])} | {_ms(k['tuned_s'])} | {sp} |")
    lines += ["", "Training step after `nfc tune` (matmul/conv kernels above, every other "
              f"kernel above {100 * args.min_share:g}% of the step with {args.rest_trials} "
              "trials); median and minimum of the timed steps:", "",
              "| model | default step | tuned step | speedup (median) | speedup (min) |",
              "|---|---:|---:|---:|---:|"]
    for r in results:
        s = r["step"]
        lines.append(f"| {MODELS[r['model']]} | {_ms(s['default_median'])} | "
                     f"{_ms(s['tuned_median'])} | "
                     f"{s['default_median'] / s['tuned_median']:.2f}x | "
                     f"{s['default_min'] / s['tuned_min']:.2f}x |")
    return "\n".join(lines)


def main() -> int:
    """Run the benchmark."""
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--rest-trials", type=int, default=24)
    ap.add_argument("--min-share", type=float, default=0.005)
    ap.add_argument("--population", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--step-repeats", type=int, default=50)
    scratch = Path(tempfile.gettempdir()) / "nfc-bench"
    ap.add_argument("--db", default=str(scratch / "tune_models.sqlite"))
    ap.add_argument("--out", default=str(scratch / "tune_models"))
    ap.add_argument("--retime", action="store_true",
                    help="only re-time the tuned kernels of an earlier run (same --db)")
    args = ap.parse_args()
    from nfc.runtime.tuning.cache import TuningCache

    if args.retime:
        with TuningCache(args.db, create=False) as cache:
            rows = {name: retime(name, cache) for name in args.models}
        text = retime_markdown(rows)
        Path(args.out + "_retime.md").write_text(text + "\n")
        Path(args.out + "_retime.json").write_text(json.dumps(rows, indent=1))
        print(text)
        return 0

    Path(args.db).parent.mkdir(parents=True, exist_ok=True)
    results = []
    start = time.monotonic()
    with TuningCache(args.db) as cache:
        for name in args.models:
            results.append(bench_model(name, cache, args))
    table = markdown(results, args)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"trials": args.trials, "rest_trials": args.rest_trials, "seconds":
            time.monotonic() - start, "loadavg": os.getloadavg(), "cpus": os.cpu_count()}
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "results": results},
                                                   indent=1, default=str))
    out.with_suffix(".md").write_text(table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
