"""The GEMM schedule knobs `double_buffer`, `vector_width` and `swap` (nfc.codegen.cuda.gemm_tiles):
each alone and combined, on ragged and aligned GEMMs of every path (f32 FMA, f16/bf16 WMMA,
tf32), simulated against the interpreter, compiled by NVRTC, run as CUDA C on CPU threads; the
double buffer's barrier; refused vector widths; the spaces that hold the knobs."""

from __future__ import annotations

import dataclasses
import importlib.util
import itertools
import json
import os

import numpy as np
import pytest
from cuda_lib import (
    UNIT,
    compute,
    drop_barrier,
    inputs_of,
    ld,
    matmul,
    random_inputs,
    reference,
    tensor,
    with_body,
)

from nfc.codegen.cuda.gemm import STATIC_SHARED_LIMIT, shared_bytes
from nfc.codegen.cuda.gemm_tiles import prefer_swap
from nfc.codegen.cuda.lower import lower_program
from nfc.codegen.cuda.render import render_program
from nfc.codegen.cuda.schedule import GemmSchedule, GpuScheduleError, gpu_schedule_from_dict
from nfc.codegen.cuda.sim import RaceError, SimError, simulate
from nfc.codegen.cuda.space import (
    FMA_KEYS,
    WMMA_KEYS,
    classify,
    default_gpu_schedule,
    gpu_space,
    to_params,
)
from nfc.codegen.loops import Store
from nfc.ir import ComputeOp, DType
from nfc.runtime.build import backend_module


def _batched() -> ComputeOp:
    """`C[b, i, j] = sum_(p, k) A[b, p, i, k] B[p, k, j]`: batch and outer reduction axes."""
    a, b = tensor("A", (3, 2, 20, 24)), tensor("B", (2, 24, 18))
    return compute({"b": 3, "i": 20, "j": 18}, ld(a, "b", "p", "i", "k") * ld(b, "p", "k", "j"),
                   reduce="sum", raxes={"p": 2, "k": 24})


def _bt() -> ComputeOp:
    """`C[i, j] = sum_k A[k, i] B[j, k]`: both operands transposed (the default swaps it)."""
    a, b = tensor("A", (24, 36)), tensor("B", (44, 24))
    return compute({"i": 36, "j": 44}, ld(a, "k", "i") * ld(b, "j", "k"), reduce="sum",
                   raxes={"k": 24})


#: name -> (op, base schedule, precision of the comparison)
CASES = {
    "fma_ragged": (lambda: matmul(70, 52, 40), GemmSchedule("fma", 32, 64, 8, 2, 4), "fma"),
    "fma_aligned": (lambda: matmul(64, 64, 64), GemmSchedule("fma", 32, 32, 16, 2, 2), "fma"),
    "fma_at": (lambda: matmul(36, 20, 24, a_t=True), GemmSchedule("fma", 16, 16, 8, 1, 1),
               "fma"),
    "fma_batched": (_batched, GemmSchedule("fma", 16, 16, 8, 2, 2), "fma"),
    "fma_bt": (_bt, GemmSchedule("fma", 16, 32, 8, 2, 2), "fma"),
    "f16_ragged": (lambda: matmul(40, 48, 56, DType.F16),
                   GemmSchedule("f16", 32, 64, 16, warps_m=2, warps_n=1), "f16"),
    "f16_aligned": (lambda: matmul(64, 64, 64, DType.F16),
                    GemmSchedule("f16", 64, 32, 32, warps_m=2, warps_n=2), "f16"),
    "bf16_ragged": (lambda: matmul(40, 48, 56, DType.BF16),
                    GemmSchedule("bf16", 32, 32, 16, warps_m=2, warps_n=2), "bf16"),
    "tf32_ragged": (lambda: matmul(40, 48, 56), GemmSchedule("tf32", 32, 32, 16), "tf32"),
    "f32_as_f16": (lambda: matmul(40, 48, 56), GemmSchedule("f16", 32, 32, 32), "f16"),
}
KNOBS = [dict(zip(("double_buffer", "vector_width", "swap"), v, strict=True))
         for v in itertools.product((False, True), (1, 2, 4), (False, True))]


