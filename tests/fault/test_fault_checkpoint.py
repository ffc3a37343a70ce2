"""Fault injection for training checkpoints.

- `nfc train` processes SIGKILLed at random moments (mid-step, mid-save, before the first
  checkpoint), resumed again and again: the final parameters, optimizer state included, are
  bit-identical to an uninterrupted run's, and the metrics log holds every step once.
- A crash before every file operation of a save: what is left always loads, without a warning.
- The newest checkpoint's npz, JSON and `latest.json` truncated, bit-flipped, deleted or
  pointing elsewhere: `--resume` warns, falls back to the newest intact checkpoint and ends
  with the uninterrupted run's parameters; with none intact, a clear error (exit 1). Never a
  traceback, never silently wrong parameters.

The kill moments are drawn from a generator seeded at random (the seed is in the failure
message; NFC_FAULT_SEED=<seed> replays it) and chosen by training progress, not by time.
NFC_FAULT_LONG=1 runs more kills, with more optimizers.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from nfc import fsutil
from nfc.cli import main
from nfc.runtime import checkpoint as ckpt
from nfc.runtime.train import TrainConfig, train

ROOT = Path(__file__).resolve().parents[2]
#: The smallest trainable model (a linear classifier, batch 16: 89 steps an epoch on digits).
TINY = ROOT / "tests" / "runtime" / "models" / "tiny.nf"
LONG = os.environ.get("NFC_FAULT_LONG") == "1"
#: Optimizers of the kill runs: SGD with momentum (tiny.nf's own) and Adam (a 0-d counter).
KILL_OPTIMIZERS = {"momentum": (), "adam": ("opt.name=adam",)}
if LONG:
    KILL_OPTIMIZERS |= {"nesterov": ("opt.momentum=0.9", "opt.nesterov=true"),
                        "adamw": ("opt.name=adamw", "opt.clip_norm=1.0")}
KILLS = 10 if LONG else 4
#: Steps of every run: past an epoch boundary. Kills come in the first half of the steps,
#: so the killed process is still training when its kill arrives.
TOTAL = 240 if LONG else 120
#: At most this many steps between two kills.
SPAN = TOTAL // (2 * KILLS)
#: Seconds each killed process sleeps after a step (--step-delay): kills land in steps,
#: in saves (every step) and in the sleeps.
STEP_DELAY = 0.01
SEED = 3

_TMP = Path(tempfile.mkdtemp(prefix="nfc-fault-tests-"))
atexit.register(shutil.rmtree, _TMP, True)


# ------------------------------------------------------------------------------ helpers


@functools.cache
def library(settings: tuple[str, ...] = ()) -> str:
    """The tiny model compiled with optimizer `settings` (once per session)."""
    from nfc.runtime.build import build_library, model_module, parse_settings, run_pipeline

    params, opt = parse_settings(settings)
    module = run_pipeline(model_module(str(TINY), params, opt))
    out = _TMP / f"tiny-{abs(hash(settings))}.so"
    return build_library(module, str(out), use_cache=False).path


def train_args(lib: str, d: Path, *extra: str) -> list[str]:
    """`nfc train` arguments of every run of a kill test (the same computation each time)."""
    return ["train", lib, "--data", "digits", "--epochs", "10", "--max-steps", str(TOTAL),
            "--seed", str(SEED), "--every", "1", "--keep", "2", "--threads", "1", "--quiet",
            "--no-eval", "--checkpoint", str(d), "--metrics", str(d.parent / "m.jsonl"),
            "--resume", *extra]


@functools.cache
def reference(lib: str, steps: int = TOTAL) -> dict[str, np.ndarray]:
    """The persistent tensors after an uninterrupted run of `steps` steps."""
    res = train(TrainConfig(source=lib, data="digits", epochs=10, seed=SEED, max_steps=steps,
                            threads=1, evaluate=False, progress=False, log=lambda s: None))
    return res.model.state_dict()


def assert_identical(a: dict[str, np.ndarray], b: dict[str, np.ndarray], what: str) -> None:
    """Same names, dtypes, shapes and bytes."""
    assert a.keys() == b.keys(), what
    for name in a:
        assert a[name].dtype == b[name].dtype and a[name].shape == b[name].shape, (what, name)
        assert a[name].tobytes() == b[name].tobytes(), f"{what}: '{name}' differs"


def final_tensors(d: Path) -> dict[str, np.ndarray]:
    """The tensors of the newest checkpoint, which must be intact and at step TOTAL."""
    found = ckpt.load_latest(d, warn=pytest.fail)
    assert found is not None and found.step == TOTAL, found and found.step
    return found.tensors


def saved_step(d: Path) -> int:
    """The step `latest.json` points to (0 before the first checkpoint)."""
    try:
        path = ckpt.latest(d)
    except ckpt.CheckpointError:
        return 0
    return 0 if path is None else int(path.name[5:-5])


def nfc_process(args: list[str]) -> subprocess.Popen[str]:
    """`python -m nfc ARGS` in the background."""
    return subprocess.Popen([sys.executable, "-m", "nfc", *args], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"))


def assert_no_traceback(err: str, what: str) -> None:
    """A clean stderr: no Python traceback, no internal error."""
    assert "Traceback" not in err and "internal error" not in err, f"{what}:\n{err}"


# ------------------------------------------------------------------------------ kills


def kill_and_resume(lib: str, d: Path, rng: np.random.Generator, what: str) -> int:
    """Run `nfc train --resume` KILLS times, each SIGKILLed at a random moment, then once to
    the end; returns how many kills hit a running training."""
    landed = 0
    for k in range(KILLS):
        done = saved_step(d)
        target = int(rng.integers(done + 1, done + SPAN + 1))
        jitter = float(rng.uniform(0.0, 2 * STEP_DELAY))
        proc = nfc_process(train_args(lib, d, "--step-delay", str(STEP_DELAY)))
        try:
            if k == 0:  # during start-up, or before the first checkpoint, or just after
                time.sleep(float(rng.uniform(0.0, 1.0)))
            else:
                deadline = time.monotonic() + 300
                while saved_step(d) < target and proc.poll() is None:
                    assert time.monotonic() < deadline, f"{what}: step {target} never came"
                    time.sleep(0.002)
                time.sleep(jitter)
            proc.send_signal(signal.SIGKILL)
        finally:
            _, err = proc.communicate(timeout=120)
        assert_no_traceback(err, f"{what}: killed run {k}")
        if proc.returncode == -signal.SIGKILL:
            landed += 1
        else:
            assert proc.returncode == 0, f"{what}: killed run {k} failed:\n{err}"
    proc = nfc_process(train_args(lib, d))
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, f"{what}: the last resume failed:\n{err}"
    assert_no_traceback(err, f"{what}: last resume")
    return landed


@pytest.mark.parametrize("optimizer", sorted(KILL_OPTIMIZERS))
def test_sigkill_at_random_moments_then_resume_is_bit_exact(optimizer: str) -> None:
    lib = library(KILL_OPTIMIZERS[optimizer])
    seed = int(os.environ.get("NFC_FAULT_SEED") or int.from_bytes(os.urandom(4), "little"))
    what = f"{optimizer}, kill seed {seed}"
    base = _TMP / f"kills-{optimizer}"
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir()
    landed = kill_and_resume(lib, base / "ck", np.random.default_rng(seed), what)
    # every kill but the first is aimed at a training process at least SPAN steps before
    # the run's end (a step takes STEP_DELAY seconds at least)
    assert landed >= KILLS - 1, f"{what}: only {landed} kills hit a training process"
    assert_identical(reference(lib), final_tensors(base / "ck"), what)
    steps = [json.loads(line)["step"] for line in (base / "m.jsonl").read_text().splitlines()
             if json.loads(line)["event"] == "step"]
    assert steps == list(range(1, TOTAL + 1)), f"{what}: the metrics lost or repeated steps"
    leftovers = [p.name for p in (base / "ck").iterdir() if p.name.startswith(".")]
    assert all(p.endswith(fsutil.TMP_SUFFIX) for p in leftovers), leftovers
    assert ckpt.remove_stale_temporaries(base / "ck", older_than_s=-1) == len(leftovers)


# ------------------------------------------------------------------------------ crashes


class Crash(BaseException):
    """A simulated power cut: raised before a file operation, caught by no handler of nfc."""


class FileOps:
    """Counts the file operations of checkpoint saves (atomic writes, deletions) and raises
    `Crash` before the one numbered `crash_at`."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        self.crash_at = 0
        monkeypatch.setattr(fsutil, "atomic_write", self._wrap(fsutil.atomic_write))
        monkeypatch.setattr(Path, "unlink", self._wrap(Path.unlink))

    def _wrap(self, real: Callable[..., None]) -> Callable[..., None]:
        def op(*args: object, **kw: object) -> None:
            self.count += 1
            if self.count == self.crash_at:
                raise Crash
            real(*args, **kw)
        return op

    def run(self, fn: Callable[[], object], crash_at: int = 0) -> bool:
        """Run `fn` crashing before operation `crash_at` (0: none); whether it crashed."""
        self.count, self.crash_at = 0, crash_at
        try:
            fn()
        except Crash:
            return True
        finally:
            self.crash_at = 0
        return False


