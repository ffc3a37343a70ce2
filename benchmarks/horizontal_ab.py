"""Horizontal fusion of independent stages (nfc.codegen.lowering.horizontal) off and on: the
loop nests and parallel regions of a training step, and its time on 1 and 2 threads, the two
builds alternating in one process.

    .venv/bin/python benchmarks/horizontal_ab.py [--rounds N] [--threads 1,2] [--count] [MODEL ...]

MODEL is an `nfc bench` name (default: the seed models) at its benchmark sizes. Both builds
(`NFC_HFUSE=0` and the default) are built without the library cache (its key does not hold
the switch), start from the same initial state and inputs, and must give bit-identical
parameters after two steps. Per step: the kernel calls (stage kernels of groups counted one by
one), the loop nests they run, their parallel loops and of those the ones with enough work to
start a team (`PARALLEL_MIN_WORK`: the regions). Times: median wall time per step over rounds
in which the builds alternate (process CPU time on one thread, which other load on the machine
disturbs less; wall time on two) (`--count`: counts only). Ratios off/on above 1: fusion is
faster (also the ratio of the fastest rounds, less disturbed by other load on two threads).
Prints the load average before and after.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

MODELS = ["resnet18", "mobilenet", "squeezenet", "lstm_lm", "bert", "capsnet"]


def _load() -> str:
    return " ".join(Path("/proc/loadavg").read_text(encoding="utf-8").split()[:3])


def _nests(body: Any) -> list[Any]:
    """The top-level nests of a kernel body (global allocations peeled)."""
    from nfc.codegen.loops import Allocate, Seq

    while isinstance(body, Allocate):
        body = body.body
    return list(body.body) if isinstance(body, Seq) else [body]


def counts(art: Any, func: str = "train_step") -> dict[str, int]:
    """Per step of `func`: kernel calls, nests, parallel loops, parallel regions."""
    from nfc.codegen.llvm.parallel import PARALLEL_MIN_WORK, parallel_work
    from nfc.codegen.loops import For, LoopKind

    ks = art.kernel_set
    out = {"calls": 0, "nests": 0, "parallel": 0, "regions": 0}

    def add(loops: Any) -> None:
        out["calls"] += 1
        out["nests"] += len(_nests(loops.body))
        for s in loops.body.walk():
            if isinstance(s, For) and s.kind is LoopKind.PARALLEL:
                out["parallel"] += 1
                c = s.const_extent
                if c is None or c * parallel_work(s.body, {s.var: (0, c - 1)}) >= (
                        PARALLEL_MIN_WORK):
                    out["regions"] += 1

    for call in art.plans[func].kernels:
        comp = ks.composites.get(call.symbol)
        if comp is None:
            add(ks.called[call.symbol].loops)
        else:
            for _, sinfo, _ in comp.calls:
                add(sinfo.loops)
    return out


def build(name: str, hfuse: bool) -> tuple[Any, Any, Any]:
    """(model, bound train step, artifact) of benchmark model `name` with the switch set."""

    from nfc.runtime.bench.models import resolve
    from nfc.runtime.build import compile_model
    from nfc.runtime.loader import load
    from nfc.runtime.train import synthetic_train_step

    bm = resolve(name)
    os.environ["NFC_HFUSE"] = "1" if hfuse else "0"
    try:
        built = compile_model(bm.file, settings=[f"{k}={v}" for k, v in bm.settings().items()],
                              use_cache=False, model=bm.model)
    finally:
        os.environ.pop("NFC_HFUSE", None)
    model = load(built.path)
    bound = synthetic_train_step(model)
    return model, bound, built.artifact


def same_after_two_steps(a: Any, b: Any) -> bool:
    import numpy as np

    for _, step, _ in (a, b):
        step()
        step()
    sa, sb = a[0].state_dict(), b[0].state_dict()
    return all(np.array_equal(np.asarray(sa[k]), np.asarray(sb[k])) for k in sa)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--count", action="store_true", help="counts only, no timing")
    ap.add_argument("models", nargs="*", default=MODELS)
    args = ap.parse_args(argv)
    print(f"load before: {_load()}")
    print("| model | calls off/on | nests off/on | parallel loops off/on | regions off/on | "
          "bits | threads: off ms, on ms, off/on |")
    for name in args.models:
        off, on = build(name, False), build(name, True)
        co, cn = counts(off[2]), counts(on[2])
        same = same_after_two_steps(off, on)
        cells = [f"{co[k]}/{cn[k]}" for k in ("calls", "nests", "parallel", "regions")]
        times = []
        if not args.count:
            for threads in (int(t) for t in args.threads.split(",")):
                for m, _, _ in (off, on):
                    m.set_num_threads(threads)
                # one thread: process CPU time (robust to other load); two: wall time
                clock = time.process_time if threads == 1 else time.perf_counter
                t0 = time.perf_counter()
                off[1]()
                reps = max(1, int(0.2 / max(1e-6, time.perf_counter() - t0)))
                med: list[list[float]] = [[], []]
                for r in range(args.rounds):
                    order = (0, 1) if r % 2 == 0 else (1, 0)
                    for k in order:
                        step = (off, on)[k][1]
                        t0 = clock()
                        for _ in range(reps):
                            step()
                        med[k].append((clock() - t0) / reps)
                a, b = statistics.median(med[0]) * 1e3, statistics.median(med[1]) * 1e3
                fast = min(med[0]) / min(med[1])
                times.append(f"{threads}: {a:.2f}, {b:.2f}, {a / b:.3f} (min {fast:.3f})")
        print(f"| {name} | {' | '.join(cells)} | {'same' if same else 'DIFFER'} | "
              f"{'; '.join(times)} |", flush=True)
    print(f"load after: {_load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
