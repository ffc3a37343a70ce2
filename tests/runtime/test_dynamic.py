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
    cores: dict[int, set[int]] = {}
    everything = os.sched_getaffinity(0)

    def watch(s, step):
        seen[step] = s.step.path
        cores[step] = os.sched_getaffinity(0)

    res = train(_config(candidates=GIVEN, libraries=({"path": good, "kernels": 3},),
                        settle_at_step=5, on_step=watch))
    _check_training(res)
    assert [s["step"] for s in res.dynamic.swaps] == [5]
    # the explorer finished at step 5: from there training has every core back
    assert res.dynamic.explorer_done_step == 5 and cores[STEPS] == everything
    # the baseline steps (before the explorer starts, at step 5 at the latest) run on every
    # core
    assert cores[1] == everything and res.dynamic.baseline_ms is not None
    if len(everything) > 1:
        assert cores[5] < everything and res.dynamic.threads_after == 1
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
        if session.proc is not None and session.proc.returncode is None:
            os.kill(session.proc.pid, signal.SIGKILL)
            session.proc.wait()

    cfg = _config(candidates=GIVEN, libraries=({"path": _good(), "delay": 600},),
                  on_step=kill, poll_seconds=0.0, baseline_seconds=0.0)
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
           "--data", "synthetic", "--max-steps", "80", "--no-eval", "--mode", "dynamic",
           "--explore-threads", "1", "--quiet"]
    out = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    assert "steps: 80 " in out.stdout
    assert "dynamic: training" in out.stdout and "exploring" in out.stdout
    # the explorer started after the baseline steps (at most 50 of them)
    assert "dynamic: exploring cost training" in out.stdout
    bad = subprocess.run([sys.executable, "-m", "nfc", "train", MODEL, "--explore-threads",
                          "2"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "--mode dynamic" in bad.stderr
    bad = subprocess.run([sys.executable, "-m", "nfc", "train", MODEL, "--mode", "dynamic",
                          "--explore-budget", "ten"], env=env, cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 1 and "--explore-budget" in bad.stderr, bad.stderr
    assert "Traceback" not in bad.stderr


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


# -- the exploration budget (`--explore-budget`): injected step times, no clock ---------------


def test_budget_accounting_stops_when_cost_exceeds_win_plus_allowance():
    from nfc.runtime.dynamic.session import ExploreBudget

    # static step 10 ms, 100 planned steps, 10%: the allowance is 0.1 s
    b = ExploreBudget(0.010, 0.10, planned_steps=100)
    assert b.allowance() == pytest.approx(0.1)
    for i in range(6):  # 25 ms while exploring: 15 ms of cost a step
        b.step(0.025, 5 + i)
        assert not b.over(), (i, b.cost)  # 6 x 15 ms = 90 ms <= 100 ms
    b.step(0.025, 11)
    assert b.over() and b.cost == pytest.approx(0.105) and b.win == 0.0

    # a swap that halves the step: from then each step wins 5 ms against the first library
    # and costs its excess over the new library's static time (5 ms)
    b = ExploreBudget(0.010, 0.10, planned_steps=100)
    for i in range(6):
        b.step(0.025, 5 + i)
    b.swapped(25.0, 12.5)
    assert b.scale == pytest.approx(0.5)
    for i in range(3):
        b.step(0.0125, 11 + i)  # 7.5 ms cost, 5 ms win a step
    # cost alone (112.5 ms) is over the allowance; what the swap won keeps it going
    assert b.cost == pytest.approx(0.1125) and b.win == pytest.approx(0.015)
    assert b.cost > b.allowance() and not b.over()
    b.step(0.0125, 14)
    b.step(0.0125, 15)  # cost 127.5 ms > win 25 ms + allowance 100 ms
    assert b.over()

    # a faster step than the static one pays back; no budget never stops; unknown length:
    # the allowance is the elapsed steps' share
    b = ExploreBudget(0.010, 0.10)
    b.step(0.030, 10)
    assert b.allowance() == pytest.approx(0.01) and b.over()
    b.step(0.0, 11)
    assert not b.over()
    b = ExploreBudget(0.010, None)
    for i in range(100):
        b.step(1.0, i)
    assert not b.over()


def test_parse_budget():
    from nfc.runtime.dynamic.session import parse_budget

    assert parse_budget("10%") == pytest.approx(0.1) and parse_budget("0.25") == 0.25
    assert parse_budget("none") is None and parse_budget("0") == 0.0
    for bad in ("-5%", "ten", "nan"):
        with pytest.raises(ValueError, match="explore-budget"):
            parse_budget(bad)


def _budget_run(exploring_s: float, budget: float | None = 0.10):
    """A run whose explorer never finishes (its one candidate waits 600 s), with the step
    times the budget sees injected: 10 ms for 4 baseline steps, `exploring_s` after."""
    import json

    metrics = scratch("dynamic-budget") / f"m-{exploring_s}-{budget}.jsonl"
    metrics.unlink(missing_ok=True)
    logs: list[str] = []
    procs = []
    cores: dict[int, set[int]] = {}

    def watch(s, step):
        procs.append(s.proc)
        cores[step] = os.sched_getaffinity(0)

    cfg = _config(candidates=GIVEN, libraries=({"path": _good(), "delay": 600},),
                  budget=budget, poll_seconds=0.0, on_step=watch, baseline_steps=4,
                  baseline_seconds=0.0,
                  step_time=lambda step, s: 0.010 if step <= 4 else exploring_s)
    cfg.metrics, cfg.log, cfg.progress = str(metrics), logs.append, True
    res = train(cfg)
    _check_training(res)
    events = [json.loads(x) for x in metrics.read_text().splitlines()]
    return res, events, logs, procs[-1], cores


def test_budget_stops_the_explorer_when_exploring_costs_too_much():
    # allowance 10% x 40 planned steps x 10 ms = 40 ms; 15 ms of cost a step from step 5:
    # 45 ms > 40 ms after step 7
    res, events, logs, proc, cores = _budget_run(0.025)
    d = res.dynamic
    assert d.explore_stopped_step == 7 and d.explorer_done_step == 7
    assert d.baseline_ms == pytest.approx(10.0)
    assert d.explore_cost_s == pytest.approx(0.045) and d.explore_win_s == 0.0
    assert d.explore_allowance_s == pytest.approx(0.04)
    assert proc.returncode is not None  # stopped at step 7, not only at the run's end
    assert cores[STEPS] == os.sched_getaffinity(0)
    if len(cores[STEPS]) > 1:
        assert cores[6] < cores[STEPS] and cores[8] == cores[STEPS]
    stop = [e for e in events if e.get("event") == "explore_stopped"]
    assert len(stop) == 1 and stop[0]["step"] == 7
    assert stop[0]["cost_s"] == pytest.approx(0.045) and stop[0]["allowance_s"] > 0
    assert any("exploration stopped" in x for x in logs), logs
    assert not any("background exploration stopped" in x for x in logs)  # no warning
    assert any("exploration stopped at step 7" in x for x in d.lines())
    assert res.losses == _static()[0]


def test_budget_does_not_stop_an_explorer_within_the_allowance():
    # 0.5 ms of cost a step x 36 steps = 18 ms <= 40 ms: explores to the end; likewise
    # 15 ms a step with no budget
    for exploring_s, budget in ((0.0105, 0.10), (0.025, None)):
        res, events, logs, proc, cores = _budget_run(exploring_s, budget)
        d = res.dynamic
        assert d.explore_stopped_step is None and d.explorer_done_step is None, d
        assert d.explore_cost_s == pytest.approx((exploring_s - 0.010) * (STEPS - 4))
        assert not any(e.get("event") == "explore_stopped" for e in events)
        assert any(e.get("event") == "explore_start" and e["step"] == 4 for e in events)
        if len(cores[STEPS]) > 1:
            assert cores[STEPS] < os.sched_getaffinity(0)  # pinned until the end
