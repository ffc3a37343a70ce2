"""The trainer's side of dynamic mode: start the explorer, pick up its verified offers at step
boundaries, swap, report.

Core policy (`--explore-threads N`, default 1): the background work (the explorer, its
measuring worker, candidate builds and verification) is pinned to the last N cores; the
training process is pinned to the other cores and its parallel loops use at most that many
threads. Pinned apart, the explorer runs at normal priority (a nice one only lost its core to
other processes without sparing training anything); sharing cores with training, it runs at
nice 10. On a 2-core machine: one core trains, one explores. When the search ends (or the
explorer dies), training gets every core and its full thread count back. `N = 0` explores
nothing (dynamic mode then trains on the cached schedules, as static mode does). With a
single core both share it (no pinning): exploring then slows training while it runs.

Budget (`--explore-budget`, default 10%, `ExploreBudget`): the first steps (at least
`baseline_steps` and `baseline_seconds` of them) run on every core with the full thread count
and no explorer; the median of their second half (past the warm-up) is the static step time
of the running library. From then on each
step's excess over that speed (scaled by what the swaps measured) is what exploring cost
training, and each swap's saving per step since it happened is what it won. When
cost > win + budget x (the run's planned training time at the static speed; the elapsed
steps' when the run's length is unknown), the explorer is stopped (what it found is in the
tuning cache already) and training gets its cores back, as when a search ends.

Kernel reports (`report_every`, default every 50th step): the explorer builds a *profiled
twin* of the running library (and of every library it offers: the same schedules with the
artifact's per-kernel clock stamps) and names it in `twin-<n>.json`. Once the running
library has its twin, the loop runs the next REPORT_BURST + 1 steps on it (the first is a
warm-up), then one step in every `report_every` (and at most one in `report_seconds` of
wall time), and after each such sampled step writes
`report-<n>.json`: per distinct kernel (symbol) of the step its name, plan positions, calls
per step, time per call (the median over the last REPORT_BURST sampled steps) and share of
the step's kernel time. The explorer orders its search by the latest report (explorer.py).
Only sampled steps run the twin; the others run the plain library.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from nfc.runtime.dynamic.swap import SwappableStep
from nfc.runtime.dynamic.verify import save_snapshot
from nfc.runtime.loader import ArtifactError, Model

#: Steps timed after a swap before the "step time before -> after" line (or AFTER_SECONDS
#: of steps, at least MIN_AFTER_STEPS, when the steps are slow).
AFTER_STEPS = 20
AFTER_SECONDS = 2.0
MIN_AFTER_STEPS = 3
#: The default of `--explore-budget`: exploring may cost training this fraction of the
#: run's training time beyond what its swaps won.
EXPLORE_BUDGET = 0.10
#: The most steps run before the explorer starts (however short they are).
BASELINE_MAX_STEPS = 50
#: Sampled steps a report's per-call times are the median of (after a warm-up step each
#: time a library gets its profiled twin).
REPORT_BURST = 3
#: The default of `report_every`: one step in this many is sampled for the kernel report.
REPORT_EVERY = 50


@dataclass
class DynamicOptions:
    """Options of dynamic mode (`nfc train --mode dynamic`)."""

    explore_threads: int = 1
    """Cores for the background work (0: none, no exploration); see the module doc."""
    reproducible: bool = False
    """Only schedules whose results are bitwise reproducible (for the initial build too)."""
    trials: int = 24
    """Candidates per kernel searched."""
    top: int = 4
    """Kernels searched (the largest shares of the step first)."""
    rounds: int = 2
    """Passes over those kernels; each doubles the trials (24, 48, ...), going on from what
    the cache recorded."""
    confirm: int = 1
    """Side-by-side confirmation rounds of a kernel's winner (nfc tune --confirm)."""
    candidates: str = "nfc.runtime.dynamic.explorer:tuned_candidates"
    """The candidate source (an import path; explorer.given_libraries for tests/demos)."""
    libraries: tuple[dict[str, Any], ...] = ()
    """Prebuilt candidates for `given_libraries`."""
    verify_timeout: float = 120.0
    poll_seconds: float = 0.2
    """How often (wall time) the loop looks for offers (at step boundaries)."""
    settle_at_step: int | None = None
    """Tests/demos: at this step wait for the explorer to finish and take its offers, so that
    whether a swap happens does not depend on the machine's speed."""
    on_step: Callable[[DynamicSession, int], None] | None = None
    """Tests: called after every step (e.g. to kill the explorer)."""
    db: str = ""
    """The tuning cache file (empty: the default)."""
    seed: int = 0
    order: str = "auto"
    """How the explorer ranks kernels: `auto`/`profile` (by the training loop's kernel
    reports, `report_every`; before the first one, or without reports, by a profiled step of
    its own; measured, so it may vary run to run) or `cost` (the FLOP/byte estimate, reports
    ignored; deterministic)."""
    budget: float | None = EXPLORE_BUDGET
    """`--explore-budget`: the fraction of the run's training time exploring may cost beyond
    what its swaps won before it is stopped (None: never stopped; see `ExploreBudget`)."""
    baseline_steps: int = 5
    baseline_seconds: float = 0.5
    """Steps run on every core before the explorer starts: at least `baseline_steps` and
    `baseline_seconds` of steps (at most BASELINE_MAX_STEPS, and up to `settle_at_step`);
    the median of their second half is the static step time the budget compares with."""
    planned_steps: int | None = None
    """The run's steps, for the budget's allowance (None: the elapsed steps)."""
    step_time: Callable[[int, float], float] | None = None
    """Tests: the step time (seconds) the budget accounts for step `step` measured at
    `seconds` (so that a test decides what exploring costs, not the machine)."""
    report_every: int = REPORT_EVERY
    """Sample one step in this many for the per-kernel report to the explorer (0: no
    reports, no profiled twins; the explorer ranks kernels itself, `order`)."""
    report_seconds: float = 1.0
    """...and at most one sampled step in this many seconds of wall time (so that tiny
    steps do not pay a report every `report_every` of them)."""
    report_wait: float = 30.0
    """Seconds the explorer waits for the first report before ranking kernels itself (0
    with `settle_at_step`, where the loop waits for the explorer)."""


