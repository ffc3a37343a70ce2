"""Train-step time with and without the `layout` pass (blocked NCHW[c]c activations), one
thread, the builds interleaved in one process, process CPU time.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/layout_ab.py [ROUNDS] [MODEL ...]

Per model builds from the same initial parameters and inputs: A = the default build
pipeline (`BUILD_PIPELINE`), then one build per variant of the pass's options (`with_layout`):
B = `layout` (the default block, weights stored blocked), C = `layout{block=32}`,
D = `layout{block=64}`, E = `layout{weights=false}` (weights packed by a compute every step).
Each round runs a few steps of every build in turn, so other load on the machine hits all of
them; the medians and the ratios A/X (above 1: the layout is faster) are printed with the
load average (`/proc/loadavg`) before and after. The first losses must agree within rounding.
`LAYOUT_VARIANTS='block=16;block=32'` chooses other option sets.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from pipeline_ab import _build  # noqa: E402  (a library built and bound, as for pipeline A/B)

#: The option sets of the layout builds (`LAYOUT_VARIANTS`, separated by `;`, overrides).
VARIANTS = ";block=32;block=64;weights=false"
MODELS = ["examples/lenet5.nf", "examples/models/resnet18.nf", "examples/models/mobilenet.nf",
          "examples/models/squeezenet.nf"]


def _load() -> str:
    return Path("/proc/loadavg").read_text(encoding="utf-8").split(" ", 3)[:3].__str__()


def main(argv: list[str]) -> None:
    from nfc.passes.layout import default_block, with_layout
    from nfc.runtime.build import BUILD_PIPELINE

    rounds = int(argv[0]) if argv else 11
    models = argv[1:] or MODELS
    variants = os.environ.get("LAYOUT_VARIANTS", VARIANTS).split(";")
    pipes = {"A": BUILD_PIPELINE}
    for k, opts in enumerate(variants):
        pipes[chr(ord("B") + k)] = with_layout(BUILD_PIPELINE, opts)
    print(f"default block {default_block()}; load before: {_load()}")
    for name, p in pipes.items():
        print(f"  {name}: {p}")
    for src in models:
        builds = {k: _build(str(ROOT / src), p) for k, p in pipes.items()}
        losses = {k: b[3] for k, b in builds.items()}
        times: dict[str, list[float]] = {k: [] for k in builds}
        steps = 3
        for _ in range(rounds):
            for k, (_m, bound, _n, _l) in builds.items():
                t0 = time.process_time()
                for _ in range(steps):
                    bound()
                times[k].append((time.process_time() - t0) / steps)
        med = {k: statistics.median(v) for k, v in times.items()}
        kernels = " / ".join(str(b[2]) for b in builds.values())
        print(f"{src}: kernels {'/'.join(builds)} {kernels}; first loss "
              + ", ".join(f"{k} {v:.6f}" for k, v in losses.items()))
        print("  median step ms: " + ", ".join(f"{k} {v * 1e3:.3f}" for k, v in med.items())
              + "; " + ", ".join(f"A/{k} {med['A'] / med[k]:.3f}" for k in med if k != "A"))
        sys.stdout.flush()
    print(f"load after: {_load()}")


if __name__ == "__main__":
    main(sys.argv[1:])
