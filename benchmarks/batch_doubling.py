"""Twice the batch within the default-batch peak: same parameters, and the step-time cost
(docs/memory.md, "Batch doubling under a budget"; docs/performance.md, "Memory").

    .venv/bin/python benchmarks/batch_doubling.py examples/models/resnet18.nf --batch 32 \
        --option "compress-activations,remat{peak=96470356}" [--steps 3] [--rounds 5]

Builds the model's train_step library at `--batch` with the default pipeline and with each
`--option` (passes between the cleanup and `apply-tuning,fuse`, as scripts/memory_table.py
places them), initialises all of them from the same seed, runs `--steps` SGD steps on the same
inputs, and compares every parameter and optimizer state of each option with the default
build's bit for bit (recomputation and exact masks change where values live, not what is
computed; the build schedules the option's float sums as the build without it does,
nfc.runtime.sum_orders, whose one-line summary is printed; a difference that remains is
printed with its largest relative size). Then times a step of each in alternating rounds
(A B, A B, ...) on one thread and prints the median step time, the ratio to the default
build's and each build's planned peak.
Exit 1 when a parameter of an `--option` build differs. `--im2col PASS` adds a build with
that pass in place of `im2col` (e.g. `im2col{max_elements=8000000}`: convolutions with larger
columns stay direct), which computes in another order: its largest parameter difference is
printed, not checked.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

BASE = "im2col,training-functions,inline,canonicalize,cse,dce"
REST = "apply-tuning,fuse"


def build(path: str, batch: int, middle: str, out: Path, tag: str, first: str = "im2col"):
    """A loaded library of `path`'s train_step at `batch` with `middle` in the pipeline (and
    `first` for `im2col`), and its planned peak (bytes)."""
    from nfc.runtime.build import build_library, build_module
    from nfc.runtime.loader import load

    base = BASE.replace("im2col", first, 1)
    pipeline = ",".join(p for p in (base, middle, REST) if p)
    module, ctx = build_module(path, {"batch": batch}, {}, pipeline)
    if "sum-orders" in ctx.remarks:  # the option's float sums, scheduled as without it
        print(f"{Path(path).name} batch {batch} {middle}: {ctx.remarks['sum-orders']}",
              flush=True)
    built = build_library(module, str(out / f"{Path(path).stem}-{tag}.so"),
                          use_cache=False, functions=["train_step"])
    m = load(built.path)
    m.set_num_threads(1)
    m.init(0)
    return m, built.artifact.plans["train_step"].memory_report().total


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    """max |a - b| / max |a| (0 for equal tensors)."""
    a64 = a.astype(np.float64)
    return float(np.max(np.abs(a64 - b), initial=0.0) / max(np.max(np.abs(a64), initial=0.0),
                                                             1e-30))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--option", action="append", default=[],
                    help="passes between the cleanup and tuning (repeatable)")
    ap.add_argument("--im2col", default=None, help="a build with this pass for im2col")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=5, help="timing rounds (0: no timing)")
    args = ap.parse_args(argv)
    from nfc.runtime.bench.worker import make_inputs

    out = Path(tempfile.mkdtemp(prefix="nfc-batch2-"))
    names = ["default", *args.option]
    models, peaks = {}, {}
    for n, middle in enumerate(names):
        models[middle], peaks[middle] = build(args.model, args.batch,
                                              "" if middle == "default" else middle, out,
                                              f"opt{n}")
    if args.im2col:
        models[args.im2col], peaks[args.im2col] = build(args.model, args.batch, "", out,
                                                        "im2col", args.im2col)
    ref = models["default"]
    inputs = make_inputs(ref.metadata, {}, 0)
    start = ref.state_dict()
    bound = {}
    for name, m in models.items():
        m.load_state_dict(start)
        fn = m.functions["train_step"]
        bound[name] = fn.bind({s.name: np.ascontiguousarray(inputs[s.name], dtype=s.dtype)
                               for s in fn.inputs})
        for _ in range(args.steps):
            bound[name]()
    want = ref.state_dict()
    bad = 0
    for name in [*args.option, *([args.im2col] if args.im2col else [])]:
        got = models[name].state_dict()
        diff = [k for k in want if not np.array_equal(want[k], got[k])]
        bad += bool(diff) and name != args.im2col
        print(f"{args.model} batch {args.batch} {name}: after {args.steps} steps "
              + ("parameters bit for bit equal to the default build's" if not diff else
                 f"{len(diff)} of {len(want)} tensors differ ({', '.join(diff[:3])}, ...); "
                 "largest difference relative to the tensor's largest value {:.3g} ({})".format(
                     *max((_rel(want[k], got[k]), k) for k in diff))),
              flush=True)
    if args.rounds:
        times: dict[str, list[float]] = {name: [] for name in bound}
        for _ in range(args.rounds):
            for name, step in bound.items():
                t0 = time.perf_counter()
                step()
                times[name].append(time.perf_counter() - t0)
        base = statistics.median(times["default"])
        for name in bound:
            med = statistics.median(times[name])
            print(f"{args.model} batch {args.batch} {name:<40} step {med * 1e3:9.2f} ms "
                  f"{med / base:5.2f}x  planned peak {peaks[name]:,} bytes", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
