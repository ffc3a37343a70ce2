"""Benchmark (not a test): static vs tune-then-static vs dynamic mode, from a cold cache.

For each model, three ways to finish N training steps, each from its own empty cache directory
(no tuning records, no compiled libraries or objects: every compile is counted):

  (a) static:  `nfc train MODEL --max-steps N`                      (default schedules)
  (b) tuned:   `nfc tune MODEL --trials 2T --top K` then (a)        (tuning time counted)
  (c) dynamic: `nfc train MODEL --max-steps N --mode dynamic --explore-trials T
                --explore-top K`        (two search rounds: T then 2T trials per kernel,
                                         the same candidates (b) measures, same seed)
  (d) shared:  (c) with `--explore-threads <all cores>`: no pinning, training keeps every
               core and thread, the search runs beside it at nice 10 (`--modes` adds it)

    .venv/bin/python benchmarks/dynamic_modes.py --models lenet5 --steps lenet5=1500 \
        --modes dynamic,shared --out benchmarks/results/dynamic_policy_1     # the core policy

The wall time of each (process start to exit, all of them) and the per-step times (from
`--metrics`) are recorded; (c)'s step-time curve with its swaps, and (a)'s and (b)'s for
comparison, go to benchmarks/results/dynamic_modes.json and, with matplotlib,
dynamic_modes.png. Every run uses the defaults for threads (static: every core for large
steps; dynamic: the training core(s), see docs/dynamic.md) and synthetic data.

    .venv/bin/python benchmarks/dynamic_modes.py      # 24 min on 2 cores at load 17
    .venv/bin/python benchmarks/dynamic_modes.py --models lenet5 --steps lenet5=500   # smoke

The machine's load average is recorded before and after every run: on a shared machine the
numbers are noisy, and one run per mode is not a distribution.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MODELS = {
    "lenet5": ("LeNet-5", "examples/lenet5.nf"),
    "resnet18": ("ResNet-18", "examples/models/resnet18.nf"),
    "capsnet": ("CapsNet", "examples/models/capsnet.nf"),
}
#: Steps per model: each static run trains for about a minute on the development machine.
STEPS = {"lenet5": 2500, "resnet18": 200, "capsnet": 80}


def log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def load() -> float:
    return os.getloadavg()[0]


def run(cmd: list[str], cache: str, timeout: float) -> dict[str, Any]:
    """Run an nfc command with its own cache dir; wall time, load before/after, output."""
    env = dict(os.environ, NFC_CACHE_DIR=cache)
    before = load()
    t0 = time.monotonic()
    out = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True,
                         timeout=timeout)
    wall = time.monotonic() - t0
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{out.stderr[-3000:]}")
    return {"wall_s": wall, "load_before": before, "load_after": load(),
            "stdout": out.stdout, "stderr": out.stderr}


def read_metrics(path: str) -> dict[str, Any]:
    steps, final, swaps = [], {}, []
    for line in Path(path).read_text().splitlines():
        rec = json.loads(line)
        if rec.get("event") == "step":
            steps.append(rec["step_ms"])
        elif rec.get("event") == "final":
            final = rec
        elif rec.get("event") == "swap_timed":
            swaps.append(rec)
    return {"step_ms": steps, "final": final, "swaps": swaps}


def median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return (s[n // 2] + s[(n - 1) // 2]) / 2 if n else float("nan")


def train(model: str, steps: int, cache: str, extra: list[str], work: Path, tag: str,
          timeout: float) -> dict[str, Any]:
    metrics = str(work / f"{tag}.jsonl")
    res = run([sys.executable, "-m", "nfc", "train", model, "--data", "synthetic",
               "--max-steps", str(steps), "--no-eval", "--quiet", "--metrics", metrics,
               *extra], cache, timeout)
    m = read_metrics(metrics)
    final = m["final"]
    out = {"wall_s": res["wall_s"], "load_before": res["load_before"],
           "load_after": res["load_after"], "compile_s": final.get("compile_s"),
           "threads": final.get("threads"), "steps_s": sum(m["step_ms"]) / 1e3,
           "step_ms_median": median(m["step_ms"]),
           "step_ms_median_last_quarter": median(m["step_ms"][-max(1, steps // 4):]),
           "step_ms": m["step_ms"]}
    if "dynamic" in final:
        dyn = final["dynamic"]
        out["dynamic"] = {k: dyn.get(k) for k in (
            "train_s", "explore_cpu_s", "explore_wall_s", "kernels_searched", "explorer_exit",
            "cores", "explorer_done_step", "step_ms_exploring", "step_ms_after", "threads_after",
            "rejected")}
        out["swaps"] = dyn.get("swaps", [])
        out["summary_lines"] = [x for x in res["stdout"].splitlines()
                                if x.startswith("dynamic:")]
    return out


def bench_model(name: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    title, rel = MODELS[name]
    model = str(ROOT / rel)
    steps = args.steps.get(name, STEPS[name])
    row: dict[str, Any] = {"model": title, "file": rel, "steps": steps}
    order = args.modes.split(",")
    for mode in order:
        cache = tempfile.mkdtemp(prefix=f"nfc-dyn-{name}-{mode}-", dir=work)
        log(f"{title}: {mode} ({steps} steps), load {load():.1f}")
        if mode == "static":
            row["static"] = train(model, steps, cache, [], work, f"{name}-static",
                                  args.timeout)
        elif mode == "tuned":
            tune = run([sys.executable, "-m", "nfc", "tune", model, "--trials",
                        str(2 * args.trials), "--top", str(args.top), "--population", "8",
                        "--patience", "3", "--confirm", "1", "--quiet"], cache, args.timeout)
            r = train(model, steps, cache, [], work, f"{name}-tuned", args.timeout)
            r["tune_s"] = tune["wall_s"]
            r["train_wall_s"] = r["wall_s"]
            r["wall_s"] = tune["wall_s"] + r["wall_s"]
            r["load_before"] = tune["load_before"]
            row["tuned"] = r
        else:
            extra = ["--explore-threads", str(os.cpu_count() or 1)] if mode == "shared" else []
            row[mode] = train(model, steps, cache,
                              ["--mode", "dynamic", "--explore-trials", str(args.trials),
                               "--explore-top", str(args.top), *extra], work,
                              f"{name}-{mode}", args.timeout)
        log(f"{title}: {mode}: {row[mode]['wall_s']:.1f} s wall, step "
            f"{row[mode]['step_ms_median']:.2f} ms median")
    for mode in ("dynamic", "shared"):
        if "tuned" not in row or mode not in row:
            continue
        tuned_ms = row["tuned"]["step_ms_median"]
        dyn = row[mode]["step_ms"]
        # the first step from which the running median (21 steps) is within 5% of (b)'s
        reach = None
        for i in range(len(dyn)):
            if median(dyn[max(0, i - 20):i + 1]) <= 1.05 * tuned_ms:
                reach = i + 1
                break
        row[f"{mode}_reaches_tuned_step"] = reach
    return row


def plot(rows: list[dict[str, Any]], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    from nfc.runtime.dynamic.plot import rolling_median

    fig, axes = plt.subplots(1, len(rows), figsize=(5 * len(rows), 3.8), squeeze=False)
    for ax, row in zip(axes[0], rows, strict=True):
        window = max(1, row["steps"] // 30)
        for mode, color in (("static", "tab:gray"), ("tuned", "tab:green"),
                            ("dynamic", "tab:blue"), ("shared", "tab:purple")):
            if mode not in row:
                continue
            ms = row[mode]["step_ms"]
            ax.plot(range(1, len(ms) + 1), rolling_median(ms, window), color=color, lw=1.2,
                    label={"static": "(a) static, defaults", "tuned": "(b) after nfc tune",
                           "dynamic": "(c) dynamic", "shared": "(d) dynamic, shared cores"
                           }[mode])
        for n, s in enumerate(row.get("dynamic", row.get("shared", {})).get("swaps", [])):
            ax.axvline(s["step"], color="tab:red", ls="--", lw=0.8,
                       label="swap" if n == 0 else None)
        ax.set_title(f"{row['model']}: step time (median of {window})")
        ax.set_xlabel("step")
        ax.set_ylabel("ms")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def table(rows: list[dict[str, Any]]) -> str:
    """One line per model and mode: wall time, step times, swaps."""
    lines = ["| model | N | mode | wall | of which tuning | step ms (median) | "
             "last quarter | swaps | reaches (b) at step | load |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        for mode in ("static", "tuned", "dynamic", "shared"):
            if mode not in r:
                continue
            x = r[mode]
            lines.append(
                f"| {r['model']} | {r['steps']} | {mode} | {x['wall_s']:.0f} s | "
                f"{x.get('tune_s', 0):.0f} s | {x['step_ms_median']:.3g} | "
                f"{x['step_ms_median_last_quarter']:.3g} | {len(x.get('swaps', []))} | "
                f"{r.get(f'{mode}_reaches_tuned_step') or '-'} | "
                f"{x['load_before']:.1f}-{x['load_after']:.1f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--steps", default="", help="per model, e.g. lenet5=500,capsnet=50")
    ap.add_argument("--trials", type=int, default=6,
                    help="dynamic's first-round trials per kernel (nfc tune gets twice)")
    ap.add_argument("--top", type=int, default=2, help="kernels searched")
    ap.add_argument("--timeout", type=float, default=900.0)
    ap.add_argument("--modes", default="static,tuned,dynamic",
                    help="which runs, in this order (static, tuned, dynamic, shared)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "dynamic_modes"))
    args = ap.parse_args()
    args.steps = {k: int(v) for k, v in (x.split("=") for x in args.steps.split(",") if x)}
    work = Path(tempfile.mkdtemp(prefix="nfc-dynamic-bench-"))
    rows = []
    t0 = time.monotonic()
    for name in args.models.split(","):
        rows.append(bench_model(name, args, work))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
           "cpus": os.cpu_count(), "trials": args.trials, "top": args.top,
           "total_s": time.monotonic() - t0, "rows": rows}
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    os.replace(tmp, out.with_suffix(".json"))
    if plot(rows, out.with_suffix(".png")):
        log(f"plot: {out.with_suffix('.png')}")
    print(table(rows))
    log(f"total {doc['total_s']:.0f} s; results {out.with_suffix('.json')}")


if __name__ == "__main__":
    main()
