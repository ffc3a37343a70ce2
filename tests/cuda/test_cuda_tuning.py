"""The GPU schedule space explored by nfc's genetic search (nfc.runtime.tuning.search.tune)
with the simulator's measurer (nfc.runtime.tuning.gpu.SimMeasurer): every candidate lowered,
simulated and checked against the interpreter's error bound; broken candidates rejected."""

from __future__ import annotations

import json

import numpy as np
import pytest
from cuda_lib import F16, compute, drop_barrier, ld, matmul, random_inputs, reference, tensor
from cuda_lib import with_body as _with_body

from nfc.codegen.cuda.lower import lower_program
from nfc.codegen.cuda.schedule import ElementwiseSchedule, GemmSchedule
from nfc.codegen.cuda.sim import simulate
from nfc.codegen.cuda.space import gpu_space
from nfc.runtime.tuning.gpu import (
    SimMeasurer,
    check_outputs,
    gpu_schedule_for,
    launch_cost,
    reference_bounds,
    search_space,
    tune_gpu_op,
)
from nfc.runtime.tuning.model import Status
from nfc.runtime.tuning.search import SearchConfig

OPS = {
    "gemm": lambda: matmul(40, 24, 40),
    "wmma_f16": lambda: matmul(40, 48, 50, F16),
    "reduce": lambda: compute({"i": 30}, ld(tensor("x", (30, 50)), "i", "j"), reduce="sum",
                              raxes={"j": 50}),
    "elementwise": lambda: compute({"i": 300}, ld(tensor("x", (300,)), "i") * 2.0 + 1.0),
}
CONFIG = SearchConfig(population=6, trials=12, patience=3, seed=1)


def _search(op, **kw):
    m = SimMeasurer(op, **kw)
    return tune_gpu_op(op, m, config=CONFIG), m


@pytest.mark.parametrize("name", list(OPS))
def test_search_visits_distinct_valid_candidates_that_agree_with_the_interpreter(name):
    op = OPS[name]()
    res, m = _search(op)
    space = search_space(op)
    schedules = [s for s, _ in m.results.values()]
    assert len(schedules) == len(set(schedules)) >= 8  # distinct schedules, not just dicts
    assert all(space.is_valid({k: v for k, v in _params(s).items() if k in space.params})
               for s in schedules)
    assert all(meas.status is Status.OK for _, meas in m.results.values()), \
        [meas.error for _, meas in m.results.values()]
    costs = {json.dumps(s.to_dict(), sort_keys=True): meas.time for s, meas in
             m.results.values()}
    chosen = space.to_schedule(res.schedule)
    assert res.time == costs[json.dumps(chosen.to_dict(), sort_keys=True)] == min(
        costs.values())
    # the chosen schedule independently against the interpreter (not the measurer's check)
    ins = random_inputs(list(op.operands), 3)
    (got,) = simulate(lower_program(op, chosen), ins)
    want = reference(op, ins)[0]
    tol = 2e-2 if op.result.dtype is F16 else 2e-5
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol)


def _params(s):
    from nfc.codegen.cuda.space import to_params

    return to_params(s)


def test_a_racy_candidate_is_rejected_not_chosen():
    op = matmul(40, 24, 40)
    clean, _ = _search(op)
    winner = search_space(op).to_schedule(clean.schedule)

    def broken_lower(op, schedule):  # the winner loses the barrier after its tile copy
        prog = lower_program(op, schedule)
        return _with_body(prog, lambda b: drop_barrier(b, 0)) if schedule == winner else prog

    res, m = _search(op, lower=broken_lower)
    meas = m.results[json.dumps(winner.to_dict(), sort_keys=True)][1]
    assert meas.status is Status.FAILED and "RaceError" in meas.error
    assert search_space(op).to_schedule(res.schedule) != winner
    assert res.failed >= 1 and res.time is not None


def test_a_wrong_candidate_is_rejected_not_chosen():
    op = OPS["reduce"]()
    clean, _ = _search(op)
    winner = search_space(op).to_schedule(clean.schedule)
    target = {"prog": None}

    def broken_lower(op, schedule):
        prog = lower_program(op, schedule)
        if schedule == winner:
            target["prog"] = prog
        return prog

    def off_by_a_little(prog, inputs, **kw):  # one element 1e-3 off: beyond the f32 bound
        outs = simulate(prog, inputs, **kw)
        if prog is target["prog"]:
            outs[0] = outs[0].copy()
            outs[0][7] += 1e-3
        return outs

    res, m = _search(op, lower=broken_lower, simulate=off_by_a_little)
    meas = m.results[json.dumps(winner.to_dict(), sort_keys=True)][1]
    assert meas.status is Status.WRONG and "(7,)" in meas.error
    assert search_space(op).to_schedule(res.schedule) != winner


def test_lossy_precisions_are_checked_against_a_widened_bound():
    op = matmul(40, 48, 50)  # f32 inputs through f16 Tensor Cores: outside the f32 bound
    m = SimMeasurer(op, search_space(op, ("fma", "f16")))
    s = GemmSchedule("f16", 32, 32, 32)
    prog = lower_program(op, s)
    got = simulate(prog, m.inputs)
    assert check_outputs(got, reference_bounds(op, m.inputs, "fma"))  # too far for f32
    assert not check_outputs(got, reference_bounds(op, m.inputs, "f16"))
    assert m.measure_schedule(s).status is Status.OK