@dataclass
class Summary:
    train_s: float = 0.0
    explore_wall_s: float = 0.0
    explore_cpu_s: float = 0.0
    swaps: list[dict[str, Any]] = field(default_factory=list)
    rejected: list[dict[str, Any]] = field(default_factory=list)
    kernels_searched: int = 0
    explorer_exit: str = ""
    cores: str = ""
    wall_s: float = 0.0
    """The run from the explorer's start to the end (the training loop's wall time)."""
    explorer_done_step: int | None = None
    """The step at which the explorer was seen finished (None: it ran to the end)."""
    step_ms_exploring: float | None = None
    """Median step time while the explorer ran."""
    step_ms_after: float | None = None
    """Median step time after the explorer finished (None: it never did)."""
    threads_after: int | None = None
    """Threads of the training step once the search ended and training had every core back
    (None: training was not pinned, or the search ran to the end)."""
    baseline_ms: float | None = None
    """The static step time (every core, no explorer) measured before the explorer started."""
    explore_cost_s: float = 0.0
    """What exploring cost training: the steps' time beyond the static speed (ExploreBudget)."""
    explore_win_s: float = 0.0
    """What the swaps won: the static time each step saved against the first library."""
    explore_allowance_s: float = 0.0
    """The budget's allowance at the last check (budget x planned or elapsed training time)."""
    explore_budget: float | None = None
    explore_stopped_step: int | None = None
    """The step at which the budget stopped the explorer (None: it did not)."""
    reports: int = 0
    """Kernel reports sent to the explorer."""
    report: dict[str, Any] | None = None
    """The latest kernel report (`kernel_report`)."""

    def lines(self) -> list[str]:
        out = [f"dynamic: training {self.train_s:.2f} s in steps; exploring "
               f"{self.explore_cpu_s:.2f} s CPU over {self.explore_wall_s:.2f} s wall "
               f"in the background ({self.cores})",
               f"dynamic: {len(self.swaps)} swap(s), {len(self.rejected)} candidate(s) "
               f"rejected, {self.kernels_searched} kernel search(es)"
               + (f"; explorer {self.explorer_exit}" if self.explorer_exit else "")]
        if self.step_ms_exploring is not None:
            text = (f"dynamic: step time {self.step_ms_exploring:.3g} ms (median) while "
                    "exploring")
            if self.step_ms_after is not None:
                text += (f", {self.step_ms_after:.3g} ms after the search ended "
                         f"(step {self.explorer_done_step})")
            out.append(text)
        if self.baseline_ms is not None:
            text = (f"dynamic: exploring cost training {self.explore_cost_s:.3g} s, swaps won "
                    f"{self.explore_win_s:.3g} s (static step {self.baseline_ms:.3g} ms; ")
            text += ("no budget)" if self.explore_budget is None else
                     f"budget {self.explore_budget:.0%}: {self.explore_allowance_s:.3g} s)")
            if self.explore_stopped_step is not None:
                text += (f"; exploration stopped at step {self.explore_stopped_step}: cost "
                         "> win + budget")
            out.append(text)
        if self.report is not None:
            out.append(f"dynamic: {self.reports} kernel report(s); the last "
                       f"{report_line(self.report)}")
        out += [f"dynamic: rejected {r.get('path', '?')}: {r.get('status')}: "
                f"{r.get('reason', '')}" for r in self.rejected]
        return out


