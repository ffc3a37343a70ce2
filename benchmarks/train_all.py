"""Train every example model through `nfc train` for a short run and print one table.

    .venv/bin/python benchmarks/train_all.py [--steps 40] [--only lenet5,bert] [--json F]
                                             [--cache-dir DIR] [--timeout 300] [--jobs 1]

Each model runs in its own `nfc train <model>.nf --data auto --max-steps N --set batch=B`
process (a small batch; the data set is the one `auto` picks from the model's input shapes),
and the table shows, per model: the data it trained on, the mean loss of the first 10 steps and
of the last 10, training steps per second (from the median step time, Python overhead
included) and the time to compile and load the library. By default every model compiles cold
in a fresh cache directory (so the compile column is a real build; tuned schedules are not
used); `--cache-dir ~/.cache/nfc` reuses libraries built before. `--jobs 2` runs two models at
a time (faster, but compile and step times then share the cores).

Every model keeps its default sizes and optimizer except (the "other settings" column):
- `squeezenet` and `mi_lstm` train with Adam (lr 0.001): with their SGD defaults the loss does
  not move within a short run (SqueezeNet's ReLU'd class scores start near zero and learn
  late; in MI-LSTM `(Wx * Uh) + b` from a zero state, x barely reaches the gates, and the
  nearly input-independent 1024-wide state makes SGD at lr 0.1 blow up the logits first);
  SqueezeNet also runs 120 steps, as it starts learning after ~50;
- `capsnet` sees 20x20 images (`image=20`: 128 primary capsules instead of 1152): at 28x28 a
  step costs ~2 GFLOP per image and its capsule convolution's kernels run at well under
  1 GFLOP/s, so even batch 2 gave ~5 s steps whose loss was all noise.

A model "learns" when the last-10 mean is below the first-10 mean; the script exits 1 when a
model fails or does not learn.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EX = ROOT / "examples"

@dataclass(frozen=True)
class Spec:
    """How one model is trained here."""

    name: str
    path: Path
    batch: int
    """A small batch (every example model has a `batch` param)."""
    steps: int | None = None
    """Steps instead of --steps (SqueezeNet starts late)."""
    sets: tuple[str, ...] = ()
    """Extra `--set` items (shown in the table; see the module doc)."""


ADAM = ("opt.name=adam", "opt.lr=0.001")


MODELS: list[Spec] = [
    Spec("mlp", EX / "mlp.nf", 32),
    Spec("mlp_digits", EX / "mlp_digits.nf", 32),
    Spec("lenet5", EX / "lenet5.nf", 16),
    Spec("resnet_block", EX / "resnet_block.nf", 8),
    Spec("shufflenet_unit", EX / "shufflenet_unit.nf", 16),
    Spec("capsule", EX / "capsule.nf", 16),
    Spec("lstm_cell", EX / "lstm_cell.nf", 8),
    Spec("milstm", EX / "milstm.nf", 8),
    Spec("resnet18", EX / "models" / "resnet18.nf", 8),
    Spec("squeezenet", EX / "models" / "squeezenet.nf", 16, steps=120, sets=ADAM),
    Spec("capsnet", EX / "models" / "capsnet.nf", 8, sets=("image=20",)),
    Spec("mobilenet", EX / "models" / "mobilenet.nf", 16),
    Spec("lstm_lm", EX / "models" / "lstm_lm.nf", 16),
    Spec("mi_lstm", EX / "models" / "mi_lstm.nf", 16, sets=ADAM),
    Spec("sc_rnn", EX / "models" / "sc_rnn.nf", 16),
    Spec("sublstm", EX / "models" / "sublstm.nf", 16),
    Spec("lltm", EX / "models" / "lltm.nf", 16),
    Spec("bert", EX / "models" / "bert.nf", 8),
]
WINDOW = 10


@dataclass
class Row:
    """One model's short run."""

    model: str
    batch: int
    ok: bool
    sets: str = ""
    data: str = ""
    first: float | None = None
    last: float | None = None
    steps: int = 0
    steps_per_s: float | None = None
    threads: int | None = None
    compile_s: float | None = None
    wall_s: float = 0.0
    error: str = ""
    losses: tuple[float, ...] = ()

    @property
    def learns(self) -> bool:
        """The loss of the last window is below the first window's."""
        return self.ok and self.first is not None and self.last is not None \
            and self.last < self.first


