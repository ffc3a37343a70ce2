"""GEMMs parallel over B's panels when their M blocks split unevenly (nfc.codegen.gemm_space,
`GemmSpace._panels_balance`) off and on: a training step's time on 1 and 2 threads, the two
builds alternating in one process.

    .venv/bin/python benchmarks/gemm_balance_ab.py [--rounds N] [--threads 1,2] [MODEL ...]

MODEL is an `nfc bench` name at its benchmark sizes (default: the recurrent models whose
default GEMM schedules the rule changes). Both builds are made without the library cache
(`gemm_space.BALANCE_PANELS` switched for the off build), start from the same state and
inputs, and must give bit-identical parameters after two steps. Times: median wall time per
step over rounds in which the builds alternate (A B, B A, ...); off/on above 1: the rule is
faster (also the ratio of the fastest rounds). Prints the load average before and after.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from horizontal_ab import _load, same_after_two_steps  # noqa: E402

MODELS = ["sc_rnn", "lstm_lm", "sublstm", "bert"]


def build(name: str, balance: bool) -> tuple[Any, Any, Any]:
    """(model, bound train step, None) of benchmark model `name` with the rule on or off."""

    from nfc.codegen import gemm_space
    from nfc.runtime.bench.models import resolve
    from nfc.runtime.build import compile_model
    from nfc.runtime.loader import load
    from nfc.runtime.train import synthetic_train_step

    bm = resolve(name)
    old, gemm_space.BALANCE_PANELS = gemm_space.BALANCE_PANELS, balance
    try:
        built = compile_model(bm.file, settings=[f"{k}={v}" for k, v in bm.settings().items()],
                              use_cache=False, model=bm.model)
    finally:
        gemm_space.BALANCE_PANELS = old
    model = load(built.path)
    bound = synthetic_train_step(model)
    return model, bound, None


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("models", nargs="*", default=MODELS)
    args = ap.parse_args(argv)
    print(f"load before: {_load()}")
    print("| model | bits | threads: off ms, on ms, off/on (min off/min on) |")
    for name in args.models:
        off, on = build(name, False), build(name, True)
        same = same_after_two_steps(off, on)
        times = []
        for threads in (int(t) for t in args.threads.split(",")):
            for m, _, _ in (off, on):
                m.set_num_threads(threads)
            t0 = time.perf_counter()
            off[1]()
            reps = max(1, int(0.1 / max(1e-6, time.perf_counter() - t0)))
            med: list[list[float]] = [[], []]
            for r in range(args.rounds):
                for k in ((0, 1) if r % 2 == 0 else (1, 0)):
                    step = (off, on)[k][1]
                    t0 = time.perf_counter()
                    for _ in range(reps):
                        step()
                    med[k].append((time.perf_counter() - t0) / reps)
            a, b = statistics.median(med[0]) * 1e3, statistics.median(med[1]) * 1e3
            times.append(f"{threads}: {a:.3f}, {b:.3f}, {a / b:.3f} "
                         f"(min {min(med[0]) / min(med[1]):.3f})")
        print(f"| {name} | {'same' if same else 'DIFFER'} | {'; '.join(times)} |", flush=True)
    print(f"load after: {_load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
