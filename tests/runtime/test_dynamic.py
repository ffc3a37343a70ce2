"""Dynamic mode (`nfc train --mode dynamic`, nfc.runtime.dynamic): the swap machinery end to
end with injected candidate libraries (so nothing depends on the machine's speed), rejection
of wrong and incompatible candidates, a killed explorer, and the CLI with the real tuner on a
tiny budget."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
from runtime_lib import ROOT, scratch

from nfc.codegen.artifact.container import read_artifact, seal
from nfc.runtime.dynamic import DynamicOptions
from nfc.runtime.dynamic.compat import incompatibility
from nfc.runtime.dynamic.verify import compare, tolerance
from nfc.runtime.loader import read_metadata
from nfc.runtime.train import TrainConfig, train

MODEL = str(ROOT / "examples" / "mlp.nf")
TINY = ("batch=16", "inputs=32", "hidden1=24", "hidden2=16", "classes=4")
GIVEN = "nfc.runtime.dynamic.explorer:given_libraries"
STEPS = 40


@pytest.fixture(autouse=True)
def _own_caches(monkeypatch):
    """Every cache (libraries, objects, tuning) in a scratch directory the explorer inherits."""
    monkeypatch.setenv("NFC_CACHE_DIR", str(_cache_dir()))


@functools.cache
def _cache_dir():
    return scratch("dynamic-cache")


@functools.cache
def _library(settings: tuple[str, ...], name: str) -> str:
    from nfc.runtime.build import compile_model

    os.environ.setdefault("NFC_CACHE_DIR", str(_cache_dir()))
    out = scratch(f"dynamic-lib-{name}") / f"{name}.so"
    return compile_model(MODEL, str(out), settings=settings, use_cache=False).path


def _good() -> str:
    """A library that may replace the running one (the same model, compiled separately)."""
    return _library(TINY, "good")


def _wrong() -> str:
    """The code of another learning rate under the good library's metadata: it passes every
    ABI check and computes something else, as a miscompiled schedule would."""
    path = scratch("dynamic-lib-wrong") / "wrong.so"
    other = read_artifact(_library((*TINY, "opt.lr=0.5"), "lr05"))
    path.write_bytes(seal(other.elf, read_metadata(_good())))
    return str(path)


def _incompatible() -> str:
    return _library(("batch=8", *TINY[1:]), "batch8")


def _config(**dynamic) -> TrainConfig:
    mode = "dynamic" if dynamic else "static"
    return TrainConfig(source=MODEL, settings=TINY, data="synthetic", max_steps=STEPS,
                       epochs=1 << 20, progress=False, evaluate=False, mode=mode,
                       dynamic=DynamicOptions(**dynamic) if dynamic else None)


@functools.cache
def _static():
    res = train(_config())
    return res.losses, {k: v.copy() for k, v in res.model.tensors.items()}


def _check_training(res):
    assert res.steps == STEPS
    assert np.all(np.isfinite(res.losses))
    assert np.mean(res.losses[-5:]) < np.mean(res.losses[:5])


def test_offered_library_is_verified_and_used_from_the_next_step():
    good = _good()
    seen: dict[int, str] = {}
    res = train(_config(candidates=GIVEN, libraries=({"path": good, "kernels": 3},),
                        settle_at_step=5,
                        on_step=lambda s, step: seen.__setitem__(step, s.step.path)))
    _check_training(res)
    assert [s["step"] for s in res.dynamic.swaps] == [5]
    assert res.dynamic.swaps[0]["kernels"] == 3 and not res.dynamic.rejected
    assert seen[5] != good and all(seen[s] == good for s in range(6, STEPS + 1))
    losses, tensors = _static()
    # the same code compiled twice: the swapped run computes what the static one does
    np.testing.assert_allclose(res.losses, losses, rtol=1e-6)
    for k, v in tensors.items():
        np.testing.assert_allclose(res.model.tensors[k], v, rtol=1e-5, atol=1e-7)


def test_wrong_and_incompatible_candidates_are_rejected_and_training_unaffected():
    category = {"backend": "test-dynamic"}
    res = train(_config(candidates=GIVEN, settle_at_step=3,
                        libraries=({"path": _wrong(), "category": category,
                                    "schedules": {"nfk1-test": {"mr": 4}}},
                                   {"path": _incompatible()})))
    _check_training(res)
    assert res.dynamic.swaps == []
    status = {os.path.basename(r["path"]): r["status"] for r in res.dynamic.rejected}
    assert status == {"wrong.so": "wrong", "batch8.so": "incompatible"}, res.dynamic.rejected
    # the schedules the wrong library brought are recorded as wrong: never used again
    from nfc.runtime.tuning.cache import TuningCache

    with TuningCache(_cache_dir() / "tuning.sqlite") as cache:
        entry = cache.lookup(category, "nfk1-test", {"mr": 4})
    assert entry is not None and str(entry.status) == "wrong", entry
    assert "failed verification" in entry.error
    losses, tensors = _static()
    assert res.losses == losses  # bit-identical: the running library never changed
    for k, v in tensors.items():
        np.testing.assert_array_equal(res.model.tensors[k], v)


def test_a_killed_explorer_does_not_stop_training():
    logs: list[str] = []

    def kill(session, step):
        if step == 4:
            os.kill(session.proc.pid, signal.SIGKILL)
            session.proc.wait()

    cfg = _config(candidates=GIVEN, libraries=({"path": _good(), "delay": 600},),
                  on_step=kill, poll_seconds=0.0)
    cfg.log = logs.append
    res = train(cfg)
    _check_training(res)
    assert res.dynamic.swaps == [] and "signal 9" in res.dynamic.explorer_exit
    assert any("background exploration stopped" in x for x in logs)
    assert res.losses == _static()[0]


def test_no_exploration_with_zero_threads():
    res = train(_config(explore_threads=0))
    _check_training(res)
    assert res.dynamic.swaps == [] and res.dynamic.explore_cpu_s == 0.0


def test_compat_and_compare_units():
    good = read_metadata(_good())
    assert incompatibility(good, good) is None
    assert "arguments" in incompatibility(good, read_metadata(_incompatible())) or \
        "tensors" in incompatibility(good, read_metadata(_incompatible()))
    lr = read_metadata(_library((*TINY, "opt.lr=0.5"), "lr05"))
    assert "attributes" in incompatibility(good, lr)
    a = {"x": np.array([1.0, 2.0, 3.0], np.float32)}
    assert compare(a, {"x": a["x"] * (1 + 1e-7)}, tolerance(64)) is None
    assert "off by" in compare(a, {"x": a["x"] + 0.01}, tolerance(64))
    assert "non-finite" in compare(a, {"x": np.array([1.0, np.nan, 3.0], np.float32)}, 1e-3)
    assert tolerance(1) == 1e-5 and tolerance(10**6) > tolerance(10)


def test_cli_dynamic_run_with_the_real_tuner_completes():
    env = dict(os.environ, NFC_CACHE_DIR=str(_cache_dir()))
    cmd = [sys.executable, "-m", "nfc", "train", MODEL, *[f"--set={s}" for s in TINY],
           "--data", "synthetic", "--max-steps", "30", "--no-eval", "--mode", "dynamic",
           "--explore-threads", "1", "--quiet"]
    out = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    assert "steps: 30 " in out.stdout
    assert "dynamic: training" in out.stdout and "exploring" in out.stdout
    bad = subprocess.run([sys.executable, "-m", "nfc", "train", MODEL, "--explore-threads",
                          "2"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "--mode dynamic" in bad.stderr


def test_a_candidate_that_corrupts_memory_is_rejected():
    """The code of a 4096-sample batch under the 16-sample metadata writes far past every
    buffer: the verifying child dies or reports garbage, training never sees it."""
    path = scratch("dynamic-lib-overflow") / "overflow.so"
    big = read_artifact(_library(("batch=4096", *TINY[1:]), "batch4096"))
    path.write_bytes(seal(big.elf, read_metadata(_good())))
    res = train(_config(candidates=GIVEN, settle_at_step=2, libraries=({"path": str(path)},)))
    _check_training(res)
    assert res.dynamic.swaps == []
    assert [r["status"] for r in res.dynamic.rejected] in (["failed"], ["wrong"])
    assert res.losses == _static()[0]


def test_reproducible_pipeline_asks_apply_tuning_for_reproducible_schedules():
    from nfc.runtime.dynamic.explorer import candidate_pipeline
    from nfc.runtime.dynamic.session import prepare_config

    text = candidate_pipeline(MODEL, None, im2col=True, fuse=True, reproducible=True)
    assert "apply-tuning{" in text and "reproducible=true" in text, text
    cfg = prepare_config(_config(reproducible=True, explore_threads=0))
    assert cfg.pipeline == text
    assert prepare_config(_config(explore_threads=0)).pipeline is None


def test_real_search_to_the_end_offers_only_verified_libraries():
    """The default candidate source on a tiny budget, waited for at step 3: whatever the
    search finds (that depends on the machine), every offered library was verified and
    swapped in, nothing was rejected, and training is correct."""
    seen: dict[int, str] = {}
    res = train(_config(trials=3, top=1, rounds=2, confirm=0, settle_at_step=3,
                        on_step=lambda s, step: seen.__setitem__(step, s.step.path)))
    _check_training(res)
    assert res.dynamic.rejected == [] and res.dynamic.explorer_exit == ""
    assert res.dynamic.kernels_searched == 2
    assert all(s["step"] == 3 for s in res.dynamic.swaps)
    if res.dynamic.swaps:
        assert seen[4] != seen[3]
    np.testing.assert_allclose(res.losses, _static()[0], rtol=1e-3)
