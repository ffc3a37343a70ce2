"""Measuring candidates in a worker process, so that no candidate can hurt the caller.

A candidate that raises, crashes the worker (segfault, `os._exit`), hangs past its time limit
(the worker is killed and a new one started) or computes a wrong result is reported as a
failed `Measurement`; the caller records it and moves on. What is measured is described by
data only (`Task`): a builder named by import path, a JSON spec, a seed; the worker builds
the kernel, generates the inputs and computes the reference outputs itself.

The builder is called as `builder(spec, schedule)` and returns `run(inputs) -> outputs`
(numpy arrays); the optional reference as `reference(spec)` returning the same kind of `run`.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from nfc.runtime.tuning.model import Measurement, Status, canonical_json


class MeasureSetupError(Exception):
    """The task itself cannot be measured (bad import path, failing reference, no worker);
    unlike a failing candidate this is not recorded in the cache."""


@dataclass(frozen=True)
class Task:
    """What to measure, as data a worker process can rebuild."""

    builder: str
    """`"package.module:function"`; called as `builder(spec, schedule) -> run`."""
    spec: Mapping[str, Any] = field(default_factory=dict)
    """JSON-able description of the kernel; `spec["inputs"]` lists `{"shape", "dtype"}`."""
    reference: str | None = None
    """`"package.module:function"` called as `reference(spec) -> run` to produce the expected
    outputs on the same inputs; `None` checks nothing."""
    seed: int = 0
    """Seed of the random inputs."""


@dataclass(frozen=True)
class MeasureOptions:
    """Time limits, timing protocol and tolerances."""

    timeout: float = 10.0
    """Seconds a candidate may run (its checked runs, warm-up and timed repeats)."""
    build_timeout: float = 60.0
    """Seconds a candidate may take to build."""
    startup_timeout: float = 60.0
    """Seconds a new worker may take to start and prepare inputs and reference."""
    warmup: int = 1
    """Untimed runs before timing (after the two checked runs)."""
    repeats: int = 5
    """Timed repeats; the median is the time, the interquartile range the spread."""
    min_repeat_time: float = 1e-3
    """A repeat loops the kernel until it lasts at least this long (seconds)."""
    rtol: float = 1e-4
    """Relative tolerance against the reference outputs."""
    atol: float = 1e-5
    """Absolute tolerance against the reference outputs."""


def _child_env() -> dict[str, str]:
    # the worker must import what the caller can (the builder's package, a test folder);
    # the interpreter's own directories it finds by itself
    own = tuple(os.path.abspath(p) + os.sep for p in {sys.prefix, sys.base_prefix})
    paths = [os.path.abspath(p or os.curdir) for p in sys.path]
    paths = [p for p in paths if not (p + os.sep).startswith(own)]
    old = os.environ.get("PYTHONPATH")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([p for p in paths if os.path.isdir(p)]
                                        + ([old] if old else []))
    return env


class _WorkerDied(Exception):
    pass


class _Worker:
    """One worker process and the pipe its events come back on."""

    def __init__(self, python: str, startup_timeout: float, *, module: str = "nfc.runtime."
                 "tuning.worker", args: Sequence[str] = (), what: str = "measuring") -> None:
        """Start `python -m module --fd FD *args` and wait for its `ready` event (kept as
        `info`); MeasureSetupError naming `what` when it does not come."""
        rfd, wfd = os.pipe()
        self.rfd, self.buf = rfd, b""
        # the worker's stderr, kept for the error text when it dies; closed in close_fds
        self.stderr = tempfile.TemporaryFile()  # noqa: SIM115
        try:
            self.proc = subprocess.Popen(
                [python, "-m", module, "--fd", str(wfd), *args],
                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=self.stderr,
                pass_fds=(wfd,), env=_child_env(), start_new_session=True)
        finally:
            os.close(wfd)
        try:
            ready = self.read(startup_timeout)
        except _WorkerDied:
            ready = None
        if ready is None or ready.get("event") != "ready":
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            why = (ready or {}).get("error") or self.tail()
            self.close_fds()
            sep = "\n" if "\n" in why.strip() else " "
            raise MeasureSetupError(f"the {what} worker did not start:{sep}{why}")
        self.info: dict[str, Any] = ready

    def send(self, msg: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write((canonical_json(msg) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise _WorkerDied from None

    def read(self, timeout: float) -> dict[str, Any] | None:
        """The next event, `None` after `timeout` seconds; _WorkerDied when the pipe closes."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.rfd], [], [], left)[0]:
                return None
            chunk = os.read(self.rfd, 1 << 16)
            if not chunk:
                raise _WorkerDied
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        event = json.loads(line)
        assert isinstance(event, dict)
        return event

    def tail(self, limit: int = 1500) -> str:
        self.stderr.seek(0, os.SEEK_END)
        size = self.stderr.tell()
        self.stderr.seek(max(0, size - limit))
        return self.stderr.read().decode(errors="replace").strip()

    def death(self) -> str:
        """Why the worker died (waits for it to exit)."""
        try:
            rc = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.kill()
            rc = self.proc.returncode
        if rc is not None and rc < 0:
            try:
                why = f"the worker was killed by {signal.Signals(-rc).name}"
            except ValueError:
                why = f"the worker was killed by signal {-rc}"
        else:
            why = f"the worker exited with code {rc}"
        tail = self.tail()
        self.close_fds()
        return why + (f"\n{tail}" if tail else "")

    def shutdown(self, timeout: float) -> None:
        """Ask the worker to exit, give it `timeout` seconds, then kill it and release its
        pipes (whatever state it is in)."""
        try:
            self.send({"op": "exit"})
            self.proc.wait(timeout=timeout)
        except (_WorkerDied, subprocess.TimeoutExpired):
            pass
        self.kill()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.close_fds()

    def close_fds(self) -> None:
        if self.rfd >= 0:
            os.close(self.rfd)
            self.rfd = -1
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        self.stderr.close()


