"""Parallel regions without the back-off: nfc's thread pool against libgomp, 1 and 2 threads,
idle and beside a busy neighbour.

    .venv/bin/python benchmarks/thread_backends.py                     # matmul 256^3, 512^3
    .venv/bin/python benchmarks/thread_backends.py --sizes 128,384 --rounds 6

Each size's matmul (default schedule) is compiled with every parallel loop a region on the
team (nfc.codegen.devbench.always_parallel: no serial path, no back-off), so what is timed is
the region mechanism itself: `NFC_THREADS_BACKEND=nfc` (the caller never waits for a helper
that has not joined) or `gomp` (libgomp's join waits for every team-mate). Every measurement
runs in a fresh process (the backend is read once per process); rounds alternate the backends
(A B A B ...), and each process times 1 thread, 2 threads, then both again beside a busy-loop
process it starts and stops. A cell is the median over rounds of per-round medians of
per-call times; the table prints them with the 2T/1T ratios (below 1: two threads faster).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

BUSY = [sys.executable, "-c", "while True: pass"]
CONFIGS = ("1T", "2T", "1T busy", "2T busy")


def worker(size: int, min_time: float) -> dict[str, float]:
    import numpy as np

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "codegen"))
    from codegen_lib import inputs_of, matmul, random_inputs

    from nfc.codegen.devbench import always_parallel
    from nfc.codegen.jit import compile_kernel, set_num_threads

    op = matmul(size, size, size)
    with always_parallel():
        k = compile_kernel(op)
    ins = random_inputs(inputs_of(op), seed=0)
    out = [np.empty((size, size), np.float32)]
    got = {}
    for loaded in (False, True):
        procs = [subprocess.Popen(BUSY)] if loaded else []
        try:
            time.sleep(0.05 if procs else 0)
            for t in (1, 2):
                set_num_threads(t)
                k.run(out, ins)
                times: list[float] = []
                end = time.perf_counter() + min_time
                while time.perf_counter() < end or len(times) < 5:
                    t0 = time.perf_counter()
                    k.run(out, ins)
                    times.append(time.perf_counter() - t0)
                got[f"{t}T{' busy' if loaded else ''}"] = statistics.median(times)
        finally:
            for p in procs:
                p.kill()
                p.wait()
    return got


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="256,512")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--min-time", type=float, default=0.3)
    ap.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(int(args.worker[0]), float(args.worker[1]))))
        return 0
    print(f"load: {os.getloadavg()[0]:.2f} (1-minute average) on {os.cpu_count()} cores")
    print(f"{'size':>5} {'backend':<8} " + " ".join(f"{c + ' ms':>10}" for c in CONFIGS)
          + f" {'2T/1T':>6} {'busy':>6}", flush=True)
    for size in (int(s) for s in args.sizes.split(",")):
        got: dict[str, dict[str, list[float]]] = {b: {c: [] for c in CONFIGS}
                                                  for b in ("nfc", "gomp")}
        for _ in range(args.rounds):
            for be in got:
                proc = subprocess.run([sys.executable, __file__, "--worker", str(size),
                                       str(args.min_time)], capture_output=True, text=True,
                                      env={**os.environ, "NFC_THREADS_BACKEND": be})
                if proc.returncode != 0:
                    raise SystemExit(proc.stderr[-2000:])
                r = json.loads(proc.stdout.strip().splitlines()[-1])
                for c in CONFIGS:
                    got[be][c].append(r[c])
        for be, v in got.items():
            ms = {c: statistics.median(v[c]) * 1e3 for c in CONFIGS}
            print(f"{size:>5} {be:<8} " + " ".join(f"{ms[c]:>10.3f}" for c in CONFIGS)
                  + f" {ms['2T'] / ms['1T']:>6.2f} {ms['2T busy'] / ms['1T busy']:>6.2f}",
                  flush=True)
    print(f"load after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