@pytest.mark.parametrize("keep", [1, 2])
def test_a_crash_before_any_file_operation_of_a_save_leaves_loadable_checkpoints(
        keep: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tensors = {s: {"w": np.full((3, 2), s, np.float32), "step": np.array(s, np.int64)}
               for s in range(1, 6)}
    expect = {"w": ((3, 2), np.dtype(np.float32)), "step": ((), np.dtype(np.int64))}
    ops = FileOps(monkeypatch)

    def setup(d: Path) -> None:
        for s in (1, 2, 3):
            ckpt.save(d, s, tensors[s], keep=keep)

    setup(tmp_path / "dry")
    assert not ops.run(lambda: ckpt.save(tmp_path / "dry", 4, tensors[4], keep=keep))
    n = ops.count
    assert n == 3 + 2, "npz, JSON, latest.json, then the pruned checkpoint's two files"
    for at in range(1, n + 1):
        d = tmp_path / f"crash-{at}"
        setup(d)
        assert ops.run(lambda d=d: ckpt.save(d, 4, tensors[4], keep=keep), crash_at=at)
        found = ckpt.load_latest(d, expect, warn=pytest.fail)  # no damage: no warning
        assert found is not None and found.step == (3 if at <= 3 else 4), (at, found)
        assert_identical(found.tensors, tensors[found.step], f"crash before op {at}")
        ckpt.save(d, 5, tensors[5], keep=keep)  # the next save tidies up
        left = sorted(p.name for p in d.iterdir() if not p.name.startswith("."))
        assert len(left) == 2 * keep + 1 and left[-1] == "latest.json", (at, left)
        found = ckpt.load_latest(d, expect, warn=pytest.fail)
        assert found is not None and found.step == 5


# ------------------------------------------------------------------------------ damage

#: Checkpoints of the damage tests: every 5 steps up to 30, the 3 newest kept.
DAMAGE_AT, DAMAGE_EVERY, RESUME_TO = 30, 5, 40
NPZ, JSON = "ckpt-000000030.npz", "ckpt-000000030.json"


def _flip(path: Path, rng: np.random.Generator) -> None:
    raw = bytearray(path.read_bytes())
    raw[int(rng.integers(len(raw)))] ^= 1 << int(rng.integers(8))
    path.write_bytes(bytes(raw))


def _truncate(path: Path, rng: np.random.Generator) -> None:
    raw = path.read_bytes()
    path.write_bytes(raw[:int(rng.integers(len(raw)))])


#: name -> (damage, what the warning names or None when no warning is due).
DAMAGE: dict[str, tuple[Callable[[Path, np.random.Generator], None], str | None]] = {
    "npz-truncated": (lambda d, g: _truncate(d / NPZ, g), NPZ),
    "npz-empty": (lambda d, g: (d / NPZ).write_bytes(b""), NPZ),
    "npz-bit-flip": (lambda d, g: _flip(d / NPZ, g), NPZ),
    "npz-deleted": (lambda d, g: (d / NPZ).unlink(), NPZ),
    "npz-replaced-by-older": (lambda d, g: shutil.copy(d / "ckpt-000000025.npz", d / NPZ), NPZ),
    "json-truncated": (lambda d, g: _truncate(d / JSON, g), JSON),
    "json-bit-flip": (lambda d, g: _flip(d / JSON, g), JSON),
    "json-not-an-object": (lambda d, g: (d / JSON).write_text("[1, 2]"), JSON),
    "latest-truncated": (lambda d, g: _truncate(d / "latest.json", g), "latest.json"),
    "latest-outside": (lambda d, g: (d / "latest.json").write_text(
        json.dumps({"checkpoint": "../../ck/ckpt-000000030.json"})), "outside"),
    "latest-missing-target": (lambda d, g: (d / "latest.json").write_text(
        json.dumps({"checkpoint": "ckpt-000000035.json"})), "does not exist"),
    "latest-deleted": (lambda d, g: (d / "latest.json").unlink(), None),
}


@pytest.fixture(scope="module")
def damaged_base() -> tuple[str, Path]:
    """An Adam run's checkpoints at steps 20, 25, 30 (a pristine copy to damage)."""
    lib = library(("opt.name=adam",))
    d = _TMP / "damage-base"
    shutil.rmtree(d, ignore_errors=True)
    train(TrainConfig(source=lib, data="digits", epochs=10, seed=SEED, max_steps=DAMAGE_AT,
                      checkpoint=str(d), every=DAMAGE_EVERY, keep=3, threads=1,
                      evaluate=False, progress=False, log=lambda s: None))
    assert sorted(p.name for p in d.glob("*.json"))[-2:] == [JSON, "latest.json"]
    return lib, d


def _resume_argv(lib: str, d: Path, *extra: str) -> list[str]:
    return ["train", lib, "--data", "digits", "--epochs", "10", "--max-steps", str(RESUME_TO),
            "--seed", str(SEED), "--every", str(DAMAGE_EVERY), "--keep", "3", "--threads", "1",
            "--quiet", "--no-eval", "--checkpoint", str(d), "--resume", *extra]


@pytest.mark.parametrize("rep", range(3 if LONG else 1))
@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damaged_newest_checkpoint_falls_back_and_ends_right(
        damage: str, rep: int, damaged_base: tuple[str, Path], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    lib, base = damaged_base
    d = tmp_path / "ck"
    shutil.copytree(base, d)
    hurt, named = DAMAGE[damage]
    hurt(d, np.random.default_rng([rep, len(damage)]))
    capsys.readouterr()
    assert main(_resume_argv(lib, d)) == 0
    err = capsys.readouterr().err
    assert_no_traceback(err, damage)
    resumed = next(line for line in err.splitlines() if "resumed from" in line)
    if named is None:
        assert "warning" not in err and JSON in resumed, err
    else:
        warning = next(line for line in err.splitlines() if "warning" in line)
        assert named in warning, err
        assert "falling back to the newest intact checkpoint" in err, err
    found = ckpt.load_latest(d, warn=pytest.fail)
    assert found is not None and found.step == RESUME_TO
    assert_identical(reference(lib, RESUME_TO), found.tensors, damage)


def test_every_checkpoint_damaged_is_a_clear_error(damaged_base: tuple[str, Path],
                                                   tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    lib, base = damaged_base
    d = tmp_path / "ck"
    shutil.copytree(base, d)
    g = np.random.default_rng(0)
    _flip(d / "ckpt-000000020.npz", g)
    _truncate(d / "ckpt-000000025.json", g)
    (d / NPZ).write_bytes(b"")
    capsys.readouterr()
    assert main(_resume_argv(lib, d)) == 1
    err = capsys.readouterr().err
    assert_no_traceback(err, "all damaged")
    error = next(line for line in err.splitlines() if line.startswith("nfc: error:"))
    assert "no intact checkpoint" in error
    for name in ("ckpt-000000020.npz", "ckpt-000000025.json", NPZ):
        assert name in error, error
    assert sorted(p.name for p in d.iterdir()) == sorted(p.name for p in base.iterdir()), \
        "a failed resume deletes nothing"
