"""Helpers of the CUDA backend tests: computes to lower, inputs, the interpreter oracle, the
error bounds of each precision, and a corpus of (name, compute, schedule) cases that the
simulator and NVRTC tests share."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from nfc.codegen.cuda.lower import GpuProgram, lower_program
from nfc.codegen.cuda.schedule import (
    ElementwiseSchedule,
    GemmSchedule,
    GpuSchedule,
    ReduceSchedule,
)
from nfc.codegen.loops import Allocate, Barrier, For, If, Seq, Stmt
from nfc.codegen.lower import group_of
from nfc.interp import run as interp_run
from nfc.ir import (
    Axis,
    Binary,
    Block,
    Call,
    Cast,
    ComputeOp,
    Const,
    DType,
    Expr,
    Func,
    Index,
    KernelOp,
    Load,
    ReturnOp,
    Select,
    TensorType,
    Value,
)

F16, BF16, F32, F64, I32, I64 = (DType.F16, DType.BF16, DType.F32, DType.F64, DType.I32,
                                 DType.I64)
#: Unit roundoff of each WMMA input precision.
UNIT = {"f16": 2.0**-11, "bf16": 2.0**-8, "tf32": 2.0**-11, "fma": 2.0**-24}


def tensor(name: str, shape: Sequence[int], dtype: DType = F32) -> Value:
    """A fresh input value."""
    return Value(TensorType(tuple(shape), dtype), name)


def ld(v: Value, *idx: Expr | str) -> Load:
    """`v[idx]`, strings as index variables."""
    return Load(v, tuple(Index(i) if isinstance(i, str) else i for i in idx))


def compute(dims: dict[str, int], body: Expr, dtype: DType = F32, *, reduce: str | None = None,
            raxes: dict[str, int] | None = None, name: str = "r") -> ComputeOp:
    """An nf.compute over `dims` (name -> extent)."""
    return ComputeOp(TensorType(tuple(dims.values()), dtype),
                     tuple(Axis(n, e) for n, e in dims.items()), body, reduce=reduce,
                     raxes=tuple(Axis(n, e) for n, e in (raxes or {}).items()), name=name)


def matmul(m: int, n: int, k: int, dtype: DType = F32, *, a_t: bool = False) -> ComputeOp:
    """`C[i, j] = sum_k A[i, k] * B[k, j]` (A stored as A[k, i] with `a_t`)."""
    a = tensor("A", (k, m) if a_t else (m, k), dtype)
    b = tensor("B", (k, n), dtype)
    body = (ld(a, "k", "i") if a_t else ld(a, "i", "k")) * ld(b, "k", "j")
    return compute({"i": m, "j": n}, body, dtype, reduce="sum", raxes={"k": k})


def inputs_of(op: ComputeOp | KernelOp | Sequence[ComputeOp]) -> list[Value]:
    """The program's inputs in order."""
    return group_of(op)[2]


def random_inputs(values: Sequence[Value], seed: int = 0, *, positive: bool = False,
                  ints: tuple[int, int] = (-8, 8)) -> list[np.ndarray]:
    """Random arrays for `values`."""
    rng = np.random.default_rng(seed)
    out = []
    for v in values:
        if v.dtype is DType.I1:
            out.append(rng.random(v.shape) < 0.5)
        elif v.dtype.is_int:
            out.append(rng.integers(*ints, v.shape).astype(v.dtype.numpy))
        elif positive:
            out.append(rng.uniform(0.1, 2.0, v.shape).astype(v.dtype.numpy))
        else:
            out.append(rng.standard_normal(v.shape).astype(v.dtype.numpy))
    return out


