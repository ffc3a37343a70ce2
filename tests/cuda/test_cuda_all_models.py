"""Every kernel of every function of every example model through the CUDA backend
(nfc.codegen.cuda.coverage; docs/cuda.md, "Coverage").

Default run, for each model of examples/ and examples/models/ at the reduced sizes of
`coverage.REDUCED` (batch 1-4), after the pipeline `nfc compile` runs (model passes, cleanup,
`fuse`), for @forward, @train_step and @eval:

- every kernel with the default GPU schedules, and the contraction kernels of a sample of
  `WMMA_SAMPLE` programs per model on Tensor Cores (the model's precision rotates through
  f16, bf16, tf32), rendered as one translation unit per model and compiled by NVRTC for
  sm_80 and sm_90, resources checked;
- each of those kernels simulated on the interpreter's values of its inputs and compared with
  the interpreter's result of its stage (f32: twice the errbound of any f32 evaluation order;
  integers exact; Tensor Cores: the per-precision bound of `coverage.wmma_tolerance`).

`NFC_CUDA_ALL=1` adds: every contraction program of every model in each of the three Tensor
Core precisions (compiled and simulated), and every model at the full sizes of its `.nf`
file, lowered and compiled for sm_80 and sm_90 (not simulated): every kernel with the default
schedules and every contraction on Tensor Cores in the model's rotating precision.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from dataclasses import replace

import pytest
from cuda_lib import compute, ld, matmul, tensor

from nfc.codegen.cuda import coverage as cov
from nfc.codegen.cuda.lower import lower_program
from nfc.codegen.cuda.program import compile_program, respill_bounds
from nfc.codegen.cuda.render import render_kernels
from nfc.codegen.cuda.schedule import GemmSchedule
from nfc.codegen.cuda.space import default_gpu_schedule
from nfc.codegen.loops import Allocate, For, If, Seq, Stmt, Store
from nfc.ir import Const
from nfc.runtime.build import backend_module

HAVE_NVRTC = importlib.util.find_spec("cuda.bindings") is not None
ALL = os.environ.get("NFC_CUDA_ALL") == "1"
#: Tensor Core programs per model in the default run.
WMMA_SAMPLE = 3
MODELS = cov.example_models()
needs_nvrtc = pytest.mark.skipif(not HAVE_NVRTC, reason="cuda-python (NVRTC) not installed")


@functools.cache
def _cases(name: str) -> tuple[list[cov.Case], list[cov.Case]]:
    """(default cases, Tensor Core cases) of a model at its reduced sizes."""
    module = backend_module(cov.examples_dir() / name, cov.REDUCED[name])
    cases = cov.model_cases(module)
    if ALL:
        wmma = [c for p in cov.WMMA_PRECISIONS for c in cov.model_cases(module, p)]
    else:
        prec = cov.wmma_precision(MODELS.index(name))
        wmma = cov.sample(cov.model_cases(module, prec), WMMA_SAMPLE)
    return cases, wmma


def test_every_example_model_has_reduced_sizes():
    # a new example model must be added to coverage.REDUCED to be tested here
    assert len(MODELS) >= 18 and "models/bert.nf" in MODELS and "lenet5.nf" in MODELS
    assert "models/layers.nf" not in MODELS  # layers only, no model
    assert sorted(cov.REDUCED) == sorted(MODELS)


@needs_nvrtc
@pytest.mark.parametrize("name", MODELS)
def test_every_kernel_compiles_for_sm80_and_sm90(name):
    cases, wmma = _cases(name)
    assert {"forward", "train_step", "eval"} <= {c.function for c in cases}
    kernels = cov.case_kernels(cases + wmma)
    assert {cov.kernel_kind(k) for k in kernels} >= {"elementwise", "reduce", "gemm", "wmma"}
    for arch in ("sm_80", "sm_90"):
        res = cov.compile_cases(cases + wmma, arch)  # one translation unit, limits checked
        assert set(res) == {k.func.name for k in kernels}
        for k in kernels:
            r = res[k.func.name]
            assert r.registers * k.block <= 65536 and not r.spill_stores, (k.func.name, r)
            assert r.shared_bytes == k.shared_bytes, k.func.name


@pytest.mark.parametrize("name", MODELS)
def test_every_kernel_matches_the_interpreter(name):
    cases, wmma = _cases(name)
    checks = [r for c in cases + wmma for r in cov.check_case(c)]
    # every kernel that computes a stage (not a GEMM's operand packing) is checked
    assert sorted(r.kernel for r in checks) == sorted(
        k.func.name for c in cases + wmma for k in cov.case_kernels([c])
        if k.func.name in cov.stage_kernels(c))
    bad = [f"{r.kernel} ({r.kind}, {r.precision}): {r.problem}" for r in checks if not r.ok]
    assert not bad, "\n".join(bad)
    # issue 13's figure for the f32 paths besides the error bound: 1e-5 normwise relative
    loose = [f"{r.kernel}: {r.rel_error:.2e}" for r in checks
             if r.kind != "wmma" and r.rel_error > 1e-5]
    assert not loose, loose
    assert {r.kind for r in checks} >= {"elementwise", "reduce", "gemm", "wmma"}


def test_reduced_sizes_exercise_every_schedule_kind():
    kinds = {(cov.kernel_kind(k), getattr(k.schedule, "strategy", None))
             for name in MODELS for c in _cases(name)[0] + _cases(name)[1]
             for k in c.program.kernels}
    assert kinds >= {("elementwise", None), ("gemm", None), ("wmma", None),
                     ("reduce", "thread"), ("reduce", "warp"), ("reduce", "block")}
    precisions = {c.precision for name in MODELS for c in _cases(name)[1]}
    assert precisions == set(cov.WMMA_PRECISIONS)


@needs_nvrtc
@pytest.mark.skipif(not ALL, reason="full-size models: set NFC_CUDA_ALL=1")
@pytest.mark.parametrize("name", MODELS)
def test_every_kernel_compiles_at_full_size(name):
    module = backend_module(cov.examples_dir() / name)
    cases = cov.model_cases(module) + cov.model_cases(
        module, cov.wmma_precision(MODELS.index(name)))
    for arch in ("sm_80", "sm_90"):
        res = cov.compile_cases(cases, arch)
        assert len(res) == len(cov.case_kernels(cases))


# -- the checks can fail ----------------------------------------------------------------------


def _scaled(s: Stmt, out: str, factor: float) -> Stmt:
    """`s` with every store to global buffer `out` multiplied by `factor`: a wrong kernel."""
    if isinstance(s, Store) and s.buffer.name == out and s.reduce is None:
        return replace(s, value=s.value * Const(factor))
    if isinstance(s, Seq):
        return Seq(tuple(_scaled(c, out, factor) for c in s.body))
    if isinstance(s, For):
        return replace(s, body=_scaled(s.body, out, factor))
    if isinstance(s, If):
        return replace(s, then=_scaled(s.then, out, factor),
                       orelse=None if s.orelse is None else _scaled(s.orelse, out, factor))
    if isinstance(s, Allocate):
        return replace(s, body=_scaled(s.body, out, factor))
    return s


def _perturbed(case: cov.Case, factor: float) -> cov.Case:
    kernels = []
    for k in case.program.kernels:
        f = k.func
        out = f.params[0]
        kernels.append(replace(k, func=replace(f, body=_scaled(f.body, out.name, factor)))
                       if out.dtype.is_float else k)
    return replace(case, program=replace(case.program, kernels=tuple(kernels)))


def test_a_few_ulps_off_in_an_f32_kernel_is_caught():
    cases, _ = _cases("mlp.nf")

    def outcomes(factor: float) -> list[cov.KernelCheck]:
        return [r for c in cases for r in cov.check_case(_perturbed(c, factor))
                if r.max_error > 0]
    # 8 units of f32 rounding: outside the bound of every elementwise kernel (about one
    # rounding); sums of K terms are allowed about K roundings of their terms' magnitudes
    eight_ulps = outcomes(1 + 2.0**-21)
    assert {r.kind for r in eight_ulps} == {"elementwise", "gemm", "reduce"}
    assert all(not r.ok for r in eight_ulps if r.kind == "elementwise")
    # 1e-5 relative (the f32 tolerance) is caught in every float kernel of the MLP
    assert not any(r.ok for r in outcomes(1 + 1e-5))


def test_a_wrong_tensor_core_result_is_caught():
    _, wmma = _cases("mlp.nf")
    assert wmma
    for c in wmma:
        u = cov.UNIT[c.precision]
        assert all(r.ok for r in cov.check_case(c))
        assert not any(r.ok for r in cov.check_case(_perturbed(c, 1 + 64 * u)))


# -- regressions ----------------------------------------------------------------------------


def _outer_gemm():
    """`dk[o, c] = sum_(n, i, j) dy[n, o, i, j] * cols[n, c, i, j]`: MobileNet's pointwise
    weight gradient at batch 16 (an outer reduction axis around the GEMM)."""
    dy, cols = tensor("dy", (16, 64, 16, 16)), tensor("cols", (16, 32, 16, 16))
    return compute({"o": 64, "c": 32}, ld(dy, "n", "o", "i", "j") * ld(cols, "n", "c", "i", "j"),
                   reduce="sum", raxes={"n": 16, "i": 16, "j": 16})


def _lenet_tf32_grad():
    """`dk[o, c, r, s] = sum_(i, j, n) dy[n, o, i, j] * cols[n, c, r, s, i, j]`: LeNet-5's
    second convolution's weight gradient at batch 64."""
    dy, cols = tensor("dy", (64, 16, 10, 10)), tensor("cols", (64, 6, 5, 5, 10, 10))
    return compute({"o": 16, "c": 6, "r": 5, "s": 5},
                   ld(dy, "n", "o", "i", "j") * ld(cols, "n", "c", "r", "s", "i", "j"),
                   reduce="sum", raxes={"i": 10, "j": 10, "n": 64})


