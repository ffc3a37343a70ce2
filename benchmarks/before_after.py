"""Training-step time of two checkouts of nfc, side by side (for "no slowdown" checks).

    git clone . /tmp/old && git -C /tmp/old checkout <commit>
    .venv/bin/python benchmarks/before_after.py /tmp/old . \\
        examples/mlp_digits.nf,examples/lenet5.nf,examples/resnet_block.nf,examples/models/lstm_lm.nf

Each tree runs `nfc train MODEL --max-steps STEPS --quiet --no-eval --threads 1` with its own
sources first on PYTHONPATH (this venv's dependencies) and its own cache directory. After one
warm-up run per tree and model (the compile), the trees alternate for ROUNDS rounds, the order
flipping every round so drift in the machine's speed falls on both; the table gives the median
of the per-run median step times and their ratio.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def step_ms(tree: Path, model: str, steps: int, cache: str) -> float | None:
    """Median step time (ms) of one `nfc train` run of `model` with the sources of `tree`."""
    env = dict(os.environ, PYTHONPATH=str(tree), NFC_CACHE_DIR=cache)
    nfc = Path(sys.executable).with_name("nfc")
    out = subprocess.run([str(nfc), "train", str(tree / model), "--max-steps", str(steps),
                          "--quiet", "--no-eval", "--threads", "1"],
                         env=env, capture_output=True, text=True, timeout=1800)
    m = re.search(r"step time ([0-9.]+) ms", out.stdout + out.stderr)
    if not m:
        print(f"failed: {model} in {tree}:\n{out.stderr[-2000:]}", file=sys.stderr)
        return None
    return float(m.group(1))


def main() -> None:
    """Parse the arguments, run the rounds, print the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("models", help="comma-separated model files, relative to each tree")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=60)
    a = ap.parse_args()
    trees = {"before": a.before.resolve(), "after": a.after.resolve()}
    models = a.models.split(",")
    caches = {t: tempfile.mkdtemp(prefix=f"nfc-{t}-") for t in trees}
    runs: dict[tuple[str, str], list[float]] = {(m, t): [] for m in models for t in trees}
    for m in models:
        for t in trees:
            step_ms(trees[t], m, a.steps, caches[t])
    for r in range(a.rounds):
        for m in models:
            for t in (("before", "after") if r % 2 == 0 else ("after", "before")):
                v = step_ms(trees[t], m, a.steps, caches[t])
                if v is not None:
                    runs[(m, t)].append(v)
    print(f"{'model':40s} {'before ms':>10s} {'after ms':>10s} {'after/before':>12s}")
    for m in models:
        if not runs[(m, "before")] or not runs[(m, "after")]:
            print(f"{m:40s} (failed)")
            continue
        b, af = statistics.median(runs[(m, "before")]), statistics.median(runs[(m, "after")])
        print(f"{m:40s} {b:10.3f} {af:10.3f} {af / b:12.3f}")


if __name__ == "__main__":
    main()
