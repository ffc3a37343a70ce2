"""Training-step time and kernel count with and without the `fuse` pass.

    .venv/bin/python benchmarks/fusion_step.py [--models mlp lstm_cell] [--threads 1 2]
                                               [--fuse-options 'region-us=2'] [--clock cpu]
                                               [--jit] [--json]

Each model (examples/<name>.nf at its default sizes) is compiled twice into an artifact:
with nfc's default pipeline, and with `fuse` appended. Both start from the same initial
parameters; the first step's losses must agree. Steps run through `Function.bind` (one
ctypes call each), the two builds alternating so that other load on the machine hits both;
the table gives the median and the best step time per thread count. `--jit` runs the steps
kernel by kernel through the JIT instead (a ctypes call per kernel, which favours fewer
kernels more than the artifact does).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _artifact_steps(name: str, pipeline: str, settings: list[str]):

    from nfc.runtime.build import compile_model
    from nfc.runtime.loader import load
    from nfc.runtime.train import synthetic_train_step

    # `pipeline` is the whole build pipeline (no apply-tuning; fusion, if any, in it)
    built = compile_model(ROOT / "examples" / f"{name}.nf", pipeline=pipeline, settings=settings)
    model = load(built.path)
    bound = synthetic_train_step(model, classes=4)
    meta = model.train_step.meta
    info = {"kernels": len(meta["kernels"]), "copies": meta["copies"],
            "arena_kib": meta["arena_bytes"] // 1024}
    loss = float(bound()["loss"])
    return model, bound, info, loss


def _jit_steps(name: str, fuse: str | None):
    import numpy as np

    sys.path.insert(0, str(ROOT / "tests" / "passes"))
    from fusion_testlib import jit_step, step_inputs, train_module

    from nfc.codegen.jit import set_num_threads
    from nfc.passmanager import build_pipeline

    module = train_module(f"{name}.nf")
    if fuse is not None:
        for p in build_pipeline(fuse):
            p.apply(__import__("nfc.passmanager").passmanager.Context(), module)
    f = module.func("train_step")
    step, n = jit_step(f)
    ins = step_inputs(f)
    loss = float(np.asarray(step(ins)[0]))

    class _Model:
        def set_num_threads(self, k: int) -> None:
            set_num_threads(k)
    return _Model(), lambda: step(ins), {"kernels": n, "copies": 0, "arena_kib": 0}, loss


def main(argv: list[str] | None = None) -> int:
    """Run the comparison and print the table."""
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["mlp", "lstm_cell"])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--fuse-options", default="", help="options of fuse, e.g. 'region-us=2'")
    ap.add_argument("--jit", action="store_true", help="kernel by kernel through the JIT")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="cpu: process CPU time (robust to other load; threads' spinning "
                         "counts, so use it with --threads 1)")
    ap.add_argument("--set", dest="settings", action="append", default=[], metavar="K=V",
                    help="model parameters for every model (e.g. batch=1024)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    from nfc.runtime.build import CLEANUP_PIPELINE, MODEL_PIPELINE

    fuse = "fuse" + (f"{{{args.fuse_options}}}" if args.fuse_options else "")
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    rows = []
    for name in args.models:
        builds = {}
        for label, extra in (("unfused", None), ("fused", fuse)):
            if args.jit:
                builds[label] = _jit_steps(name, extra)
            else:
                pipe = f"{MODEL_PIPELINE},{CLEANUP_PIPELINE}" + ("," + extra if extra else "")
                builds[label] = _artifact_steps(name, pipe, args.settings)
        la, lb = builds["unfused"][3], builds["fused"][3]
        assert abs(la - lb) <= 1e-4 * max(1.0, abs(la)), f"{name}: losses differ {la} {lb}"
        for n in args.threads:
            times: dict[str, list[float]] = {"unfused": [], "fused": []}
            for model, _, _, _ in builds.values():
                model.set_num_threads(n)
            reps = max(1, int(0.2 / max(1e-6, _once(builds["unfused"][1]))))
            for _ in range(args.repeats):
                for label, (_, step, _, _) in builds.items():
                    t = clock()
                    for _ in range(reps):
                        step()
                    times[label].append((clock() - t) / reps)
            row = {"model": name, "threads": n}
            for label, (_, _, info, _) in builds.items():
                row[f"{label}_kernels"] = info["kernels"]
                row[f"{label}_copies"] = info["copies"]
                row[f"{label}_arena_kib"] = info["arena_kib"]
                row[f"{label}_median_ms"] = statistics.median(times[label]) * 1e3
                row[f"{label}_min_ms"] = min(times[label]) * 1e3
            row["speedup_median"] = row["unfused_median_ms"] / row["fused_median_ms"]
            rows.append(row)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"{'model':<10} {'thr':>3} {'kernels':>9} {'copies':>7} {'arena KiB':>11} "
          f"{'median ms':>17} {'best ms':>17} {'speedup':>7}")
    for r in rows:
        print(f"{r['model']:<10} {r['threads']:>3} "
              f"{r['unfused_kernels']:>4}->{r['fused_kernels']:<4} "
              f"{r['unfused_copies']:>3}->{r['fused_copies']:<3} "
              f"{r['unfused_arena_kib']:>5}->{r['fused_arena_kib']:<5} "
              f"{r['unfused_median_ms']:>8.3f}->{r['fused_median_ms']:<8.3f} "
              f"{r['unfused_min_ms']:>8.3f}->{r['fused_min_ms']:<8.3f} "
              f"{r['speedup_median']:>6.2f}x")
    return 0


def _once(step) -> float:
    t = time.perf_counter()
    step()
    return time.perf_counter() - t


if __name__ == "__main__":
    sys.exit(main())
