"""The trainer's side of dynamic mode: start the explorer, pick up its verified offers at step
boundaries, swap, report.

Core policy (`--explore-threads N`, default 1): the background work (the explorer, its
measuring worker, candidate builds and verification) is pinned to the last N cores and runs
at a lower priority (nice 10); the training process is pinned to the other cores and its
parallel loops use at most that many threads. On a 2-core machine: one core trains, one
explores. `N = 0` explores nothing (dynamic mode then trains on the cached schedules, as
static mode does). With a single core both share it (no pinning): exploring then slows
training while it runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from nfc.runtime.dynamic.swap import SwappableStep
from nfc.runtime.dynamic.verify import save_snapshot
from nfc.runtime.loader import ArtifactError, Model

#: Steps timed after a swap before the "step time before -> after" line.
AFTER_STEPS = 20


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

    def lines(self) -> list[str]:
        out = [f"dynamic: training {self.train_s:.2f} s in steps; exploring "
               f"{self.explore_cpu_s:.2f} s CPU over {self.explore_wall_s:.2f} s wall "
               f"in the background ({self.cores})",
               f"dynamic: {len(self.swaps)} swap(s), {len(self.rejected)} candidate(s) "
               f"rejected, {self.kernels_searched} kernel search(es)"
               + (f"; explorer {self.explorer_exit}" if self.explorer_exit else "")]
        out += [f"dynamic: rejected {r.get('path', '?')}: {r.get('status')}: "
                f"{r.get('reason', '')}" for r in self.rejected]
        return out


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
        job = dict(job, workdir=str(self.work), cpus=self.explore_cpus, nice=10,
                   reproducible=opts.reproducible, trials=opts.trials, top=opts.top,
                   rounds=opts.rounds,
                   confirm=opts.confirm, candidates=opts.candidates,
                   libraries=list(opts.libraries), verify_timeout=opts.verify_timeout,
                   db=opts.db, seed=opts.seed)
        self.job = job
        if n == 0:
            return
        (self.work / "job.json").write_text(json.dumps(job))
        from nfc.runtime.tuning.measure import _child_env

        env = _child_env()
        env["OMP_NUM_THREADS"] = str(max(1, len(self.explore_cpus) or n))
        self._rusage0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        self._log_fh = open(self.work / "explorer.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "nfc.runtime.dynamic.explorer", str(self.work / "job.json")],
            stdout=self._log_fh, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        if self.train_cpus:
            with contextlib.suppress(OSError):
                self._old_affinity = os.sched_getaffinity(0)
                os.sched_setaffinity(0, set(self.train_cpus))

    def training_threads(self, threads: int, asked: int | None) -> int:
        """Threads of the training step: at most the training cores unless asked for."""
        if asked or not self.train_cpus:
            return threads
        return max(1, min(threads, len(self.train_cpus)))

    def wrap(self, bound: Any) -> SwappableStep:
        self.step = SwappableStep(self.model, bound)
        return self.step

    # -- at every step boundary --------------------------------------------------------------

    def after_step(self, step: int, seconds: float, threads: int) -> None:
        self.summary.train_s += seconds
        self._times.append(seconds)
        assert self.step is not None
        if not self._snapshot and self.proc is not None:
            save_snapshot(str(self.work / "snapshot.npz"), self.model, self.step.inputs,
                          np.array([self.model.seed, max(0, step - 1)], np.int64))
            self._snapshot = True
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
            if step - p["step"] >= AFTER_STEPS:
                self._report_swap(p)

    def _poll(self, step: int, threads: int) -> None:
        if self.proc is None:
            return
        for f in sorted(self.work.glob("offer-*.json")):
            if f.name in self._seen:
                continue
            self._seen.add(f.name)
            offer = json.loads(f.read_text())
            before = float(np.median(self._times[-AFTER_STEPS:])) if self._times else 0.0
            try:
                assert self.step is not None
                self.step.swap(offer["path"], threads)
            except ArtifactError as exc:  # verified by the explorer: should not happen
                self.summary.rejected.append({"path": offer["path"], "status": "load",
                                              "reason": str(exc)})
                continue
            rec = {"step": step, "kernels": offer.get("kernels", 0), "path": offer["path"],
                   "before_ms": before * 1e3, "times_from": len(self._times)}
            self._pending.append(rec)
            self.metrics({"event": "swap", "step": step, "kernels": rec["kernels"],
                          "step_ms_before": rec["before_ms"]})
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
        rec = {"step": p["step"], "kernels": p["kernels"], "step_ms_before": p["before_ms"],
               "step_ms_after": after}
        self.summary.swaps.append(rec)
        if self.verbose:
            self.log(f"step {p['step']}: swapped in {p['kernels']} tuned kernel"
                     f"{'s' if p['kernels'] != 1 else ''}, step time {p['before_ms']:.3g} -> "
                     f"{after:.3g} ms")
        self.metrics({"event": "swap_timed", **rec})

    # -- the end -----------------------------------------------------------------------------

    def stop(self) -> Summary:
        for p in list(self._pending):
            self._report_swap(p)
        if self._old_affinity is not None:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(0, self._old_affinity)
        if self.proc is not None:
            self.summary.explore_wall_s = time.monotonic() - self._t0
            if self.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.proc.pid, signal.SIGTERM)
                try:
                    self.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(self.proc.pid, signal.SIGKILL)
                    self.proc.wait()
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


def start_session(cfg: Any, model: Model, metrics: Callable[[dict[str, Any]], None]
                  ) -> DynamicSession:
    """Start the explorer for the run `cfg` (a TrainConfig) training `model`."""
    settings = list(cfg.settings)
    if cfg.batch is not None and not any(s.startswith("batch=") for s in settings):
        settings.append(f"batch={cfg.batch}")
    if cfg.lr is not None:
        settings.append(f"opt.lr={cfg.lr}")
    job = {"source": os.path.abspath(cfg.source), "settings": settings,
           "pipeline": cfg.pipeline, "im2col": cfg.im2col, "fuse": cfg.fuse,
           "profile": cfg.profile, "current": os.path.abspath(model.path),
           "model": getattr(cfg, "model", None)}
    opts = _options(cfg)
    session = DynamicSession(opts, job, model, cfg.log, metrics)
    session.verbose = cfg.progress
    if cfg.progress:
        cfg.log(f"nfc: dynamic mode: {session.summary.cores}")
    return session
