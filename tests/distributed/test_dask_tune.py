"""`nfc tune --cluster`: candidates measured on the workers of a dask LocalCluster (2 worker
processes), the search and the cache on the client. The cache is filled exactly like a local
run's (the same candidates of the same kernels, all measured fine), and a worker killed while
it measures loses nothing: its candidate is measured by the other worker."""

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


def test_cluster_tuning_fills_the_cache_like_local_tuning(module: Any, cluster: Any,
                                                          local: Any, tmp_path: Path) -> None:
    sent: list[ClusterMeasurer] = []
    with cluster_measurer(cluster) as make, TuningCache(tmp_path / "dask.sqlite") as cache:
        assert len(make.workers) == 2

        def counting(task: Any, options: Any) -> ClusterMeasurer:
            sent.append(make(task, options))
            return sent[-1]

        remote = tune_module(module, cache, options=_options(measurer=counting))
    assert sum(m.sent for m in sent) == local[0] == remote.measured == 6
    got = _records(tmp_path / "dask.sqlite")
    assert got == local[1] and len(got) == 2
    assert all(status == Status.OK.value for recs in got.values() for _, status in recs)


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
