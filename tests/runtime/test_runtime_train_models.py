"""`nfc train` on example models in real processes: `--data auto` picks the data set from the
model's inputs and the loss falls (mean of the last 10 steps below the first 10).

The three model files compile cold in a private cache at once (one process each), so the test
costs one compile's wall time rather than three."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from runtime_lib import ROOT, built_library

EX = ROOT / "examples"
STEPS = 40


def _start(tmp: Path, name: str, source: str, *args: str) -> tuple[subprocess.Popen, Path]:
    metrics = tmp / f"{name}.jsonl"
    env = dict(os.environ, NFC_CACHE_DIR=str(tmp / "cache"), PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "nfc", "train", source, "--max-steps", str(STEPS),
           "--threads", "1", "--quiet", "--no-eval", "--metrics", str(metrics), *args]
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    return proc, metrics


def _losses(metrics: Path) -> list[float]:
    recs = [json.loads(x) for x in metrics.read_text().splitlines()]
    return [r["loss"] for r in recs if r["event"] == "step"]


def test_models_train_with_falling_loss(tmp_path):
    runs = {
        # the compiled library (no IR at hand: ranges from the metadata), digits as they are
        "mlp_digits": _start(tmp_path, "mlp_digits", built_library()),
        # digits upscaled to 1x28x28
        "lenet5": _start(tmp_path, "lenet5", str(EX / "lenet5.nf"), "--set", "batch=8"),
        # characters of Python's docs, targets = ids shifted by one
        "lstm_lm": _start(tmp_path, "lstm_lm", str(EX / "models" / "lstm_lm.nf"),
                          "--set", "batch=16", "--set", "steps=8", "--set", "vocab=32",
                          "--set", "embed=16", "--set", "hidden=32"),
        # digits as 4 rows of 64 features, one row per step; Adam (as benchmarks/train_all.py)
        # because the multiplicative cell's gates barely depend on x at first under SGD
        "mi_lstm": _start(tmp_path, "mi_lstm", str(EX / "models" / "mi_lstm.nf"),
                          "--set", "batch=16", "--set", "steps=4", "--set", "inputs=64",
                          "--set", "hidden=32", "--set", "opt.name=adam", "--lr", "0.01"),
    }
    want_data = {"mlp_digits": "digits (8x8 as is)",
                 "lenet5": "digits (8x8 -> 28x28 bilinear)",
                 "lstm_lm": "text: 32-character vocabulary, targets = ids shifted by one",
                 "mi_lstm": "digits (8x8 -> 4 rows of 64 (bilinear))"}
    for name, (proc, metrics) in runs.items():
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, (name, out, err)
        assert f"data: {want_data[name]}" in out, (name, out)
        losses = _losses(metrics)
        assert len(losses) == STEPS
        first, last = sum(losses[:10]) / 10, sum(losses[-10:]) / 10
        # cross-entropy in nats: a tenth of a nat is learning, not noise (runs are
        # deterministic: one thread, seed 0); the classifiers fall by more than one
        assert first - last > (0.1 if name == "lstm_lm" else 0.3), (name, first, last)


def test_impossible_fit_is_a_message_not_a_traceback():
    # digits' 64 float features cannot become the one-hot character window of text
    proc = subprocess.run([sys.executable, "-m", "nfc", "train", built_library(),
                           "--data", "text", "--max-steps", "1", "--quiet"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert "nfc: error: input 'x' [64] cannot hold a one-hot text window" in proc.stderr
    assert "Traceback" not in proc.stderr
