"""1 -> 2 thread scaling of training steps, idle and beside a busy neighbour core.

    .venv/bin/python benchmarks/thread_scaling.py                 # default models
    .venv/bin/python benchmarks/thread_scaling.py lltm mlp3 --rounds 5 --min-time 0.5
    .venv/bin/python benchmarks/thread_scaling.py lltm --policy active    # libgomp spinning

Each model is built once (nfc's build pipeline, the library cache allowed) and then timed in
one fresh worker process that loads the library the way `nfc bench` does (nfc.runtime.loader)
and runs its `train_step` in rounds, each round in the order 1 thread, 2 threads, then the
same two with a busy neighbour: a busy-loop process this script starts before and stops after
(`--busy` of them). A configuration's time is the median over rounds of its per-round
median step time, so the configurations are interleaved (A B A B ...) and a load change on
the machine hits them alike. The table prints the four times and the ratios 1T/2T (above 1:
two threads are faster), idle and busy, of these medians and of the fastest single steps
(`min`: on a machine that other work loads, the steps that ran while the cores were free).

`--baseline TREE` adds the same measurements of another checkout of nfc (its sources first on
PYTHONPATH, its own cache directory; libgomp as that tree leaves it), interleaved with the
others: before/after comparisons in one run.

`--policy` is the libgomp wait policy of the worker: `nfc` (default) leaves it to nfc (idle
workers sleep, nfc.codegen.jit.openmp), `active` or `passive` sets `OMP_WAIT_POLICY` in the
worker's environment (`active`: workers spin at every barrier, libgomp's behaviour outside
nfc before it chose), `default` sets `GOMP_SPINCOUNT=300000` (libgomp's own default: spin
300,000 times, then sleep). `pool` and `gomp` choose the thread backend of the library's
parallel loops (`NFC_THREADS_BACKEND`: nfc's own pool, nfc.codegen.llvm.threadpool, or
libgomp's `GOMP_parallel`), e.g. `--policy pool,gomp` compares them round by round.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODELS = ("lltm", "sc_rnn", "sublstm", "lstm_cell", "mlp3", "lenet5")
CONFIGS = ("1T", "2T", "1T busy", "2T busy")
POLICIES = {"nfc": {}, "active": {"OMP_WAIT_POLICY": "active"},
            "passive": {"OMP_WAIT_POLICY": "passive"}, "default": {"GOMP_SPINCOUNT": "300000"},
            "pool": {"NFC_THREADS_BACKEND": "nfc"}, "gomp": {"NFC_THREADS_BACKEND": "gomp"}}
BUSY = [sys.executable, "-c", "while True: pass"]


def build(name: str, out: Path) -> dict[str, Any]:
    """Build model `name` (a bench name or .nf file) into `out/<name>.so`, inputs beside."""
    import numpy as np

    from nfc.runtime.bench.models import resolve
    from nfc.runtime.bench.worker import make_inputs
    from nfc.runtime.build import build_library, build_module, parse_settings, pipeline_for
    from nfc.runtime.loader import read_metadata

    m = resolve(name)
    settings = [f"{k}={v}" for k, v in m.settings().items()]
    params, opt = parse_settings(settings)
    module, _ = build_module(str(m.file), params, opt, pipeline_for(str(m.file)))
    so = out / f"{m.name}.so"
    build_library(module, str(so), use_cache=True)
    meta = read_metadata(so)
    inputs = make_inputs(meta, m.int_bounds, 0)
    np.savez(out / f"{m.name}.npz", **inputs)
    kernels = len(meta["functions"]["train_step"]["kernels"])
    return {"name": m.name, "so": str(so), "inputs": str(out / f"{m.name}.npz"),
            "kernels": kernels}


def _steps(bound: Any, min_time: float, min_steps: int = 5) -> list[float]:
    times: list[float] = []
    while len(times) < min_steps or sum(times) < min_time:
        t = time.perf_counter()
        bound()
        times.append(time.perf_counter() - t)
    return times


def worker(so: str, inputs: str, rounds: int, min_time: float, busy: int) -> dict[str, Any]:
    """Time one library in this process (see the module doc); seconds per configuration."""
    import numpy as np

    from nfc.runtime.loader import load

    try:
        from nfc.codegen.jit import openmp_wait_policy
    except ImportError:  # a --baseline tree from before nfc chose a wait policy
        def openmp_wait_policy() -> str:
            return "libgomp's own"

    model = load(so)
    model.init(0)
    fn = model.functions["train_step"]
    with np.load(inputs) as z:
        bound = fn.bind({s.name: np.ascontiguousarray(z[s.name], dtype=s.dtype)
                         for s in fn.inputs})
    state = model.state_dict()
    for t in (1, 2):  # warm-up: first touch of the arena, thread creation
        model.set_num_threads(t)
        _steps(bound, 0.05, 2)
    got: dict[str, list[float]] = {c: [] for c in CONFIGS}
    best: dict[str, float] = {c: float("inf") for c in CONFIGS}
    for _ in range(rounds):
        for loaded in (False, True):
            procs = [subprocess.Popen(BUSY) for _ in range(busy)] if loaded else []
            try:
                if procs:
                    time.sleep(0.05)
                for t in (1, 2):
                    model.set_num_threads(t)
                    model.load_state_dict(state)  # every configuration steps the same model
                    c = f"{t}T{' busy' if loaded else ''}"
                    times = _steps(bound, min_time)
                    got[c].append(statistics.median(times))
                    best[c] = min(best[c], min(times))
            finally:
                for p in procs:
                    p.kill()
                    p.wait()
    backend = os.environ.get("NFC_THREADS_BACKEND", "default")
    return {"policy": f"{openmp_wait_policy()}; backend {backend}",
            **{c: statistics.median(v) for c, v in got.items()},
            **{f"{c} min": v for c, v in best.items()}}


def policy_env(policy: str) -> dict[str, str]:
    """The environment variables of a `--policy` value."""
    if policy.startswith("spin="):
        return {"GOMP_SPINCOUNT": policy.split("=", 1)[1]}
    return POLICIES[policy]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="*", default=list(DEFAULT_MODELS))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--min-time", type=float, default=0.3, help="seconds per measurement")
    ap.add_argument("--busy", type=int, default=1, help="busy-loop processes beside (1)")
    ap.add_argument("--policy", default="nfc",
                    help="comma-separated wait policies or thread backends, compared round by "
                         "round: nfc, active, passive, default, spin=N (GOMP_SPINCOUNT=N), pool "
                         "(nfc's thread pool), gomp (libgomp's GOMP_parallel)")
    ap.add_argument("--out", default=str(ROOT / "out" / "thread_scaling"))
    ap.add_argument("--json", help="append one JSON line per model and policy")
    ap.add_argument("--baseline", metavar="TREE",
                    help="also build and time each model with the nfc sources of TREE (e.g. "
                         "`git archive HEAD | tar -x -C TREE`), round by round with the others")
    ap.add_argument("--build", nargs=2, metavar=("MODEL", "OUT"), help=argparse.SUPPRESS)
    ap.add_argument("--worker", nargs=5, metavar=("SO", "INPUTS", "ROUNDS", "MIN_TIME", "BUSY"),
                    help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.build:
        print(json.dumps(build(args.build[0], Path(args.build[1]))))
        return 0
    if args.worker:
        so, inputs, rounds, min_time, busy = args.worker
        print(json.dumps(worker(so, inputs, int(rounds), float(min_time), int(busy))))
        return 0
    policies = args.policy.split(",")
    runs = [(p, {}) for p in policies]
    if args.baseline:
        runs.append(("baseline", {"PYTHONPATH": str(Path(args.baseline).resolve()),
                                  "NFC_CACHE_DIR": str(Path(args.out) / "baseline-cache")}))
    for p in policies:
        if p not in POLICIES and not (p.startswith("spin=") and p[5:].isdigit()):
            ap.error(f"unknown policy '{p}'")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    base = {k: v for k, v in os.environ.items()
            if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS",
                         "NFC_THREADS_BACKEND")}
    print(f"load: {os.getloadavg()[0]:.2f} (1-minute average) on {os.cpu_count()} cores; "
          f"{args.rounds} rounds x {args.min_time} s per configuration")
    head = f"{'model':<12} {'policy':<10} {'kernels':>7} " + " ".join(
        f"{c + ' ms':>10}" for c in CONFIGS)
    print(head + f" {'1T/2T':>6} {'busy':>6} {'min 1T/2T':>9} {'busy':>6}", flush=True)
    for name in args.models:
        b = build(name, out)
        libs = {p: b for p in policies}
        if args.baseline:
            (out / "baseline").mkdir(exist_ok=True)
            proc = subprocess.run([sys.executable, __file__, "--build", name,
                                   str(out / "baseline")], env={**base, **runs[-1][1]},
                                  capture_output=True, text=True)
            if proc.returncode != 0:
                raise SystemExit(f"{name}: baseline build failed:\n{proc.stderr[-2000:]}")
            libs["baseline"] = json.loads(proc.stdout.strip().splitlines()[-1])
        keys = [*CONFIGS, *(f"{c} min" for c in CONFIGS)]
        got: dict[str, dict[str, list[float]]] = {p: {c: [] for c in keys} for p, _ in runs}
        wait: dict[str, str] = {}
        for _ in range(args.rounds):  # one round of each policy in turn (A B A B ...)
            for p, extra in runs:
                lib = libs[p]
                proc = subprocess.run(
                    [sys.executable, __file__, "--worker", lib["so"], lib["inputs"], "1",
                     str(args.min_time), str(args.busy)],
                    env={**base, **(policy_env(p) if p != "baseline" else {}), **extra},
                    capture_output=True, text=True)
                if proc.returncode != 0:
                    raise SystemExit(f"{name}: worker failed:\n{proc.stderr[-2000:]}")
                r = json.loads(proc.stdout.strip().splitlines()[-1])
                wait[p] = r["policy"]
                for c in keys:
                    got[p][c].append(r[c])
        for p, _ in runs:
            ms = {c: statistics.median(got[p][c]) * 1e3 for c in CONFIGS}
            ms.update({c: min(got[p][c]) * 1e3 for c in keys if c.endswith(" min")})
            print(f"{b['name']:<12} {p:<10} {libs[p]['kernels']:>7} "
                  + " ".join(f"{ms[c]:>10.3f}" for c in CONFIGS)
                  + f" {ms['1T'] / ms['2T']:>6.2f} {ms['1T busy'] / ms['2T busy']:>6.2f}"
                  + f" {ms['1T min'] / ms['2T min']:>9.2f}"
                  + f" {ms['1T busy min'] / ms['2T busy min']:>6.2f}", flush=True)
            if args.json:
                with open(args.json, "a") as fh:
                    fh.write(json.dumps({"model": b["name"], "policy": p,
                                         "wait_policy": wait[p], "kernels": libs[p]["kernels"],
                                         "load": os.getloadavg()[0], **ms}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
