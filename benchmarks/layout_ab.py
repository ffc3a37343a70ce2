"""Train-step time of the convolutional seed models with the `layout` pass off and on (blocks
8 and 16), 1 and 2 threads, the builds alternating in one process: the measurement behind the
rule of `layout{when=auto}` (docs/passes-builtin.md, "layout").

    .venv/bin/python benchmarks/layout_ab.py [--rounds N] [--threads 1,2] [MODEL ...]

MODEL is an `nfc bench` name (default: every convolutional seed model) at its benchmark sizes.
Per model and thread count, every choice of `nfc.runtime.tuning.layout.candidates()` (`off`,
`8`, `16` on AVX-512) is built from the default build pipeline with its `layout` pass fixed
(`choice_pipeline`), from the same initial state and inputs, and timed in rounds whose order
rotates (`measure_choices`: median wall time per step; what `nfc tune` measures). Printed:
the medians, off/X ratios (above 1: the layout is faster), what the rule of `when=auto`
(without a tuned choice) picks, and the load average before and after.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

MODELS = ["lenet5", "resnet18", "squeezenet", "capsnet", "matrix_capsule", "shufflenet_unit",
          "mobilenet"]


def _load() -> str:
    return " ".join(Path("/proc/loadavg").read_text(encoding="utf-8").split()[:3])


def main(argv: list[str]) -> int:
    from nfc.passes.layout import auto_decision, default_block
    from nfc.runtime.bench.models import resolve
    from nfc.runtime.build import frontend_module
    from nfc.runtime.tuning.layout import candidates, measure_choices, step_timer

    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("models", nargs="*", default=MODELS)
    args = ap.parse_args(argv)
    choices = candidates()
    print(f"choices {choices}; default block {default_block()}; load before: {_load()}")
    print("| model | threads | off (ms) | " + " | ".join(f"block {c}" for c in choices[1:])
          + " | rule |")
    for name in args.models:
        bm = resolve(name)
        settings = [f"{k}={v}" for k, v in bm.settings().items()]
        on, why = auto_decision(frontend_module(bm.file, bm.settings(), {}, model=bm.model),
                                default_block())
        for threads in (int(t) for t in args.threads.split(",")):
            timer = step_timer(bm.file, settings, model=bm.model, choices=choices,
                               threads=threads, min_time=0.2)
            med = measure_choices(timer, choices, args.rounds)
            ratios = " | ".join(f"{med['off'] / med[c]:.2f}" for c in choices[1:])
            print(f"| {name} | {threads} | {med['off'] * 1e3:.3f} | {ratios} | "
                  f"{'on' if on else 'off'} |", flush=True)
        print(f"  rule: {why}", flush=True)
    print(f"load after: {_load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
