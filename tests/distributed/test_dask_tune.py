"""`nfc tune --cluster`: candidates measured on the workers of a dask LocalCluster (2 worker
processes), the search and the cache on the client. The cache is filled exactly like a local
run's (the same candidates of the same kernels, all measured fine), the candidates of a
generation are measured at the same time on both workers, and a worker killed while it
measures loses nothing: its candidate is measured by the other worker."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("distributed", reason="the distributed extra (dask.distributed) is not "
                    "installed: pip install 'nfc[distributed]'")

from nfc.runtime.distributed.dask_tune import (  # noqa: E402
    ClusterError,
    ClusterMeasurer,
    cluster_measurer,
)
from nfc.runtime.tuning.cache import TuningCache  # noqa: E402
from nfc.runtime.tuning.category import default_category  # noqa: E402
from nfc.runtime.tuning.driver import TuneOptions, build_model, tune_module  # noqa: E402
from nfc.runtime.tuning.model import Status  # noqa: E402

TINY = """\
import std.nn

model tiny(batch = 8) {
  input  x: f32[batch, 16]
  input  y: i32[batch]
  param  w: f32[16, 8] = he_normal
  param  b: f32[8] = zeros
  logits = linear(x, w, b)
  loss = softmax_cross_entropy(logits, y)
  output logits
  minimize loss with sgd(lr = 0.1)
}
"""


@pytest.fixture(scope="module")
def cluster():
    from distributed import LocalCluster

    c = LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                     dashboard_address=None, silence_logs=40)
    yield c
    c.close()


@pytest.fixture(scope="module")
def module(tmp_path_factory: pytest.TempPathFactory) -> Any:
    path = tmp_path_factory.mktemp("tiny") / "tiny.nf"
    path.write_text(TINY)
    return build_model(path)


@pytest.fixture(scope="module")
def local(module: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[int, Any]:
    """(candidates measured, the cache's records) of a local run."""
    db = tmp_path_factory.mktemp("local") / "local.sqlite"
    with TuningCache(db) as cache:
        report = tune_module(module, cache, options=_options())
    return report.measured, _records(db)


def _options(**kw: Any) -> TuneOptions:
    # fewer trials than a generation: the default and seeded random candidates, so the
    # candidates do not depend on the times measured (which differ between runs)
    return TuneOptions(trials=3, top=2, order="cost", population=4, patience=100, confirm=0,
                       **kw)


def _records(db: Path) -> dict[str, set[tuple[str, str]]]:
    import json

    cat = default_category()
    with TuningCache(db, create=False) as cache:
        return {k.key: {(json.dumps(e.schedule, sort_keys=True), e.status.value)
                        for e in cache.entries(cat, k.key, include_pruned=True)}
                for k in cache.list_keys(cat)}


class Killer(ClusterMeasurer):
    """Kills the dask worker that runs its first measurement, while it runs it."""

    killed: list[str] = []

    def _submit(self, schedules: Any, side_by_side: bool) -> Any:
        fut = super()._submit(schedules, side_by_side)
        if not Killer.killed:
            pids = self.client.run(os.getpid)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not Killer.killed:
                for addr, keys in self.client.processing().items():
                    if fut.key in keys and not fut.done():
                        os.kill(pids[addr], signal.SIGKILL)
                        Killer.killed.append(addr)
                        break
                time.sleep(0.005)
        return fut


@pytest.fixture(scope="module")
def remote(module: Any, cluster: Any, tmp_path_factory: pytest.TempPathFactory
           ) -> tuple[Any, list[ClusterMeasurer], Any, int]:
    """(report, the kernels' measurers, the cache's records, matching workers) of a run
    through the cluster."""
    db = tmp_path_factory.mktemp("dask") / "dask.sqlite"
    sent: list[ClusterMeasurer] = []
    with cluster_measurer(cluster) as make, TuningCache(db) as cache:
        def counting(task: Any, options: Any) -> ClusterMeasurer:
            sent.append(make(task, options))
            return sent[-1]

        report = tune_module(module, cache, options=_options(measurer=counting))
    return report, sent, _records(db), len(make.workers)


def test_cluster_tuning_fills_the_cache_like_local_tuning(local: Any, remote: Any) -> None:
    report, sent, got, workers = remote
    assert workers == 2
    assert sum(m.sent for m in sent) == local[0] == report.measured == 6
    assert got == local[1] and len(got) == 2
    assert all(status == Status.OK.value for recs in got.values() for _, status in recs)


def _meeting(directory: str, wait: float = 60.0) -> Any:
    """`measure_on_worker` behind a meeting point (a function pickled by value, as it is
    local): each task marks itself running in `directory` and, until two tasks have been
    running at the same moment (`met`) or one gave up after `wait` seconds (`gave-up`), waits
    for another to arrive before it measures. No timing decides the outcome: only whether a
    second task starts while the first is still running."""

    def meet_then_measure(*args: Any) -> Any:
        import uuid
        from pathlib import Path

        from nfc.runtime.distributed.dask_tune import measure_on_worker

        d = Path(directory)
        mine = d / f"running-{uuid.uuid4().hex}"
        mine.touch()
        try:
            deadline = time.monotonic() + wait
            while not (d / "met").exists() and not (d / "gave-up").exists():
                if len(list(d.glob("running-*"))) >= 2:
                    (d / "met").touch()
                elif time.monotonic() > deadline:
                    (d / "gave-up").touch()
                else:
                    time.sleep(0.01)
            return measure_on_worker(*args)
        finally:
            mine.unlink()
    return meet_then_measure


class Meeting(ClusterMeasurer):
    """Submits the measurements of a batch of several candidates through `_meeting`."""

    directory = ""

    def measure_batch(self, schedules: Any, done: Any) -> None:
        self.together = len(schedules) > 1
        try:
            super().measure_batch(schedules, done)
        finally:
            self.together = False

    def _submit(self, schedules: Any, side_by_side: bool) -> Any:
        if not getattr(self, "together", False):
            return super()._submit(schedules, side_by_side)
        self.sent += 1
        return self.client.submit(_meeting(Meeting.directory), self.key, self.task,
                                  self.options, [dict(s) for s in schedules], side_by_side,
                                  self.environ, workers=self.workers,
                                  allow_other_workers=False, pure=False)


def test_a_generation_is_measured_concurrently_on_both_workers(module: Any, cluster: Any,
                                                               local: Any,
                                                               tmp_path: Path) -> None:
    # the candidates of a generation (up to the trial budget of 3) go out at once, so two
    # of them run on the two workers at the same time (sent one at a time, the first would
    # wait at the meeting point in vain)
    Meeting.directory = str(tmp_path)
    sent: list[ClusterMeasurer] = []
    with cluster_measurer(cluster) as make, TuningCache(tmp_path / "dask.sqlite") as cache:
        def meeting(task: Any, options: Any) -> ClusterMeasurer:
            sent.append(Meeting(make.client, make.workers, task, options))
            return sent[-1]

        report = tune_module(module, cache, options=_options(measurer=meeting))
    runs = [r for m in sent for r in m.runs]
    assert (tmp_path / "met").exists() and not (tmp_path / "gave-up").exists(), runs
    assert [len(m.runs) for m in sent] == [3, 3] and report.measured == 6
    assert len({r.worker for r in runs}) == 2  # the workers reported who measured what
    assert _records(tmp_path / "dask.sqlite") == local[1]


def test_a_worker_killed_mid_measurement_loses_only_that_attempt(module: Any, cluster: Any,
                                                                 local: Any,
                                                                 tmp_path: Path) -> None:
    with cluster_measurer(cluster) as make, TuningCache(tmp_path / "dask.sqlite") as cache:
        def killing(task: Any, options: Any) -> ClusterMeasurer:
            return Killer(make.client, make.workers, task, options)

        report = tune_module(module, cache, options=_options(measurer=killing))
    assert Killer.killed, "no measurement was caught running"
    assert report.measured == 6
    # dask gave the killed worker's candidate to the other one: the cache is complete
    assert _records(tmp_path / "dask.sqlite") == local[1]


def test_no_worker_of_this_category_is_refused(cluster: Any) -> None:
    other = dict(default_category(), device="another CPU")
    with pytest.raises(ClusterError, match="no dask worker of this machine's category"), \
            cluster_measurer(cluster, category=other):
        pass


def test_the_measuring_process_gets_the_clients_thread_settings(
        module: Any, cluster: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # a dask nanny starts its workers with OMP_NUM_THREADS=1: without the client's setting a
    # parallel kernel would be timed on one thread and recorded as this machine's time
    from nfc.codegen.kernel_spec import space
    from nfc.runtime.tuning.driver import BUILDER, REFERENCE
    from nfc.runtime.tuning.kernels import collect_kernels, kernel_spec
    from nfc.runtime.tuning.measure import MeasureOptions, Task

    def thread_environ() -> dict[str, str | None]:
        return {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "NFC_THREADS_BACKEND")}

    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    monkeypatch.delenv("NFC_THREADS_BACKEND", raising=False)
    spec = kernel_spec(collect_kernels(module, ["train_step"])[0])
    with cluster_measurer(cluster) as make, \
            make(Task(BUILDER, spec, reference=REFERENCE, seed=0), MeasureOptions()) as m:
        assert m(space(spec).default()).status is Status.OK
        worker = m.runs[0].worker
        seen = m.client.run(thread_environ, workers=[worker])[worker]
    assert seen == {"OMP_NUM_THREADS": "2", "NFC_THREADS_BACKEND": None}
