"""The measuring worker process: `python -m nfc.runtime.tuning.worker --fd N`.

It reads one JSON request per line on stdin and writes one JSON event per line to file
descriptor N (its stdout is pointed at stderr, so a kernel's prints cannot corrupt the
protocol). A request names the builder by import path and carries a JSON spec, a seed and a
schedule; the worker generates the inputs itself, so nothing but JSON crosses the pipe.

Events: `ready` on start; for `prepare`: `prepared` or `error`; for `measure`: `built` once
the kernel is built and the inputs and reference are ready, then `result`; for `compare`
(several schedules timed side by side, their repeats interleaved: A B A B ...): `built` once
all are built, then `results`, one result per schedule in order.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import signal
import statistics
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

RunFn = Callable[[list[np.ndarray]], Any]
"""What a builder returns: outputs (an array or a sequence of arrays) from inputs. It may
carry attributes `workspace_bytes: int` and `reproducible: bool`."""


def resolve(path: str) -> Callable[..., Any]:
    """The function named by `"package.module:function"`."""
    module, sep, name = path.partition(":")
    if not sep or not module or not name:
        raise ValueError(f"'{path}' is not of the form 'package.module:function'")
    obj: Any = importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(f"'{path}' is not callable")
    return obj


def make_inputs(spec: Mapping[str, Any], seed: int) -> list[np.ndarray]:
    """The random inputs `spec["inputs"]` describes (`shape`, `dtype`, optional `low`/`high`
    for integers), generated from `seed`; a caller gets the same arrays as the worker."""
    rng = np.random.default_rng(seed)
    out = []
    for desc in spec.get("inputs", []):
        shape = tuple(int(d) for d in desc["shape"])
        dtype = np.dtype(desc.get("dtype", "float32"))
        if dtype == np.bool_:
            out.append(rng.random(shape) < 0.5)
        elif np.issubdtype(dtype, np.integer):
            out.append(rng.integers(desc.get("low", -8), desc.get("high", 8), shape, dtype=dtype))
        else:
            out.append(rng.standard_normal(shape).astype(dtype))
    return out


def as_outputs(value: Any) -> list[np.ndarray]:
    """A run's result as a list of arrays."""
    if isinstance(value, np.ndarray | np.generic):
        return [np.asarray(value)]
    return [np.asarray(v) for v in value]


def compare(outputs: Sequence[np.ndarray], reference: Sequence[np.ndarray], rtol: float,
            atol: float) -> str:
    """Why `outputs` differ from `reference` (empty when they match within tolerance)."""
    if len(outputs) != len(reference):
        return f"{len(outputs)} outputs, the reference has {len(reference)}"
    for i, (out, ref) in enumerate(zip(outputs, reference, strict=True)):
        if out.shape != ref.shape:
            return f"output {i} has shape {out.shape}, the reference {ref.shape}"
        a, b = out.astype(np.float64), ref.astype(np.float64)
        close = np.isclose(a, b, rtol=rtol, atol=atol, equal_nan=True)
        if not close.all():
            err = np.where(close, 0.0, np.abs(a - b))
            err = np.where(np.isnan(err), np.inf, err)
            at = np.unravel_index(int(np.argmax(err)), err.shape)
            return (f"output {i} differs from the reference at {tuple(int(x) for x in at)}: "
                    f"{a[at]:.7g} vs {b[at]:.7g} (rtol {rtol:g}, atol {atol:g}, "
                    f"{int((~close).sum())} elements differ)")
    return ""


def _error(err: BaseException) -> str:
    text = "".join(traceback.format_exception(err)).strip()
    return text[-1500:]


