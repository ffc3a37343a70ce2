"""Training steps of nfc libraries and PyTorch twins alternating in one process.

    nfc bench resnet18 --frameworks nfc --threads 1 --keep /tmp/keep   # model.so, case.npz
    python benchmarks/interleaved_step.py --model resnet18 --case /tmp/keep/resnet18/case.npz \\
        --threads 1 --rounds 10 /tmp/before.so /tmp/keep/resnet18/model.so

Every library and framework (`--frameworks`, default torch and torch-compile; `none` for nfc
libraries only) starts from the case file's parameters and inputs; then rounds of `--steps`
steps of each, in turn, so a load that comes and goes on a shared machine hits all of them
alike. Prints per entry the wall time and the calling thread's CPU time of a step (min and
median, ms): on one thread the CPU time leaves out what the scheduler gave other jobs.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROLES = ("param", "state", "opt_state")


def nfc_step(path: str, arrays: dict[str, np.ndarray], threads: int) -> Callable[[], object]:
    """One bound training step of the library at `path`, from the case's state."""
    from nfc.runtime.loader import load

    model = load(path)
    model.set_num_threads(threads)
    model.load_state_dict({k.split(":", 1)[1]: v for k, v in arrays.items()
                           if k.split(":", 1)[0] in ROLES})
    fn = model.functions["train_step"]
    bound = fn.bind({s.name: np.ascontiguousarray(arrays[f"input:{s.name}"], dtype=s.dtype)
                     for s in fn.inputs})
    return bound


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("libraries", nargs="*", help="nfc libraries (.so) of the same model")
    ap.add_argument("--model", required=True, help="a PyTorch twin (benchmarks/torch_models)")
    ap.add_argument("--case", required=True, help="the case file of `nfc bench --keep`")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--steps", type=int, default=3, help="steps of each entry per round")
    ap.add_argument("--frameworks", default="torch,torch-compile")
    args = ap.parse_args(argv)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(args.threads)
    sys.path.insert(0, str(HERE))
    import run_baseline

    steps: dict[str, Callable[[], object]] = {}
    frameworks = [f for f in args.frameworks.split(",") if f and f != "none"]
    case = run_baseline.read_case(args.case)
    for fw in frameworks:
        ns = argparse.Namespace(framework=fw, threads=args.threads, model=args.model, seed=0)
        steps[fw], _ = run_baseline.torch_case(ns, {}, case)
    with np.load(args.case, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    for path in args.libraries:
        steps[path] = nfc_step(path, arrays, args.threads)
    for step in steps.values():  # compiles (torch.compile), warms up
        for _ in range(3):
            step()
    wall: dict[str, list[float]] = {k: [] for k in steps}
    cpu: dict[str, list[float]] = {k: [] for k in steps}
    for _ in range(args.rounds):
        for name, step in steps.items():
            for _ in range(args.steps):
                c, t = time.thread_time(), time.perf_counter()
                step()
                wall[name].append(time.perf_counter() - t)
                cpu[name].append(time.thread_time() - c)
    print(f"{args.model}, {args.threads} thread(s), load average {os.getloadavg()[0]:.2f}")
    for name in steps:
        w, c = np.array(wall[name]) * 1e3, np.array(cpu[name]) * 1e3
        print(f"{name:40s} wall min {w.min():8.2f} median {np.median(w):8.2f} | thread CPU "
              f"min {c.min():8.2f} median {np.median(c):8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
