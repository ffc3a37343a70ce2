"""Mixed-precision training (`nfc train --precision bf16`) against f32 on three seed models.

    .venv/bin/python benchmarks/precision.py [--steps 300] [--models mlp lenet5 lstm]
                                             [--threads 1] [--rounds 7] [--json]

Each model is trained twice from the same initial parameters on the same batches (seed 0):
once with the default build pipeline (f32), once with the `precision` pass inserted (bf16
operands of every matmul and convolution, f32 sums, f32 master weights and optimizer
state). Reported per model: the final loss of each run (mean of the last 20 steps), their
difference as a fraction of the first loss against the stated tolerance, and the step-time
ratio bf16 / f32, measured after training on the loaded libraries, alternating f32 and
bf16 calls on the same batch (`--rounds` rounds of 20 calls each, the median of each
round, the minimum over rounds), so load on the machine hits both alike.
`NFC_CPU_FEATURES` (for instance `-avx512bf16`, or the AVX2 set of
tests/codegen/test_lowp.py) picks the code path.

Models: MLP-3 (examples/mlp.nf, digits), LeNet-5 (examples/lenet5.nf, digits resized to
28x28), the character-level LSTM language model (examples/models/lstm_lm.nf, text; batch
16, 32 steps, hidden 256).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
MODELS = {"mlp": ("examples/mlp.nf", "digits", ()),
          "lenet5": ("examples/lenet5.nf", "digits", ()),
          "lstm": ("examples/models/lstm_lm.nf", "text", ())}
#: The final losses (mean of the last 20 steps) of the two runs may differ by this fraction
#: of the first loss (the scale the training moves the loss on): the runs drift apart as
#: bf16 rounding of the contraction operands (2^-8 relative each) is fed back through
#: hundreds of updates, and a final loss near zero makes a relative difference meaningless.
TOLERANCE = 0.02
LAST = 20


def train_once(source: str, data: str, settings: tuple[str, ...], precision: str,
               steps: int, threads: int):  # -> nfc.runtime.train.TrainResult
    """Train `source` for `steps` steps in `precision`."""
    from nfc.passes.precision import with_precision
    from nfc.runtime.build import pipeline_for
    from nfc.runtime.train import TrainConfig, train

    cfg = TrainConfig(source=str(ROOT / source), data=data, max_steps=steps, epochs=10_000,
                      seed=0, settings=settings, threads=threads, progress=False,
                      evaluate=False, pipeline=with_precision(pipeline_for(ROOT / source),
                                                              precision),
                      log=lambda s: None)
    return train(cfg)


def _batch(fn) -> dict[str, np.ndarray]:
    """Inputs of a train_step: zeros of the right shapes and dtypes (ids and labels 0)."""
    return {s.name: np.zeros(s.shape, s.dtype) for s in fn.inputs}


def step_times(models: dict[str, object], rounds: int, calls: int = 20) -> dict[str, float]:
    """Seconds per train_step call of each loaded model, alternating between them."""
    fns = {k: m.functions["train_step"] for k, m in models.items()}
    batches = {k: _batch(f) for k, f in fns.items()}
    for k, f in fns.items():  # warm up
        f(**batches[k])
    best = {k: float("inf") for k in fns}
    for _ in range(rounds):
        for k, f in fns.items():
            ts = []
            for _ in range(calls):
                t = time.perf_counter()
                f(**batches[k])
                ts.append(time.perf_counter() - t)
            best[k] = min(best[k], statistics.median(ts))
    return best


def main(argv: list[str] | None = None) -> int:
    """Run the comparison and print the table."""
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    from nfc.codegen.cpu import host_target

    rows = []
    for name in args.models:
        source, data, settings = MODELS[name]
        runs = {p: train_once(source, data, settings, p, args.steps, args.threads)
                for p in ("f32", "bf16")}
        final = {p: float(np.mean(r.losses[-LAST:])) for p, r in runs.items()}
        first = {p: float(r.losses[0]) for p, r in runs.items()}
        times = step_times({p: r.model for p, r in runs.items()}, args.rounds)
        rel = abs(final["bf16"] - final["f32"]) / first["f32"]
        rows.append({"model": name, "steps": args.steps, "first_f32": first["f32"],
                     "first_bf16": first["bf16"], "final_f32": final["f32"],
                     "final_bf16": final["bf16"], "rel_diff": rel,
                     "within": rel <= TOLERANCE, "ms_f32": 1e3 * times["f32"],
                     "ms_bf16": 1e3 * times["bf16"], "ratio": times["bf16"] / times["f32"]})
    t = host_target()
    path = "avx512bf16" if t.has("avx512bf16") else ("avx2" if not t.has("avx512f") else
                                                      "avx512 (no bf16)")
    if args.json:
        print(json.dumps({"cpu": t.cpu, "path": path, "threads": args.threads, "rows": rows},
                         indent=1))
        return 0
    print(f"cpu {t.cpu}, bf16 path: {path}, {args.threads} thread(s), {args.steps} steps, "
          f"final loss = mean of the last {LAST} steps; |difference| / first f32 loss "
          f"<= {TOLERANCE:.0%}")
    print(f"{'model':8} {'loss f32':>9} {'loss bf16':>9} {'diff':>8} {'ok':>3} "
          f"{'ms f32':>8} {'ms bf16':>8} {'bf16/f32':>8}")
    for r in rows:
        print(f"{r['model']:8} {r['final_f32']:9.4f} {r['final_bf16']:9.4f} "
              f"{r['rel_diff']:8.2%} {'yes' if r['within'] else 'NO':>3} {r['ms_f32']:8.3f} "
              f"{r['ms_bf16']:8.3f} {r['ratio']:8.2f}")
    return 0 if all(r["within"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