def _knobbed() -> list[tuple[str, ComputeOp, GemmSchedule, str]]:
    """Every case with every combination of knobs the case admits."""
    out = []
    for name, (build, base, precision) in CASES.items():
        op = build()
        space = gpu_space(op, precisions=(base.precision,))
        for kw in KNOBS:
            s = dataclasses.replace(base, **kw)
            if space.problem(to_params(s)) is None:
                out.append((name, op, s, precision))
    return out


KNOBBED = _knobbed()
_IDS = [f"{n}-db{int(s.double_buffer)}-v{s.vector_width}-sw{int(s.swap)}"
        for n, _, s, _ in KNOBBED]


def _check(op: ComputeOp, got: np.ndarray, want: np.ndarray, ins: list[np.ndarray],
           precision: str) -> None:
    """docs/cuda.md "Tolerances": f32 at 2e-5; Tensor Cores per element within
    (3u + K 2^-23) sum_k |a_k b_k| + 2 u_out |want|."""
    assert got.shape == want.shape
    if precision == "fma":
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
        return
    k = int(np.prod([a.extent for a in op.raxes]))
    mag = np.abs(reference(op, [np.abs(x) for x in ins])[0].astype(np.float64))
    u, u_out = UNIT[precision], UNIT.get(op.result.dtype.value, 0.0)
    want64 = want.astype(np.float64)
    bound = (3 * u + k * 2.0**-23) * mag * 1.01 + 2 * u_out * np.abs(want64) + 1e-30
    err = np.abs(got.astype(np.float64) - want64)
    assert (err <= bound).all(), f"max excess {np.max(err - bound)}"
    assert np.mean(err) <= u * np.sqrt(k) * np.mean(mag)


def test_every_case_tries_each_knob():
    for knob in ("double_buffer", "swap"):
        assert {n for n, _, s, _ in KNOBBED if getattr(s, knob)} == set(CASES)
    vec = {n for n, _, s, _ in KNOBBED if s.vector_width == 4}
    assert vec >= {"fma_ragged", "fma_aligned", "fma_at", "fma_bt", "f16_ragged", "tf32_ragged"}
    assert len(KNOBBED) >= 80


@pytest.mark.parametrize("case", KNOBBED, ids=_IDS)
def test_knobs_simulate_like_the_interpreter(case):
    name, op, s, precision = case
    ins = random_inputs(inputs_of(op), 1)
    p = lower_program(op, s, name="mm")
    (got,) = simulate(p, ins, order="shuffled", seed=3)
    _check(op, got, reference(op, ins)[0], ins, precision)
    if precision == "fma":  # the knobs move data, not arithmetic: the plain kernel's bits
        (plain,) = simulate(lower_program(op, CASES[name][1]), ins)
        np.testing.assert_array_equal(got, plain)


def test_knobs_render_what_they_say():
    op = matmul(64, 64, 64)
    plain = render_program(lower_program(op, GemmSchedule("fma", 32, 32, 16, 2, 2), name="mm"))
    s = GemmSchedule("fma", 32, 32, 16, 2, 2, double_buffer=True, vector_width=4)
    src = render_program(lower_program(op, s, name="mm"))
    assert src.count("__syncthreads();") == 2 and plain.count("__syncthreads();") == 2
    assert "As[2][32][17]" in src and "As[32][17]" in plain
    assert "As[k0 % 2]" in src and "if (k0 + 1 < 4) {" in src
    assert "struct alignas(16) nfc_vec { float x[4]; };" in src and "nfc_vec" not in plain
    assert "double_buffer=True, vector_width=4, swap=False" in src
    f16 = render_program(lower_program(matmul(64, 64, 64, DType.F16), GemmSchedule(
        "f16", 32, 32, 32, vector_width=4), name="mm"))
    assert "struct alignas(8) nfc_vec { __half x[4]; };" in f16
    assert "__half2float(nfc_v.x[3])" in f16


@pytest.mark.parametrize("precision", ["fma", "f16"])
@pytest.mark.parametrize("n,what", [(0, "reads what|loads a fragment over"),
                                    (1, "writes what thread|reads what|loads a fragment")])