@dataclass
class ExploreBudget:
    """What exploring costs training against what it wins (all times in seconds).

    `baseline` is the static step time of the first library (every core, no explorer).
    `scale` is the current library's step time relative to the first one (the product of
    the swaps' after/before ratios), so `baseline * scale` is the current library's static
    step time. Per step while exploring: cost += t - baseline * scale (the slowdown, signed so
    that noise averages out), win += baseline - baseline * scale (the swaps' saving). So
    cost - win is the steps' time beyond the static speed of the first library: stopping when
    cost > win + allowance bounds that excess by the allowance."""

    baseline: float
    fraction: float | None
    """The budget (None: unlimited)."""
    planned_steps: int | None = None
    cost: float = 0.0
    win: float = 0.0
    scale: float = 1.0
    steps: int = 0
    """Steps accounted (the baseline steps and those before it are not)."""
    done_steps: int = 0
    """Steps of the whole run so far (for the allowance when planned_steps is unknown)."""

    def step(self, seconds: float, done_steps: int) -> None:
        current = self.baseline * self.scale
        self.cost += seconds - current
        self.win += self.baseline - current
        self.steps += 1
        self.done_steps = done_steps

    def swapped(self, before: float, after: float) -> None:
        """A swap's step time went from `before` to `after` (both measured while exploring)."""
        if before > 0 and after > 0 and np.isfinite(before) and np.isfinite(after):
            self.scale *= after / before

    def allowance(self) -> float:
        if self.fraction is None:
            return float("inf")
        steps = max(self.planned_steps or 0, self.done_steps)
        return self.fraction * self.baseline * steps

    def over(self) -> bool:
        """Exploring cost more than it won plus the allowance: stop it."""
        return self.cost > self.win + self.allowance()


def parse_budget(text: str) -> float | None:
    """`--explore-budget`: `10%`, `0.1` (a fraction) or `none` (never stop the search)."""
    t = text.strip().lower()
    if t in ("none", "off", "inf", "unlimited"):
        return None
    try:
        value = float(t[:-1]) / 100 if t.endswith("%") else float(t)
    except ValueError:
        raise ValueError(f"--explore-budget: expected a percentage (10%), a fraction (0.1) "
                         f"or none, got {text!r}") from None
    if not np.isfinite(value) or value < 0:
        raise ValueError(f"--explore-budget must be >= 0, got {text!r}")
    return value


def _cpus() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:
        return list(range(os.cpu_count() or 1))


