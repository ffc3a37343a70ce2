"""Benchmark (not a test): what dynamic mode's kernel reports cost the training loop.

The loop samples one step in `--every` on the running library's profiled twin (the artifact's
per-kernel clock stamps) and then builds and writes a report (session.kernel_report, a JSON
file). For each model this measures, interleaved in one process (A B A B ..., medians):

  step:   one plain step vs one step of the profiled twin (the cost of a sampled step)
  report: building and writing one report (after a sampled step)
  loop:   blocks of `--block` steps with reporting (a sampled step + a report every
          `--every` steps, without the session's `--seconds` limit) vs the same blocks
          without: the overhead on training. The overhead expected from the first two
          numbers is printed too, without and with the limit (at most one sampled step per
          `--seconds`, which bounds it for steps much shorter than a millisecond).

    .venv/bin/python benchmarks/dynamic_report_overhead.py                  # mlp-big, lenet5
    .venv/bin/python benchmarks/dynamic_report_overhead.py --models lenet5 --rounds 5

The load average is printed: on a shared machine the ratios are noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
MODELS = {
    "mlp-big": ("examples/mlp.nf", ["batch=16", "inputs=2048", "hidden1=24", "hidden2=16",
                                    "classes=4"]),
    "mlp-tiny": ("examples/mlp.nf", ["batch=16", "inputs=32", "hidden1=24", "hidden2=16",
                                     "classes=4"]),
    "lenet5": ("examples/lenet5.nf", []),
}


def bench(name: str, args: argparse.Namespace, work: Path) -> dict[str, float]:
    from nfc.runtime.build import compile_model
    from nfc.runtime.dynamic.session import REPORT_BURST, kernel_report
    from nfc.runtime.dynamic.swap import SwappableStep
    from nfc.runtime.loader import load

    source, settings = MODELS[name]
    plain = compile_model(str(ROOT / source), str(work / f"{name}.so"), settings=settings)
    twin = compile_model(str(ROOT / source), str(work / f"{name}-profiled.so"),
                         settings=settings, profile=True)
    model = load(plain.path)
    model.init(0)
    model.set_num_threads(1)
    st = SwappableStep(model, model.functions["train_step"].bind())
    assert st.attach_profiled(model.path, twin.path), "the twin's kernels differ"
    for x in st.inputs.values():
        x[...] = 0
    for _ in range(20):  # warm-up, both libraries
        st()
        st.sample(1)
        st()

    def report() -> None:
        rep = kernel_report(st.kernels(), st.samples[-REPORT_BURST:])
        out = work / "report.json"
        tmp = work / ".report.tmp"
        tmp.write_text(json.dumps(rep))
        os.replace(tmp, out)

    plain_s, twin_s, report_s = [], [], []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        st()
        plain_s.append(time.perf_counter() - t0)
        st.sample(1)
        t0 = time.perf_counter()
        st()
        twin_s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        report()
        report_s.append(time.perf_counter() - t0)

    def block(reporting: bool) -> float:
        t0 = time.perf_counter()
        for i in range(1, args.block + 1):
            if reporting and i % args.every == 0:
                st.sample(1)
            st()
            if reporting and i % args.every == 0:
                report()
        return time.perf_counter() - t0

    with_s, without_s = [], []
    for _ in range(args.rounds):
        with_s.append(block(True))
        without_s.append(block(False))
    res = {"plain_step_ms": float(np.median(plain_s)) * 1e3,
           "twin_step_ms": float(np.median(twin_s)) * 1e3,
           "report_ms": float(np.median(report_s)) * 1e3,
           "loop_with_s": float(np.median(with_s)), "loop_without_s": float(np.median(without_s)),
           "kernels": len(st.kernels())}
    res["twin_over_plain"] = res["twin_step_ms"] / res["plain_step_ms"]
    res["loop_ratio"] = res["loop_with_s"] / res["loop_without_s"]
    extra = res["twin_step_ms"] - res["plain_step_ms"] + res["report_ms"]
    res["expected_overhead"] = extra / args.every / res["plain_step_ms"]
    # with the session's time limit: at most one sampled step per `--seconds`
    res["expected_overhead_limited"] = extra / max(args.every * res["plain_step_ms"],
                                                   args.seconds * 1e3)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="mlp-big,lenet5")
    ap.add_argument("--every", type=int, default=50, help="report_every")
    ap.add_argument("--seconds", type=float, default=1.0, help="report_seconds")
    ap.add_argument("--steps", type=int, default=200, help="interleaved single steps")
    ap.add_argument("--block", type=int, default=500, help="steps per loop block")
    ap.add_argument("--rounds", type=int, default=10, help="loop blocks of each kind")
    args = ap.parse_args()
    print(f"load average before: {os.getloadavg()}")
    with tempfile.TemporaryDirectory(prefix="nfc-report-bench-") as tmp:
        for name in args.models.split(","):
            res = bench(name, args, Path(tmp))
            print(f"{name}: {res['kernels']} kernel calls; plain step "
                  f"{res['plain_step_ms']:.4g} ms, sampled (twin) step "
                  f"{res['twin_step_ms']:.4g} ms (x{res['twin_over_plain']:.3f}), report "
                  f"{res['report_ms']:.3g} ms; loop with/without reporting every "
                  f"{args.every}: x{res['loop_ratio']:.4f} (expected overhead "
                  f"{res['expected_overhead']:+.2%}; with at most one per {args.seconds} s: "
                  f"{res['expected_overhead_limited']:+.3%})", flush=True)
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