def test_double_buffer_without_its_barrier_is_a_race(precision, n, what):
    """Barrier 0 follows the first tile's copy, barrier 1 ends every K step: without it the
    copy of tile k0 + 2 overwrites the stage other threads still multiply."""
    dt = DType.F16 if precision == "f16" else DType.F32
    op = matmul(40, 40, 64, dt)
    s = (GemmSchedule("f16", 32, 32, 16, double_buffer=True) if precision == "f16"
         else GemmSchedule("fma", 32, 32, 8, 2, 2, double_buffer=True))
    p = lower_program(op, s, name="mm")
    (ok,) = simulate(p, random_inputs(inputs_of(op)))  # race-free with both barriers
    broken = with_body(p, lambda b: drop_barrier(b, n))
    with pytest.raises(RaceError, match=what):
        simulate(broken, random_inputs(inputs_of(op)))


def test_double_buffer_doubles_the_tiles_within_the_shared_limit():
    op = matmul(256, 256, 64)
    big = GemmSchedule("fma", 128, 128, 32, 4, 4)
    assert shared_bytes(dataclasses.replace(big, double_buffer=True), DType.F32) == \
        2 * shared_bytes(big, DType.F32) > STATIC_SHARED_LIMIT >= shared_bytes(big, DType.F32)
    space = gpu_space(op)
    assert space.is_valid(to_params(big))
    why = space.problem(to_params(big) | {"double_buffer": True})
    assert why is not None and "shared memory" in why
    with pytest.raises(GpuScheduleError, match="bytes of shared memory"):
        lower_program(op, dataclasses.replace(big, double_buffer=True))
    p = lower_program(op, dataclasses.replace(big, block_k=8, double_buffer=True))
    assert p.kernels[0].shared_bytes == shared_bytes(dataclasses.replace(
        big, block_k=8, double_buffer=True), DType.F32)


@pytest.mark.parametrize("op,s,why", [
    (matmul(64, 64, 64), GemmSchedule("fma", 32, 32, 16, 2, 2, vector_width=3),
     "vector width 3 is not one of"),
    (matmul(64, 30, 64), GemmSchedule("fma", 32, 32, 16, 2, 2, vector_width=4),
     "contiguous extent 30 is not a multiple of the vector width 4"),
    (matmul(64, 64, 64), GemmSchedule("fma", 32, 32, 2, 2, 2, vector_width=4),
     "2-element tile side of operand A along its contiguous axis"),
    (matmul(20, 20, 20, DType.F64), GemmSchedule("fma", 16, 32, 8, 2, 2, vector_width=4),
     "4 f64 elements of 'A' exceed a 16-byte load"),
    (compute({"b": 4, "i": 8, "j": 8}, ld(tensor("A", (8, 16, 4)), "i", "k", "b")
             * ld(tensor("B", (4, 16, 8)), "b", "k", "j"), reduce="sum", raxes={"k": 16}),
     GemmSchedule("fma", 16, 16, 8, 2, 2, vector_width=2), "contiguous axis 'b' is not one of"),
], ids=["width", "extent", "tile", "bytes", "batch_axis"])
def test_invalid_vector_widths_are_refused_with_a_reason(op, s, why):
    space = gpu_space(op)
    got = s.problem() or space.problem(to_params(s))
    assert got is not None and why in got
    assert not space.is_valid(to_params(s))
    with pytest.raises(GpuScheduleError, match=why.split(" of")[0]):
        lower_program(op, s)
    assert space.is_valid(to_params(dataclasses.replace(s, vector_width=1)))


def test_a_misaligned_vector_load_is_reported():
    """The simulator checks each vector load's alignment: a copy shifted by one element."""
    op = matmul(32, 32, 32)
    p = lower_program(op, GemmSchedule("fma", 32, 32, 8, 2, 2, vector_width=4), name="mm")

    def shift(s):
        from nfc.codegen.cuda.gpuir import VecLoad
        from nfc.ir import Binary, Const

        if isinstance(s, VecLoad) and s.src.name == "B":
            *lead, last = s.index
            return dataclasses.replace(s, index=(*lead, Binary("+", last, Const(1))))
        return None
    with pytest.raises(SimError, match="vector load of 'B' at element 1 .* is not aligned"):
        simulate(with_body(p, lambda b: _map(b, shift)), random_inputs(inputs_of(op)))


def _map(s, fn):
    from nfc.codegen.loops import Allocate, For, If, Seq

    new = fn(s)
    if new is not None:
        return new
    if isinstance(s, Seq):
        return Seq(tuple(_map(c, fn) for c in s.body))
    if isinstance(s, For):
        return For(s.var, s.extent, s.kind, _map(s.body, fn))
    if isinstance(s, If):
        return If(s.cond, _map(s.then, fn), None if s.orelse is None else _map(s.orelse, fn))
    if isinstance(s, Allocate):
        return Allocate(s.buffer, _map(s.body, fn))
    return s


