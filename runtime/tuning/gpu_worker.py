"""GPU candidates measured in a worker process, so that no candidate can hurt the tuner.

    with GpuWorker(GpuWorkerOptions(timeout=10)) as worker:
        measure = WorkerDeviceMeasurer(op, worker, space)     # the search's `measure`
        result = tune_gpu_op(op, measure, space=space)

A candidate kernel on a GPU can hang (a loop that never ends) or fault (an illegal address:
`CUDA_ERROR_ILLEGAL_ADDRESS` is sticky, every later call of the context fails with it). So
`nfc tune --target cuda` measures in a worker process, `python -m
nfc.runtime.tuning.gpu_worker --fd N`, started fresh (never forked: a CUDA context does not
survive a fork), which owns the only CUDA context of the search and runs
`nfc.runtime.tuning.gpu.DeviceMeasurer` there: lower, compile with NVRTC, reject by resources
before any launch, run once and check against the interpreter's bound, time with CUDA events.
Per candidate:

- a run that lasts over `timeout` seconds (or a build over `build_timeout`) is `timeout`: the
  worker is killed and the next candidate starts a new one;
- a driver error that leaves the context unusable (the worker checks with a
  `cuCtxSynchronize` after every failure) is `failed` with the driver's message; the worker
  exits and the next candidate starts a new one with a fresh context;
- a worker that dies (a crash in the driver, `os._exit`) is `failed` with its exit status and
  the tail of its stderr;
- anything else is what `DeviceMeasurer` says (`ok` with the time, `wrong`, `failed`).

Nothing but JSON crosses the pipes (as in nfc.runtime.tuning.worker): the request carries the
compute as IR text (nfc.printer; nfc.irparser in the worker), the seed of the inputs and the
schedule's dict; the worker generates the inputs and the reference bound itself. The worker's
stdout goes to stderr, so prints cannot corrupt the protocol.

`GpuWorkerOptions.driver` names a factory `"package.module:function"` called with
`driver_spec` (JSON data) in the worker to build the object `Device` drives instead of
`cuda.bindings.driver`: tests use it to run the worker on
`nfc.codegen.cuda.fakedriver.FakeDriver` (`fake_driver` below, or a subclass with fault hooks)
on machines without a GPU. It is a constructor argument only, never read from the environment
or the command line of `nfc`, so a real run cannot pick up a fake driver by accident.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from nfc.runtime.tuning.measure import _Worker, _WorkerDied
from nfc.runtime.tuning.model import Measurement, Status, canonical_json

__all__ = ["GpuWorker", "GpuWorkerOptions", "WorkerDeviceMeasurer", "fake_driver", "main",
           "worker_options"]

MODULE = "nfc.runtime.tuning.gpu_worker"


@dataclass(frozen=True)
class GpuWorkerOptions:
    """Time limits, the timing protocol and (tests only) the driver of a `GpuWorker`."""

    timeout: float = 20.0
    """Seconds a candidate may run on the device (checked run, warm-up, timed rounds)."""
    build_timeout: float = 120.0
    """Seconds a candidate may take to lower, compile and prepare its reference."""
    startup_timeout: float = 120.0
    """Seconds a new worker may take to start and create its CUDA context."""
    repeats: int = 20
    rounds: int = 5
    warmup: int = 3
    """`DeviceMeasurer`'s timing: the median of `rounds` rounds of `repeats` launches, after
    `warmup` untimed runs."""
    driver: str | None = None
    """A factory `"package.module:function"` of a stand-in for `cuda.bindings.driver`,
    called in the worker with `driver_spec`; None: the real driver. For tests (module doc)."""
    driver_spec: Mapping[str, Any] = field(default_factory=dict)


class _Process(_Worker):
    """The worker process and the pipe its events come back on (measure._Worker's pipe
    handling, another module and arguments)."""

    def __init__(self, options: GpuWorkerOptions) -> None:  # noqa: D107
        args: list[str] = []
        if options.driver is not None:
            args += ["--driver", options.driver, "--driver-spec",
                     canonical_json(dict(options.driver_spec))]
        super().__init__(sys.executable, options.startup_timeout, module=MODULE, args=args,
                         what="GPU measuring")


class GpuWorker:
    """The measuring worker of a search (module doc), restarted after a hang, a fault or a
    crash; shared by the `WorkerDeviceMeasurer`s of every compute. Use as a context manager,
    or call `close()`, to stop it."""

    def __init__(self, options: GpuWorkerOptions | None = None) -> None:
        self.options = options or GpuWorkerOptions()
        canonical_json(dict(self.options.driver_spec))  # JSON data: fail here, not there
        self.restarts = 0
        """Workers started after the first one (each hang, fault or crash costs one)."""
        self.pids: list[int] = []
        """Every worker process started, in order."""
        self._proc: _Process | None = None

    def start(self) -> dict[str, Any]:
        """Start a worker if none runs; its `ready` event (`name`, `arch` of the device).
        MeasureSetupError when it cannot start (no driver, no device)."""
        if self._proc is not None and self._proc.proc.poll() is not None:
            self._drop()
        if self._proc is None:
            if self.pids:
                self.restarts += 1
            self._proc = _Process(self.options)
            self.pids.append(self._proc.proc.pid)
        return self._proc.info

    def measure(self, func: str, seed: int, schedule: Mapping[str, Any]) -> Measurement:
        """Measure one schedule (its dict) of the compute in `func` (IR text, the function
        `candidate`); never raises for a bad candidate."""
        self.start()
        proc = self._proc
        assert proc is not None
        o = self.options
        try:
            proc.send({"op": "measure", "func": func, "seed": seed, "schedule": dict(schedule),
                       "repeats": o.repeats, "rounds": o.rounds, "warmup": o.warmup})
            event = proc.read(o.build_timeout)
            if event is None:
                self._drop(kill=True)
                return Measurement(Status.TIMEOUT, error=f"build took over {o.build_timeout:g} "
                                   "s (the worker was killed)")
            if event.get("event") == "built":
                event = proc.read(o.timeout)
                if event is None:
                    self._drop(kill=True)
                    return Measurement(Status.TIMEOUT, error=f"run took over {o.timeout:g} s "
                                       "(the worker was killed)")
        except _WorkerDied:
            self._proc = None
            return Measurement(Status.FAILED, error=f"the GPU worker died: {proc.death()}")
        if event.get("event") != "result":
            self._drop(kill=True)
            return Measurement(Status.FAILED, error=f"unexpected worker event {event!r}")
        status = Status(event["status"])
        error = str(event.get("error", ""))
        if event.get("fatal"):
            self._drop()  # it exits by itself: its context is unusable
            error += " (the CUDA context was unusable afterwards: the worker was restarted)"
        if status is Status.OK:
            return Measurement(Status.OK, time=float(event["time"]))
        return Measurement(status, error=error)

    def _drop(self, kill: bool = False) -> None:
        if self._proc is not None:
            self._proc.kill() if kill else self._proc.death()
            self._proc = None

    def close(self) -> None:
        """Ask the worker to exit (killing it if it does not) and reap it."""
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.shutdown(timeout=5)

    def __enter__(self) -> GpuWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class WorkerDeviceMeasurer:
    """`DeviceMeasurer` in a `GpuWorker`: the search's `measure` for one compute. `results`
    keeps every distinct schedule measured, in order (as the in-process measurers)."""

    def __init__(self, op: Any, worker: GpuWorker, space: Any = None, *, seed: int = 0) -> None:
        from nfc.ir import Module
        from nfc.printer import print_module
        from nfc.runtime.tuning.gpu import _group_func, search_space

        self.op = op
        self.worker = worker
        self.space = space if space is not None else search_space(op)
        self.seed = seed
        self.func = print_module(Module("tuning", [_group_func(op)]), locs=False)
        self.results: dict[str, tuple[Any, Measurement]] = {}

    def measure_schedule(self, schedule: Any) -> Measurement:
        """Measure one GpuSchedule in the worker (memoised by schedule)."""
        from nfc.runtime.tuning.gpu import _schedule_key

        key = _schedule_key(schedule)
        if key not in self.results:
            self.results[key] = (schedule, self.worker.measure(self.func, self.seed,
                                                               schedule.to_dict()))
        return self.results[key][1]

    def __call__(self, cfg: dict[str, Any]) -> Measurement:
        return self.measure_schedule(self.space.to_schedule(cfg))

    def __enter__(self) -> WorkerDeviceMeasurer:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def worker_options(device: Any, **kw: Any) -> GpuWorkerOptions:
    """The options of a worker measuring on the GPU behind `device` (a Device the caller
    opened, for its category): the real driver, or, when `device` runs on a FakeDriver (a
    test's), a FakeDriver of the same architecture in the worker too."""
    from nfc.codegen.cuda.fakedriver import FakeDriver

    if isinstance(device.d, FakeDriver):
        kw = {"driver": f"{MODULE}:fake_driver", "driver_spec": {"arch": list(device.d.arch)},
              **kw}
    return GpuWorkerOptions(**kw)


def fake_driver(spec: Mapping[str, Any]) -> Any:
    """A `FakeDriver` (the simulator behind the driver API) for `GpuWorkerOptions.driver`:
    `"nfc.runtime.tuning.gpu_worker:fake_driver"`; `spec` may give `arch` ([major, minor])."""
    from nfc.codegen.cuda.fakedriver import FakeDriver

    return FakeDriver({}, arch=tuple(spec.get("arch", (9, 0))))


# ---------------------------------------------------------------------------------------------
# the worker process


def _error(err: BaseException) -> str:
    return "".join(traceback.format_exception(err)).strip()[-1500:]


class _Server:
    def __init__(self, fd: int, device: Any) -> None:
        self.fd = fd
        self.device = device
        self.measurers: dict[str, Any] = {}

    def send(self, event: dict[str, Any]) -> None:
        data = (json.dumps(event) + "\n").encode()
        while data:
            data = data[os.write(self.fd, data):]

    def measurer(self, req: Mapping[str, Any]) -> Any:
        """The DeviceMeasurer of a request's compute (made once per worker)."""
        from nfc.ir import ComputeOp
        from nfc.irparser import parse_module
        from nfc.runtime.tuning.gpu import DeviceMeasurer

        name = json.dumps([req["func"], req["seed"], req["repeats"], req["rounds"],
                           req["warmup"]])
        if name not in self.measurers:
            func = parse_module(req["func"]).func("candidate")
            op = next(o for o in func.body.ops if isinstance(o, ComputeOp))
            self.measurers[name] = DeviceMeasurer(op, self.device, seed=int(req["seed"]),
                                                  repeats=int(req["repeats"]),
                                                  rounds=int(req["rounds"]),
                                                  warmup=int(req["warmup"]))
        return self.measurers[name]

    def healthy(self) -> bool:
        """Whether the context still works (a sticky error fails every call)."""
        try:
            self.device.synchronize()
        except Exception:  # noqa: BLE001 - any failure: the context is not to be trusted
            return False
        return True

    def measure(self, req: Mapping[str, Any]) -> dict[str, Any]:
        from nfc.codegen.cuda.schedule import gpu_schedule_from_dict

        try:
            dm = self.measurer(req)
            schedule = gpu_schedule_from_dict(req["schedule"])
            built = dm.build(schedule)
            dm.sim.bounds(getattr(schedule, "precision", "fma"))  # the reference, before
        except Exception as err:  # noqa: BLE001 - a candidate that cannot be built
            return {"status": "failed", "error": "build: " + _error(err)}
        if isinstance(built, Measurement):
            return {"status": str(built.status), "error": built.error}
        self.send({"event": "built"})
        try:
            m = dm.run(schedule, *built)
        except Exception as err:  # noqa: BLE001 - the simulator's SimError, a driver bug
            m = Measurement(Status.FAILED, error="run: " + _error(err))
        out: dict[str, Any] = {"status": str(m.status), "error": m.error, "time": m.time}
        if m.status is not Status.OK and not self.healthy():
            out["fatal"] = True
        return out

    def serve(self) -> int:
        for line in iter(sys.stdin.readline, ""):
            req = json.loads(line)
            if req["op"] == "exit":
                return 0
            if req["op"] == "measure":
                result = self.measure(req)
                self.send({"event": "result", **result})
                if result.get("fatal"):
                    return 4  # the context is gone: a new worker makes a new one
        return 0


def main(argv: list[str] | None = None) -> int:
    """Serve measurement requests until stdin closes (or the context breaks: exit 4)."""
    from nfc.runtime.tuning.worker import _watch_parent, resolve

    parser = argparse.ArgumentParser(prog="nfc-gpu-tuning-worker")
    parser.add_argument("--fd", type=int, required=True, help="descriptor to write events to")
    parser.add_argument("--driver", default=None, help="factory of a stand-in driver (tests)")
    parser.add_argument("--driver-spec", default="{}", help="its JSON argument")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when to stop
    os.dup2(2, 1)  # stray prints (even from C) go to stderr, never into the protocol
    threading.Thread(target=_watch_parent, daemon=True).start()
    server = _Server(args.fd, None)
    try:
        from nfc.codegen.cuda.driver import Device

        driver = None if args.driver is None else resolve(args.driver)(
            json.loads(args.driver_spec))
        server.device = Device(driver=driver)
    except Exception as err:  # noqa: BLE001 - reported to the parent, which raises
        server.send({"event": "error", "error": f"{type(err).__name__}: {err}"})
        return 2
    server.send({"event": "ready", "pid": os.getpid(), "name": server.device.name,
                 "arch": server.device.arch})
    return server.serve()


if __name__ == "__main__":
    sys.exit(main())
