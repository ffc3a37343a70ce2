"""f16 and bf16 in the CPU backend: 16-bit tensors, f32 arithmetic, rounding at stores and
casts (nearest even), f32 accumulation. Every case runs on the host's code path and on the
AVX2 one (AVX-512 and its BF16 conversions switched off, as `NFC_CPU_FEATURES` does); the
bf16 rounding is `vcvtneps2bf16` on the first where the CPU has AVX-512 BF16, integer
arithmetic on the second.

Oracles: the interpreter bit for bit where both compute the same thing (a cast, one
operation on 16-bit operands: exact in f32, then one rounding), else the float64 reference
with the error bound of the format (nfc.testing.run_bounded, unit roundoff 2^-11 for f16 and
2^-8 for bf16 per operation, probable mode).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from codegen_lib import compute, inputs_of, ld, matmul, random_inputs, tensor

from nfc.codegen.cpu import CpuTarget, host_target
from nfc.codegen.jit import compile_kernel, compile_kernels
from nfc.interp import run as interp_run
from nfc.ir import Block, Call, Cast, ComputeOp, Const, DType, Func, ReturnOp
from nfc.testing import assert_within_bounds, run_bounded

ml_dtypes = pytest.importorskip("ml_dtypes")

F16, BF16, F32 = DType.F16, DType.BF16, DType.F32
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

#: What `NFC_CPU_FEATURES` appends to force the AVX2 path on an AVX-512 host.
AVX2_ONLY = ("-avx512f,-avx512bw,-avx512bf16,-avx512vl,-avx512dq,-avx512cd,-avx512vbmi,"
             "-avx512vbmi2,-avx512vnni,-avx512bitalg,-avx512vpopcntdq,-avx512vp2intersect,"
             "-avx512fp16,-avx512ifma,-avxneconvert")


def _targets() -> list:
    h = host_target()
    avx2 = CpuTarget(h.cpu, h.features + "," + AVX2_ONLY, h.triple)
    marks = [] if h.has("avx512bf16") else [pytest.mark.skip(reason="no AVX-512 BF16 here")]
    return [pytest.param(h, id="native", marks=marks), pytest.param(avx2, id="avx2")]


TARGETS = _targets()


def _func(op: ComputeOp) -> Func:
    from nfc.codegen.lower import group_of

    return Func("f", list(group_of(op)[2]), Block([op, ReturnOp([op.result])]))


def _as_f32(x: np.ndarray) -> np.ndarray:
    return np.asarray(x).astype(np.float32)


def _bf16_values(x: np.ndarray) -> np.ndarray:
    """float32 values that bf16 represents (inputs of bf16 tensors)."""
    return x.astype(ml_dtypes.bfloat16).astype(np.float32)


def _inputs(op: ComputeOp, seed: int = 0) -> list[np.ndarray]:
    ins = random_inputs(inputs_of(op), seed)
    return [_bf16_values(x) if v.dtype is BF16 else x
            for x, v in zip(ins, inputs_of(op), strict=True)]


def _ties(n: int) -> np.ndarray:
    """float32 values around every rounding case of both formats: exact ties of bf16 (low
    16 bits 0x8000, odd and even upper halves) and of f16 (13 low bits 0x1000), one ulp of
    f32 either side, signed zeros, inf, NaN, f16 overflow and f16 subnormals."""
    rng = np.random.default_rng(1)
    hi = rng.integers(0x3C00, 0x4400, n // 4, dtype=np.uint32) << 16  # |x| in [2^-7, 2^9)
    bf = np.concatenate([hi | 0x8000, (hi | 0x18000), hi | 0x7FFF, hi | 0x8001])
    f16 = (rng.integers(0x1E000, 0x22000, n // 4, dtype=np.uint32) << 13)
    f16 = np.concatenate([f16 | 0x1000, f16 | 0x3000, f16 | 0x0FFF, f16 | 0x1001])
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 7.0e4, -7.0e4, 65520.0, 3.0e-6,
                        -1.0e-7, 1.0e-30], np.float32)
    out = np.concatenate([bf.view(np.float32), f16.view(np.float32), special])
    flip = (rng.random(out.size) < 0.5) & ~np.isnan(out)
    return np.where(flip, -out, out)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dt", [F16, BF16], ids=str)
def test_cast_rounds_to_nearest_even(dt, target):
    x = _ties(256)
    src = tensor("x", x.shape, F32)
    op = compute({"i": x.size}, Cast(dt, ld(src, "i")), dt)
    got = _as_f32(compile_kernel(op, target=target)(x))
    want = _as_f32(interp_run(_func(op), [x])[0])
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))
    # the kernel's bits, not just its values: bf16 and f16 round the same ties differently
    if dt is BF16:
        np.testing.assert_array_equal(compile_kernel(op, target=target)(x)[~nan].view(
            np.uint16), want[~nan].view(np.uint32) >> 16)


@pytest.mark.parametrize("target", TARGETS)
def test_bf16_path_follows_cpu_features(target):
    x = tensor("x", (64,), F32)
    op = compute({"i": 64}, Cast(BF16, ld(x, "i")), BF16)
    text = compile_kernel(op, target=target).ir_text
    native = re.search(r"fptrunc [^\n]* to (<\d+ x )?bfloat", text) is not None
    assert native == target.has("avx512bf16")


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dt", [F16, BF16], ids=str)
def test_one_operation_matches_the_interpreter_bitwise(dt, target):
    """x * y + widening and narrowing casts: f32 arithmetic on 16-bit operands, exact, then
    one rounding: what the interpreter does (numpy's float16 rounds every operation)."""
    a, b = tensor("a", (7, 45), dt), tensor("b", (7, 45), dt)
    op = compute({"i": 7, "j": 45}, ld(a, "i", "j") * ld(b, "i", "j"), dt)
    ins = _inputs(op, 3)
    got = _as_f32(compile_kernel(op, target=target)(*ins))
    want = _as_f32(interp_run(_func(op), ins)[0])
    np.testing.assert_array_equal(got, want)
    c = tensor("c", (7, 45), dt)
    op2 = compute({"i": 7, "j": 45}, Cast(F32, ld(c, "i", "j")) * Const(0.5), F32)
    got2 = compile_kernel(op2, target=target)(ins[0])
    np.testing.assert_array_equal(got2, ins[0].astype(np.float32) * np.float32(0.5))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dt,k,term", [(F16, 1 << 19, 2.0 ** -8), (BF16, 1 << 16, 1.0)],
                         ids=str)