def test_swap_writes_the_result_transposed_and_the_default_rule():
    op = matmul(36, 44, 24)
    s = GemmSchedule("fma", 16, 32, 8, 2, 2, swap=True)
    p = lower_program(op, s)
    # the block's M side runs along j: 44 / 16 = 3 tiles, N along i: 36 / 32 = 2
    assert p.kernels[0].grid == 3 * 2
    stores = [x for x in p.kernels[0].func.body.walk()
              if isinstance(x, Store) and x.buffer.name == p.params[0].name]
    assert len(stores) == 1
    assert prefer_swap(_bt()) and default_gpu_schedule(_bt()).swap
    assert not prefer_swap(op) and not default_gpu_schedule(op).swap
    assert not prefer_swap(matmul(256, 10, 64)) and not prefer_swap(matmul(36, 20, 24, a_t=True))
    assert default_gpu_schedule(matmul(16, 512, 64, DType.F16)).swap is False


def test_schedules_with_knobs_round_trip_and_old_records_read_back():
    s = GemmSchedule("f16", 32, 32, 32, double_buffer=True, vector_width=2, swap=True)
    assert gpu_schedule_from_dict(json.loads(json.dumps(s.to_dict()))) == s
    old = {k: x for k, x in GemmSchedule("fma", 32, 32, 8, 2, 2).to_dict().items()
           if k not in ("double_buffer", "vector_width", "swap")}
    back = gpu_schedule_from_dict(old)
    assert (back.double_buffer, back.vector_width, back.swap) == (False, 1, False)


def test_spaces_hold_the_knobs_and_sampled_candidates_agree():
    for keys in (FMA_KEYS, WMMA_KEYS):
        assert {"double_buffer", "vector_width", "swap"} <= set(keys)
    rng = np.random.default_rng(5)
    for op, precs, precision in ((matmul(40, 48, 56), ("fma",), "fma"),
                                 (matmul(40, 48, 56, DType.F16), ("f16",), "f16"),
                                 (_bt(), ("fma", "tf32"), "tf32")):
        space = gpu_space(op, precisions=precs)
        assert space.params["vector_width"] == (1, 2, 4)
        assert space.is_valid(space.default())
        cands = [c for c in space.candidates() if c.double_buffer and c.vector_width > 1]
        assert {c.swap for c in cands} == {False, True}
        assert all(space.to_schedule(to_params(c)) == c for c in cands)
        ins = random_inputs(inputs_of(op), 2)
        want = reference(op, ins)[0]
        for n in rng.choice(len(cands), 3, replace=False):
            (got,) = simulate(lower_program(op, cands[n]), ins)
            _check(op, got, want, ins, "fma" if cands[n].precision == "fma" else precision)


_NVRTC = [x for x in KNOBBED if x[2].double_buffer or x[2].vector_width > 1 or x[2].swap]


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_knobbed_kernels_compile_with_nvrtc(arch, tmp_path, monkeypatch):
    pytest.importorskip("cuda.bindings.nvrtc", reason="cuda-python is not installed")
    from nfc.codegen.cuda.nvrtc import compile_cuda
    from nfc.codegen.cuda.program import compile_program

    monkeypatch.setenv("NFC_CACHE_DIR", str(tmp_path))
    kernels = [lower_program(op, s, name=f"k{n}").kernels[0]
               for n, (_, op, s, _) in enumerate(_NVRTC)]
    compiled = compile_program(kernels, arch)  # ResourceError past the limits
    for k in kernels:
        res = compiled.resources[k.func.name]
        assert res.spill_stores == res.spill_loads == 0
        assert res.shared_bytes == k.shared_bytes <= STATIC_SHARED_LIMIT
        assert res.registers * k.block <= 65536
    # the vector copies are vector instructions
    f32 = lower_program(matmul(64, 64, 64), GemmSchedule("fma", 32, 32, 16, 2, 2,
                                                          vector_width=4), name="v4")
    ptx = compile_cuda(render_program(f32), arch, ptx=True).image.decode()
    assert "ld.global.nc.v4.f32" in ptx or "ld.global.v4.f32" in ptx


