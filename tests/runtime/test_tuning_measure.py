"""Measuring in worker processes: crashes, hangs, exceptions and wrong results are recorded as
failures and the caller carries on; real timing; tuning with a real worker."""

from __future__ import annotations

import numpy as np
import pytest
from tuning_fakes import CATEGORY

from nfc.runtime.tuning import synthetic
from nfc.runtime.tuning.cache import TuningCache
from nfc.runtime.tuning.measure import MeasureOptions, Measurer, MeasureSetupError, Task
from nfc.runtime.tuning.model import Status
from nfc.runtime.tuning.search import SearchConfig, tune
from nfc.runtime.tuning.worker import make_inputs

SPEC = synthetic.make_spec(16)
TASK = Task(synthetic.BUILDER, SPEC, reference=synthetic.REFERENCE, seed=5)
# the hangs below cost `timeout` each, so it is short; but a candidate that must succeed runs a
# 16x16 product a few times, far below it even on a slow, loaded machine, and builds that must
# succeed get a generous limit (the build hang has its own measurer with a short one)
QUICK = MeasureOptions(timeout=3.0, build_timeout=60.0, repeats=3, min_repeat_time=1e-4)
BUILD_HANG = MeasureOptions(timeout=3.0, build_timeout=0.5, repeats=3, min_repeat_time=1e-4)


def test_faults_are_reported_and_the_worker_recovers() -> None:
    with Measurer(TASK, QUICK) as measure:
        results = {fault: measure({"block": 4, "reps": 1, "fault": fault})
                   for fault in ("none", "raise", "crash", "exit", "hang", "wrong")}
        again = measure({"block": 8, "reps": 1, "fault": "none"})
        assert measure.restarts == 3  # crash, exit, hang
    with Measurer(TASK, BUILD_HANG) as measure:
        build_hang = measure({"block": 8, "reps": 1, "fault": "build-hang"})
        after = measure({"block": 4, "reps": 1, "fault": "none"})
        assert measure.restarts == 1
    assert after.status is Status.OK
    ok = results["none"]
    assert ok.status is Status.OK and ok.time > 0 and ok.spread >= 0 and ok.error == ""
    assert ok.workspace == 4 * 16 * 4 and ok.reproducible
    assert results["raise"].status is Status.FAILED and "injected failure" in \
        results["raise"].error
    assert results["crash"].status is Status.FAILED and "SIGSEGV" in results["crash"].error
    assert results["exit"].status is Status.FAILED and "code 3" in results["exit"].error
    assert results["hang"].status is Status.TIMEOUT
    assert results["wrong"].status is Status.WRONG and "differs" in results["wrong"].error
    assert again.status is Status.OK and again.workspace == 8 * 16 * 4
    assert build_hang.status is Status.TIMEOUT and "build" in build_hang.error


def test_more_work_measures_slower() -> None:
    # real timing, not a constant: 12 times the work must measure slower. Timed side by side
    # (`compare` alternates the two), so a disturbance of the machine hits both alike; the
    # assertion is only the order, which holds on any machine however fast or loaded
    spec = synthetic.make_spec(64)
    opts = MeasureOptions(repeats=7, min_repeat_time=2e-3)
    with Measurer(Task(synthetic.BUILDER, spec, synthetic.REFERENCE), opts) as measure:
        one, many = measure.compare([{"block": 4, "reps": 1}, {"block": 4, "reps": 12}])
    assert one.status is Status.OK and many.status is Status.OK
    assert many.time > one.time > 0


def test_tuning_with_a_real_worker_records_crashes_and_hangs() -> None:
    space = synthetic.SyntheticSpace(n=16, blocks=(8, 16), reps=(1,),
                                     faults=("none", "crash", "hang"))
    with TuningCache(":memory:") as cache, Measurer(TASK, QUICK) as measure:
        result = tune(space, measure, cache=cache, category=CATEGORY, key="mm16",
                      config=SearchConfig(population=3, trials=None, patience=99))
        entries = cache.entries(CATEGORY, "mm16", include_pruned=True)
    assert result.stop_reason == "exhausted" and result.evaluated == 6
    assert result.schedule["fault"] == "none" and result.time <= result.default_time
    by_fault = {}
    for e in entries:
        by_fault.setdefault(e.schedule["fault"], set()).add(e.status)
    assert by_fault == {"none": {Status.OK}, "crash": {Status.FAILED},
                        "hang": {Status.TIMEOUT}}


def test_a_task_that_cannot_run_at_all_is_an_error_not_a_record() -> None:
    with pytest.raises(MeasureSetupError, match="nfc.runtime.tuning.nonexistent"), \
            Measurer(Task("nfc.runtime.tuning.nonexistent:build", SPEC)) as measure:
        measure({"block": 4})
    with pytest.raises(MeasureSetupError, match="not of the form"), \
            Measurer(Task(synthetic.BUILDER, SPEC, reference="no-colon")) as measure:
        measure({"block": 4})
    with pytest.raises(TypeError):
        Measurer(Task(synthetic.BUILDER, {"bad": object()}))


def test_inputs_are_reproducible_from_the_seed() -> None:
    a, b = make_inputs(SPEC, 5), make_inputs(SPEC, 5)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not np.array_equal(a[0], make_inputs(SPEC, 6)[0])
    assert [x.shape for x in a] == [(16, 16), (16, 16)] and a[0].dtype == np.float32
    ints = make_inputs({"inputs": [{"shape": [100], "dtype": "int32", "low": 0, "high": 3}]}, 0)
    assert ints[0].dtype == np.int32 and set(np.unique(ints[0])) <= {0, 1, 2}