def run_one(spec: Spec, steps: int, cache: str, timeout: float) -> Row:
    """Train one model in a fresh `nfc train` process and read its metrics."""
    name, path, batch, sets = spec.name, spec.path, spec.batch, spec.sets
    steps = spec.steps or steps
    shown = " ".join(sets)
    with tempfile.TemporaryDirectory(prefix=f"train-all-{name}-") as tmp:
        metrics = Path(tmp) / "m.jsonl"
        cmd = [sys.executable, "-m", "nfc", "train", str(path), "--data", "auto",
               "--max-steps", str(steps), "--set", f"batch={batch}", "--seed", "0",
               "--metrics", str(metrics), "--quiet", "--no-eval"]
        for s in sets:
            cmd += ["--set", s]
        env = dict(os.environ, NFC_CACHE_DIR=cache, PYTHONUNBUFFERED="1")
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT,
                                  timeout=timeout)
        except subprocess.TimeoutExpired:
            return Row(name, batch, False, shown, wall_s=time.perf_counter() - t0,
                       error=f"timed out after {timeout:.0f} s")
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
            return Row(name, batch, False, shown, wall_s=wall, error=tail[:200])
        recs = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]
    losses = [r["loss"] for r in recs if r["event"] == "step"]
    final = next(r for r in recs if r["event"] == "final")
    k = min(WINDOW, max(1, len(losses) // 2))
    step_ms = float(final["step_ms"])
    return Row(name, batch, True, shown, final.get("data_note") or final.get("data", ""),
               sum(losses[:k]) / k, sum(losses[-k:]) / k, len(losses),
               1e3 / step_ms if step_ms > 0 else None, final.get("threads"),
               final.get("compile_s"), wall, losses=tuple(losses))


def table(rows: list[Row]) -> str:
    """The results as a Markdown table."""
    out = ["| model | batch | other settings | data (`--data auto`) | loss: first 10 → last 10 "
           "steps | steps | steps/s | threads | compile s |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if not r.ok:
            out.append(f"| {r.model} | {r.batch} | {r.sets} | failed: {r.error} | | | | | |")
            continue
        mark = "" if r.learns else " (not falling)"
        rate = f"{r.steps_per_s:,.1f}" if r.steps_per_s else "-"
        comp = f"{r.compile_s:.1f}" if r.compile_s is not None else "-"
        out.append(f"| {r.model} | {r.batch} | {r.sets} | {r.data} "
                   f"| {r.first:.3f} → {r.last:.3f}{mark} "
                   f"| {r.steps} | {rate} | {r.threads} | {comp} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    """Run the models, print the table; 1 when one fails or does not learn."""
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=40,
                    help="training steps per model (CapsNet: 20)")
    ap.add_argument("--only", default="", help="comma-separated model names")
    ap.add_argument("--cache-dir", default=None,
                    help="NFC_CACHE_DIR for the runs (default: a fresh one, cold compiles)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per model")
    ap.add_argument("--jobs", type=int, default=1, help="models trained at a time")
    ap.add_argument("--json", metavar="FILE", help="write one JSON line per model")
    args = ap.parse_args(argv)
    names = [n for n in args.only.split(",") if n]
    unknown = set(names) - {m.name for m in MODELS}
    if unknown:
        ap.error(f"unknown models: {', '.join(sorted(unknown))}")
    todo = [m for m in MODELS if not names or m.name in names]
    cache = args.cache_dir or tempfile.mkdtemp(prefix="nfc-train-all-cache-")
    t0 = time.perf_counter()
    try:
        with ThreadPoolExecutor(max(1, args.jobs)) as pool:
            futures = [pool.submit(run_one, m, args.steps, cache, args.timeout) for m in todo]
            rows = []
            for f in futures:
                rows.append(f.result())
                r = rows[-1]
                state = "ok" if r.learns else ("not falling" if r.ok else r.error)
                print(f"{r.model}: {state} ({r.wall_s:.0f} s)", file=sys.stderr, flush=True)
    finally:
        if args.cache_dir is None:
            shutil.rmtree(cache, ignore_errors=True)
    print(table(rows))
    print(f"\n{len(rows)} models, {args.steps} steps each, {time.perf_counter() - t0:.0f} s "
          f"in all ({os.cpu_count()} cores)")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            for r in rows:
                fh.write(json.dumps(asdict(r)) + "\n")
    return 0 if all(r.learns for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
