"""Dynamic mode survives `kill -9`: a `nfc train --mode dynamic` run is SIGKILLed (its whole
process group) once its explorer has finished a search; everything that search measured is in
the persistent tuning cache (intact), and a restart, static or dynamic, builds its first
library with the cached schedules and replays the recorded candidates instead of measuring
them again. Also the swap lines, the `--plot-steps` option and the summary's time split.

Nothing here depends on the machine's speed: the kill waits for an event (a finished search),
not for a time, and only what the killed run recorded is asserted on."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from runtime_lib import ROOT, scratch

from nfc.runtime.dynamic import DynamicOptions
from nfc.runtime.dynamic.plot import read_step_times
from nfc.runtime.dynamic.session import swap_line
from nfc.runtime.train import TrainConfig, train

MODEL = str(ROOT / "examples" / "mlp.nf")
TINY = ("batch=16", "inputs=32", "hidden1=24", "hidden2=16", "classes=4")
TRIALS = 3
FOUND = re.compile(r"tuning cache: (\d+) of (\d+) kernels found")
WAIT = 600.0
"""Seconds to wait for an event before failing (a hang, not a slow machine)."""


def _cli(*extra: str) -> list[str]:
    return [sys.executable, "-m", "nfc", "train", MODEL, *[f"--set={s}" for s in TINY],
            "--data", "synthetic", "--no-eval", *extra]


def _events(tmp: Path) -> list[dict]:
    out = []
    for f in tmp.glob("nfc-dynamic-*/events.jsonl"):
        for line in f.read_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError):  # the line being written
                out.append(json.loads(line))
    return out


def _wait_for(what, proc: subprocess.Popen | None = None, label: str = ""):
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        got = what()
        if got:
            return got
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"the run ended (rc {proc.returncode}) before {label}")
        time.sleep(0.1)
    pytest.fail(f"no {label} after {WAIT} s")


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _module():
    from nfc.runtime.tuning.driver import build_model

    return build_model(MODEL, list(TINY), None)


def _kernels():
    from nfc.runtime.tuning.driver import training_functions
    from nfc.runtime.tuning.kernels import collect_kernels

    module = _module()
    return collect_kernels(module, training_functions(module))


def _ranked_by_cost():
    from nfc.runtime.dynamic.explorer import rank_kernels

    return rank_kernels(_module(), "cost")[0]


def test_kill_9_then_static_and_dynamic_restarts_reuse_what_was_found(monkeypatch):
    from nfc.runtime.tuning.cache import TuningCache
    from nfc.runtime.tuning.category import default_category
    from nfc.runtime.tuning.kernels import schedules_from_cache

    root = scratch("dynamic-kill9")
    cache_dir, tmp = root / "cache", root / "tmp"
    cache_dir.mkdir()
    tmp.mkdir()
    db = cache_dir / "tuning.sqlite"
    env = dict(os.environ, NFC_CACHE_DIR=str(cache_dir), TMPDIR=str(tmp), NFC_DYNAMIC_KEEP="1")
    log = open(root / "run1.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(
        _cli("--mode", "dynamic", "--max-steps", "100000000", "--step-delay", "0.005",
             "--explore-trials", str(TRIALS), "--explore-top", "1"),
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        searched = _wait_for(lambda: [e for e in _events(tmp) if e.get("status") == "searched"],
                             proc, "finished search")[0]
        start = [e for e in _events(tmp) if e.get("event") == "start"][0]
        os.killpg(proc.pid, signal.SIGKILL)  # the whole `nfc train` process group
        assert proc.wait() == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
    # the explorer (its own session) notices that its trainer is gone and exits
    _wait_for(lambda: _gone(start["pid"]), None, "explorer exit")
    first = (root / "run1.log").read_text()
    m = FOUND.search(first)  # it started on default schedules
    assert "tuning cache: none; default schedules" in first or (m and m.group(1) == "0"), first

    # what the killed run found is in the cache, which is intact
    key = searched["key"]
    assert searched["evaluated"] == TRIALS and searched["measured"] == TRIALS, searched
    category = default_category()
    kernels = _kernels()
    with TuningCache(db, create=False) as cache:
        assert cache.health_problems(full=True) == []
        recorded = cache.entries(category, key, include_pruned=True)
        assert len(recorded) >= TRIALS
        best = cache.best(category, key)
        assert best is not None and best.time is not None
        # the best is the fastest record (the default's included: a later measurement of the
        # same schedule, e.g. the explorer's check against the running kernel, replaces its
        # time, so the search's own default_s is not a bound)
        timed = [e.time for e in recorded if e.time is not None and not e.error and not e.pruned]
        assert best.time <= min(timed) * (1 + 1e-9)
        table = schedules_from_cache(kernels, cache, category)
    assert key in table and table[key] == dict(best.schedule)

    # a static restart builds with it: its report counts every kernel the cache has
    out = subprocess.run(_cli("--max-steps", "3"), cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=WAIT)
    assert out.returncode == 0, out.stderr
    m = FOUND.search(out.stderr)
    assert m is not None, out.stderr
    assert int(m.group(1)) == len(table) >= 1 and str(db) in out.stderr

    # a dynamic restart too, and its search replays the recorded candidates of that kernel
    # instead of measuring them again (ranked by the FLOP/byte estimate, which does not
    # depend on timing, down to that kernel)
    ranked = [k.key for k in _ranked_by_cost() if k.tunable]
    monkeypatch.setenv("NFC_CACHE_DIR", str(cache_dir))
    lines: list[str] = []
    seen: list[dict] = []

    def grab(session, step):
        if step == 3:
            seen.extend(session.events())

    cfg = TrainConfig(source=MODEL, settings=TINY, data="synthetic", max_steps=4, epochs=1 << 20,
                      progress=True, evaluate=False, mode="dynamic",
                      dynamic=DynamicOptions(trials=TRIALS, top=ranked.index(key) + 1,
                                             rounds=1, confirm=1, order="cost",
                                             settle_at_step=2, on_step=grab))
    cfg.log = lines.append
    res = train(cfg)
    assert res.steps == 4 and res.dynamic.explorer_exit == ""
    found = [FOUND.search(x) for x in lines if FOUND.search(x)]
    assert found and int(found[0].group(1)) == len(table), lines
    again = [e for e in seen if e.get("key") == key and e.get("status") == "searched"]
    assert len(again) == 1, seen
    assert again[0]["evaluated"] == TRIALS and again[0]["measured"] == 0, again[0]
    assert again[0]["best_s"] <= searched["best_s"] * (1 + 1e-9)


def test_swap_lines_name_the_kernels_and_times():
    rec = {"step": 120, "kernels": 1, "step_ms_before": 31.0, "step_ms_after": 19.0,
           "changes": [{"name": "gemm 64x128/256 at m.nf:3:5", "before_ms": 4.1,
                        "after_ms": 1.2}]}
    assert swap_line(rec) == ("step 120: gemm 64x128/256 at m.nf:3:5 4.1 ms -> 1.2 ms "
                              "(tuned), step time 31 -> 19 ms")
    rec["changes"].append({"key": "k2", "before_ms": 0.05, "after_ms": None})
    assert "; k2 50 us -> ? (tuned)," in swap_line(rec)
    assert swap_line({**rec, "changes": [], "kernels": 3}).startswith(
        "step 120: swapped in 3 tuned kernels, step time")


def test_plot_steps_and_the_summary_time_split():
    """`--plot-steps` writes a PNG from the step times (the metrics file it read has one per
    step); the summary accounts the steps' time and the explorer's. No exploration budget:
    these steps take microseconds, so any budget would stop the explorer at once and leave
    no exploring steps to account (the budget has its own tests)."""
    pytest.importorskip("matplotlib")
    root = scratch("dynamic-plot")
    env = dict(os.environ, NFC_CACHE_DIR=str(root))
    png, metrics = root / "steps.png", root / "m.jsonl"
    out = subprocess.run(_cli("--max-steps", "80", "--mode", "dynamic", "--explore-trials", "2",
                              "--explore-top", "1", "--explore-budget", "none", "--quiet",
                              "--metrics", str(metrics), "--plot-steps", str(png)),
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=WAIT)
    assert out.returncode == 0, out.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    steps, ms, swaps = read_step_times(str(metrics))
    assert steps == list(range(1, 81)) and all(t > 0 for t in ms)
    final = json.loads(metrics.read_text().splitlines()[-1])
    dyn = final["dynamic"]
    assert dyn["train_s"] == pytest.approx(sum(ms) / 1e3, rel=1e-6)
    assert dyn["wall_s"] >= dyn["train_s"] and dyn["step_ms_exploring"] is not None
    assert [s["step"] for s in dyn["swaps"]] == [s["step"] for s in swaps]
    assert "dynamic: training" in out.stdout and "exploring" in out.stdout
    # without --metrics the plot still works (a temporary metrics file, removed)
    png2 = root / "static.png"
    out = subprocess.run(_cli("--max-steps", "5", "--quiet", "--plot-steps", str(png2)),
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=WAIT)
    assert out.returncode == 0, out.stderr
    assert png2.read_bytes()[:4] == b"\x89PNG"
    bad = subprocess.run(_cli("--explore-trials", "3"), cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=WAIT)
    assert bad.returncode == 1 and "--mode dynamic" in bad.stderr
    assert "Traceback" not in bad.stderr
    assert np.isfinite(ms).all()


def test_reproducible_skips_a_faster_non_reproducible_schedule(monkeypatch):
    """`--reproducible` is the tuning cache's attribute: a dynamic run with it builds its first
    library without a cached schedule that is not bitwise reproducible, however fast; without
    it (or in static mode) that schedule is used."""
    from nfc.runtime.dynamic.explorer import _defaults
    from nfc.runtime.tuning.cache import TuningCache
    from nfc.runtime.tuning.category import default_category

    root = scratch("dynamic-reproducible")
    monkeypatch.setenv("NFC_CACHE_DIR", str(root))
    k = next(k for k in _ranked_by_cost() if k.tunable)
    with TuningCache(root / "tuning.sqlite") as cache:
        cache.put(default_category(), k.key, _defaults([k])[k.key], 1e-4, reproducible=False,
                  desc=k.desc)

    def found(mode: str, **dynamic) -> int:
        lines: list[str] = []
        cfg = TrainConfig(source=MODEL, settings=TINY, data="synthetic", max_steps=2,
                          epochs=1 << 20, progress=True, evaluate=False, mode=mode,
                          dynamic=DynamicOptions(explore_threads=0, **dynamic)
                          if mode == "dynamic" else None)
        cfg.log = lines.append
        assert train(cfg).steps == 2
        return int(next(FOUND.search(x) for x in lines if FOUND.search(x)).group(1))

    assert found("static") == 1
    assert found("dynamic") == 1
    assert found("dynamic", reproducible=True) == 0