class DynamicSession:
    """One dynamic-mode run (see the module doc)."""

    def __init__(self, opts: DynamicOptions, job: dict[str, Any], model: Model,
                 log: Callable[[str], None], metrics: Callable[[dict[str, Any]], None]):
        self.opts = opts
        self.model = model
        self.log = log
        self.metrics = metrics
        self.verbose = True
        """Print a line per swap (the summary and warnings are printed regardless)."""
        self.work = Path(tempfile.mkdtemp(prefix="nfc-dynamic-"))
        cpus = _cpus()
        n = max(0, opts.explore_threads)
        if n and len(cpus) > n:
            self.explore_cpus, self.train_cpus = cpus[-n:], cpus[:-n]
        else:
            self.explore_cpus, self.train_cpus = [], []
        self.summary = Summary(cores=(f"training on cores {self.train_cpus}, exploring on "
                                      f"{self.explore_cpus}" if self.explore_cpus else
                                      "no exploration" if not n else "cores shared"))
        self._old_affinity = None
        self.step: SwappableStep | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self._snapshot = False
        self._seen: set[str] = set()
        self._last_poll = 0.0
        self._times: list[float] = []
        self._pending: list[dict[str, Any]] = []
        self._dead_reported = False
        self._t0 = time.monotonic()
        self._n = n
        self._train_threads: int | None = None
        self.budget: ExploreBudget | None = None
        self.planned_steps = opts.planned_steps
        self._explore_from = 0
        """Index in `_times` of the first step run with the explorer."""
        self._twins: dict[str, str] = {}
        """library -> its profiled twin (named by the explorer)."""
        self._reported = 0
        """`step.samples` already reported (the first of them, a warm-up, never is)."""
        self._fresh = False
        """A twin was just attached: sample a burst."""
        self._sampled_at = 0.0
        job = dict(job, workdir=str(self.work), cpus=self.explore_cpus,
                   nice=0 if self.explore_cpus else 10,
                   reproducible=opts.reproducible, trials=opts.trials, top=opts.top,
                   rounds=opts.rounds,
                   confirm=opts.confirm, candidates=opts.candidates, order=opts.order,
                   libraries=list(opts.libraries), verify_timeout=opts.verify_timeout,
                   db=opts.db, seed=opts.seed, report=opts.report_every > 0,
                   report_wait=0.0 if opts.settle_at_step is not None else opts.report_wait)
        self.job = job

    def _start_explorer(self, step: int) -> None:
        """After the baseline steps: measure the static step time, start the explorer, pin
        training to its cores and threads."""
        times = self._times[len(self._times) // 2:]
        self.budget = ExploreBudget(float(np.median(times)), self.opts.budget,
                                    self.planned_steps)
        self.summary.baseline_ms = self.budget.baseline * 1e3
        self.summary.explore_budget = self.opts.budget
        self._explore_from = len(self._times)
        job, n = self.job, self._n
        (self.work / "job.json").write_text(json.dumps(job))
        from nfc.runtime.tuning.measure import _child_env

        env = _child_env()
        env["OMP_NUM_THREADS"] = str(max(1, len(self.explore_cpus) or n))
        self._rusage0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        self._explore_t0 = time.monotonic()
        self._log_fh = open(self.work / "explorer.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "nfc.runtime.dynamic.explorer", str(self.work / "job.json")],
            stdout=self._log_fh, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        if self.train_cpus:
            with contextlib.suppress(OSError):
                self._old_affinity = os.sched_getaffinity(0)
                os.sched_setaffinity(0, set(self.train_cpus))
            if self._train_threads is not None and self.step is not None \
                    and self._train_threads != self._full_threads:
                self.step.set_threads(self._train_threads)
        self.metrics({"event": "explore_start", "step": step, "baseline_steps": self._explore_from,
                      "baseline_ms": self.summary.baseline_ms, "budget": self.opts.budget})

    def training_threads(self, threads: int, asked: int | None) -> int:
        """Threads of the training step: all of them for the baseline steps, then (while the
        explorer runs) at most the training cores unless asked for; the full count comes
        back when the search ends (`_yield_cores`)."""
        self._full_threads = threads
        if not asked and self.train_cpus:
            self._train_threads = max(1, min(threads, len(self.train_cpus)))
        return threads

    def _threads_now(self) -> int:
        if self.proc is not None and self.summary.threads_after is None \
                and self._train_threads is not None and self._old_affinity is not None:
            return self._train_threads
        return getattr(self, "_full_threads", 1)

    def _yield_cores(self, step: int, why: str = "the search ended") -> None:
        """The search is over (finished, or the explorer died): training takes every core
        back, and the thread count static mode would use."""
        if self._old_affinity is None:
            return
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, self._old_affinity)
        self._old_affinity = None
        full = getattr(self, "_full_threads", None)
        if full is not None and self.step is not None:
            self.step.set_threads(full)
            self.summary.threads_after = full
        if self.verbose:
            self.log(f"nfc: dynamic mode: {why} at step {step}; training on every "
                     f"core again ({full} thread{'s' if full != 1 else ''})")

    def wrap(self, bound: Any) -> SwappableStep:
        self.step = SwappableStep(self.model, bound)
        return self.step

    # -- at every step boundary --------------------------------------------------------------

    def after_step(self, step: int, seconds: float, threads: int) -> None:
        self.summary.train_s += seconds
        if self.opts.step_time is not None:
            seconds = self.opts.step_time(step, seconds)
        self._times.append(seconds)
        assert self.step is not None
        if not self._snapshot and self._n:
            save_snapshot(str(self.work / "snapshot.npz"), self.model, self.step.inputs,
                          np.array([self.model.seed, max(0, step - 1)], np.int64))
            self._snapshot = True
        exploring = self.proc is not None and self.proc.poll() is None \
            and self.summary.explorer_done_step is None
        if self._n and self.budget is None:
            k = len(self._times)
            due = k >= BASELINE_MAX_STEPS or (k >= max(1, self.opts.baseline_steps) and sum(
                self._times) >= self.opts.baseline_seconds)
            if due or (self.opts.settle_at_step is not None and k >= self.opts.settle_at_step):
                self._start_explorer(step)
        elif exploring and self.budget is not None:
            self.budget.step(seconds, len(self._times))
        if self.opts.on_step is not None:
            self.opts.on_step(self, step)
        if self.opts.settle_at_step is not None and step == self.opts.settle_at_step \
                and self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=600)
            self._last_poll = 0.0
        now = time.monotonic()
        if now - self._last_poll >= self.opts.poll_seconds:
            self._last_poll = now
            self._poll(step, threads)
        for p in list(self._pending):
            n = len(self._times) - p["times_from"]
            if n >= AFTER_STEPS or (n >= MIN_AFTER_STEPS and sum(
                    self._times[p["times_from"]:]) >= AFTER_SECONDS):
                self._report_swap(p)
        if exploring and self.budget is not None:
            self._check_budget(step)
        if self.opts.report_every > 0:
            self._kernel_report(step)

    # -- kernel reports ----------------------------------------------------------------------

    def _kernel_report(self, step: int) -> None:
        """Report the sampled steps' kernel times (module doc) and sample the next step
        when one is due."""
        st = self.step
        if st is None or not st.profiled:
            return
        if self._fresh:  # the twin just came: a warm-up step (new code, cold arena) + a burst
            self._fresh = False
            st.sample(REPORT_BURST + 1)
            return
        if st.sampling:
            return
        n = len(st.samples)
        if n > 1 and n > self._reported:
            first = self._reported == 0
            self._reported = n
            self._send_report(step, st.samples[1:][-REPORT_BURST:], first)
        now = time.monotonic()
        if step % self.opts.report_every == 0 and \
                now - self._sampled_at >= self.opts.report_seconds:
            self._sampled_at = now
            st.sample(1)

    def _send_report(self, step: int, samples: list[np.ndarray], first: bool) -> None:
        assert self.step is not None
        rep = kernel_report(self.step.kernels(), samples)
        self.summary.reports += 1
        rep = {"seq": self.summary.reports, "step": step, "library": self.step.path, **rep}
        self.summary.report = rep
        tmp = self.work / f".report-{rep['seq']:04d}.tmp"
        tmp.write_text(json.dumps(rep))
        os.replace(tmp, self.work / f"report-{rep['seq']:04d}.json")
        top = [{k: r[k] for k in ("name", "share", "calls", "per_call_ms")}
               for r in rep["kernels"][:5]]
        self.metrics({"event": "kernel_report", "step": step, "seq": rep["seq"],
                      "samples": rep["samples"], "kernel_ms": rep["kernel_ms"],
                      "kernels": top})
        if self.verbose and first:  # the first of each library
            self.log(f"nfc: dynamic mode: {report_line(rep)}")

    def _check_budget(self, step: int) -> None:
        """Stop the explorer when exploring cost training more than it won plus the
        allowance (ExploreBudget); offers already made are taken first."""
        b = self.budget
        assert b is not None and self.proc is not None
        self.summary.explore_cost_s, self.summary.explore_win_s = b.cost, b.win
        self.summary.explore_allowance_s = b.allowance()
        if not b.over() or self.proc.poll() is not None:
            return
        self._poll(step, self._threads_now())
        if self.proc.poll() is not None:  # it finished meanwhile: the ordinary end
            return
        self._dead_reported = True  # stopped on purpose: no warning
        self._terminate()
        self.summary.explore_stopped_step = step
        self.summary.explorer_exit = "stopped by the budget"
        allowance = "unlimited" if b.fraction is None else f"{b.allowance():.3g} s"
        rec = {"event": "explore_stopped", "step": step, "cost_s": b.cost, "win_s": b.win,
               "allowance_s": b.allowance(), "budget": b.fraction,
               "baseline_ms": b.baseline * 1e3}
        self.metrics(rec)
        if self.verbose:
            self.log(f"nfc: dynamic mode: exploring cost training {b.cost:.3g} s, swaps won "
                     f"{b.win:.3g} s, allowance {allowance} ({b.fraction:.0%} budget): "
                     "exploration stopped")
        self.summary.explorer_done_step = step
        self._done_at = len(self._times)
        self._yield_cores(step, "exploration stopped")

    def _terminate(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

    def _poll(self, step: int, threads: int) -> None:
        if self.proc is None:
            return
        self._poll_offers(step)
        for f in sorted(self.work.glob("twin-*.json")):
            if f.name in self._seen:
                continue
            self._seen.add(f.name)
            twin = json.loads(f.read_text())
            self._twins[twin["library"]] = twin["profiled"]
        self._attach_twin()
        self._poll_end(step)

    def _attach_twin(self) -> None:
        st = self.step
        if st is None or st.profiled or st.path not in self._twins:
            return
        try:
            ok = st.attach_profiled(st.path, self._twins[st.path])
        except (ArtifactError, OSError):  # no twin: no reports of this library
            ok = False
        if ok:
            self._reported, self._fresh = 0, True
        else:
            del self._twins[st.path]

    def _poll_offers(self, step: int) -> None:
        assert self.proc is not None
        for f in sorted(self.work.glob("offer-*.json")):
            if f.name in self._seen:
                continue
            self._seen.add(f.name)
            offer = json.loads(f.read_text())
            recent = self._times[max(self._explore_from, len(self._times) - AFTER_STEPS):]
            before = float(np.median(recent or self._times[-1:])) if self._times else 0.0
            try:
                assert self.step is not None
                self.step.swap(offer["path"], self._threads_now())
            except ArtifactError as exc:  # verified by the explorer: should not happen
                self.summary.rejected.append({"path": offer["path"], "status": "load",
                                              "reason": str(exc)})
                continue
            rec = {"step": step, "kernels": offer.get("kernels", 0), "path": offer["path"],
                   "before_ms": before * 1e3, "times_from": len(self._times),
                   "changes": offer.get("changes") or []}
            self._pending.append(rec)
            self.metrics({"event": "swap", "step": step, "kernels": rec["kernels"],
                          "changes": rec["changes"], "step_ms_before": rec["before_ms"]})

    def _poll_end(self, step: int) -> None:
        assert self.proc is not None
        if self.proc.poll() is not None and self.summary.explorer_done_step is None:
            self.summary.explorer_done_step = step
            self._done_at = len(self._times)
            self._yield_cores(step)
        if self.proc.poll() is not None and self.proc.returncode != 0 \
                and not self._dead_reported:
            self._dead_reported = True
            rc = self.proc.returncode
            how = f"killed by signal {-rc}" if rc < 0 else f"exit code {rc}"
            self.summary.explorer_exit = how
            self.log(f"nfc: warning: background exploration stopped ({how}; see "
                     f"{self.work / 'explorer.log'}); training goes on with the current "
                     "library")

    def _report_swap(self, p: dict[str, Any]) -> None:
        self._pending.remove(p)
        after_t = self._times[p["times_from"]:p["times_from"] + AFTER_STEPS]
        after = float(np.median(after_t)) * 1e3 if after_t else float("nan")
        rec = {"step": p["step"], "kernels": p["kernels"], "changes": p["changes"],
               "step_ms_before": p["before_ms"], "step_ms_after": after}
        self.summary.swaps.append(rec)
        if self.budget is not None:
            self.budget.swapped(p["before_ms"], after)
        if self.verbose:
            self.log(swap_line(rec))
        self.metrics({"event": "swap_timed", **rec})

    # -- the end -----------------------------------------------------------------------------

    def stop(self) -> Summary:
        for p in list(self._pending):
            self._report_swap(p)
        self.summary.wall_s = time.monotonic() - self._t0
        if self.budget is not None:
            self.summary.explore_cost_s = self.budget.cost
            self.summary.explore_win_s = self.budget.win
            self.summary.explore_allowance_s = self.budget.allowance()
        if self.proc is not None and self._times:
            done = getattr(self, "_done_at", len(self._times))
            if done > self._explore_from:
                self.summary.step_ms_exploring = float(np.median(
                    self._times[self._explore_from:done])) * 1e3
            if done < len(self._times):
                self.summary.step_ms_after = float(np.median(self._times[done:])) * 1e3
        if self._old_affinity is not None:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(0, self._old_affinity)
        if self.proc is not None:
            self.summary.explore_wall_s = time.monotonic() - self._explore_t0
            self._terminate()
            r = resource.getrusage(resource.RUSAGE_CHILDREN)
            self.summary.explore_cpu_s = ((r.ru_utime - self._rusage0.ru_utime)
                                          + (r.ru_stime - self._rusage0.ru_stime))
            self._log_fh.close()
            for rec in self.events():
                if rec.get("event") == "rejected":
                    self.summary.rejected.append(rec)
                elif rec.get("event") == "kernel" and rec.get("status") == "searched":
                    self.summary.kernels_searched += 1
                elif rec.get("event") == "done":
                    self.summary.explore_cpu_s = max(self.summary.explore_cpu_s,
                                                     float(rec.get("cpu_s", 0.0)))
        if not os.environ.get("NFC_DYNAMIC_KEEP"):
            shutil.rmtree(self.work, ignore_errors=True)
        return self.summary

    def events(self) -> list[dict[str, Any]]:
        p = self.work / "events.jsonl"
        if not p.exists():
            return []
        out = []
        for line in p.read_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                out.append(json.loads(line))
        return out


def _ms(x: float) -> str:
    return f"{x * 1e3:.3g} us" if x < 1.0 else f"{x:.3g} ms"


def kernel_report(kernels: list[dict[str, Any]], samples: list[np.ndarray]) -> dict[str, Any]:
    """The report of sampled steps: `kernels` are the step's calls (the library's metadata,
    plan order), `samples` each sampled step's seconds per call. Per distinct kernel (the
    calls of one symbol): name (the label of its first call without the plan position), plan
    positions (`ops`, the IR op of each call), calls per step, the median time per call
    (ms) and per step, and share of the step's kernel time; largest first."""
    secs = np.median(np.array(samples), axis=0)
    groups: dict[str, dict[str, Any]] = {}
    for k, t in zip(kernels, secs, strict=True):
        head, _, rest = k["label"].partition(" ")
        op = int(head) if head.isdigit() else None
        g = groups.setdefault(k["symbol"], {"symbol": k["symbol"],
                                            "name": _short(rest if op is not None
                                                           else k["label"]),
                                            "ops": [], "calls": 0, "ms": 0.0})
        g["ops"].append(op)
        g["calls"] += 1
        g["ms"] += float(t) * 1e3
    total = sum(g["ms"] for g in groups.values())
    out = sorted(groups.values(), key=lambda g: -g["ms"])
    for g in out:
        g["per_call_ms"] = g["ms"] / g["calls"]
        g["share"] = g["ms"] / total if total > 0 else 0.0
    return {"samples": len(samples), "kernel_ms": total, "kernels": out}


def _short(label: str) -> str:
    """A plan label without most of a fused kernel's result names: `%d_y_5 +6 kernel
    mlp.nf:5:1` for `%d_y_5, %d_y_3, ... kernel mlp.nf:5:1`."""
    m = re.match(r"((?:%[^,\s]*, )*%[^,\s]*)(.*)$", label)
    if m is None:
        return label
    names = m.group(1).split(", ")
    return names[0] + (f" +{len(names) - 1}" if len(names) > 1 else "") + m.group(2)


def report_line(rep: dict[str, Any], top: int = 3) -> str:
    """`kernel shares at step 12 (1.3 ms of kernels per step): %h1 [...] 41% (2 calls), ...`"""
    parts = [f"{g['name'][:70]} {g['share']:.0%} ({g['calls']} call"
             f"{'s' if g['calls'] != 1 else ''})" for g in rep["kernels"][:top]]
    return (f"kernel shares at step {rep['step']} ({rep['kernel_ms']:.3g} ms of kernels per "
            f"step): " + ", ".join(parts))


def swap_line(rec: dict[str, Any]) -> str:
    """`step 120: gemm 256x128/784 at mlp.nf:14:9 41 us -> 12 us (tuned), step time 1.4 ->
    1.2 ms` (one kernel part per changed kernel; a count when the offer named none)."""
    parts = []
    for c in rec.get("changes") or []:
        b, a = c.get("before_ms"), c.get("after_ms")
        times = f" {_ms(b) if b is not None else '?'} -> {_ms(a) if a is not None else '?'}"
        parts.append(f"{c.get('name', c.get('key', '?'))}{times} (tuned)")
    if not parts:
        k = rec.get("kernels", 0)
        parts.append(f"swapped in {k} tuned kernel{'s' if k != 1 else ''}")
    return (f"step {rec['step']}: " + "; ".join(parts) + f", step time "
            f"{rec['step_ms_before']:.3g} -> {rec['step_ms_after']:.3g} ms")


def _options(cfg: Any) -> DynamicOptions:
    return cfg.dynamic if cfg.dynamic is not None else DynamicOptions()


def prepare_config(cfg: Any) -> Any:
    """The TrainConfig of a dynamic run: a model file is needed (candidates are compiled
    from it); with `reproducible`, the initial build takes only reproducible schedules too."""
    import dataclasses

    from nfc.codegen.artifact.container import is_library_path
    from nfc.runtime.dynamic.explorer import candidate_pipeline
    from nfc.runtime.train import TrainError

    opts = _options(cfg)
    if is_library_path(cfg.source) and opts.candidates.endswith(":tuned_candidates") \
            and opts.explore_threads > 0:
        raise TrainError("--mode dynamic compiles better kernels from the model: give the "
                         "model file (.nf or .nfir), not a compiled library")
    if cfg.profile:
        raise TrainError("--mode dynamic does not combine with --profile yet")
    if not cfg.tuning:
        raise TrainError("--mode dynamic uses the tuning cache; drop --no-tuning")
    if opts.reproducible and not is_library_path(cfg.source):
        text = candidate_pipeline(cfg.source, cfg.pipeline, im2col=cfg.im2col, fuse=cfg.fuse,
                                  reproducible=True, db=opts.db)
        cfg = dataclasses.replace(cfg, pipeline=text)
    return cfg


def start_session(cfg: Any, model: Model, metrics: Callable[[dict[str, Any]], None],
                  planned_steps: int | None = None) -> DynamicSession:
    """Start the explorer for the run `cfg` (a TrainConfig) training `model` for
    `planned_steps` steps (the exploration budget's allowance)."""
    settings = list(cfg.settings)
    if cfg.batch is not None and not any(s.startswith("batch=") for s in settings):
        settings.append(f"batch={cfg.batch}")
    if cfg.lr is not None:
        settings.append(f"opt.lr={cfg.lr}")
    pipeline = cfg.pipeline
    if not getattr(cfg, "layout", True):  # `--no-layout`: the candidates without it too
        from nfc.codegen.artifact.container import is_library_path
        from nfc.runtime.build import pipeline_for

        if not is_library_path(cfg.source):
            pipeline = pipeline_for(cfg.source, pipeline, im2col=cfg.im2col, layout=False)
    job = {"source": os.path.abspath(cfg.source), "settings": settings,
           "pipeline": pipeline, "im2col": cfg.im2col, "fuse": cfg.fuse,
           "profile": cfg.profile, "current": os.path.abspath(model.path),
           "model": getattr(cfg, "model", None)}
    opts = replace(_options(cfg), planned_steps=planned_steps)
    session = DynamicSession(opts, job, model, cfg.log, metrics)
    session.verbose = cfg.progress
    if cfg.progress:
        cfg.log(f"nfc: dynamic mode: {session.summary.cores}")
    return session
