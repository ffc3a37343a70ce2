"""Benchmark (not a test): `nfc tune --cluster` with 1 against 2 dask workers.

Tunes the kernels of a small model's training step through a dask `LocalCluster` of 1 and of
2 worker processes (1 thread each), each run into a fresh tuning cache so that every
candidate is measured, and prints the wall time and the candidates measured per second of
each, and the ratio 2 workers / 1 worker. The search sends a whole generation at a time
(`ClusterMeasurer.measure_batch`), so with two workers two candidates are measured at once.
Runs alternate (1, 2, 1, 2, ...: drift of a shared machine affects both alike) and the
medians are reported; `--local` adds the local path (no cluster) as a third arm.

    python benchmarks/dask_tuning.py                         # MLP-3, 2 rounds, ~2 minutes
    python benchmarks/dask_tuning.py --rounds 3 --trials 32 --local --json out.json

The searches of the two arms need not propose the same candidates after the first generation
(the times differ), so compare candidates per second rather than the wall time alone. On a
machine with fewer free cores than workers the two workers' measurements compete for the
CPU: the ratio is then bounded by the free cores, and the times they measure are disturbed.
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


def tune_once(module: Any, make: Any, args: argparse.Namespace, db: Path) -> dict[str, Any]:
    """One tuning run into a fresh cache at `db`: wall seconds and candidates measured."""
    from nfc.runtime.tuning.cache import TuningCache
    from nfc.runtime.tuning.driver import TuneOptions, tune_module

    options = TuneOptions(trials=args.trials, population=args.population,
                          patience=args.patience, top=args.top, order="cost", confirm=0,
                          seed=args.seed, measurer=make)
    with TuningCache(db) as cache:
        t0 = time.perf_counter()
        report = tune_module(module, cache, options=options)
        wall = time.perf_counter() - t0
    measured = sum(r.measured for r in report.kernels)
    return {"wall_s": wall, "measured": measured, "per_s": measured / wall,
            "kernels": sum(r.status == "tuned" for r in report.kernels)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(ROOT / "examples" / "mlp.nf"))
    ap.add_argument("--set", dest="settings", action="append", default=[], metavar="K=V")
    ap.add_argument("--trials", type=int, default=24, help="candidates per kernel")
    ap.add_argument("--population", type=int, default=8, help="candidates per generation")
    ap.add_argument("--patience", type=int, default=100)
    ap.add_argument("--top", type=int, default=3, help="kernels tuned (most expensive)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=2, help="runs of each arm (alternating)")
    ap.add_argument("--local", action="store_true", help="also tune without a cluster")
    ap.add_argument("--json", metavar="OUT", help="write the results as JSON")
    args = ap.parse_args(argv)

    try:
        from distributed import LocalCluster
    except ImportError:
        print("needs dask.distributed: pip install 'nfc[distributed]'", file=sys.stderr)
        return 1
    from nfc.runtime.distributed.dask_tune import cluster_measurer
    from nfc.runtime.tuning.driver import build_model

    module = build_model(args.model, args.settings)
    clusters = {n: LocalCluster(n_workers=n, threads_per_worker=1, processes=True,
                                dashboard_address=":0", silence_logs=40) for n in (1, 2)}
    arms: dict[str, list[dict[str, Any]]] = {"1 worker": [], "2 workers": []}
    if args.local:
        arms["local"] = []
    try:
        with tempfile.TemporaryDirectory(prefix="nfc-dask-bench-") as tmp, \
                cluster_measurer(clusters[1]) as one, cluster_measurer(clusters[2]) as two:
            makes = {"1 worker": one, "2 workers": two, "local": None}
            for r in range(args.rounds):
                for arm in arms:
                    res = tune_once(module, makes[arm], args,
                                    Path(tmp) / f"{arm.replace(' ', '-')}-{r}.sqlite")
                    arms[arm].append(res)
                    print(f"round {r + 1} {arm:>9}: {res['wall_s']:6.1f} s, "
                          f"{res['measured']} candidates ({res['kernels']} kernels), "
                          f"{res['per_s']:.2f} candidates/s", flush=True)
    finally:
        for c in clusters.values():
            c.close()

    summary = {arm: {"wall_s": statistics.median(x["wall_s"] for x in runs),
                     "per_s": statistics.median(x["per_s"] for x in runs),
                     "measured": statistics.median(x["measured"] for x in runs)}
               for arm, runs in arms.items()}
    print()
    for arm, s in summary.items():
        print(f"median {arm:>9}: {s['wall_s']:6.1f} s, {s['per_s']:.2f} candidates/s")
    ratio = summary["2 workers"]["per_s"] / summary["1 worker"]["per_s"]
    wall = summary["1 worker"]["wall_s"] / summary["2 workers"]["wall_s"]
    print(f"2 workers / 1 worker: {ratio:.2f}x candidates/s, wall time 1/2 = {wall:.2f}x")
    load = os.getloadavg()
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "model": args.model, "trials": args.trials, "population": args.population,
            "top": args.top, "runs": arms, "median": summary, "ratio_per_s": ratio,
            "ratio_wall": wall, "loadavg": load}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
