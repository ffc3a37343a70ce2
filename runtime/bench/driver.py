"""`nfc bench`'s plan and its execution: every case in a fresh process, one after another.

For each model: one `compile` process builds nfc's library and writes the case file (the
initial parameters from nfc's initializers and the inputs); then for each thread count, nfc's
`run` process and one process per baseline framework (benchmarks/run_baseline.py), all
starting from that case file. Cases never overlap in time: each would steal the other's cores.

A case that cannot run (the model does not compile, a framework is not installed, the model has
no twin, the process crashed or timed out) becomes a record with its `status` and `error`, and
the run goes on.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from nfc.runtime.bench.models import ROOT, BenchModel

FRAMEWORKS = ("nfc", "torch", "torch-compile", "jax")
BASELINES = ("torch", "torch-compile", "jax")
#: The Python package each framework needs.
PACKAGES = {"torch": "torch", "torch-compile": "torch", "jax": "jax"}
RUNNER = ROOT / "benchmarks" / "run_baseline.py"

#: Fields of every JSON line (a missing measurement is null).
FIELDS = ("model", "file", "framework", "threads", "batch", "params", "status", "error",
          "step_ms", "min_ms", "cpu_ms", "steps", "first_loss", "ratio_to_nfc", "gflops",
          "compile_s", "compile_kind", "peak_rss_mb", "rss_after_import_mb", "step_peak_mb",
          "planned_mb", "version", "wall_s", "loadavg")

#: Rough seconds a case takes besides its timed steps, for the estimate printed at the start
#: (measured on the 2-core machine with nothing else running).
START_S = {"nfc": 1.5, "torch": 4.0, "torch-compile": 5.0, "jax": 4.0}
COMPILE_S = {"nfc": 20.0, "torch": 0.0, "torch-compile": 40.0, "jax": 8.0}


@dataclass(frozen=True)
class BenchOptions:
    """What to benchmark and how (the `nfc bench` flags)."""

    models: tuple[BenchModel, ...]
    frameworks: tuple[str, ...] = FRAMEWORKS
    threads: tuple[int, ...] = (1, 2)
    min_time: float = 1.0
    """Seconds of timed steps per case, at least."""
    min_steps: int = 3
    warmup: float = 0.2
    """Seconds of untimed steps after the first."""
    quick: bool = False
    """Smoke mode: small models, a few steps, the library cache allowed."""
    settings: Mapping[str, Any] = field(default_factory=dict)
    """Model params over every model's benchmark sizes (`--set`)."""
    seed: int = 0
    timeout: float = 900.0
    """Seconds one process may take before it is killed (status "timeout")."""
    profile: bool = False
    """Also build a profiled library and record nfc's slowest kernels."""
    defer: bool = False
    """Run torch.compile's cases on the later thread counts after every other case."""
    budget: float | None = None
    """Seconds after which the remaining cases are skipped (reported as such); None: none."""
    work_dir: str | None = None
    """Where libraries and case files go (default: a temporary directory, removed after)."""
    python: str = sys.executable
    pipeline: str | None = None
    """nfc's pipeline after the frontend (`-p`); None: the build pipeline of `nfc compile`."""
    im2col: bool = True
    """nfc builds with the im2col pass (`--no-im2col` removes it)."""
    tuning: bool = True
    """nfc's kernels take tuned schedules from the tuning cache (`--no-tuning`)."""
    fuse: bool = True
    """nfc builds with the fuse pass (`--no-fuse` removes it)."""
    layout: bool = True
    """nfc builds with the layout pass where it decides to (`--no-layout` removes it)."""

    def pipeline_spec(self) -> dict[str, Any]:
        """The part of a compile worker's spec that chooses its pipeline
        (nfc.runtime.bench.worker.case_pipeline)."""
        return {"pipeline": self.pipeline, "im2col": self.im2col, "tuned": self.tuning,
                "fuse": self.fuse, "layout": self.layout}


