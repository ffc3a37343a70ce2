"""GPU schedules as data, the default rule of each kind and the enumerable spaces."""

from __future__ import annotations

import json

import numpy as np
import pytest
from cuda_lib import compute, inputs_of, ld, matmul, random_inputs, reference, tensor

from nfc.codegen.cuda.lower import lower_program
from nfc.codegen.cuda.schedule import (
    GPU_SCHEDULE_VERSION,
    ElementwiseSchedule,
    GemmSchedule,
    GpuScheduleError,
    ReduceSchedule,
    gpu_schedule_from_dict,
)
from nfc.codegen.cuda.sim import simulate
from nfc.codegen.cuda.space import classify, default_gpu_schedule, gpu_space, to_params
from nfc.ir import DType


@pytest.mark.parametrize("s", [ElementwiseSchedule(128, 4), ReduceSchedule("block", 512, False),
                               GemmSchedule("f16", 64, 32, 32, warps_m=2, warps_n=1),
                               GemmSchedule("fma", 32, 64, 8, 2, 4)])
def test_schedules_round_trip_through_json(s):
    d = json.loads(json.dumps(s.to_dict()))
    assert d["kind"] == s.kind and d["version"] == GPU_SCHEDULE_VERSION
    assert gpu_schedule_from_dict(d) == s


def test_foreign_schedules_are_refused():
    d = GemmSchedule().to_dict()
    with pytest.raises(GpuScheduleError, match="version 'old' is not"):
        gpu_schedule_from_dict(d | {"version": "old"})
    with pytest.raises(GpuScheduleError, match="unknown GPU schedule kind 'loop'"):
        gpu_schedule_from_dict(d | {"kind": "loop"})
    with pytest.raises(GpuScheduleError, match=r"unknown gemm schedule fields \['tile'\]"):
        gpu_schedule_from_dict(d | {"tile": 3})


@pytest.mark.parametrize("s,why", [
    (ElementwiseSchedule(100), "threads 100 is not a multiple of 32"),
    (ReduceSchedule("block", 96), "power-of-two thread count"),
    (ReduceSchedule("tree", 64), "unknown reduction strategy 'tree'"),
    (GemmSchedule("f16", 64, 64, 24), "block_k 24 is not a multiple of 16"),
    (GemmSchedule("f16", 128, 128, 16, warps_m=2, warps_n=2), "4x4 fragments per warp"),
    (GemmSchedule("tf32", 48, 64, 8), "not a whole number of 16x16 fragments"),
    (GemmSchedule("fma", 64, 64, 16, 3, 4), "thread tile 3x4 does not divide"),
    (GemmSchedule("fma", 64, 64, 16, 1, 1), "4096 threads per block"),
    (GemmSchedule("int8"), "unknown precision 'int8'"),
])
def test_invalid_schedules_say_why(s, why):
    assert why in s.problem()
    with pytest.raises(GpuScheduleError, match="invalid"):
        lower_program(matmul(64, 64, 64) if s.kind == "gemm" else compute(
            {"i": 8}, ld(tensor("x", (8, 4)), "i", "j"), reduce="sum", raxes={"j": 4})
            if s.kind == "reduce" else compute({"i": 8}, ld(tensor("x", (8,)), "i") * 2.0), s)


def test_default_rules():
    x = tensor("x", (64, 1000))
    assert classify(matmul(8, 8, 8)) == "gemm"
    tiny = compute({"i": 10}, ld(tensor("v", (10,)), "i") * 2.0)
    assert default_gpu_schedule(tiny) == ElementwiseSchedule(32)
    huge = compute({"i": 1 << 22}, ld(tensor("w", (1 << 22,)), "i") * 2.0)
    assert default_gpu_schedule(huge) == ElementwiseSchedule(256, 4)
    rows = compute({"i": 64}, ld(x, "i", "j"), reduce="sum", raxes={"j": 1000})
    assert default_gpu_schedule(rows) == ReduceSchedule("warp", 256)
    big = compute({"i": 2}, ld(tensor("y", (2, 100000)), "i", "j"), reduce="sum",
                  raxes={"j": 100000})
    assert default_gpu_schedule(big) == ReduceSchedule("block", 1024, True)
    small = compute({"i": 64}, ld(tensor("z", (64, 10)), "i", "j"), reduce="max",
                    raxes={"j": 10})
    assert default_gpu_schedule(small).strategy == "thread"
    assert default_gpu_schedule(matmul(256, 256, 256)) == GemmSchedule("fma", 64, 64, 16, 4, 4)
    assert default_gpu_schedule(matmul(10, 300, 5)) == GemmSchedule("fma", 16, 64, 8, 2, 4)
    h = default_gpu_schedule(matmul(256, 20, 256, DType.F16))
    assert (h.precision, h.block_m, h.block_n, h.frag_m, h.frag_n) == ("f16", 64, 32, 2, 1)
    assert default_gpu_schedule(matmul(64, 64, 64, DType.BF16)).precision == "bf16"


def test_lossy_precisions_only_on_request():
    assert gpu_space(matmul(64, 64, 64)).params["precision"] == ("fma",)
    assert gpu_space(matmul(64, 64, 64, DType.F16)).params["precision"] == ("f16",)
    space = gpu_space(matmul(64, 64, 64), precisions=("fma", "tf32"))
    assert {s.precision for s in space.candidates()} == {"fma", "tf32"}


@pytest.mark.parametrize("op", [matmul(40, 24, 40), matmul(40, 24, 40, DType.F16),
                                compute({"i": 30}, ld(tensor("x", (30, 50)), "i", "j"),
                                        reduce="sum", raxes={"j": 50}),
                                compute({"i": 30}, ld(tensor("x", (30,)), "i") + 1.0)],
                         ids=["gemm", "wmma", "reduce", "elementwise"])
def test_spaces_enumerate_valid_schedules_that_compute_the_same(op):
    space = gpu_space(op)
    cands = list(space.candidates())
    assert len(cands) == len(set(cands)) >= 8
    assert space.to_schedule(space.default()) == default_gpu_schedule(op)
    assert space.is_valid(space.default())
    assert all(space.to_schedule(to_params(s)) == s for s in cands)
    ins = random_inputs(inputs_of(op), 0)
    want = reference(op, ins)[0]
    rng = np.random.default_rng(0)
    for n in rng.choice(len(cands), 4, replace=False):  # a sample: each lowers and agrees
        (got,) = simulate(lower_program(op, cands[n]), ins)
        tol = 2e-2 if op.result.dtype is DType.F16 else 2e-5
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol)