def test_sums_accumulate_in_f32(dt, k, term, target):
    """A sum of equal terms whose partial sums pass the format's last exact step many times
    over, even split across 64 vector lanes (f16 stalls at 2^11 terms, bf16 at 2^8, when
    accumulated in the format itself), comes out exact."""
    x = tensor("x", (3, k), dt)
    op = compute({"i": 3}, ld(x, "i", "k"), dt, reduce="sum", raxes={"k": k})
    got = _as_f32(compile_kernel(op, target=target)(np.full((3, k), term, np.float32)))
    np.testing.assert_array_equal(got, np.full(3, k * term, np.float32))


def _check_bounded(op, kernel, ins) -> None:
    got = kernel(*ins)
    got = got if isinstance(got, tuple) else (got,)
    bounds = run_bounded(_func(op), ins, probable=True)
    for n, (g, (v, e)) in enumerate(zip(got, bounds, strict=True)):
        g = np.asarray(g)
        if g.dtype.kind in "iub":
            np.testing.assert_array_equal(g, v)
            continue
        g = _as_f32(g).astype(np.float64)
        special = ~np.isfinite(v)
        assert np.array_equal(np.isnan(g[special]), np.isnan(v[special])), n
        assert_within_bounds(g, v, np.where(special, np.inf, e), name=f"result {n}")


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dt", [F16, BF16], ids=str)
@pytest.mark.parametrize("shape", [(37, 45, 300), (64, 64, 64), (3, 130, 17)], ids=str)
def test_matmul_within_the_format_bound(dt, shape, target):
    op = matmul(*shape, dt)
    kernel = compile_kernel(op, target=target)
    if shape != (3, 130, 17):  # (its odd k is no micro-kernel's) bf16 tiles: vdpbf16ps
        assert ("dpbf16ps" in kernel.ir_text) == (dt is BF16 and target.has("avx512bf16"))
    _check_bounded(op, kernel, _inputs(op))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dt", [F16, BF16], ids=str)
def test_elementwise_math_within_the_format_bound(dt, target):
    a = tensor("a", (9, 33), dt)
    x = ld(a, "i", "j")
    body = Call("tanh", (x,)) * Call("exp", (x * Const(0.5),)) + Call("sigmoid", (x,))
    op = compute({"i": 9, "j": 33}, body, dt)
    _check_bounded(op, compile_kernel(op, target=target), _inputs(op, 5))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dt", [F16, BF16], ids=str)
def test_mlp_training_step_computes(dt, target):
    """Every compute of the MLP-3 training step (frontend + autodiff) in f16/bf16, compiled
    into one module, within the format's bound of the float64 reference."""
    from nfc.frontend import compile_source
    from nfc.passmanager import PassManager, get_pass

    src = (EXAMPLES / "mlp.nf").read_text().replace("f32[", f"{dt}[")
    module = compile_source(src, "mlp_lowp.nf", params={"batch": 8, "inputs": 24,
                                                       "hidden1": 16, "hidden2": 12})
    PassManager([get_pass("autodiff")()], verify=False).run(module)
    ops = [op for op in module.func("train_step").walk() if isinstance(op, ComputeOp)]
    assert ops and any(op.result.dtype is dt for op in ops)
    for op, kernel in zip(ops, compile_kernels(ops, target=target), strict=True):
        ins = random_inputs(kernel.info.inputs, 1, positive=True)
        for n, v in enumerate(kernel.info.inputs):
            if v.dtype.is_int:  # labels and rng words: small non-negative values
                ins[n] = np.abs(ins[n]) % 2
            elif v.dtype is BF16:
                ins[n] = _bf16_values(ins[n])
        _check_bounded(op, kernel, ins)


def _mixed_matmul(m: int, n: int, k: int) -> ComputeOp:
    """C[i, j] = sum_k f32(A16[i, k]) * f32(B16[k, j]) in f32: what the precision pass
    makes of a matmul."""
    a, b = tensor("A", (m, k), BF16), tensor("B", (k, n), BF16)
    return compute({"i": m, "j": n}, Cast(F32, ld(a, "i", "k")) * Cast(F32, ld(b, "k", "j")),
                   F32, reduce="sum", raxes={"k": k})


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("shape", [(64, 64, 64), (37, 45, 300), (96, 130, 84)], ids=str)
def test_mixed_gemm_dot_products(shape, target):
    """The GEMM micro-kernel of bf16 operands summed in f32 uses `vdpbf16ps` exactly where
    the CPU has AVX-512 BF16 (two products per lane and instruction), and either way stays
    within the f32 bound of the sum of exact products (worst case, any order)."""
    op = _mixed_matmul(*shape)
    kernel = compile_kernel(op, target=target)
    assert ("dpbf16ps" in kernel.ir_text) == target.has("avx512bf16")
    ins = _inputs(op, 2)
    got = np.asarray(kernel(*ins), np.float64)
    (v, e), = run_bounded(_func(op), ins)
    assert_within_bounds(got, v, e)