def reference(op: ComputeOp | KernelOp | Sequence[ComputeOp],
              inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The interpreter's outputs."""
    ops, outs, ins = group_of(op)
    body = [op] if isinstance(op, ComputeOp | KernelOp) else list(ops)
    rets = list(op.results) if isinstance(op, KernelOp) else list(outs)
    return interp_run(Func("f", list(ins), Block([*body, ReturnOp(rets)])), list(inputs))


def assert_matches(got: np.ndarray, want: np.ndarray, rtol: float = 1e-5,
                   atol: float = 1e-6) -> float:
    """Same shape and dtype; floats within tolerance, others equal. The max error relative to
    1 + |want|."""
    assert got.shape == want.shape, (got.shape, want.shape)
    if got.dtype.kind != "f":
        np.testing.assert_array_equal(got, want)
        return 0.0
    np.testing.assert_allclose(got, want.astype(got.dtype), rtol=rtol, atol=atol)
    return float(np.max(np.abs(got.astype(np.float64) - want) / (1 + np.abs(want)), initial=0))


def drop_barrier(s: Stmt, n: int, scope: str = "block") -> Stmt:
    """`s` without its n-th barrier of `scope` (walk order): a deliberately racy kernel."""
    count = [0]

    def go(s: Stmt) -> Stmt:
        if isinstance(s, Seq):
            out = []
            for c in s.body:
                if isinstance(c, Barrier) and c.scope == scope:
                    count[0] += 1
                    if count[0] - 1 == n:
                        continue
                out.append(go(c))
            return Seq(tuple(out))
        if isinstance(s, For):
            return For(s.var, s.extent, s.kind, go(s.body))
        if isinstance(s, If):
            return If(s.cond, go(s.then), None if s.orelse is None else go(s.orelse))
        if isinstance(s, Allocate):
            return Allocate(s.buffer, go(s.body))
        return s
    out = go(s)
    assert count[0] > n, f"the kernel has only {count[0]} {scope} barriers"
    return out


def with_body(p: GpuProgram, fn: Callable[[Stmt], Stmt]) -> GpuProgram:
    """`p` with its (single) kernel's body transformed."""
    (k,) = p.kernels
    return replace(p, kernels=(replace(k, func=replace(k.func, body=fn(k.func.body))),))


# ---------------------------------------------------------------------------------------------
# the corpus


def _elementwise() -> ComputeOp:
    x, y = tensor("x", (37, 29)), tensor("y", (29,))
    e = Call("exp", (ld(x, "i", "j") * 0.5,)) + Call("tanh", (ld(y, "j"),))
    e = e * Call("sigmoid", (ld(x, "i", "j"),)) - Call("erf", (ld(y, "j"),))
    e = Select(Binary(">", ld(x, "i", "j"), Const(0.0)), e, Call("abs", (ld(x, "i", "j"),)))
    return compute({"i": 37, "j": 29}, e + Cast(F32, Index("j") % 3 - Index("i") // 5))


def _gather() -> ComputeOp:
    table, idx = tensor("table", (50, 24)), tensor("idx", (13,), I32)
    return compute({"t": 13, "d": 24}, ld(table, ld(idx, "t"), "d") * 2.0)


def _reduce(kind: str) -> ComputeOp:
    x = tensor("x", (6, 70, 5))
    return compute({"b": 6, "c": 5}, ld(x, "b", "r", "c"), reduce=kind, raxes={"r": 70})


def softmax() -> list[ComputeOp]:
    """Row max, exponentials and their sum, normalisation: a three-stage group."""
    x = tensor("x", (9, 45))
    m = compute({"i": 9}, ld(x, "i", "j"), reduce="max", raxes={"j": 45}, name="m")
    e = compute({"i": 9, "j": 45}, Call("exp", (ld(x, "i", "j") - ld(m.result, "i"),)),
                name="e")
    s = compute({"i": 9}, ld(e.result, "i", "j"), reduce="sum", raxes={"j": 45}, name="s")
    y = compute({"i": 9, "j": 45}, ld(e.result, "i", "j") / ld(s.result, "i"), name="y")
    return [m, e, s, y]


def _strided_grad() -> ComputeOp:
    """The input gradient of a stride-2, width-3 window (a gather-form gradient):
    dx[n, h] = sum_r (dy[n, (h - r) // 2] if (h - r) % 2 == 0 and 0 <= (h - r) // 2 < 15)."""
    dy = tensor("dy", (4, 15))
    h_r = Index("h") - Index("r")
    cond = Binary("and", Binary("==", h_r % 2, Const(0)),
                  Binary("and", Binary(">=", h_r // 2, Const(0)), Binary("<", h_r // 2,
                                                                          Const(15))))
    body = Select(cond, ld(dy, "n", h_r // 2), Const(0.0))
    return compute({"n": 4, "h": 31}, body, reduce="sum", raxes={"r": 3})


def _adam() -> ComputeOp:
    w, m, v, lr = tensor("w", (300,)), tensor("m", (300,)), tensor("v", (300,)), tensor("lr", ())
    upd = ld(lr) * ld(m, "i") / (Call("sqrt", (ld(v, "i"),)) + 1e-8)
    return compute({"i": 300}, ld(w, "i") - upd)


def _dropout() -> ComputeOp:
    """Inverted dropout with the philox intrinsic (its CUDA port against nfc/philox.py)."""
    x, seed = tensor("x", (300,)), tensor("seed", (), I64)
    keep = Binary("<", Call("philox", (ld(seed), Index("i") + 1000)), Const(0.7))
    return compute({"i": 300}, Select(keep, ld(x, "i") / 0.7, Const(0.0)))


def _conv_im2col() -> ComputeOp:
    """A convolution after im2col: y[n, o, i, j] = sum_(c, r, s) k[o, c, r, s] *
    cols[n, c, r, s, i, j], a contraction over runs of axes (a batched GEMM view)."""
    k, cols = tensor("k", (8, 3, 3, 3)), tensor("cols", (2, 3, 3, 3, 6, 6))
    return compute({"n": 2, "o": 8, "i": 6, "j": 6},
                   ld(k, "o", "c", "r", "s") * ld(cols, "n", "c", "r", "s", "i", "j"),
                   reduce="sum", raxes={"c": 3, "r": 3, "s": 3})


def _batched_kouter() -> ComputeOp:
    """`C[b, i, j] = sum_(p, k) A[b, p, i, k] * B[p, k, j]`: a batch axis and an outer
    reduction axis around the GEMM."""
    a, b = tensor("A", (3, 2, 20, 24)), tensor("B", (2, 24, 18))
    return compute({"b": 3, "i": 20, "j": 18}, ld(a, "b", "p", "i", "k") * ld(b, "p", "k", "j"),
                   reduce="sum", raxes={"p": 2, "k": 24})


#: name -> (builder, schedules to try (None: the default), positive inputs, precision)
CASES: dict[str, tuple[Callable[[], ComputeOp | list[ComputeOp]], list[GpuSchedule | None],
                       bool, str]] = {
    "elementwise": (_elementwise, [None, ElementwiseSchedule(64, 3)], False, "fma"),
    "gather": (_gather, [None], False, "fma"),
    "dropout": (_dropout, [None], False, "fma"),
    "adam": (_adam, [None, ElementwiseSchedule(128, 2)], True, "fma"),
    "sum": (lambda: _reduce("sum"), [ReduceSchedule(s, t, sh) for s, t, sh in (
        ("thread", 32, True), ("warp", 64, True), ("block", 64, True),
        ("block", 128, False), ("block", 32, True))], False, "fma"),
    "max": (lambda: _reduce("max"), [None, ReduceSchedule("block", 256, True)], False, "fma"),
    "prod": (lambda: _reduce("prod"), [ReduceSchedule("warp", 32)], True, "fma"),
    "softmax": (softmax, [None], False, "fma"),
    "strided_grad": (_strided_grad, [None, ReduceSchedule("warp", 128)], False, "fma"),
    "matmul": (lambda: matmul(70, 50, 40), [
        None, GemmSchedule("fma", 32, 64, 8, 2, 4), GemmSchedule("fma", 16, 16, 16, 1, 1)],
        False, "fma"),
    "matmul_i32": (lambda: matmul(20, 21, 22, I32), [None], False, "fma"),
    "matmul_f64": (lambda: matmul(20, 21, 22, F64), [GemmSchedule("fma", 16, 32, 8, 2, 2)],
                   False, "fma"),
    "matmul_at": (lambda: matmul(33, 20, 17, a_t=True), [None], False, "fma"),
    "conv_im2col": (_conv_im2col, [None], False, "fma"),
    "batched_kouter": (_batched_kouter, [None], False, "fma"),
    "matmul_f16": (lambda: matmul(40, 48, 50, F16), [
        None, GemmSchedule("f16", 16, 16, 16, warps_m=1, warps_n=1),
        GemmSchedule("f16", 32, 64, 16, warps_m=2, warps_n=1),
        GemmSchedule("f16", 64, 32, 32, warps_m=2, warps_n=2)], False, "f16"),
    "matmul_bf16": (lambda: matmul(40, 48, 50, BF16), [None], False, "bf16"),
    "matmul_tf32": (lambda: matmul(40, 48, 50), [GemmSchedule("tf32", 32, 32, 16)], False,
                    "tf32"),
    "matmul_f32_as_f16": (lambda: matmul(40, 48, 50), [GemmSchedule("f16", 32, 32, 32)],
                          False, "f16"),
    "conv_im2col_f16": (lambda: _conv_f16(), [None], False, "f16"),
}


def _conv_f16() -> ComputeOp:
    k, cols = tensor("k", (8, 3, 3, 3), F16), tensor("cols", (2, 3, 3, 3, 6, 6), F16)
    return compute({"n": 2, "o": 8, "i": 6, "j": 6},
                   ld(k, "o", "c", "r", "s") * ld(cols, "n", "c", "r", "s", "i", "j"), F16,
                   reduce="sum", raxes={"c": 3, "r": 3, "s": 3})


def case_programs() -> list[tuple[str, ComputeOp | list[ComputeOp], GpuProgram, bool, str]]:
    """Every (case, schedule) of the corpus lowered: (id, op, program, positive, precision);
    kernel names are unique across the list."""
    out = []
    for name, (build, scheds, positive, precision) in CASES.items():
        for n, s in enumerate(scheds):
            op = build()
            out.append((f"{name}_{n}", op, lower_program(op, s, name=f"{name}_{n}"), positive,
                        precision))
    return out
