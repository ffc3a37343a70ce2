"""Helpers of the codegen tests: IR builders, random inputs and the interpreter oracle with
the error bound of each computation (nfc.testing)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from nfc.interp import run as interp_run
from nfc.ir import (
    Axis,
    Block,
    ComputeOp,
    DType,
    Expr,
    Func,
    Index,
    KernelOp,
    Load,
    ReturnOp,
    TensorType,
    Value,
)

F32, F64, I32, I64, I1 = DType.F32, DType.F64, DType.I32, DType.I64, DType.I1
#: Fallback tolerances where a result has no finite error bound (see assert_matches).
RTOL = {F32: 1e-4, F64: 1e-10}


def tensor(name: str, shape: Sequence[int], dtype: DType = F32) -> Value:
    """A fresh input value."""
    return Value(TensorType(tuple(shape), dtype), name)


def ix(*names: str) -> tuple[Expr, ...]:
    """Index variables."""
    return tuple(Index(n) for n in names)


def ld(v: Value, *idx: Expr | str) -> Load:
    """`v[idx]` with strings as index variables."""
    return Load(v, tuple(Index(i) if isinstance(i, str) else i for i in idx))


def compute(dims: dict[str, int], body: Expr, dtype: DType = F32, *, reduce: str | None = None,
            raxes: dict[str, int] | None = None, name: str = "r") -> ComputeOp:
    """An nf.compute over `dims` (name -> extent)."""
    shape = tuple(dims.values())
    return ComputeOp(TensorType(shape, dtype), tuple(Axis(n, e) for n, e in dims.items()),
                     body, reduce=reduce,
                     raxes=tuple(Axis(n, e) for n, e in (raxes or {}).items()), name=name)


def matmul(m: int, n: int, k: int, dtype: DType = F32) -> ComputeOp:
    """C[i, j] = sum_k A[i, k] * B[k, j]."""
    a, b = tensor("A", (m, k), dtype), tensor("B", (k, n), dtype)
    return compute({"i": m, "j": n}, ld(a, "i", "k") * ld(b, "k", "j"), dtype, reduce="sum",
                   raxes={"k": k})


def inputs_of(op: ComputeOp | KernelOp) -> list[Value]:
    """The kernel inputs in codegen's order."""
    from nfc.codegen.lower import group_of

    return group_of(op)[2]


def random_inputs(values: Sequence[Value], seed: int = 0, *, positive: bool = False
                  ) -> list[np.ndarray]:
    """Random arrays for `values` (ints in [-8, 8), floats normal or in (0.1, 2))."""
    rng = np.random.default_rng(seed)
    out = []
    for v in values:
        dt = v.dtype.numpy
        if v.dtype is I1:
            out.append(rng.random(v.shape) < 0.5)
        elif v.dtype.is_int:
            out.append(rng.integers(-8, 8, v.shape).astype(dt))
        elif positive:
            out.append(rng.uniform(0.1, 2.0, v.shape).astype(dt))
        else:
            out.append(rng.standard_normal(v.shape).astype(dt))
    return out


def _single(op: ComputeOp | KernelOp) -> Func:
    from nfc.codegen.lower import group_of

    _, outs, ins = group_of(op)
    rets = list(op.results) if isinstance(op, KernelOp) else list(outs)
    return Func("f", list(ins), Block([op, ReturnOp(rets)]))


def reference(op: ComputeOp | KernelOp, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The interpreter's results for `op` on `inputs`."""
    return interp_run(_single(op), list(inputs))


def assert_matches(op: ComputeOp | KernelOp, inputs: Sequence[np.ndarray],
                   got: Sequence[np.ndarray], *, atol: float | None = None) -> None:
    """`got` (the results of a compiled `op` on `inputs`) against the interpreter, within the
    error bound of the computation (nfc.testing.assert_matches_oracle: float64 reference and
    a bound of any float32/float64 evaluation order, so neither the machine nor the schedule's
    summation order matters). Elements without a finite bound fall back to rtol RTOL and
    `atol` (default 1e-5 for f32, 1e-12 for f64)."""
    from nfc.testing import assert_matches_oracle

    f32 = any(np.asarray(g).dtype == np.float32 for g in got)
    dt = F32 if f32 else F64
    assert_matches_oracle(_single(op), list(inputs), list(got), rtol=RTOL[dt],
                          atol=atol if atol is not None else (1e-5 if f32 else 1e-12))


def check(op: ComputeOp | KernelOp, schedule: object = None, *, seed: int = 0,
          positive: bool = False, inputs: Sequence[np.ndarray] | None = None,
          atol: float | None = None):
    """Compile `op` (default or given schedule), run, compare with the interpreter
    (assert_matches)."""
    from nfc.codegen.jit import compile_kernel

    kernel = compile_kernel(op, schedule)  # type: ignore[arg-type]
    ins = list(inputs) if inputs is not None else random_inputs(inputs_of(op), seed,
                                                               positive=positive)
    got = kernel(*ins)
    assert_matches(op, ins, list(got) if isinstance(got, tuple) else [got], atol=atol)
    return kernel