def test_resources_are_checked_before_simulating(monkeypatch):
    from nfc.codegen.cuda import nvrtc

    pytest.importorskip("cuda.bindings.nvrtc")
    try:
        nvrtc.nvrtc_version()
    except nvrtc.CudaToolchainError as exc:
        pytest.skip(str(exc))
    op = OPS["elementwise"]()
    tiny = nvrtc.Arch("sm_80", nvrtc.ARCHS["sm_80"].smem_per_sm, regs_per_sm=1024)
    monkeypatch.setitem(nvrtc.ARCHS, "sm_80", tiny)
    calls = []
    m = SimMeasurer(op, nvrtc_arch="sm_80",
                    simulate=lambda *a, **k: calls.append(1) or simulate(*a, **k))
    meas = m.measure_schedule(ElementwiseSchedule(256, 1))
    assert meas.status is Status.FAILED and "registers" in meas.error and not calls


def test_launch_cost_is_a_deterministic_model():
    op = compute({"i": 1 << 20}, ld(tensor("x", (1 << 20,)), "i") * 2.0)
    one = lower_program(op, ElementwiseSchedule(256, 1))
    assert launch_cost(one) == launch_cost(lower_program(op, ElementwiseSchedule(256, 1)))
    # 4x the outputs: the memory term grows 4x past the launch overhead
    big = compute({"i": 1 << 22}, ld(tensor("x", (1 << 22,)), "i") * 2.0)
    a, b = launch_cost(one) - 3e-6, launch_cost(lower_program(big, ElementwiseSchedule(256, 1)))
    assert b - 3e-6 == pytest.approx(4 * a, rel=0.01)
    assert launch_cost(one, "sm_90") < launch_cost(one, "sm_80")  # more bandwidth


def test_chosen_schedules_become_a_schedule_for():
    from nfc.runtime.tuning.kernels import kernel_key

    op = OPS["gemm"]()
    res, _ = _search(op)
    chosen = search_space(op).to_schedule(res.schedule)
    lookup = gpu_schedule_for({kernel_key(op): chosen.to_dict()})
    assert lookup(op) == chosen
    assert lookup(OPS["reduce"]()) is None
    assert gpu_space(op).is_valid(_params(chosen) | {k: v[0] for k, v in
                                                     gpu_space(op).params.items()
                                                     if k not in _params(chosen)})


def _fake_device():
    from nfc.codegen.cuda import nvrtc
    from nfc.codegen.cuda.driver import Device
    from nfc.codegen.cuda.fakedriver import FakeDriver

    pytest.importorskip("cuda.bindings.nvrtc")
    try:
        nvrtc.nvrtc_version()
    except nvrtc.CudaToolchainError as exc:
        pytest.skip(str(exc))
    fake = FakeDriver({})
    return Device(driver=fake), fake


def test_the_device_measurer_compiles_checks_and_times_through_the_driver():
    from nfc.runtime.tuning.gpu import DeviceMeasurer

    dev, fake = _fake_device()
    op = OPS["elementwise"]()
    m = DeviceMeasurer(op, dev, repeats=2, rounds=2, warmup=1)
    meas = m.measure_schedule(ElementwiseSchedule(64, 2))
    assert meas.status is Status.OK and meas.time is not None and meas.time > 0, meas.error
    # one checked run, one warm-up, 2 rounds of 2 timed runs: 6 launches of its one kernel
    assert fake.counters["launches"] == 6
    assert fake.allocations == {}  # every buffer freed


def test_the_device_measurer_rejects_by_resources_before_launching(monkeypatch):
    from nfc.codegen.cuda import nvrtc
    from nfc.runtime.tuning.gpu import DeviceMeasurer

    dev, fake = _fake_device()
    monkeypatch.setitem(nvrtc.ARCHS, dev.arch, nvrtc.Arch(dev.arch, 1 << 20, regs_per_sm=1024))
    m = DeviceMeasurer(OPS["elementwise"](), dev, repeats=1, rounds=1)
    meas = m.measure_schedule(ElementwiseSchedule(256, 1))
    assert meas.status is Status.FAILED and meas.error.startswith("resources: ")
    assert fake.counters["launches"] == 0


def test_a_tuned_stage_schedule_reaches_the_fused_groups_kernels():
    """After fusion a GEMM is a stage of a group: the schedule tuned for the unfused compute
    (the same kernel key) is the one its kernel is lowered with."""
    from pathlib import Path

    from nfc.codegen.cuda.space import classify, default_gpu_schedule
    from nfc.codegen.lower import group_stages
    from nfc.ir import KernelOp
    from nfc.runtime.cuda_load import build_cuda_module, cuda_artifact
    from nfc.runtime.tuning.kernels import kernel_key

    mlp = str(Path(__file__).resolve().parents[2] / "examples" / "mlp.nf")
    module = build_cuda_module(mlp, ["batch=4"])
    fwd = module.func("forward")
    stage = next(st for op in fwd.body.ops if isinstance(op, KernelOp)
                 for st, _ in group_stages(op, None) if classify(st) == "gemm")
    other = next(s for s in gpu_space(stage).candidates()
                 if s != default_gpu_schedule(stage))
    art = cuda_artifact(module, functions=["forward"], schedules={kernel_key(stage): other},
                        compile=False)
    assert other in [k.schedule for k in art.step.kernels.values()]
    plain = cuda_artifact(module, functions=["forward"], compile=False)
    assert other not in [k.schedule for k in plain.step.kernels.values()]
