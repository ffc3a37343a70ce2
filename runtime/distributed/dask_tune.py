"""`nfc tune --cluster ADDR`: candidates measured on dask workers, the search on the client.

    with cluster_measurer("tcp://10.0.0.5:8786") as make:      # a dask.distributed Client
        tune_module(module, cache, options=TuneOptions(measurer=make))

The genetic search (nfc.runtime.tuning.search) and the tuning cache stay in the client process:
every measurement comes back as data and the client commits it to the local cache, exactly as a
local run does (same candidates, same records; only the times are the workers'). The search
hands over a whole generation at a time (`ClusterMeasurer.measure_batch`, the search's batch
interface): every candidate the cache does not have becomes a dask future at once, the matching
workers measure them in parallel, and each result is committed to the cache as it completes
(`distributed.as_completed`), so a client killed mid-generation loses only the candidates still
in flight. A candidate goes to a dask worker whose machine category
(nfc.runtime.tuning.category, which keys the cache) equals the client's: measurements of other
machines would be recorded under the wrong category. On the worker a `Measurer`
(nfc.runtime.tuning.measure) times it in a process of its own, so a candidate that crashes or
hangs costs that measuring process, not the dask worker; one `Measurer` per kernel stays open
on each worker until the kernel is done.
When a dask worker itself dies mid-measurement, dask gives the candidate to another matching
worker (up to the scheduler's `allowed-failures`), after which it is recorded as failed:
nothing else of the run is lost. A worker measures one candidate at a time, whatever its
thread count (two timings side by side in one worker would disturb each other); the
parallelism is across workers, so give each worker one thread (`dask worker --nthreads 1`).

Tasks carry JSON data only (the kernel spec, the schedule, the options) and the measuring
function by import path; dask's own transport is what moves them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from nfc.runtime.tuning.measure import MeasureOptions, Measurer, MeasureSetupError, Task
from nfc.runtime.tuning.model import Measurement, Status, canonical_json, category_id

__all__ = ["ClusterError", "ClusterMeasurer", "Factory", "RemoteRun", "cluster_measurer",
           "worker_categories"]


class ClusterError(RuntimeError):
    """No usable dask cluster (dask missing, no worker of this machine's category)."""


# ---- on the worker ----------------------------------------------------------------------------

_OPEN: dict[str, Measurer] = {}
_LOCK = threading.Lock()
_MEASURING = threading.Lock()  # one measurement at a time per worker process

THREAD_ENVIRON = ("OMP_NUM_THREADS", "NFC_THREADS_BACKEND", "NFC_THREADS_SPIN")
"""Variables that set how many threads (and which pool) a kernel runs with: the client's
values go with every task and the worker's measuring process gets them, as a local run's
would. (A dask nanny starts its workers with OMP_NUM_THREADS=1, which would otherwise time
every parallel kernel on one thread and record it under the client's category.)"""


def _category() -> dict[str, Any]:
    from nfc.runtime.tuning.category import default_category

    return default_category()


def _measurer(key: str, task: Mapping[str, Any], options: Mapping[str, Any]) -> Measurer:
    with _LOCK:
        m = _OPEN.get(key)
        if m is None:
            m = Measurer(Task(**task), MeasureOptions(**options))
            _OPEN[key] = m
        return m


def _as_data(m: Measurement) -> dict[str, Any]:
    return {"status": m.status.value, "time": m.time, "spread": m.spread,
            "workspace": m.workspace, "reproducible": m.reproducible, "error": m.error}


def _worker_address() -> str:
    try:
        from distributed import get_worker

        return str(get_worker().address)
    except (ImportError, ValueError):  # not in a dask worker (called directly)
        return ""


def _set_environ(environ: Mapping[str, str | None]) -> None:
    for name, value in environ.items():
        if name in THREAD_ENVIRON:
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = str(value)


def measure_on_worker(key: str, task: Mapping[str, Any], options: Mapping[str, Any],
                      schedules: Sequence[Mapping[str, Any]], side_by_side: bool,
                      environ: Mapping[str, str | None] | None = None) -> dict[str, Any]:
    """Run on a dask worker: measure `schedules` (one, or several side by side) with the
    worker's open `Measurer` of the task `key`, whose measuring process runs with the
    client's `environ` (THREAD_ENVIRON; None: unset). Returns JSON data: the measurements
    (`results`), the worker's address and the wall-clock interval of the measurement
    (`worker`, `started`, `ended`: seconds since the epoch, after waiting for the worker's
    measuring lock)."""
    with _MEASURING:
        started = time.time()
        _set_environ(environ or {})  # before the Measurer (re)starts its process
        m = _measurer(key, task, options)
        if side_by_side:
            results = [_as_data(r) for r in m.compare([dict(s) for s in schedules])]
        else:
            results = [_as_data(m(dict(schedules[0])))]
        ended = time.time()
    return {"results": results, "worker": _worker_address(), "started": started,
            "ended": ended}


def close_on_worker(key: str) -> bool:
    """Run on every dask worker: stop the `Measurer` of task `key` if one is open."""
    with _LOCK:
        m = _OPEN.pop(key, None)
    if m is not None:
        m.close()
    return m is not None


# ---- on the client ----------------------------------------------------------------------------

def _from_data(d: Mapping[str, Any]) -> Measurement:
    return Measurement(Status(d["status"]), d.get("time"), d.get("spread"),
                       int(d.get("workspace") or 0), bool(d.get("reproducible", True)),
                       str(d.get("error") or ""))


def worker_categories(client: Any) -> dict[str, dict[str, Any]]:
    """Each dask worker's machine category, by worker address."""
    return client.run(_category)


@dataclasses.dataclass(frozen=True)
class RemoteRun:
    """One measurement task as the worker reported it (for diagnostics and tests; the
    times are the worker's wall clock)."""

    worker: str
    started: float
    ended: float
    schedules: int


class ClusterMeasurer:
    """A `Measurer` look-alike for one kernel whose measurements run on the dask workers
    `workers` (see the module doc): `measure(schedule)`, `compare(schedules)`, and the
    search's batch interface `measure_batch(schedules, done)`; a context manager, as the
    driver uses it."""

    def __init__(self, client: Any, workers: Sequence[str], task: Task,
                 options: MeasureOptions) -> None:
        self.client = client
        self.workers = list(workers)
        self.task = {"builder": task.builder, "spec": dict(task.spec),
                     "reference": task.reference, "seed": task.seed}
        self.options = dataclasses.asdict(options)
        self.environ = {name: os.environ.get(name) for name in THREAD_ENVIRON}
        """The client's thread settings, which the workers' measuring processes get."""
        self.key = canonical_json({"task": self.task, "options": self.options,
                                   "environ": self.environ})
        self.restarts = 0
        """Candidates whose dask worker was lost (each re-sent or recorded as failed)."""
        self.sent = 0
        """Measurement tasks submitted."""
        self.runs: list[RemoteRun] = []
        """The tasks that came back, in the order they completed."""

    def _submit(self, schedules: Sequence[Mapping[str, Any]], side_by_side: bool) -> Any:
        """The future of one measurement task on a matching worker."""
        self.sent += 1
        return self.client.submit(measure_on_worker, self.key, self.task, self.options,
                                  [dict(s) for s in schedules], side_by_side, self.environ,
                                  workers=self.workers, allow_other_workers=False, pure=False)

    def _collect(self, fut: Any, n: int) -> list[Measurement]:
        """The measurements of a finished future of `n` schedules: failed ones when its
        worker was lost (dask already re-sent it as often as the scheduler allows)."""
        try:
            out = fut.result()
        except MeasureSetupError:
            raise  # the kernel cannot be measured at all: as a local Measurer reports it
        except Exception as exc:  # noqa: BLE001 - a lost worker (KilledWorker) or the like
            self.restarts += 1
            why = f"the dask worker measuring it was lost: {type(exc).__name__}: {exc}"
            return [Measurement(Status.FAILED, error=why)] * n
        self.runs.append(RemoteRun(str(out.get("worker", "")), float(out["started"]),
                                   float(out["ended"]), n))
        return [_from_data(d) for d in out["results"]]

    def _run(self, schedules: Sequence[Mapping[str, Any]], side_by_side: bool
             ) -> list[Measurement]:
        return self._collect(self._submit(schedules, side_by_side), len(schedules))

    def __call__(self, schedule: Mapping[str, Any]) -> Measurement:
        return self._run([schedule], False)[0]

    def compare(self, schedules: Sequence[Mapping[str, Any]]) -> list[Measurement]:
        """Side by side in one worker (as `Measurer.compare`)."""
        return self._run(schedules, True)

    def measure_batch(self, schedules: Sequence[Mapping[str, Any]],
                      done: Callable[[int, Measurement], None]) -> None:
        """Measure `schedules` in parallel on the workers, one task each, calling
        `done(index, measurement)` as each completes (the search commits it to the cache
        there). On an exception (Ctrl-C, a kernel that cannot be measured at all) the
        tasks still pending are cancelled; what was reported stays reported."""
        from distributed import as_completed

        index: dict[str, int] = {}
        futures = []
        try:
            for i, s in enumerate(schedules):
                fut = self._submit([s], False)
                index[fut.key] = i
                futures.append(fut)
            for fut in as_completed(futures):
                done(index[fut.key], self._collect(fut, 1)[0])
        finally:
            pending = [f for f in futures if not f.done()]
            if pending:
                with contextlib.suppress(Exception):
                    self.client.cancel(pending)

    def close(self) -> None:
        """Stop the kernel's measuring processes on the workers still there (asking a dead
        one would wait for the connection timeout)."""
        with contextlib.suppress(Exception):
            alive = set(self.client.scheduler_info().get("workers", {}))
            workers = [w for w in self.workers if w in alive]
            if workers:
                self.client.run(close_on_worker, self.key, workers=workers)

    def __enter__(self) -> ClusterMeasurer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclasses.dataclass(frozen=True)
class Factory:
    """`TuneOptions.measurer` of a cluster: a `ClusterMeasurer` per kernel."""

    client: Any
    workers: list[str]

    def __call__(self, task: Task, options: MeasureOptions) -> ClusterMeasurer:
        return ClusterMeasurer(self.client, self.workers, task, options)


@contextlib.contextmanager
def cluster_measurer(address: Any, category: Mapping[str, Any] | None = None,
                     log: Any = None) -> Iterator[Any]:
    """A `TuneOptions.measurer` measuring on the dask cluster at `address` (a scheduler
    address, or a `dask.distributed` Client or cluster object), on the workers whose category
    is `category` (default: this machine's)."""
    try:
        from distributed import Client
    except ImportError:
        raise ClusterError("--cluster needs dask.distributed: pip install "
                           "'nfc[distributed]'") from None
    from nfc.runtime.tuning.category import default_category, describe_category

    want = dict(category) if category is not None else default_category()
    own = not hasattr(address, "submit")
    try:
        client = Client(address, timeout=30) if own else address
    except OSError as exc:
        raise ClusterError(f"cannot reach the dask scheduler at {address}: {exc}") from None
    try:
        cats = worker_categories(client)
        workers = [w for w, c in cats.items() if category_id(c) == category_id(want)]
        if not workers:
            seen = sorted({describe_category(c) for c in cats.values()}) or ["no workers"]
            raise ClusterError(f"no dask worker of this machine's category "
                               f"({describe_category(want)}); the cluster has: "
                               f"{'; '.join(seen)}")
        if log is not None:
            log(f"nfc: measuring on {len(workers)} of {len(cats)} dask workers")
        yield Factory(client, workers)
    finally:
        if own:
            client.close()