class Measurer:
    """Measures schedules of one `Task` in a worker process; callable as a search's
    `measure`. Use as a context manager, or call `close()`, to stop the worker."""

    def __init__(self, task: Task, options: MeasureOptions | None = None, *,
                 python: str | None = None) -> None:
        canonical_json(dict(task.spec))  # a spec must be JSON data: fail here, not in a worker
        self.task = task
        self.options = options or MeasureOptions()
        self.python = python or sys.executable
        self.restarts = 0
        """Workers started after the first one (each crash or hang costs one)."""
        self._worker: _Worker | None = None

    def _request(self, op: str, schedule: Mapping[str, Any] | None = None) -> dict[str, Any]:
        o = self.options
        return {"op": op, "builder": self.task.builder, "spec": dict(self.task.spec),
                "reference": self.task.reference, "seed": self.task.seed,
                "schedule": dict(schedule or {}), "warmup": o.warmup, "repeats": o.repeats,
                "min_repeat_time": o.min_repeat_time, "rtol": o.rtol, "atol": o.atol}

    def prepare(self) -> None:
        """Start a worker if none runs and have it build the inputs and reference; raises
        MeasureSetupError when the task cannot be measured at all."""
        if self._worker is not None:
            return
        worker = _Worker(self.python, self.options.startup_timeout)
        try:
            worker.send(self._request("prepare"))
            event = worker.read(self.options.startup_timeout)
        except _WorkerDied:
            raise MeasureSetupError(f"preparing the task killed the worker: "
                                    f"{worker.death()}") from None
        if event is None or event.get("event") != "prepared":
            worker.kill()
            why = "it timed out" if event is None else event.get("error", "")
            raise MeasureSetupError(f"cannot prepare '{self.task.builder}': {why}")
        self._worker = worker

    def __call__(self, schedule: Mapping[str, Any]) -> Measurement:
        """Measure one schedule; never raises for a bad candidate."""
        if self._worker is not None and self._worker.proc.poll() is not None:
            self._drop()
        self.prepare()
        worker = self._worker
        assert worker is not None
        o = self.options
        try:
            worker.send(self._request("measure", schedule))
            event = worker.read(o.build_timeout)
            if event is None:
                self._drop(kill=True)
                return Measurement(Status.TIMEOUT, error=f"build took over {o.build_timeout:g} s")
            if event.get("event") == "built":
                event = worker.read(o.timeout)
                if event is None:
                    self._drop(kill=True)
                    return Measurement(Status.TIMEOUT, error=f"run took over {o.timeout:g} s")
        except _WorkerDied:
            self._worker = None
            self.restarts += 1
            return Measurement(Status.FAILED, error=worker.death())
        assert event.get("event") == "result", f"unexpected worker event {event!r}"
        status = Status(event["status"])
        if status is not Status.OK:
            return Measurement(status, error=str(event.get("error", "")))
        return Measurement(Status.OK, float(event["time"]), float(event["spread"]),
                           int(event["workspace"]), bool(event["reproducible"]))

    def compare(self, schedules: Sequence[Mapping[str, Any]]) -> list[Measurement]:
        """Measure `schedules` side by side: built and checked in one worker, then timed in
        turns (one repeat of each per turn), so that whatever disturbs the machine meanwhile
        disturbs all of them alike. One measurement per schedule, in order; never raises for
        a bad candidate (a crash or a hang fails all of them: which one caused it is
        unknown)."""
        if self._worker is not None and self._worker.proc.poll() is not None:
            self._drop()
        self.prepare()
        worker = self._worker
        assert worker is not None
        o = self.options
        n = max(1, len(schedules))
        req = {**self._request("compare"), "schedules": [dict(s) for s in schedules]}
        try:
            worker.send(req)
            event = worker.read(o.build_timeout * n)
            if event is None:
                self._drop(kill=True)
                return [Measurement(Status.TIMEOUT, error=f"build took over "
                                    f"{o.build_timeout * n:g} s")] * len(schedules)
            if event.get("event") == "built":
                event = worker.read(o.timeout * n)
                if event is None:
                    self._drop(kill=True)
                    return [Measurement(Status.TIMEOUT, error=f"runs took over "
                                        f"{o.timeout * n:g} s")] * len(schedules)
        except _WorkerDied:
            self._worker = None
            self.restarts += 1
            why = worker.death()
            return [Measurement(Status.FAILED, error=why)] * len(schedules)
        assert event.get("event") == "results", f"unexpected worker event {event!r}"
        out = []
        for res in event["results"]:
            status = Status(res["status"])
            if status is not Status.OK:
                out.append(Measurement(status, error=str(res.get("error", ""))))
            else:
                out.append(Measurement(Status.OK, float(res["time"]), float(res["spread"]),
                                       int(res["workspace"]), bool(res["reproducible"])))
        return out

    def _drop(self, kill: bool = False) -> None:
        if self._worker is not None:
            self._worker.kill() if kill else self._worker.death()
            self._worker = None
            self.restarts += 1

    def close(self) -> None:
        """Ask the worker to exit (killing it if it does not) and release its pipes."""
        worker, self._worker = self._worker, None
        if worker is not None:
            worker.shutdown(timeout=2)

    def __enter__(self) -> Measurer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
