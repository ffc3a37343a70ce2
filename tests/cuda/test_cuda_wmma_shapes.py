"""The WMMA fragment shapes of `GemmSchedule.wmma_shape` (f16/bf16 m16n16k16, m32n8k16,
m8n32k16; tf32 m16n16k8): simulated against the interpreter on aligned and ragged GEMMs,
compiled by NVRTC, run as CUDA C on CPU threads; illegal combinations refused with a reason;
old records; the search space that holds the knob."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from cuda_lib import inputs_of, matmul, random_inputs, reference
from test_cuda_gemm_knobs import _check

from nfc.codegen.cuda.gemm import STATIC_SHARED_LIMIT, shared_bytes
from nfc.codegen.cuda.lower import lower_program
from nfc.codegen.cuda.render import render_program
from nfc.codegen.cuda.schedule import GemmSchedule, GpuScheduleError, gpu_schedule_from_dict
from nfc.codegen.cuda.sim import simulate
from nfc.codegen.cuda.space import GEMM_PARAMS, WMMA_KEYS, gpu_space, to_params
from nfc.ir import DType

_DT = {"f16": DType.F16, "bf16": DType.BF16}
#: shape -> a schedule of it (precision filled in per case)
_SCHEDULES = {
    "": GemmSchedule("f16", 32, 32, 16, warps_m=2, warps_n=2),
    "32x8x16": GemmSchedule("f16", 64, 8, 32, warps_m=2, warps_n=1, wmma_shape="32x8x16"),
    "8x32x16": GemmSchedule("f16", 16, 64, 16, warps_m=1, warps_n=2, wmma_shape="8x32x16"),
}
_SIZES = {"aligned": (64, 64, 64), "ragged": (40, 44, 56)}
CASES = [(p, shape, size) for p in _DT for shape in _SCHEDULES for size in _SIZES]
_IDS = [f"{p}-{shape or 'default'}-{size}" for p, shape, size in CASES]


def _case(p: str, shape: str, size: str, **kw: object):
    op = matmul(*_SIZES[size], _DT[p])
    return op, dataclasses.replace(_SCHEDULES[shape], precision=p, **kw)


def test_shapes_give_their_fragments_and_blocks():
    s = _SCHEDULES["32x8x16"]
    assert (s.mnk, s.frag_m, s.frag_n, s.threads) == ((32, 8, 16), 1, 1, 64)
    s = _SCHEDULES["8x32x16"]
    assert (s.mnk, s.frag_m, s.frag_n, s.threads) == ((8, 32, 16), 2, 1, 64)
    assert _SCHEDULES[""].mnk == (16, 16, 16) and GemmSchedule("tf32").mnk == (16, 16, 8)
    for s in _SCHEDULES.values():
        assert s.problem() is None
        m, n, _ = s.mnk
        tiles = (s.block_m * (s.block_k + 8) + s.block_k * (s.block_n + 8)) * 2
        assert shared_bytes(s, DType.F16) == tiles + 4 * s.threads // 32 * m * (n + 4)


@pytest.mark.parametrize("case", CASES, ids=_IDS)
def test_shapes_simulate_like_the_interpreter(case):
    p, shape, size = case
    op, s = _case(p, shape, size)
    ins = random_inputs(inputs_of(op), 1)
    (got,) = simulate(lower_program(op, s, name="mm"), ins, order="shuffled", seed=2)
    _check(op, got, reference(op, ins)[0], ins, p)


@pytest.mark.parametrize("shape", ["32x8x16", "8x32x16"])
def test_shapes_with_the_other_knobs(shape):
    op, base = _case("f16", shape, "ragged")
    ins = random_inputs(inputs_of(op), 3)
    want = reference(op, ins)[0]
    for kw in ({"swap": True}, {"double_buffer": True}, {"vector_width": 4}):
        (got,) = simulate(lower_program(op, dataclasses.replace(base, **kw)), ins)
        _check(op, got, want, ins, "f16")


def test_shapes_render_their_fragments_and_scratch():
    op, s = _case("f16", "32x8x16", "aligned")
    src = render_program(lower_program(op, s, name="mm"))
    assert "wmma::fragment<wmma::matrix_a, 32, 8, 16, __half, wmma::row_major>" in src
    assert "wmma::fragment<wmma::accumulator, 32, 8, 16, float>" in src
    assert "[2][32][12]" in src  # two warps' 32 x (8 + 4) f32 scratch tiles
    op, s = _case("bf16", "8x32x16", "aligned")
    src = render_program(lower_program(op, s, name="mm"))
    assert "wmma::fragment<wmma::matrix_b, 8, 32, 16, __nv_bfloat16, wmma::row_major>" in src
    assert "[2][8][36]" in src


@pytest.mark.parametrize("s,why", [
    (GemmSchedule("tf32", 64, 16, 16, wmma_shape="32x8x16"), "not one of 16x16x8 for tf32"),
    (GemmSchedule("f16", 32, 32, 16, wmma_shape="16x16x8"), "not one of 16x16x16, 32x8x16"),
    (GemmSchedule("fma", 32, 32, 8, 2, 2, wmma_shape="32x8x16"), "on the fma path"),
    (GemmSchedule("f16", 64, 16, 16, warps_m=2, warps_n=2, wmma_shape="32x8x16"),
     "not 32-byte aligned"),
    (GemmSchedule("f16", 48, 32, 16, warps_m=1, warps_n=1, wmma_shape="32x8x16"),
     "not a whole number of 32x8 fragments"),
], ids=["tf32", "f16_k8", "fma", "b_alignment", "whole"])
def test_illegal_shapes_are_refused_with_a_reason(s, why):
    assert why in (s.problem() or "")
    dt = DType.F32 if s.precision in ("fma", "tf32") else DType.F16
    with pytest.raises(GpuScheduleError, match=why.split(" ")[-1]):
        lower_program(matmul(64, 64, 64, dt), s)


def test_shapes_round_trip_and_old_records_read_back():
    s = _SCHEDULES["8x32x16"]
    assert gpu_schedule_from_dict(json.loads(json.dumps(s.to_dict()))) == s
    plain = GemmSchedule("bf16", 32, 64, 32, warps_m=2, warps_n=2)
    old = {k: x for k, x in plain.to_dict().items() if k != "wmma_shape"}
    back = gpu_schedule_from_dict(json.loads(json.dumps(old)))
    assert back == plain and back.mnk == (16, 16, 16) and (back.frag_m, back.frag_n) == (1, 2)


def test_the_space_holds_the_shapes_and_sampled_candidates_agree():
    from nfc.runtime.tuning.gpu import search_space

    assert GEMM_PARAMS["wmma_shape"][0] == "" and "wmma_shape" in WMMA_KEYS
    op = matmul(40, 48, 56, DType.F16)
    assert "wmma_shape" in search_space(op).params
    assert "wmma_shape" not in search_space(matmul(40, 48, 56), ("fma",)).params
    space = gpu_space(op)
    assert space.default()["wmma_shape"] == "" and space.is_valid(space.default())
    tf32 = gpu_space(matmul(40, 48, 56), ("tf32",))
    assert {c.wmma_shape for c in tf32.candidates()} == {""}
    cands = list(space.candidates())
    assert {c.wmma_shape for c in cands} == {"", "32x8x16", "8x32x16"}
    assert all(space.to_schedule(to_params(c)) == c for c in cands)
    assert all(shared_bytes(c, DType.F16) <= STATIC_SHARED_LIMIT for c in cands)
    ins = random_inputs(inputs_of(op), 4)
    want = reference(op, ins)[0]
    rng = np.random.default_rng(7)
    for shape in ("32x8x16", "8x32x16"):
        some = [c for c in cands if c.wmma_shape == shape]
        for n in rng.choice(len(some), 3, replace=False):
            (got,) = simulate(lower_program(op, some[n]), ins)
            _check(op, got, want, ins, "f16")


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_shapes_compile_with_nvrtc(arch, tmp_path, monkeypatch):
    pytest.importorskip("cuda.bindings.nvrtc", reason="cuda-python is not installed")
    from nfc.codegen.cuda.program import compile_program

    monkeypatch.setenv("NFC_CACHE_DIR", str(tmp_path))
    kernels = [lower_program(*_case(*c), name=f"k{n}").kernels[0] for n, c in enumerate(CASES)]
    compiled = compile_program(kernels, arch)  # ResourceError past the limits
    for k in kernels:
        res = compiled.resources[k.func.name]
        assert res.spill_stores == res.spill_loads == 0
        assert res.shared_bytes == k.shared_bytes <= STATIC_SHARED_LIMIT
        assert res.registers * k.block <= 65536


def test_shapes_cuda_c_on_cpu_threads(tmp_path):
    from nfc.codegen.cuda.hostrun import build_host, host_compiler, run_host

    if host_compiler() is None:
        pytest.skip("no host C++ compiler")
    progs = [(op, lower_program(op, s, name=f"h{n}"), c[0])
             for n, c in enumerate(x for x in CASES if x[2] == "ragged")
             for op, s in [_case(*c)]]
    lib = build_host([k for _, p, _ in progs for k in p.kernels], tmp_path)
    for op, p, prec in progs:
        ins = random_inputs(inputs_of(op), 5)
        (got,) = run_host(p, ins, lib)
        _check(op, got, reference(op, ins)[0], ins, prec)
