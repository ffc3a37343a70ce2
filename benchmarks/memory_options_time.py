"""Step-time cost of the memory options (docs/memory.md, docs/performance.md).

    .venv/bin/python benchmarks/memory_options_time.py examples/lenet5.nf [...] [--rounds 7]

For each model, builds the train_step library with the default pipeline, with `remat`, with
`compress-activations` (masks), with masks and `remat`, and with bf16 storage, then times one
step of each in alternating rounds (A B C D E, A B C D E, ...) in this one process, on one
thread, from the same parameters and inputs, and prints each option's median step time and
its ratio to the default's, and the planned peak. The machine's load moves all options
alike within a round; the ratio is what to read.
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
OPTIONS = [("default", ""), ("remat", "remat"), ("masks", "compress-activations"),
           ("masks+remat", "compress-activations,remat"),
           ("masks+bf16", "compress-activations{dtype=bf16}")]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=3, help="steps per option per round")
    args = ap.parse_args(argv)
    from nfc.runtime.bench.worker import make_inputs
    from nfc.runtime.build import build_library, build_module
    from nfc.runtime.loader import load

    out = Path(tempfile.mkdtemp(prefix="nfc-memtime-"))
    for path in args.models:
        models, peaks = {}, {}
        for name, middle in OPTIONS:
            pipeline = ",".join(p for p in (BASE, middle, "apply-tuning,fuse") if p)
            module, _ = build_module(path, {}, {}, pipeline)
            built = build_library(module, str(out / f"{Path(path).stem}-{name}.so"),
                                  use_cache=False, functions=["train_step"])
            peaks[name] = built.artifact.plans["train_step"].memory_report().total
            m = load(built.path)
            m.set_num_threads(1)
            m.init(0)
            models[name] = m
        inputs = make_inputs(models["default"].metadata, {}, 0)
        state = models["default"].state_dict()
        bound = {}
        for name, m in models.items():
            m.load_state_dict(state)
            fn = m.functions["train_step"]
            bound[name] = fn.bind({s.name: np.ascontiguousarray(inputs[s.name], dtype=s.dtype)
                                   for s in fn.inputs})
            bound[name]()  # warm-up
        times: dict[str, list[float]] = {name: [] for name in models}
        for _ in range(args.rounds):
            for name, step in bound.items():
                for _ in range(args.steps):
                    t0 = time.perf_counter()
                    step()
                    times[name].append(time.perf_counter() - t0)
        base = statistics.median(times["default"])
        for name in models:
            med = statistics.median(times[name])
            print(f"{path} {name:<12} step {med * 1e3:9.3f} ms  {med / base:5.2f}x  "
                  f"planned peak {peaks[name] / 2**20:8.2f} MiB", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
