"""Genetic search over a schedule space, backed by the tuning cache.

The search is seeded with the space's default schedule, so (in `FULL` mode) what it returns is
never slower than the default as measured. Every candidate is evaluated at most once per run:
one found in the cache is not measured again, and every fresh measurement is committed to the
cache at once. With a fixed seed the run is deterministic given the measured times, so a rerun
after a kill replays the recorded candidates from the cache and measures only the rest.
Each generation is proposed whole before it is measured, so a measurer with a batch interface
(`BatchMeasurer`, e.g. a dask cluster's) times its candidates at once; a plain one measures
them one by one, with the same candidates either way.
"""

from __future__ import annotations

import itertools
import math
import random
import time as _time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from nfc.runtime.tuning.cache import TuningCache
from nfc.runtime.tuning.model import Measurement, Mode, Status, canonical_json, canonical_schedule

MeasureFn = Callable[[dict[str, Any]], Measurement]
"""Measures one schedule; `measure.Measurer` is one, a cost model in a test is another."""
ProgressFn = Callable[[str, int, float], None]
"""Called after every evaluated candidate with (kernel, trial number, best speedup so far)."""


class BatchMeasurer(Protocol):
    """A `MeasureFn` that can also measure several schedules at once (a dask cluster's
    `ClusterMeasurer`): the search then hands it each generation's unrecorded candidates
    together instead of one at a time."""

    def __call__(self, schedule: dict[str, Any]) -> Measurement:
        ...

    def measure_batch(self, schedules: Sequence[dict[str, Any]],
                      done: Callable[[int, Measurement], None]) -> None:
        """Measure `schedules` (concurrently, as far as the measurer can) and call
        `done(index, measurement)` for each as soon as it completes, in any order; every
        schedule gets exactly one call unless an exception (Ctrl-C) ends the batch."""
        ...

_ENUMERATE_LIMIT = 4096  # spaces this small are enumerated when random sampling stalls


class ScheduleSpace(Protocol):
    """What the search needs of a schedule space. A space may also define
    `is_naive(cfg) -> bool` to mark reference schedules that `Mode.FAST` skips."""

    params: Mapping[str, Sequence[Any]]
    """Every parameter with its candidate values."""

    def default(self) -> dict[str, Any]:
        """The heuristic schedule; always valid."""
        ...

    def is_valid(self, cfg: Mapping[str, Any]) -> bool:
        """Whether a combination of parameter values is a legal schedule."""
        ...


@dataclass(frozen=True)
class SearchConfig:
    """Knobs of the genetic search."""

    population: int = 16
    """Candidates per generation."""
    trials: int | None = 64
    """Candidates evaluated per run (cache hits included); `None` for no limit."""
    time_budget: float | None = None
    """Wall-clock seconds per run; `None` for no limit."""
    patience: int = 4
    """Stop after this many generations without a faster schedule."""
    elite: int = 2
    """Best schedules carried into every next generation as parents."""
    crossover_rate: float = 0.9
    """Probability a child mixes two parents rather than copying one."""
    mutation_rate: float = 0.25
    """Probability each parameter of a child is redrawn."""
    tournament: int = 3
    """Candidates compared to pick one parent."""
    seed: int = 0
    """Seed of the run's `random.Random`."""
    mode: Mode = Mode.FULL
    """How much measuring is allowed (see `Mode`)."""
    reproducible: bool = False
    """Choose only schedules whose outputs are bitwise reproducible."""


@dataclass(frozen=True)
class SearchResult:
    """The outcome of one tuning run."""

    schedule: dict[str, Any]
    """The chosen schedule (the default when nothing better ran correctly)."""
    time: float | None
    """Its measured time, `None` when it was never measured correctly."""
    default_time: float | None
    """The default schedule's time, when known."""
    speedup: float
    """Baseline time over chosen time (baseline: the default, else the first ok candidate)."""
    evaluated: int
    """Candidates evaluated in this run (measured plus found in the cache)."""
    measured: int
    """Candidates measured in this run."""
    cached: int
    """Candidates found in the cache."""
    failed: int
    """Candidates that failed, timed out or computed a wrong result."""
    generations: int
    """Generations run after the initial population."""
    stop_reason: str
    """`trials`, `time`, `patience`, `exhausted` or `heuristic`."""


