"""The genetic search: never worse than the default, reproducible, no duplicates, budgets,
modes, the cache as memory, and resume after `kill -9` and concurrent tuners."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tuning_fakes import CATEGORY, OTHER_CPU, FakeMeasure, FakeSpace, cost

from nfc.runtime.tuning.cache import TuningCache
from nfc.runtime.tuning.model import Mode, canonical_json
from nfc.runtime.tuning.search import SearchConfig, tune

HERE = Path(__file__).resolve().parent
DRIVER = HERE / "tuning_driver.py"
SPACE = FakeSpace()
DEFAULT_COST = cost(SPACE.default())


def _run(seed: int = 0, cache=None, measure=None, **kw):
    measure = measure or FakeMeasure()
    cfg = SearchConfig(seed=seed, **{"population": 8, "trials": 40, **kw})
    result = tune(SPACE, measure, cache=cache, category=CATEGORY if cache else None,
                  key="k", config=cfg)
    return result, measure


@pytest.mark.parametrize("seed", range(8))
def test_never_slower_than_the_default_and_returns_the_best_measured(seed: int) -> None:
    result, measure = _run(seed, trials=24)
    assert measure.calls[0] == canonical_json(SPACE.default())  # seeded with the default
    assert result.default_time == DEFAULT_COST
    assert result.time <= DEFAULT_COST
    assert result.time == min(cost(json.loads(c)) for c in measure.calls)
    assert SPACE.is_valid(result.schedule)
    assert result.speedup == pytest.approx(DEFAULT_COST / result.time)


def test_search_beats_random_sampling_and_finds_the_optimum() -> None:
    result, _ = _run(0, trials=150, population=16, patience=50)
    assert result.schedule == {"a": 5, "b": 3, "c": "y", "d": 0}


def test_same_seed_same_run_other_seed_other_run() -> None:
    _, m1 = _run(7)
    _, m2 = _run(7)
    _, m3 = _run(8)
    assert m1.calls == m2.calls
    assert m1.calls != m3.calls


def test_no_candidate_is_evaluated_twice_and_all_are_valid() -> None:
    result, measure = _run(3, trials=120, patience=100)
    assert len(measure.calls) == len(set(measure.calls)) == result.measured == 120
    assert all(SPACE.is_valid(json.loads(c)) for c in measure.calls)


def test_small_space_is_exhausted_without_duplicates() -> None:
    class Tiny(FakeSpace):
        params = {"a": [4, 5], "b": [2, 3], "c": ["y"], "d": [0, 1]}

        def default(self):
            return {"a": 4, "b": 2, "c": "y", "d": 1}

    measure = FakeMeasure()
    result = tune(Tiny(), measure, config=SearchConfig(population=3, trials=None, patience=99))
    assert result.stop_reason == "exhausted"
    assert sorted(measure.calls) == sorted(set(measure.calls)) and len(measure.calls) == 8
    assert result.schedule == {"a": 5, "b": 3, "c": "y", "d": 0}


def test_budgets_and_patience_stop_the_run() -> None:
    result, measure = _run(1, trials=10)
    assert result.stop_reason == "trials" and len(measure.calls) == 10
    # the time budget, on an injected clock (no assertion may depend on the machine's
    # speed): every trial "takes" 0.03 s, the budget is checked before each trial, so a run
    # of 0.2 s measures exactly the 7 trials that start before it is spent
    now = [0.0]

    class Ticking(FakeMeasure):
        def __call__(self, cfg):
            now[0] += 0.03
            return FakeMeasure.__call__(self, cfg)

    slow = Ticking()
    result = tune(SPACE, slow, key="k", clock=lambda: now[0], config=SearchConfig(
        seed=1, population=8, trials=None, time_budget=0.2, patience=100))
    assert result.stop_reason == "time" and len(slow.calls) == 7
    assert now[0] - 0.03 < 0.2 <= now[0]  # the last trial started within the budget

    class Flat(FakeMeasure):
        def __call__(self, cfg):
            self.calls.append(canonical_json(cfg))
            return FakeMeasure.__call__(self, {"a": 1, "b": 1, "c": "x", "d": 0})

    flat = Flat()
    result, _ = _run(1, measure=flat, trials=None, patience=3)
    assert result.stop_reason == "patience" and result.generations == 3
    assert result.schedule == SPACE.default()  # ties keep the earliest, the default


def test_failed_candidates_are_never_chosen() -> None:
    # the region around the optimum 'fails': the search must settle for something else
    measure = FakeMeasure(fail=lambda c: c["a"] in (4, 5, 6))
    result, _ = _run(2, measure=measure, trials=80)
    assert result.schedule["a"] not in (4, 5, 6)
    assert result.failed > 0 and result.time <= DEFAULT_COST


def test_reproducible_search_chooses_only_reproducible_schedules(tmp_path: Path) -> None:
    class Nondet(FakeMeasure):
        def __call__(self, cfg):
            m = FakeMeasure.__call__(self, cfg)
            return dataclasses.replace(m, reproducible=cfg["d"] == 1)  # d=0 races

    with TuningCache(tmp_path / "c.sqlite") as cache:
        free, _ = _run(0, cache=cache, measure=Nondet(), trials=60)
        strict, _ = _run(0, cache=cache, measure=Nondet(), trials=60, reproducible=True)
    assert free.schedule["d"] == 0 and strict.schedule["d"] == 1
    assert strict.time > free.time


def test_progress_reports_every_trial_with_a_monotone_speedup() -> None:
    seen = []
    tune(SPACE, FakeMeasure(), config=SearchConfig(trials=30, population=8),
         desc="conv", progress=lambda kernel, trial, speedup: seen.append((kernel, trial,
                                                                            speedup)))
    assert [t for _, t, _ in seen] == list(range(1, 31))
    assert {k for k, _, _ in seen} == {"conv"}
    speedups = [s for _, _, s in seen]
    assert speedups[0] == 1.0 and speedups == sorted(speedups) and speedups[-1] > 1


def test_cached_candidates_are_not_measured_again(tmp_path: Path) -> None:
    with TuningCache(tmp_path / "c.sqlite") as cache:
        first, m1 = _run(4, cache=cache)
        second, m2 = _run(4, cache=cache)
        assert m2.calls == [] and second.cached == second.evaluated == first.measured
        assert (second.schedule, second.time) == (first.schedule, first.time)
        # another seed explores elsewhere but reuses what overlaps, and can only improve
        third, m3 = _run(5, cache=cache)
        assert set(m3.calls).isdisjoint(m1.calls)
        assert third.time <= first.time


def test_a_record_from_another_category_is_ignored(tmp_path: Path) -> None:
    with TuningCache(tmp_path / "c.sqlite") as cache:
        cache.put(OTHER_CPU, "k", SPACE.default(), 1e-9)  # "fast" on another machine
        result, measure = _run(0, cache=cache, trials=5)
        assert measure.calls[0] == canonical_json(SPACE.default())  # measured here anyway
        assert result.cached == 0 and result.time > 1e-9


def test_modes(tmp_path: Path) -> None:
    with TuningCache(tmp_path / "c.sqlite") as cache:
        none = FakeMeasure()
        h = tune(SPACE, none, cache=cache, category=CATEGORY, key="k",
                 config=SearchConfig(mode=Mode.HEURISTIC))
        assert none.calls == [] and h.schedule == SPACE.default() and h.time is None
        fast, m = _run(0, cache=cache, mode=Mode.FAST, trials=20)
        assert canonical_json(SPACE.default()) not in m.calls
        assert fast.default_time is None and fast.schedule != SPACE.default()
        h = tune(SPACE, none, cache=cache, category=CATEGORY, key="k",
                 config=SearchConfig(mode=Mode.HEURISTIC))
        assert none.calls == [] and (h.schedule, h.time) == (fast.schedule, fast.time)
        full, m = _run(0, cache=cache, trials=20)
        assert m.calls[0] == canonical_json(SPACE.default())  # FULL measures the naive one
        assert full.time <= min(fast.time, DEFAULT_COST)
        assert cache.lookup(CATEGORY, "k", SPACE.default()).naive


def _records(db: Path) -> dict[str, float]:
    with TuningCache(db) as cache:
        return {canonical_json(e.schedule): e.timestamp
                for e in cache.entries(CATEGORY, "k", include_pruned=True)}


def _driver(db: Path, *args: str) -> list[str]:
    return [sys.executable, str(DRIVER), str(db), *args]


def test_kill_9_then_rerun_loses_nothing_and_measures_nothing_twice(tmp_path: Path) -> None:
    db, log1, log2 = tmp_path / "k.sqlite", tmp_path / "1.log", tmp_path / "2.log"
    trials = "60"
    proc = subprocess.Popen(_driver(db, "--seed", "3", "--trials", trials, "--sleep", "0.03",
                                     "--log", str(log1)), stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (
            not log1.exists() or len(log1.read_text().splitlines()) < 12):
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    before = _records(db)
    assert 10 <= len(before) < 60
    out = subprocess.run(_driver(db, "--seed", "3", "--trials", trials, "--log", str(log2)),
                         capture_output=True, text=True, timeout=60, check=True)
    result = json.loads(out.stdout)
    remeasured = set(log2.read_text().splitlines()) & set(before)
    assert not remeasured
    after = _records(db)
    assert all(after[s] == stamp for s, stamp in before.items())  # not measured again
    assert result["cached"] == len(before) and result["measured"] == 60 - len(before)
    # the killed run plus its rerun measured exactly what one uninterrupted run measures
    with TuningCache(tmp_path / "fresh.sqlite") as fresh:
        tune(SPACE, FakeMeasure(), cache=fresh, category=CATEGORY, key="k",
             config=SearchConfig(population=8, trials=60, seed=3, patience=1000))
    assert set(_records(tmp_path / "fresh.sqlite")) == set(after)
    with TuningCache(db) as cache:
        assert cache.verify() == []


def test_two_concurrent_tuners_on_one_database(tmp_path: Path) -> None:
    db = tmp_path / "shared.sqlite"
    logs = [tmp_path / f"{i}.log" for i in range(2)]
    procs = [subprocess.Popen(_driver(db, "--seed", str(i), "--trials", "150", "--sleep",
                                      "0.002", "--log", str(logs[i])),
                              stdout=subprocess.PIPE, text=True) for i in range(2)]
    results = [json.loads(p.communicate(timeout=60)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    mine = [set(log.read_text().splitlines()) for log in logs]
    records = _records(db)
    assert set(records) == mine[0] | mine[1]  # every measurement survived
    assert sum(r["evaluated"] for r in results) == 300
    # the two tuners really wrote at the same time: their records interleave in time
    spans = [[records[s] for s in m - mine[1 - i]] for i, m in enumerate(mine)]
    assert min(spans[0]) < max(spans[1]) and min(spans[1]) < max(spans[0])
    with TuningCache(db) as cache:
        assert cache.verify() == []
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]


class BatchMeasure(FakeMeasure):
    """A batch measurer (as a dask cluster's): measures each batch, then reports the results
    in reverse order; remembers the batch sizes. `interrupt_after` results, it raises
    KeyboardInterrupt (a client killed mid-generation)."""

    def __init__(self, interrupt_after: int | None = None, **kw) -> None:
        super().__init__(**kw)
        self.batches: list[int] = []
        self.interrupt_after = interrupt_after

    def measure_batch(self, schedules, done) -> None:
        self.batches.append(len(schedules))
        results = [self(s) for s in schedules]
        for i in reversed(range(len(results))):
            if self.interrupt_after is not None and self.interrupt_after <= 0:
                raise KeyboardInterrupt
            done(i, results[i])
            if self.interrupt_after is not None:
                self.interrupt_after -= 1


def _entries(cache: TuningCache) -> dict[str, tuple[str, float | None]]:
    return {canonical_json(e.schedule): (e.status.value, e.time)
            for e in cache.entries(CATEGORY, "k", include_pruned=True)}


@pytest.mark.parametrize(("seed", "kw"), [
    (0, {}), (1, {"trials": 13}), (2, {"mode": Mode.FAST, "trials": 21}),
    (3, {"population": 5, "trials": 60, "patience": 3}), (4, {"trials": None, "patience": 2}),
])
def test_batch_measurement_evaluates_exactly_the_one_by_one_candidates(
        tmp_path: Path, seed: int, kw: dict) -> None:
    def fail(cfg):
        return cfg["d"] == 1 and cfg["a"] % 2 == 0

    runs = []
    for name, measure in (("one", FakeMeasure(fail=fail)), ("batch", BatchMeasure(fail=fail))):
        progress: list[tuple[int, float]] = []
        with TuningCache(tmp_path / f"{name}.sqlite") as cache:
            res = tune(SPACE, measure, cache=cache, category=CATEGORY, key="k",
                       config=SearchConfig(seed=seed, **{"population": 8, "trials": 40, **kw}),
                       progress=lambda _k, n, s, progress=progress: progress.append((n, s)))
            runs.append((res, measure.calls, progress, _entries(cache)))
    (one, one_calls, one_progress, one_db), (batch, batch_calls, batch_progress, batch_db) = runs
    assert batch_calls == one_calls and batch_progress == one_progress
    assert batch == one and batch_db == one_db and len(one_db) == one.measured > 0
    # whole generations went out together (the initial population, then the children)
    assert max(measure.batches) > 1 and sum(measure.batches) == one.measured


def test_an_interrupted_batch_keeps_the_results_that_arrived(tmp_path: Path) -> None:
    with TuningCache(tmp_path / "c.sqlite") as cache:
        measure = BatchMeasure(interrupt_after=11)
        with pytest.raises(KeyboardInterrupt):
            tune(SPACE, measure, cache=cache, category=CATEGORY, key="k",
                 config=SearchConfig(seed=5, population=8, trials=40))
        assert measure.batches == [8, 6]  # interrupted in the first generation of children
        assert len(_entries(cache)) == 11  # the 8 of the first batch and 3 that arrived
        # a rerun replays those from the cache and measures only the rest
        again = FakeMeasure()
        res = tune(SPACE, again, cache=cache, category=CATEGORY, key="k",
                   config=SearchConfig(seed=5, population=8, trials=40))
        assert res.cached == 11 and res.measured == len(again.calls) == 29
        assert not set(again.calls) & set(measure.calls[:8])
