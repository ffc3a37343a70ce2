"""The GEMM schedule knob `pack` (nfc.codegen.cuda.gemm_pack): operand A, B or both copied by a
kernel of their own into a zero-padded, tile-contiguous temporary that the GEMM reads. Packed
programs on ragged and aligned GEMMs of every path (f32 FMA, f16/bf16 WMMA, tf32), alone and
with swap, double buffering and vector loads, simulated against the interpreter and against the
unpacked kernel's bits; the temporary's layout and padded size; refusals and notes; NVRTC for
sm_80/sm_90; the generated CUDA C on CPU threads; the space; a whole model's step."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
from cuda_lib import UNIT, compute, inputs_of, ld, matmul, random_inputs, reference, tensor

from nfc.codegen.cuda.gemm_pack import PACK_GROWTH, pack_notes
from nfc.codegen.cuda.lower import lower_program
from nfc.codegen.cuda.render import render_program
from nfc.codegen.cuda.schedule import GemmSchedule, GpuScheduleError, gpu_schedule_from_dict
from nfc.codegen.cuda.sim import simulate, simulate_kernel
from nfc.codegen.cuda.space import (
    FMA_KEYS,
    GEMM_PARAMS,
    WMMA_KEYS,
    default_gpu_schedule,
    gpu_space,
    to_params,
)
from nfc.contraction import match_contraction
from nfc.ir import ComputeOp, DType


def _batched() -> ComputeOp:
    """`C[b, i, j] = sum_(p, k) A[b, p, i, k] B[p, k, j]`: lead axes in the packed layout."""
    a, b = tensor("A", (3, 2, 20, 24)), tensor("B", (2, 24, 18))
    return compute({"b": 3, "i": 20, "j": 18}, ld(a, "b", "p", "i", "k") * ld(b, "p", "k", "j"),
                   reduce="sum", raxes={"p": 2, "k": 24})


#: name -> (op, base schedule, precision of the comparison)
CASES = {
    "fma_ragged": (lambda: matmul(70, 52, 40), GemmSchedule("fma", 32, 64, 8, 2, 4), "fma"),
    "fma_aligned": (lambda: matmul(64, 64, 64), GemmSchedule("fma", 32, 32, 16, 2, 2), "fma"),
    "fma_at": (lambda: matmul(36, 20, 24, a_t=True), GemmSchedule("fma", 16, 16, 8, 1, 1),
               "fma"),
    "fma_batched": (_batched, GemmSchedule("fma", 16, 16, 8, 2, 2), "fma"),
    "f16_ragged": (lambda: matmul(40, 48, 56, DType.F16),
                   GemmSchedule("f16", 32, 64, 16, warps_m=2, warps_n=1), "f16"),
    "f16_aligned": (lambda: matmul(64, 64, 64, DType.F16),
                    GemmSchedule("f16", 64, 32, 32, warps_m=2, warps_n=2), "f16"),
    "bf16_ragged": (lambda: matmul(40, 48, 56, DType.BF16),
                    GemmSchedule("bf16", 32, 32, 16, warps_m=2, warps_n=2), "bf16"),
    "tf32_ragged": (lambda: matmul(40, 48, 56), GemmSchedule("tf32", 32, 32, 16), "tf32"),
}
KNOBS = [{}, {"swap": True}, {"double_buffer": True, "vector_width": 4},
         {"swap": True, "double_buffer": True, "vector_width": 4}]


def _widest(space, s: GemmSchedule) -> GemmSchedule:
    """`s` with the widest vector width its space admits (1 at least)."""
    for w in range(s.vector_width, 0, -1):
        t = dataclasses.replace(s, vector_width=w)
        if w in (1, 2, 4) and space.problem(to_params(t)) is None:
            return t
    raise AssertionError(f"no valid width for {s}")


def _packed_cases() -> list[tuple[str, ComputeOp, GemmSchedule, str]]:
    out = []
    for name, (build, base, precision) in CASES.items():
        op = build()
        space = gpu_space(op, precisions=(base.precision,))
        for pack in ("a", "b", "ab"):
            for kw in KNOBS:
                out.append((name, op, _widest(space, dataclasses.replace(base, pack=pack, **kw)),
                            precision))
    return out


PACKED = _packed_cases()
_IDS = [f"{n}-{s.pack}-db{int(s.double_buffer)}-v{s.vector_width}-sw{int(s.swap)}"
        for n, _, s, _ in PACKED]


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


def test_the_cases_cover_every_pack_and_vector_loads():
    assert {(n, s.pack) for n, _, s, _ in PACKED} == {(n, p) for n in CASES
                                                      for p in ("a", "b", "ab")}
    # a packed operand always takes the widest load: both packed, every case vectorises by 4
    assert all(s.vector_width == 4 for _, _, s, _ in PACKED if s.pack == "ab"
               and s.double_buffer)


@pytest.mark.parametrize("case", PACKED, ids=_IDS)
def test_packed_gemms_simulate_like_the_interpreter_and_the_unpacked_kernel(case):
    name, op, s, precision = case
    ins = random_inputs(inputs_of(op), 1)
    p = lower_program(op, s, name="mm")
    assert [k.kind for k in p.kernels] == ["elementwise"] * len(s.pack) + ["gemm"]
    assert len(p.temps) == len(s.pack)
    (got,) = simulate(p, ins, order="shuffled", seed=3)  # races, bounds, alignment checked
    _check(op, got, reference(op, ins)[0], ins, precision)
    # the shared tiles hold the same values: the same bits as the unpacked kernel
    plain = dataclasses.replace(s, pack="none")
    space = gpu_space(op, precisions=(s.precision,))
    if space.problem(to_params(plain)) is not None:  # the unpacked operand cannot vectorise
        plain = dataclasses.replace(plain, vector_width=1)
    (want,) = simulate(lower_program(op, plain), ins)
    np.testing.assert_array_equal(got, want)


def _tiles(x: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """A 2-D array zero padded to whole `rows x cols` tiles, as [row tiles, col tiles, rows,
    cols]."""
    rn, cn = -(-x.shape[0] // rows) * rows, -(-x.shape[1] // cols) * cols
    pad = np.zeros((rn, cn), x.dtype)
    pad[:x.shape[0], :x.shape[1]] = x
    return pad.reshape(rn // rows, rows, cn // cols, cols).transpose(0, 2, 1, 3)


@pytest.mark.parametrize("swap", [False, True])
def test_the_packed_temporary_has_the_padded_tile_layout(swap):
    """A (70 x 40) and B (40 x 52), tiles 32 x 64 x 8: on the M side an operand is packed as
    [M tiles, K tiles, 32, 8], on the N side as [N tiles, K tiles, 8, 64]; swapped, A is on
    the N side (its i is the block's N) and B on the M side."""
    op = matmul(70, 52, 40)
    s = GemmSchedule("fma", 32, 64, 8, 2, 4, pack="ab", swap=swap)
    p = lower_program(op, s, name="mm")
    a_t, b_t = p.temps
    kt = math.ceil(40 / 8)
    if swap:
        assert a_t.shape == (math.ceil(70 / 64), kt, 8, 64)
        assert b_t.shape == (math.ceil(52 / 32), kt, 32, 8)
    else:
        assert a_t.shape == (math.ceil(70 / 32), kt, 32, 8)
        assert b_t.shape == (math.ceil(52 / 64), kt, 8, 64)
    # the packing kernels alone: numpy's padded tiles, every element written
    ins = random_inputs(inputs_of(op), 5)
    for k, t, src, x, n_side in zip(p.kernels[:2], (a_t, b_t), ("A", "B"), ins,
                                    (swap, not swap), strict=True):
        arrays = {src: x.ravel().copy(), t.name: np.full(t.size, np.nan, np.float32)}
        simulate_kernel(k, arrays)
        oriented = x.T if swap else x  # (tile row axis, tile column axis)
        want = _tiles(oriented, *t.shape[2:])
        if n_side:  # [K tiles, N tiles, ..] -> [N tiles, K tiles, ..]
            want = want.transpose(1, 0, 2, 3)
        assert t.size == want.size
        np.testing.assert_array_equal(arrays[t.name].reshape(t.shape), want)


def test_lead_axes_lead_the_packed_layout():
    op = _batched()  # A[b, p, i, k] (3, 2, 20, 24), B[p, k, j] (2, 24, 18)
    p = lower_program(op, GemmSchedule("fma", 16, 16, 8, 2, 2, pack="ab"), name="mm")
    assert [t.shape for t in p.temps] == [(3, 2, 2, 3, 16, 8), (2, 2, 3, 8, 16)]


def test_pack_refusals_notes_and_old_records():
    op = matmul(10, 512, 64)  # A padded to 128 rows: 12.8 times its size
    s = GemmSchedule("fma", 128, 64, 16, 8, 4, pack="a")
    space = gpu_space(op)
    why = space.problem(to_params(s))
    assert why is not None and f"over {PACK_GROWTH} times" in why and "operand A" in why
    assert not space.is_valid(to_params(s))
    with pytest.raises(GpuScheduleError, match="over 4 times"):
        lower_program(op, s)
    assert space.is_valid(to_params(dataclasses.replace(s, pack="b")))
    bad = GemmSchedule("fma", 32, 32, 16, 2, 2, pack="c")
    assert "pack 'c' is not one of none, a, b, ab" in (bad.problem() or "")
    with pytest.raises(GpuScheduleError, match="pack 'c'"):
        lower_program(matmul(32, 32, 32), bad)
    # legal but pointless: K == block_k (A) and N == block_n (B) are tile-contiguous already
    tight = GemmSchedule("fma", 32, 64, 16, 2, 4, pack="ab")
    assert pack_notes(matmul(64, 64, 16), tight) == [
        "operand A is already tile-contiguous: packing copies it unchanged",
        "operand B is already tile-contiguous: packing copies it unchanged"]
    assert gpu_space(matmul(64, 64, 16)).is_valid(to_params(tight))
    assert pack_notes(matmul(70, 52, 40), tight) == []
    # records: round trip, and one written before the knob reads back unpacked
    assert gpu_schedule_from_dict(json.loads(json.dumps(tight.to_dict()))) == tight
    old = {k: x for k, x in GemmSchedule("fma", 32, 32, 8, 2, 2).to_dict().items()
           if k != "pack"}
    assert gpu_schedule_from_dict(old).pack == "none"
    assert to_params(gpu_schedule_from_dict(old))["pack"] == "none"


def test_a_packed_operand_allows_the_widest_vector_load():
    """B's row length 30 refuses 4-wide loads of B; packed, its tiles' rows are 32 long."""
    op = matmul(64, 30, 64)
    s = GemmSchedule("fma", 32, 32, 16, 2, 2, vector_width=4)
    space = gpu_space(op)
    assert "contiguous extent 30" in (space.problem(to_params(s)) or "")
    packed = dataclasses.replace(s, pack="b")
    assert space.is_valid(to_params(packed))
    ins = random_inputs(inputs_of(op), 2)
    p = lower_program(op, packed, name="mm")
    (got,) = simulate(p, ins)
    (want,) = simulate(lower_program(op, dataclasses.replace(s, vector_width=1)), ins)
    np.testing.assert_array_equal(got, want)
    src = render_program(p)
    assert "reinterpret_cast<const nfc_vec*>(&B_packed[" in src
    assert "pack=b" in src and "pack operand B ('B') into 16x32 tiles [1, 4, 16, 32]" in src
    f64 = matmul(20, 20, 20, DType.F64)  # 16 bytes: two f64 per load at most, packed or not
    assert "exceed a 16-byte load" in (gpu_space(f64).problem(to_params(GemmSchedule(
        "fma", 16, 32, 8, 2, 2, vector_width=4, pack="ab"))) or "")


def test_spaces_hold_the_knob_and_sampled_candidates_agree():
    assert GEMM_PARAMS["pack"] == ("none", "a", "b", "ab")
    assert "pack" in FMA_KEYS and "pack" in WMMA_KEYS
    from nfc.runtime.tuning.gpu import search_space

    assert search_space(matmul(40, 48, 56)).params["pack"] == ("none", "a", "b", "ab")
    rng = np.random.default_rng(7)
    for op, precs in ((matmul(40, 48, 56), ("fma",)), (matmul(40, 48, 56, DType.F16), ("f16",)),
                      (_batched(), ("fma",))):
        space = gpu_space(op, precisions=precs)
        assert space.default()["pack"] == "none" == default_gpu_schedule(op).pack
        cands = [c for c in space.candidates() if c.pack != "none"]
        assert {c.pack for c in cands} == {"a", "b", "ab"}
        assert all(space.to_schedule(to_params(c)) == c for c in cands)
        ins = random_inputs(inputs_of(op), 2)
        want = reference(op, ins)[0]
        for n in rng.choice(len(cands), 3, replace=False):
            p = lower_program(op, cands[n])
            assert len(p.kernels) == 1 + len(cands[n].pack)
            (got,) = simulate(p, ins)
            _check(op, got, want, ins, cands[n].precision)


_NVRTC = [x for x in PACKED if x[2].pack == "ab" or not x[2].swap]


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_packed_kernels_compile_with_nvrtc(arch, tmp_path, monkeypatch):
    pytest.importorskip("cuda.bindings.nvrtc", reason="cuda-python is not installed")
    from nfc.codegen.cuda.gemm import STATIC_SHARED_LIMIT
    from nfc.codegen.cuda.nvrtc import compile_cuda
    from nfc.codegen.cuda.program import compile_program

    monkeypatch.setenv("NFC_CACHE_DIR", str(tmp_path))
    kernels = [k for n, (_, op, s, _) in enumerate(_NVRTC)
               for k in lower_program(op, s, name=f"k{n}").kernels]
    compiled = compile_program(kernels, arch)  # ResourceError past the limits
    for k in kernels:
        res = compiled.resources[k.func.name]
        assert res.spill_stores == res.spill_loads == 0
        assert res.shared_bytes == k.shared_bytes <= STATIC_SHARED_LIMIT
        assert res.registers * k.block <= 65536
    # a ragged GEMM's packed tiles are read by 128-bit loads without guards
    p = lower_program(matmul(70, 52, 40), GemmSchedule("fma", 32, 64, 8, 2, 4, pack="ab",
                                                       vector_width=4), name="v4")
    ptx = compile_cuda(render_program(p), arch, ptx=True).image.decode()
    assert "ld.global.nc.v4.f32" in ptx or "ld.global.v4.f32" in ptx


def test_packed_cuda_c_on_cpu_threads(tmp_path):
    from nfc.codegen.cuda.hostrun import build_host, host_compiler, run_host

    if host_compiler() is None:
        pytest.skip("no host C++ compiler")
    picks = [x for x in PACKED if x[2].double_buffer and (x[2].pack == "ab" or x[2].swap)]
    progs = [(op, lower_program(op, s, name=f"h{n}"), prec)
             for n, (_, op, s, prec) in enumerate(picks)]
    lib = build_host([k for _, p, _ in progs for k in p.kernels], tmp_path)
    assert len(progs) >= 16
    for op, p, prec in progs:
        ins = random_inputs(inputs_of(op), 4)
        (got,) = run_host(p, ins, lib)
        _check(op, got, reference(op, ins)[0], ins, prec)


EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _packed_schedule(st: ComputeOp) -> GemmSchedule | None:
    """The default schedule of a contraction stage with both operands packed (or the one
    whose temporary its space admits), None for other stages."""
    if match_contraction(st) is None:
        return None
    d = default_gpu_schedule(st)
    assert isinstance(d, GemmSchedule)
    space = gpu_space(st)
    for pack in ("ab", "a", "b"):
        s = dataclasses.replace(d, pack=pack)
        if space.is_valid(to_params(s)):
            return s
    return None


def test_a_training_step_with_packed_gemms_on_the_simulator():
    """build_cuda_step with every GEMM packed: the packing kernels run in the step, their
    temporaries lie in the op's workspace apart from the GEMM's other buffers, and two
    training steps give the default step's bits (the FMA sums are unchanged)."""
    from nfc.codegen.cuda.step import build_cuda_step
    from nfc.codegen.lower import group_stages
    from nfc.ir import KernelOp
    from nfc.runtime.build import build_module, pipeline_for
    from nfc.runtime.cuda_model import simulated_model

    src = EXAMPLES / "mlp.nf"
    module, _ = build_module(src, {"batch": 4}, {}, pipeline_for(src, tuning=False))

    def schedule_for(op):
        if isinstance(op, KernelOp):
            return [_packed_schedule(st) for st, _ in group_stages(op, None)]
        return _packed_schedule(op)

    plain, packed = build_cuda_step(module), build_cuda_step(module, schedule_for=schedule_for)
    fn = packed.funcs["train_step"]
    packs = [x for x in fn.launches if "_pack_" in x.symbol]
    assert len(packs) >= 4 and "_pack_" in packed.source
    for n, x in enumerate(fn.launches):  # each packing kernel, then the GEMM reading its
        if "_pack_" not in x.symbol:     # temporary: the GEMM's buffers do not overlap
            continue
        temp = packed.kernels[x.symbol].func.params[0]
        gemm = next(g for g in fn.launches[n + 1:] if g.op_index == x.op_index
                    and temp in packed.kernels[g.symbol].func.params)
        assert packed.kernels[gemm.symbol].kind == "gemm"
        k = packed.kernels[gemm.symbol]
        spans = sorted({(slot.index + off, slot.index + off + b.nbytes)
                        for (slot, off), b in zip(gemm.params, k.func.params, strict=True)
                        if slot.kind == "arena"})
        assert spans[-1][1] <= fn.arena_bytes
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False)), spans
        tslot, toff = x.params[0]
        assert tslot.kind == "arena"
        assert (tslot.index + toff, tslot.index + toff + temp.nbytes) in spans
    runs = []
    for step in (plain, packed):
        with simulated_model(step) as m:
            m.init(seed=2)
            rng = np.random.default_rng(3)
            ins = {a.name: rng.standard_normal(a.shape).astype(a.dtype)
                   if a.dtype.kind == "f" else rng.integers(0, 4, a.shape).astype(a.dtype)
                   for a in m.train_step.inputs}
            outs = [m.train_step(**ins) for _ in range(2)]
            runs.append((outs, m.tensors))
    (o1, t1), (o2, t2) = runs
    for a, b in zip(o1, o2, strict=True):
        for n in a:
            np.testing.assert_array_equal(a[n], b[n], err_msg=n)
    assert set(t1) == set(t2) and t1
    for n in t1:
        np.testing.assert_array_equal(t1[n], t2[n], err_msg=n)


def test_packed_kernels_on_the_device():
    """With an NVIDIA driver and a GPU (scripts/gpu_check.sh): every packed program runs on it
    within the tolerances of the simulator's comparison."""
    try:
        from nfc.codegen.cuda.driver import Device, NoDriverError, run_program
    except ImportError:
        pytest.skip("cuda-python is not installed")
    try:
        dev = Device()
    except NoDriverError:
        pytest.skip("no NVIDIA driver on this machine (scripts/gpu_check.sh runs this on one)")
    from nfc.codegen.cuda.program import compile_program

    arch = dev.arch if dev.arch in ("sm_80", "sm_90") else "sm_80"
    try:
        for _, op, s, precision in PACKED:
            p = lower_program(op, s, name="mm")
            ins = random_inputs(inputs_of(op), 1)
            (got,) = run_program(dev, p, compile_program(p, arch), ins)
            _check(op, got, reference(op, ins)[0], ins, precision)
    finally:
        dev.close()
