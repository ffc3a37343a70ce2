"""GPU candidates measured in a worker process (nfc.runtime.tuning.gpu_worker): a hanging
kernel is a `timeout`, a faulting one (a sticky illegal address) `failed` with the driver's
message, a crashing worker `failed` with its exit status; each costs one worker restart and
the search goes on. The worker runs the fake driver with fault hooks (fake_gpu_faults.py):
no GPU is needed, NVRTC is (every candidate is compiled)."""

from __future__ import annotations

import glob
import os

import numpy as np
import pytest
from cuda_lib import compute, ld, reference, tensor

from nfc.codegen.cuda.lower import lower_program
from nfc.codegen.cuda.sim import simulate
from nfc.runtime.tuning.gpu import random_inputs, search_space, tune_gpu_op
from nfc.runtime.tuning.gpu_worker import GpuWorker, GpuWorkerOptions, WorkerDeviceMeasurer
from nfc.runtime.tuning.measure import MeasureSetupError
from nfc.runtime.tuning.model import Status
from nfc.runtime.tuning.search import SearchConfig

FAULTY = "fake_gpu_faults:faulty_driver"


@pytest.fixture(autouse=True)
def _nvrtc():
    from nfc.codegen.cuda import nvrtc

    pytest.importorskip("cuda.bindings.nvrtc")
    try:
        nvrtc.nvrtc_version()
    except nvrtc.CudaToolchainError as exc:
        pytest.skip(str(exc))


def _op():
    return compute({"i": 300}, ld(tensor("x", (300,)), "i") * 2.0 + 1.0)


def _options(**hooks):
    # timeout: far above a candidate's run (under 1 s on the fake driver, loaded machine
    # included), far below the hang (an hour)
    return GpuWorkerOptions(timeout=15, repeats=1, rounds=1, warmup=0, driver=FAULTY,
                            driver_spec={k: [s.to_dict() for s in v] for k, v in hooks.items()})


def _children():
    """Processes whose parent is this one, zombies included (from /proc/*/stat)."""
    out = set()
    for f in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(f) as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        if int(fields[1]) == os.getpid():
            out.add(int(f.split("/")[2]))
    return out


def _reaped(pid):
    try:
        os.kill(pid, 0)  # a zombie still takes a signal: only a reaped process is gone
    except ProcessLookupError:
        return True
    return False


def test_hangs_faults_and_crashes_cost_a_restart_each_and_the_search_goes_on():
    op = _op()
    space = search_space(op)
    cands = list(space.space.candidates())
    hang, fault, crash, skip = cands[1], cands[2], cands[3], cands[4]
    good = [cands[0], *cands[5:8]]
    bad = {hang, fault, crash, skip}
    before = _children()
    with GpuWorker(_options(hang=[hang], fault=[fault], exit=[crash], skip=[skip])) as worker:
        m = WorkerDeviceMeasurer(op, worker, space)
        order = [good[0], hang, good[1], fault, good[2], crash, good[3], skip]
        got = {s: m.measure_schedule(s) for s in order}
        assert got[hang].status is Status.TIMEOUT and "over 15 s" in got[hang].error
        assert got[fault].status is Status.FAILED
        assert "CUDA_ERROR_ILLEGAL_ADDRESS" in got[fault].error
        assert got[crash].status is Status.FAILED and "exited with code 7" in got[crash].error
        assert got[skip].status is Status.WRONG  # the check against the interpreter's bound
        # every good candidate after a bad one ran in a new worker, correctly
        assert all(got[s].status is Status.OK and got[s].time > 0 for s in good), \
            [got[s].error for s in good]
        assert worker.restarts == 3 and len(set(worker.pids)) == 4
        res = tune_gpu_op(op, m, space=space,
                          config=SearchConfig(population=6, trials=12, patience=3, seed=1))
        pids = list(worker.pids)
    assert all(_reaped(p) for p in pids)  # no worker left running, no zombie
    assert _children() <= before
    chosen = space.to_schedule(res.schedule)
    assert res.time is not None and chosen not in bad and space.is_valid(res.schedule)
    measured = {s: meas for s, meas in m.results.values()}
    assert measured[chosen].status is Status.OK and res.time == measured[chosen].time
    assert len(measured) > len(order)  # the search measured more, through the same worker
    # the chosen schedule independently against the interpreter
    ins = random_inputs(op, 3)
    (out,) = simulate(lower_program(op, chosen), ins)
    np.testing.assert_allclose(out.astype(np.float64), reference(op, ins)[0], rtol=2e-5,
                               atol=2e-5)


def test_the_worker_names_its_device_and_measures_as_the_in_process_measurer():
    from nfc.codegen.cuda.driver import Device
    from nfc.codegen.cuda.fakedriver import FakeDriver
    from nfc.runtime.tuning.gpu import DeviceMeasurer

    op = _op()
    s = list(search_space(op).space.candidates())[5]
    with GpuWorker(_options()) as worker:
        info = worker.start()
        m = WorkerDeviceMeasurer(op, worker)
        remote = m.measure_schedule(s)
    assert info["arch"] == "sm_90" and "FakeDriver" in info["name"]
    local = DeviceMeasurer(op, Device(driver=FakeDriver({})), repeats=1, rounds=1,
                           warmup=0).measure_schedule(s)
    assert remote.status is local.status is Status.OK and worker.restarts == 0


def test_a_worker_that_cannot_start_is_a_setup_error_not_a_traceback():
    before = _children()
    worker = GpuWorker(GpuWorkerOptions(driver="fake_gpu_faults:no_such_factory"))
    with pytest.raises(MeasureSetupError, match="did not start.*no_such_factory"):
        worker.start()
    worker.close()
    assert _children() <= before  # the failed worker was reaped
    with pytest.raises(TypeError):
        GpuWorker(GpuWorkerOptions(driver=FAULTY, driver_spec={"bad": object()}))