class _Stop(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _Run:
    """State of one search run."""

    def __init__(self, space: ScheduleSpace, measure: MeasureFn, cache: TuningCache | None,
                 category: Mapping[str, Any] | None, key: str, desc: str, cfg: SearchConfig,
                 progress: ProgressFn | None,
                 clock: Callable[[], float] = _time.monotonic) -> None:
        assert cache is None or category is not None, "a cache needs the category"
        self.space, self.measure, self.cache = space, measure, cache
        self.category, self.key, self.desc, self.cfg = category, key, desc, cfg
        self.progress = progress
        self.rng = random.Random(cfg.seed)
        self.names = sorted(space.params)
        self.default = canonical_schedule(space.default())
        self.default_text = canonical_json(self.default)
        self.times: dict[str, float | None] = {}  # canonical text -> time (None: failed)
        self.schedules: dict[str, dict[str, Any]] = {}
        self.order: list[str] = []  # evaluation order, for ties
        self.proposed: set[str] = set()  # every candidate proposed (evaluated or about to be)
        self.measured = self.cached = self.failed = 0
        self.baseline: float | None = None
        self.clock = clock
        self.start = clock()
        self._valid_pool: list[dict[str, Any]] | None = None
        self._best: float | None = None

    # -- evaluation ------------------------------------------------------------------------

    def is_naive(self, cfg: dict[str, Any]) -> bool:
        extra = getattr(self.space, "is_naive", None)
        return canonical_json(cfg) == self.default_text or bool(extra and extra(cfg))

    def evaluate(self, cfg: dict[str, Any]) -> None:
        """Evaluate one new candidate (from the cache or by measuring), honouring budgets."""
        text = canonical_json(cfg)
        assert text not in self.times, "the search proposed a duplicate"
        naive = self.is_naive(cfg)
        if naive and self.cfg.mode is Mode.FAST:
            self.times[text] = None  # never measured, never chosen
            return
        self._check_budgets(len(self.order))
        entry = None
        if self.cache is not None and self.category is not None:
            entry = self.cache.lookup(self.category, self.key, cfg)
        if entry is not None:
            self.cached += 1
            ok, t, repro = entry.status is Status.OK, entry.time, entry.reproducible
        else:
            m = self.measure(dict(cfg))
            self._commit(cfg, m, naive)
            ok, t, repro = m.status is Status.OK, m.time, m.reproducible
        self._record(cfg, text, ok, t, repro)

    def evaluate_all(self, cfgs: Sequence[dict[str, Any]]) -> None:
        """Evaluate proposed candidates in order: one by one (`evaluate`), or, when the
        measurer has `measure_batch`, all that the cache does not have at once
        (`evaluate_batch`)."""
        if getattr(self.measure, "measure_batch", None) is None:
            for cfg in cfgs:
                self.evaluate(cfg)
        else:
            self.evaluate_batch(cfgs)

    def evaluate_batch(self, cfgs: Sequence[dict[str, Any]]) -> None:
        """`evaluate` of each of `cfgs` in order, the measurements made together.

        The trial budget admits the same candidates as one-by-one evaluation; the time budget
        is checked once, before the batch (a run ends at most one batch past it). Each
        measurement is committed to the cache the moment it arrives, so an interrupted batch
        loses only the candidates still in flight; the run's own state (order, best, progress)
        is then updated in proposal order, so the search continues exactly as it would have
        one by one with the same times."""
        plan: list[tuple[dict[str, Any], str, bool, Any]] = []  # (cfg, text, naive, entry)
        stop: str | None = None
        counted = len(self.order)
        for cfg in cfgs:
            text = canonical_json(cfg)
            assert text not in self.times, "the search proposed a duplicate"
            naive = self.is_naive(cfg)
            if naive and self.cfg.mode is Mode.FAST:
                plan.append((cfg, text, naive, None))
                continue
            try:
                self._check_budgets(counted, time=counted == len(self.order))
            except _Stop as exc:
                stop = exc.reason
                break
            counted += 1
            entry = None
            if self.cache is not None and self.category is not None:
                entry = self.cache.lookup(self.category, self.key, cfg)
            plan.append((cfg, text, naive, entry))
        fresh = [(cfg, naive) for cfg, _, naive, entry in plan if entry is None
                 and not (naive and self.cfg.mode is Mode.FAST)]
        results: dict[str, Measurement] = {}

        def done(index: int, m: Measurement) -> None:
            cfg, naive = fresh[index]
            self._commit(cfg, m, naive)
            results[canonical_json(cfg)] = m

        if fresh:
            batch: BatchMeasurer = self.measure  # type: ignore[assignment]
            batch.measure_batch([dict(cfg) for cfg, _ in fresh], done)
        for cfg, text, naive, entry in plan:
            if naive and self.cfg.mode is Mode.FAST:
                self.times[text] = None
            elif entry is not None:
                self.cached += 1
                self._record(cfg, text, entry.status is Status.OK, entry.time,
                             entry.reproducible)
            else:
                m = results[text]
                self._record(cfg, text, m.status is Status.OK, m.time, m.reproducible)
        if stop is not None:
            raise _Stop(stop)

    def _check_budgets(self, evaluated: int, time: bool = True) -> None:
        if self.cfg.trials is not None and evaluated >= self.cfg.trials:
            raise _Stop("trials")
        # the budget is checked before each trial: a run ends at most one trial past it
        if time and self.cfg.time_budget is not None and \
                self.clock() - self.start >= self.cfg.time_budget:
            raise _Stop("time")

    def _commit(self, cfg: dict[str, Any], m: Measurement, naive: bool) -> None:
        """Count a fresh measurement and record it in the cache at once."""
        self.measured += 1
        if self.cache is not None and self.category is not None:
            self.cache.put_measurement(self.category, self.key, cfg, m, naive=naive,
                                       desc=self.desc)

    def _record(self, cfg: dict[str, Any], text: str, ok: bool, t: float | None,
                repro: bool) -> None:
        """The run's state after one evaluated candidate."""
        if not ok or (self.cfg.reproducible and not repro):
            t = None  # never chosen, never a parent
        self.failed += not ok
        self.times[text] = t
        self.schedules[text] = cfg
        self.order.append(text)
        if t is not None and self.baseline is None:
            self.baseline = t
        if t is not None and (self._best is None or t < self._best):
            self._best = t
        if text == self.default_text and t is not None:
            self.baseline = t
        if self.progress is not None:
            self.progress(self.desc or self.key, len(self.order), self.speedup())

    def ranked(self) -> list[tuple[float, int, str]]:
        """Ok candidates evaluated so far, fastest first (ties: earlier first)."""
        pos = {text: i for i, text in enumerate(self.order)}
        return sorted((t, pos[text], text) for text, t in self.times.items()
                      if t is not None and text in pos)

    def best_time(self) -> float | None:
        return self._best

    def speedup(self) -> float:
        best = self.best_time()
        if best is None or self.baseline is None:
            return 1.0
        return self.baseline / best if best > 0 else math.inf

    # -- proposing candidates --------------------------------------------------------------

    def random_cfg(self) -> dict[str, Any]:
        return canonical_schedule({n: self.rng.choice(list(self.space.params[n]))
                                   for n in self.names})

    def fresh(self, cfg: dict[str, Any]) -> bool:
        return canonical_json(cfg) not in self.proposed and self.space.is_valid(cfg)

    def propose(self, cfg: dict[str, Any]) -> dict[str, Any]:
        """Mark `cfg` as taken (no later proposal repeats it) before it is evaluated."""
        self.proposed.add(canonical_json(cfg))
        return cfg

    def random_unseen(self) -> dict[str, Any] | None:
        for _ in range(200):
            cfg = self.random_cfg()
            if self.fresh(cfg):
                return cfg
        size = math.prod(len(self.space.params[n]) for n in self.names)
        if size > _ENUMERATE_LIMIT:
            return None
        if self._valid_pool is None:
            combos = itertools.product(*(list(self.space.params[n]) for n in self.names))
            self._valid_pool = [c for c in (canonical_schedule(dict(zip(self.names, vals,
                                                                        strict=True)))
                                            for vals in combos) if self.space.is_valid(c)]
        left = [c for c in self._valid_pool if canonical_json(c) not in self.proposed]
        return self.rng.choice(left) if left else None

    def tournament(self, pool: list[tuple[float, int, str]]) -> dict[str, Any]:
        picks = [self.rng.randrange(len(pool)) for _ in range(max(1, self.cfg.tournament))]
        return self.schedules[pool[min(picks)][2]]  # pool is sorted: lowest index wins

    def child(self, pool: list[tuple[float, int, str]]) -> dict[str, Any] | None:
        if pool:
            for _ in range(50):
                a = self.tournament(pool)
                if self.rng.random() < self.cfg.crossover_rate:
                    b = self.tournament(pool)
                    cfg = {n: (a if self.rng.random() < 0.5 else b)[n] for n in self.names}
                else:
                    cfg = dict(a)
                for n in self.names:
                    if self.rng.random() < self.cfg.mutation_rate:
                        cfg[n] = self.rng.choice(list(self.space.params[n]))
                cfg = canonical_schedule(cfg)
                if self.fresh(cfg):
                    return cfg
        return self.random_unseen()

    # -- the loop --------------------------------------------------------------------------

    def run(self) -> tuple[int, str]:
        """Run generations until a budget, patience or the space runs out.

        Each generation is proposed whole before it is evaluated (`evaluate_all`): within a
        generation the proposals depend only on the parents and on which candidates are
        taken, not on the new times, so this is the same sequence of candidates as proposing
        each after the previous one's measurement, and a batch measurer can time them all
        at once."""
        generations = 0
        try:
            first = [self.propose(self.default)]
            while len(first) < self.cfg.population:
                cfg = self.random_unseen()
                if cfg is None:
                    break
                first.append(self.propose(cfg))
            self.evaluate_all(first)
            population = [canonical_json(c) for c in first]
            stale, best = 0, self.best_time()
            while stale < self.cfg.patience:
                generations += 1
                ranked = self.ranked()
                elites = [s for _, _, s in ranked[:self.cfg.elite]]
                current = set(population) | set(elites)
                pool = [r for r in ranked if r[2] in current]
                population = list(elites)
                children: list[dict[str, Any]] = []
                exhausted = False
                for _ in range(max(1, self.cfg.population - len(elites))):
                    cfg = self.child(pool)
                    if cfg is None:
                        exhausted = True
                        break
                    children.append(self.propose(cfg))
                self.evaluate_all(children)
                if exhausted:
                    raise _Stop("exhausted")
                population.extend(canonical_json(c) for c in children)
                now = self.best_time()
                improved = now is not None and (best is None or now < best)
                stale, best = (0, now) if improved else (stale + 1, best)
            return generations, "patience"
        except _Stop as stop:
            return generations, stop.reason


def tune(space: ScheduleSpace, measure: MeasureFn, *, cache: TuningCache | None = None,
         category: Mapping[str, Any] | None = None, key: str = "", desc: str = "",
         config: SearchConfig | None = None, progress: ProgressFn | None = None,
         clock: Callable[[], float] = _time.monotonic) -> SearchResult:
    """Search `space` for the fastest correct schedule of one kernel.

    `measure` times one schedule (normally a `measure.Measurer`). With a `cache`, candidates
    already recorded under (`category`, `key`) are not measured again, every new measurement
    is recorded at once, and the cache's best entry competes with the run's own. `clock`
    (seconds) measures `config.time_budget`; a test may pass a fake one.
    """
    cfg = config or SearchConfig()
    default = canonical_schedule(space.default())
    assert space.is_valid(default), "the space's default schedule must be valid"
    if cfg.mode is Mode.HEURISTIC:
        entry = cache.best(category, key, reproducible=cfg.reproducible) \
            if cache is not None and category is not None else None
        if entry is not None:
            return SearchResult(entry.schedule, entry.time, None, 1.0, 0, 0, 0, 0, 0,
                                "heuristic")
        return SearchResult(default, None, None, 1.0, 0, 0, 0, 0, 0, "heuristic")
    run = _Run(space, measure, cache, category, key, desc, cfg, progress, clock)
    generations, reason = run.run()
    ranked = run.ranked()
    chosen, chosen_time = default, None
    if ranked:
        chosen_time, _, text = ranked[0]
        chosen = run.schedules[text]
    if cache is not None and category is not None:
        entry = cache.best(category, key, reproducible=cfg.reproducible,
                           include_naive=cfg.mode is not Mode.FAST)
        if entry is not None and entry.time is not None and (
                chosen_time is None or entry.time < chosen_time):
            chosen, chosen_time = entry.schedule, entry.time
    default_time = run.times.get(run.default_text)
    speedup = 1.0
    if chosen_time is not None and run.baseline is not None:
        speedup = run.baseline / chosen_time if chosen_time > 0 else math.inf
    return SearchResult(chosen, chosen_time, default_time, speedup, len(run.order),
                        run.measured, run.cached, run.failed, generations, reason)


def progress_bar(total: int | None, *, desc: str = "tuning") -> ProgressFn:
    """A progress callback drawing a tqdm bar (silent when tqdm is not installed)."""
    try:
        from tqdm import tqdm
    except ImportError:
        return lambda kernel, trial, speedup: None
    bar = tqdm(total=total, desc=desc, leave=False)

    def update(kernel: str, trial: int, speedup: float) -> None:
        bar.set_postfix_str(f"{kernel[:24]} x{speedup:.2f}")
        bar.update(trial - bar.n)
        if total is not None and trial >= total:
            bar.close()
    return update