def test_relaxed_kernels_render_their_relief():
    prog = lower_program(_lenet_tf32_grad(), GemmSchedule("tf32", 16, 64, 16, warps_m=1,
                                                          warps_n=2), name="dk")
    plain, one, two = (render_kernels(prog.kernels, relax=r) for r in (None, {"dk": 1},
                                                                       {"dk": 2}))
    assert "__launch_bounds__(64) " in plain and "#pragma unroll 1\n" not in plain
    assert "__launch_bounds__(64, 1)" in one and "#pragma unroll 1\n" not in one
    assert "__launch_bounds__(64, 1)" in two
    # every loop the lowering left serial is kept rolled, the unrolled ones stay unrolled
    serial = two.count("#pragma unroll 1\n")
    assert serial >= 3 and two.count("#pragma unroll\n") == plain.count("#pragma unroll\n")
    assert render_kernels(prog.kernels, relax={"other": 2}) == plain


@needs_nvrtc
@pytest.mark.parametrize("build,schedule,arch", [
    # ptxas targets 64 registers under __launch_bounds__(128) alone and spilled this FMA tile
    # on sm_80: compile_program refused MobileNet's training step (level 1 fixes it)
    (_outer_gemm, GemmSchedule("fma", 64, 32, 16, 4, 4), "sm_80"),
    # ptxas unrolled the 16-step B tile copy in the K loop and spilled at 255 registers on
    # sm_80: LeNet-5's training step on tf32 Tensor Cores (level 2 fixes it)
    (_lenet_tf32_grad, GemmSchedule("tf32", 16, 64, 16, warps_m=1, warps_n=2), "sm_80"),
], ids=["fma-outer-batch", "tf32-lenet-grad"])
def test_a_spilling_kernel_is_compiled_again_with_less_pressure(build, schedule, arch):
    prog = lower_program(build(), schedule, name="dk")
    plain = compile_program(prog, arch, check=False, use_cache=False)
    if not respill_bounds(plain, prog.kernels):
        pytest.skip("this NVRTC does not spill the kernel")
    res = compile_program(prog, arch, use_cache=False).resources["dk"]
    assert res.spill_stores == res.spill_loads == 0
    assert res.registers * prog.kernels[0].block <= 65536


