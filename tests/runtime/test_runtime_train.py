"""`nfc train`: digits accuracy, metrics and plots, checkpoints, and a SIGKILLed run that
resumes to bit-identical parameters."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from runtime_lib import ROOT, built_library, scratch

from nfc.runtime import checkpoint as ckpt
from nfc.runtime import data as datasets
from nfc.runtime.train import TrainConfig, TrainError, train


def test_digits_reaches_90_percent_and_logs_metrics():
    d = scratch("train-digits")
    cfg = TrainConfig(source=built_library(), data="digits", epochs=5, seed=0,
                      metrics=str(d / "m.jsonl"), plot=str(d / "loss.png"), progress=False)
    res = train(cfg)
    assert res.test_accuracy is not None and res.test_accuracy >= 0.90, res.test_accuracy
    assert res.steps == 5 * (1437 // 64)
    first, last = np.mean(res.losses[:10]), np.mean(res.losses[-10:])
    assert last < 0.3 * first
    recs = [json.loads(x) for x in (d / "m.jsonl").read_text().splitlines()]
    steps = [r for r in recs if r["event"] == "step"]
    epochs = [r for r in recs if r["event"] == "epoch"]
    assert len(steps) == res.steps and len(epochs) == 5 and recs[-1]["event"] == "final"
    assert epochs[-1]["test_accuracy"] == res.test_accuracy
    assert (d / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_batch_mismatch_and_missing_resume_dir_are_errors():
    with pytest.raises(TrainError, match="compiled for batch 64"):
        train(TrainConfig(source=built_library(), batch=32, progress=False))
    with pytest.raises(TrainError, match="--resume needs --checkpoint"):
        train(TrainConfig(source=built_library(), resume=True, progress=False))


def _nfc(*args: str, **kw):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, "-m", "nfc", *args], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def _final_tensors(directory: Path) -> dict[str, np.ndarray]:
    path = ckpt.latest(directory)
    assert path is not None
    tensors, info = ckpt.load(path)
    return tensors | {"__step__": np.array(info["step"])}


def test_sigkill_then_resume_is_bit_exact():
    lib = built_library()
    base = scratch("killresume")
    common = ["train", lib, "--data", "digits", "--epochs", "3", "--seed", "5", "--every", "7",
              "--quiet", "--threads", "1"]
    ref = _nfc(*common, "--checkpoint", str(base / "ref"))
    killed = _nfc(*common, "--checkpoint", str(base / "run"), "--step-delay", "0.05",
                  "--metrics", str(base / "m.jsonl"))
    try:
        deadline = time.time() + 120
        while time.time() < deadline:  # wait for a checkpoint past the first epoch's middle
            last = ckpt.latest(base / "run") if (base / "run").exists() else None
            if last is not None and json.loads(last.read_text())["step"] >= 14:
                break
            assert killed.poll() is None, killed.communicate()
            time.sleep(0.05)
        else:
            pytest.fail("no checkpoint appeared")
        killed.send_signal(signal.SIGKILL)
        killed.wait(30)
    finally:
        if killed.poll() is None:
            killed.kill()
    assert killed.returncode == -signal.SIGKILL
    interrupted_at = json.loads(ckpt.latest(base / "run").read_text())["step"]
    assert interrupted_at < 3 * (1437 // 64)
    resumed = _nfc(*common, "--checkpoint", str(base / "run"), "--resume",
                   "--metrics", str(base / "m.jsonl"))
    out, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err
    assert "resumed from" in err
    rout, rerr = ref.communicate(timeout=300)
    assert ref.returncode == 0, rerr
    a, b = _final_tensors(base / "ref"), _final_tensors(base / "run")
    assert a.keys() == b.keys() and int(a["__step__"]) == 3 * (1437 // 64)
    for name in a:
        assert a[name].dtype == b[name].dtype and a[name].tobytes() == b[name].tobytes(), name
    assert out.splitlines()[-1] == rout.splitlines()[-1]  # same final test accuracy line
    steps = [json.loads(x)["step"] for x in (base / "m.jsonl").read_text().splitlines()
             if json.loads(x)["event"] == "step"]
    assert steps == sorted(set(steps)), "the resumed metrics continue without repeats"


def test_checkpoint_is_verified_and_pruned(tmp_path):
    t = {"w": np.arange(6, dtype=np.float32).reshape(2, 3)}
    for step in (1, 2, 3, 4):
        ckpt.save(tmp_path, step, t, {"seed": 0}, keep=2)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["ckpt-000000003.json", "ckpt-000000003.npz", "ckpt-000000004.json",
                     "ckpt-000000004.npz", "latest.json"]
    tensors, info = ckpt.load(ckpt.latest(tmp_path))
    assert info["step"] == 4 and np.array_equal(tensors["w"], t["w"])
    npz = tmp_path / "ckpt-000000004.npz"
    raw = bytearray(npz.read_bytes())
    raw[-1] ^= 0xFF
    npz.write_bytes(bytes(raw))
    with pytest.raises(ckpt.CheckpointError, match="does not match the hash"):
        ckpt.load(ckpt.latest(tmp_path))
    assert ckpt.latest(tmp_path / "nothing") is None


def test_batch_order_resumes_mid_epoch():
    a = datasets.BatchOrder(100, 8, seed=3)
    seen = []
    for n, idx in enumerate(a.epoch_batches()):
        seen.append(idx)
        if n == 4:
            state = json.loads(json.dumps(a.state()))
    a.next_epoch()
    nxt = list(a.epoch_batches())
    b = datasets.BatchOrder(100, 8, seed=3)
    b.restore(state)
    rest = list(b.epoch_batches())
    assert all(np.array_equal(x, y) for x, y in zip(rest, seen[5:], strict=True))
    b.next_epoch()
    assert all(np.array_equal(x, y) for x, y in zip(list(b.epoch_batches()), nxt, strict=True))
    assert a.batches_per_epoch == 12  # the partial batch is dropped


def test_data_sets_fit_model_inputs():
    f32, i32 = np.dtype(np.float32), np.dtype(np.int32)
    d = datasets.load("digits", datasets.InputSpec("x", (64, 64), f32), 10)
    assert d.x_train.shape == (1437, 64) and d.x_test.shape == (360, 64)
    big = datasets.load("digits", datasets.InputSpec("x", (32, 1, 28, 28), f32), 10)
    assert big.x_train.shape == (1437, 1, 28, 28)
    assert abs(float(big.x_train.mean()) - float(d.x_train.mean())) < 0.05
    with pytest.raises(datasets.DataError, match="--set inputs=64"):
        datasets.load("digits", datasets.InputSpec("x", (8, 99), f32), 10)
    t = datasets.load("text", datasets.InputSpec("x", (16, 12), i32), 40)
    assert t.x_train.shape[1:] == (12,) and t.x_train.dtype == np.int32
    assert t.y_train.max() < 40 and t.x_test is not None
    onehot = datasets.load("text", datasets.InputSpec("x", (4, 5 * 30), f32), 30)
    assert onehot.x_train.shape[1:] == (150,) and set(np.unique(onehot.x_train)) <= {0.0, 1.0}
    s = datasets.load("synthetic", datasets.InputSpec("x", (16, 3, 4), f32), 5)
    assert s.x_train.shape == (2048, 3, 4) and s.y_train.max() < 5  # >= 64 batches, >= 2048
    with pytest.raises(datasets.DataError, match="unknown data set"):
        datasets.load("imagenet", datasets.InputSpec("x", (1, 1), f32), 2)


def test_mnist1d_loads_from_its_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NFC_CACHE_DIR", str(tmp_path))
    (tmp_path / "data").mkdir()
    g = np.random.default_rng(0)
    np.savez(tmp_path / "data" / "mnist1d-default.npz", x=g.random((50, 40)),
             y=g.integers(0, 10, 50), x_test=g.random((20, 40)), y_test=g.integers(0, 10, 20))
    d = datasets.load("mnist1d", datasets.InputSpec("x", (10, 40), np.dtype(np.float32)), 10)
    assert d.x_train.shape == (50, 40) and d.x_test.dtype == np.float32