def available(framework: str) -> str | None:
    """None when `framework` can be tried here, else why not."""
    if framework == "nfc":
        return None
    pkg = PACKAGES[framework]
    if importlib.util.find_spec(pkg) is None:
        return f"{pkg} is not installed (pip install {pkg})"
    if not RUNNER.exists():
        return f"the baseline runner {RUNNER} is missing (nfc bench needs a source checkout)"
    return None


def estimate_seconds(opts: BenchOptions) -> float:
    """A rough duration of the whole run (startup, compile, warm-up and timed steps)."""
    total = 0.0
    for m in opts.models:
        if "nfc" in opts.frameworks:
            total += START_S["nfc"] + (2.0 if opts.quick else COMPILE_S["nfc"])
        for _ in opts.threads:
            for fw in opts.frameworks:
                if fw != "nfc" and (m.twin is None or available(fw)):
                    continue
                total += START_S[fw] + opts.warmup + opts.min_time
                total += COMPILE_S[fw] * (0.25 if opts.quick else 1.0) if fw != "nfc" else 0.0
    return total


class Runner:
    """Runs the plan, streaming records to the JSON file and progress to `log`."""

    def __init__(self, opts: BenchOptions, json_out: TextIO | None = None,
                 log: Callable[[str], None] | None = None) -> None:
        self.opts = opts
        self.json_out = json_out
        self.log = log or (lambda s: print(s, file=sys.stderr, flush=True))
        self.records: list[dict[str, Any]] = []
        self.total = sum(len(opts.threads) * len(opts.frameworks) for _ in opts.models)
        self.done = 0
        self.start = time.monotonic()
        self.nfc_ms: dict[tuple[str, int], float] = {}
        self.deferred: list[tuple[BenchModel, str, int, Mapping[str, Any], Any]] = []

    # -- processes ------------------------------------------------------------------------------
    def _env(self, threads: int) -> dict[str, str]:
        env = dict(os.environ)
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            env[var] = str(threads)
        env.setdefault("PYTHONHASHSEED", "0")
        return env

    def _process(self, cmd: Sequence[str], threads: int,
                 env: Mapping[str, str] | None = None) -> dict[str, Any]:
        """Run `cmd` in a new session; its last JSON line, or an error record. `process_cpu_s`
        is the CPU time the process and its children used (on a busy machine, a better guide
        than the wall time to what the case would take alone)."""
        t0 = time.monotonic()
        ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env={**self._env(threads), **(env or {})}, cwd=str(ROOT),
                                start_new_session=True)
        try:
            limit = self._timeout()
            out, err = proc.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            out, err = proc.communicate()
            return {"status": "timeout", "wall_s": time.monotonic() - t0,
                    "error": f"killed after {limit:.0f} s"}
        finally:
            _kill_group(proc)  # compile workers a framework may have left behind
        wall = time.monotonic() - t0
        ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
        for line in reversed(out.strip().splitlines()):
            if line.startswith("{"):
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue
                rec["wall_s"] = wall
                rec["process_cpu_s"] = cpu
                return rec
        tail = (err.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
        why = f"signal {-proc.returncode}" if proc.returncode < 0 else tail
        return {"status": "error", "wall_s": wall, "process_cpu_s": cpu,
                "error": f"process died without a result ({why})"[:400]}

    # -- cases ----------------------------------------------------------------------------------
    def _emit(self, rec: dict[str, Any]) -> None:
        full = {k: rec.get(k) for k in FIELDS}
        full.update({k: v for k, v in rec.items() if k not in FIELDS and k != "traceback"})
        self.records.append(full)
        if self.json_out is not None:
            self.json_out.write(json.dumps(full) + "\n")
            self.json_out.flush()
        self.done += 1
        elapsed = time.monotonic() - self.start
        what = (f"{full['step_ms']:.3f} ms" if full["status"] == "ok" and full["step_ms"]
                is not None else f"{full['status']}: {full['error']}")
        self.log(f"[{self.done}/{self.total} {_mmss(elapsed)}] {full['model']} "
                 f"{full['framework']} {full['threads']}t: {what}")

    def _base(self, m: BenchModel, fw: str, threads: int, params: Mapping[str, Any]
              ) -> dict[str, Any]:
        return {"model": m.name, "file": m.path, "framework": fw, "threads": threads,
                "params": dict(params), "loadavg": os.getloadavg()[0]}

    def _compile(self, m: BenchModel, params: Mapping[str, Any], work: Path) -> dict[str, Any]:
        spec = {"source": str(m.file), "settings": [f"{k}={v}" for k, v in params.items()],
                "out": str(work / m.name), "seed": self.opts.seed,
                "int_bounds": {k: list(v) for k, v in m.int_bounds.items()},
                "use_cache": self.opts.quick, "profile": self.opts.profile, "model": m.model,
                **self.opts.pipeline_spec()}
        self.log(f"[{_mmss(time.monotonic() - self.start)}] {m.name}: compiling with nfc "
                 f"({', '.join(f'{k}={v}' for k, v in params.items()) or 'defaults'})")
        # a cold compile: no per-kernel object cache either (--quick may use both caches)
        rec = self._process([self.opts.python, "-m", "nfc.runtime.bench.worker", "compile",
                             json.dumps(spec)], 1,
                            None if self.opts.quick else {"NFC_OBJECT_CACHE": "0"})
        if rec.get("status") == "ok":
            self.log(f"  compiled in {rec['compile_s']:.1f} s ({rec['compile_kind']}; "
                     f"{rec['kernels']} kernels, {rec['gflop']:.3f} GFLOP per step; "
                     f"{rec['tuning']})")
        else:
            self.log(f"  nfc: {rec.get('status')}: {rec.get('error')}")
        return rec

    def run_model(self, m: BenchModel, work: Path) -> None:
        """Every case of one model (torch.compile on more threads than the first count is
        queued in `self.deferred`: its cold compile is the dearest case of all, so under a
        time budget it is what gets dropped)."""
        o = self.opts
        params = m.settings(o.quick, o.settings)
        need_case = "nfc" in o.frameworks or (m.twin is not None and any(
            fw != "nfc" and available(fw) is None for fw in o.frameworks))
        if self._over_budget():
            comp = {"status": "skipped", "error": self._budget_text()}
        elif need_case:
            comp = self._compile(m, params, work)
        else:
            comp = {"status": "skipped"}
        for threads in o.threads:
            for fw in o.frameworks:
                if (fw == "torch-compile" and threads != o.threads[0] and o.defer
                        and m.twin is not None and available(fw) is None):
                    self.deferred.append((m, fw, threads, params, comp))
                else:
                    self._case(m, fw, threads, params, comp)

    def _case(self, m: BenchModel, fw: str, threads: int, params: Mapping[str, Any],
              comp: Mapping[str, Any]) -> None:
        compiled = comp.get("status") == "ok"
        rec = self._base(m, fw, threads, params)
        if compiled:
            rec["batch"] = comp.get("batch")
        expect = START_S[fw] + COMPILE_S[fw] + self.opts.warmup + self.opts.min_time
        if self._over_budget(0.0 if fw == "nfc" else expect):
            rec.update(status="skipped", error=self._budget_text())
        elif fw == "nfc":
            rec.update(self._nfc_case(comp, threads))
            if rec.get("status") == "ok":
                self.nfc_ms[(m.name, threads)] = rec["step_ms"]
        else:
            rec.update(self._baseline_case(m, fw, threads, params, comp))
        if rec.get("status") == "ok" and rec.get("step_ms"):
            nfc_ms = self.nfc_ms.get((m.name, threads))
            if nfc_ms:
                rec["ratio_to_nfc"] = rec["step_ms"] / nfc_ms
            if compiled:
                rec["gflops"] = comp["gflop"] / (rec["step_ms"] * 1e-3)
        self._emit(rec)

    def _over_budget(self, expect: float = 0.0) -> bool:
        """Whether a case expected to take `expect` seconds would end past the budget."""
        b = self.opts.budget
        return b is not None and time.monotonic() - self.start + expect > b

    def _timeout(self) -> float:
        """The per-process timeout, cut so that no process outlives the budget by much."""
        if self.opts.budget is None:
            return self.opts.timeout
        left = self.opts.budget - (time.monotonic() - self.start)
        return max(10.0, min(self.opts.timeout, left + 30.0))

    def _budget_text(self) -> str:
        return f"not run: the time budget of {self.opts.budget / 60:.0f} min was used up"

    def _nfc_case(self, comp: Mapping[str, Any], threads: int) -> dict[str, Any]:
        if comp.get("status") != "ok":
            return {"status": comp.get("status", "error"),
                    "error": comp.get("error") or "nfc did not compile the model",
                    "compile_s": comp.get("compile_s")}
        o = self.opts
        spec = {"so": comp["so"], "case": comp["case"], "threads": threads,
                "min_time": o.min_time, "min_steps": o.min_steps, "warmup": o.warmup}
        if comp.get("profile_so"):
            spec["profile_so"] = comp["profile_so"]
        rec = self._process([o.python, "-m", "nfc.runtime.bench.worker", "run",
                             json.dumps(spec)], threads)
        from nfc import __version__

        rec.update(compile_s=comp["compile_s"], compile_kind=comp["compile_kind"],
                   version=__version__, compile_rss_mb=comp.get("peak_rss_mb"),
                   gflop=comp.get("gflop"), kernels=comp.get("kernels"),
                   planned_mb=comp.get("planned_mb"),
                   tuning=comp.get("tuning"), pipeline=comp.get("pipeline"),
                   compile_cpu_s=comp.get("process_cpu_s"))
        return rec

    def _baseline_case(self, m: BenchModel, fw: str, threads: int, params: Mapping[str, Any],
                       comp: Mapping[str, Any]) -> dict[str, Any]:
        if m.twin is None:
            return {"status": "skipped",
                    "error": "no PyTorch/JAX twin in benchmarks/ for this model"}
        why = available(fw)
        if why is not None:
            return {"status": "missing", "error": why}
        o = self.opts
        cmd = [o.python, str(RUNNER), "--framework", fw, "--model", m.twin,
               "--threads", str(threads), "--min-time", str(o.min_time),
               "--min-steps", str(o.min_steps), "--warmup", str(o.warmup),
               "--seed", str(o.seed)]
        for k, v in params.items():
            cmd += ["--set", f"{k}={_text(v)}"]
        note = None
        if comp.get("status") == "ok":
            cmd += ["--data", comp["case"]]
        else:
            note = "initial values from the twin's initializers: nfc did not compile the model"
        rec = self._process(cmd, threads)
        if fw != "torch" and rec.get("status") == "ok":
            rec["compile_kind"] = "cold"
        if note:
            rec["note"] = note
        return rec

    def run(self) -> list[dict[str, Any]]:
        """Run every case; the records in order."""
        own = self.opts.work_dir is None
        work = Path(self.opts.work_dir or tempfile.mkdtemp(prefix="nfc-bench-"))
        work.mkdir(parents=True, exist_ok=True)
        ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        try:
            for m in self.opts.models:
                self.run_model(m, work)
            if self.deferred:
                self.log(f"[{_mmss(time.monotonic() - self.start)}] torch.compile on more "
                         f"threads: {len(self.deferred)} deferred case(s)")
            for args in self.deferred:
                self._case(*args)
        finally:
            if own:
                shutil.rmtree(work, ignore_errors=True)
        ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
        loads = [r["loadavg"] for r in self.records if r.get("loadavg") is not None]
        self.log(f"finished {self.done} cases in {_mmss(time.monotonic() - self.start)} "
                 f"(the processes used {_mmss(cpu)} of CPU time; mean 1-minute load average "
                 f"before a case {sum(loads) / max(len(loads), 1):.2f} on "
                 f"{os.cpu_count()} CPUs)")
        return self.records


def _text(v: Any) -> str:
    return ("true" if v else "false") if isinstance(v, bool) else str(v)


def _mmss(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 60}:{s % 60:02d}"


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