class _Worker:
    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.prepared: dict[str, tuple[list[np.ndarray], list[np.ndarray] | None]] = {}

    def send(self, event: dict[str, Any]) -> None:
        data = (json.dumps(event, allow_nan=True) + "\n").encode()
        while data:
            data = data[os.write(self.fd, data):]

    def context(self, req: dict[str, Any]) -> tuple[list[np.ndarray], list[np.ndarray] | None]:
        """Inputs and reference outputs of a task, computed once per worker."""
        name = json.dumps([req["spec"], req["seed"], req.get("reference")], sort_keys=True)
        if name not in self.prepared:
            inputs = make_inputs(req["spec"], req["seed"])
            ref = None
            if req.get("reference"):
                run = resolve(req["reference"])(req["spec"])
                ref = [o.copy() for o in as_outputs(run([x.copy() for x in inputs]))]
            resolve(req["builder"])  # fail early on a bad import path
            self.prepared[name] = (inputs, ref)
        return self.prepared[name]

    def measure(self, req: dict[str, Any]) -> dict[str, Any]:
        try:
            inputs, ref = self.context(req)
            run = resolve(req["builder"])(req["spec"], req["schedule"])
        except Exception as err:
            return {"status": "failed", "error": "build: " + _error(err)}
        self.send({"event": "built"})
        args = [x.copy() for x in inputs]
        try:
            first = [o.copy() for o in as_outputs(run(args))]
            if ref is not None and (why := compare(first, ref, req["rtol"], req["atol"])):
                return {"status": "wrong", "error": why}
            second = as_outputs(run(args))
            for _ in range(max(0, req["warmup"])):
                run(args)
            t0 = time.perf_counter()
            run(args)
            single = max(time.perf_counter() - t0, 1e-9)
            number = max(1, min(100_000, math.ceil(req["min_repeat_time"] / single)))
            samples = []
            for _ in range(max(1, req["repeats"])):
                t0 = time.perf_counter()
                for _ in range(number):
                    run(args)
                samples.append((time.perf_counter() - t0) / number)
        except Exception as err:
            return {"status": "failed", "error": "run: " + _error(err)}
        q = statistics.quantiles(samples, n=4) if len(samples) > 1 else [samples[0]] * 3
        same = all(np.array_equal(a, b, equal_nan=True)
                   for a, b in zip(first, second, strict=True))
        return {"status": "ok", "time": statistics.median(samples), "spread": q[2] - q[0],
                "workspace": int(getattr(run, "workspace_bytes", 0)),
                "reproducible": bool(getattr(run, "reproducible", True)) and same,
                "repeats": len(samples), "number": number}

    def compare(self, req: dict[str, Any]) -> list[dict[str, Any]]:
        """Build and check every schedule of `req["schedules"]`, then time them in turns,
        one repeat each per turn, so that a disturbance of the machine (a busy neighbour, a
        frequency change) falls on all of them alike. Each result carries its `samples`."""
        try:
            inputs, ref = self.context(req)
        except Exception as err:
            return [{"status": "failed", "error": "prepare: " + _error(err)}
                    for _ in req["schedules"]]
        runs: list[RunFn | None] = []
        results: list[dict[str, Any]] = []
        for sched in req["schedules"]:
            try:
                runs.append(resolve(req["builder"])(req["spec"], sched))
                results.append({"status": "ok"})
            except Exception as err:
                runs.append(None)
                results.append({"status": "failed", "error": "build: " + _error(err)})
        self.send({"event": "built"})
        args = [x.copy() for x in inputs]
        numbers: list[int] = []
        for run, res in zip(runs, results, strict=True):
            numbers.append(1)
            if run is None:
                continue
            try:
                first = [o.copy() for o in as_outputs(run(args))]
                if ref is not None and (why := compare(first, ref, req["rtol"], req["atol"])):
                    res.update(status="wrong", error=why)
                    continue
                second = as_outputs(run(args))
                res["same"] = all(np.array_equal(a, b, equal_nan=True)
                                  for a, b in zip(first, second, strict=True))
                for _ in range(max(0, req["warmup"])):
                    run(args)
                t0 = time.perf_counter()
                run(args)
                single = max(time.perf_counter() - t0, 1e-9)
                numbers[-1] = max(1, min(100_000, math.ceil(req["min_repeat_time"] / single)))
                res["samples"] = []
            except Exception as err:
                res.update(status="failed", error="run: " + _error(err))
        live = [i for i, r in enumerate(results) if r["status"] == "ok"]
        for _ in range(max(1, req["repeats"])):
            for i in list(live):
                run = runs[i]
                assert run is not None
                try:
                    t0 = time.perf_counter()
                    for _ in range(numbers[i]):
                        run(args)
                    results[i]["samples"].append((time.perf_counter() - t0) / numbers[i])
                except Exception as err:
                    results[i].update(status="failed", error="run: " + _error(err))
                    live.remove(i)
        for i in live:
            samples = results[i]["samples"]
            q = statistics.quantiles(samples, n=4) if len(samples) > 1 else [samples[0]] * 3
            run = runs[i]
            results[i].update(time=statistics.median(samples), spread=q[2] - q[0],
                              workspace=int(getattr(run, "workspace_bytes", 0)),
                              reproducible=bool(getattr(run, "reproducible", True))
                              and results[i].pop("same"), number=numbers[i])
        return results

    def serve(self) -> None:
        self.send({"event": "ready", "pid": os.getpid()})
        for line in iter(sys.stdin.readline, ""):
            req = json.loads(line)
            if req["op"] == "exit":
                return
            if req["op"] == "prepare":
                try:
                    self.context(req)
                    self.send({"event": "prepared"})
                except Exception as err:
                    self.send({"event": "error", "error": _error(err)})
            elif req["op"] == "measure":
                self.send({"event": "result", **self.measure(req)})
            elif req["op"] == "compare":
                self.send({"event": "results", "results": self.compare(req)})


def _watch_parent() -> None:
    # a parent killed with SIGKILL cannot stop us; a hanging kernel would otherwise live on
    parent = os.getppid()
    while True:
        time.sleep(0.5)
        if os.getppid() != parent:
            os._exit(3)


def main(argv: list[str] | None = None) -> int:
    """Serve measurement requests until stdin closes."""
    parser = argparse.ArgumentParser(prog="nfc-tuning-worker")
    parser.add_argument("--fd", type=int, required=True, help="descriptor to write events to")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when to stop
    os.dup2(2, 1)  # stray prints (even from C) go to stderr, never into the protocol
    threading.Thread(target=_watch_parent, daemon=True).start()
    _Worker(args.fd).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