def test_knobbed_cuda_c_on_cpu_threads(tmp_path):
    from nfc.codegen.cuda.hostrun import build_host, host_compiler, run_host

    if host_compiler() is None:
        pytest.skip("no host C++ compiler")
    # every case double buffered and swapped (each vector width it admits), and with vector
    # loads alone
    picks = [x for x in _NVRTC if x[2].double_buffer and x[2].swap] + \
        [x for x in _NVRTC if x[2].vector_width > 1 and not x[2].double_buffer
         and not x[2].swap]
    progs = [(op, lower_program(op, s, name=f"h{n}"), prec)
             for n, (_, op, s, prec) in enumerate(picks)]
    lib = build_host([k for _, p, _ in progs for k in p.kernels], tmp_path)
    assert len(progs) >= 10
    for op, p, prec in progs:
        ins = random_inputs(inputs_of(op), 4)
        (got,) = run_host(p, ins, lib)
        _check(op, got, reference(op, ins)[0], ins, prec)


@pytest.mark.skipif(os.environ.get("NFC_CUDA_ALL") != "1", reason="every model: NFC_CUDA_ALL=1")
def test_every_model_gemm_with_the_knobs(tmp_path, monkeypatch):
    """Opt-in (about 2 minutes): every contraction stage of every example model (reduced
    sizes, fma and, for f32 models, tf32) double buffered, swapped the other way from its
    default, with the widest vector width its space admits: simulated against the interpreter
    (nfc.codegen.cuda.coverage's checks) and compiled for sm_80 and sm_90."""
    from nfc.codegen.cuda import coverage as cov

    monkeypatch.setenv("NFC_CACHE_DIR", str(tmp_path))
    compile_ok = importlib.util.find_spec("cuda.bindings") is not None
    vectorised = 0
    for name in cov.example_models():
        module = backend_module(cov.examples_dir() / name, cov.REDUCED[name])
        kernels = []
        for case in cov.model_cases(module):
            gemm = [classify(st) == "gemm" for st in case.stages]
            if not any(gemm):
                continue
            f32 = case.stages[gemm.index(True)].result.dtype is DType.F32
            for prec in ("fma", "tf32") if f32 else ("fma",):
                scheds = [None if not g else _knobbed_default(st, prec)
                          for st, g in zip(case.stages, gemm, strict=True)]
                vectorised += sum(s is not None and s.vector_width > 1 for s in scheds)
                prog = lower_program(case.op, scheds, name=f"{case.function}_{case.index}_{prec}")
                kernels += [k for k, g in zip(prog.kernels, gemm, strict=True) if g]
                checks = cov.check_case(dataclasses.replace(case, program=prog, precision=prec))
                assert not [c.problem for c in checks if c.problem], (name, case.index, prec)
        if compile_ok:
            from nfc.codegen.cuda.program import compile_program

            for arch in ("sm_80", "sm_90"):
                compile_program(kernels, arch)
    assert vectorised > 100


def _knobbed_default(st: ComputeOp, precision: str) -> GemmSchedule:
    d = default_gpu_schedule(st, precision)
    assert isinstance(d, GemmSchedule)
    space = gpu_space(st, precisions=(precision,))
    for w in (4, 2, 1):
        s = dataclasses.replace(d, double_buffer=True, vector_width=w, swap=not d.swap)
        if space.is_valid(to_params(s)):
            return s
    raise AssertionError(f"no valid knobbed schedule near {d}")


def _device():
    try:
        from nfc.codegen.cuda.driver import Device, NoDriverError
    except ImportError:
        return None
    try:
        return Device()
    except NoDriverError:
        return None


def test_knobbed_kernels_on_the_device():
    """With an NVIDIA driver and a GPU (scripts/gpu_check.sh): every knobbed kernel runs on it
    within the tolerances of the simulator's comparison."""
    dev = _device()
    if dev is None:
        pytest.skip("no NVIDIA driver on this machine (scripts/gpu_check.sh runs this on one)")
    from nfc.codegen.cuda.driver import run_program
    from nfc.codegen.cuda.program import compile_program

    arch = dev.arch if dev.arch in ("sm_80", "sm_90") else "sm_80"
    for _, op, s, precision in KNOBBED:
        p = lower_program(op, s, name="mm")
        ins = random_inputs(inputs_of(op), 1)
        (got,) = run_program(dev, p, compile_program(p, arch), ins)
        _check(op, got, reference(op, ins)[0], ins, precision)