def test_default_schedule_takes_an_explicit_tensor_core_precision():
    op = matmul(40, 24, 20)
    assert default_gpu_schedule(op).precision == "fma"  # never lossy by default
    for prec, step in (("f16", 16), ("bf16", 16), ("tf32", 8)):
        s = default_gpu_schedule(op, prec)
        assert s.precision == prec and s.block_k % step == 0 and s.problem() is None
        case = cov.Case("f", 0, op, lower_program(op, s, name=f"mm_{prec}"), [op], prec)
        (r,) = cov.check_case(case)
        assert r.ok and r.kind == "wmma" and r.max_error > 0, r


def test_kernels_that_pack_operands_feed_the_checked_gemm():
    # a GEMM schedule may add packing kernels before its stage's kernel: they run, on the
    # interpreter's inputs, and only the stage's kernel is compared
    op = matmul(40, 24, 20)
    for pack, precision in (("ab", "fma"), ("a", "tf32")):
        s = replace(default_gpu_schedule(op, precision), pack=pack)
        prog = lower_program(op, s, name=f"mm_{pack}")
        assert len(prog.kernels) > 1
        case = cov.Case("f", 0, op, prog, [op], precision)
        assert list(cov.stage_kernels(case)) == [f"mm_{pack}"]
        (r,) = cov.check_case(case)
        assert r.ok and r.kernel == f"mm_{pack}" and r.max_error > 0, r
        assert len(cov.case_kernels([case])) == len(prog.kernels)
