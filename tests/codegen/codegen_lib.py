"""Helpers of the codegen tests: IR builders, random inputs and the interpreter oracle."""

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


def reference(op: ComputeOp | KernelOp, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The interpreter's results for `op` on `inputs`."""
    from nfc.codegen.lower import group_of

    _, outs, ins = group_of(op)
    rets = list(op.results) if isinstance(op, KernelOp) else list(outs)
    func = Func("f", list(ins), Block([op, ReturnOp(rets)]))
    return interp_run(func, list(inputs))


def check(op: ComputeOp | KernelOp, schedule: object = None, *, seed: int = 0,
          positive: bool = False, inputs: Sequence[np.ndarray] | None = None,
          atol: float | None = None):
    """Compile `op` (default or given schedule), run, compare with the interpreter."""
    from nfc.codegen.jit import compile_kernel

    kernel = compile_kernel(op, schedule)  # type: ignore[arg-type]
    ins = list(inputs) if inputs is not None else random_inputs(inputs_of(op), seed,
                                                               positive=positive)
    got = kernel(*ins)
    got = list(got) if isinstance(got, tuple) else [got]
    want = reference(op, ins)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, w.shape, g.dtype, w.dtype)
        dt = DType(str(g.dtype).replace("float", "f").replace("int", "i")) \
            if g.dtype != np.bool_ else I1
        if g.dtype.kind == "f":
            tol = atol if atol is not None else (1e-5 if dt is F32 else 1e-12)
            np.testing.assert_allclose(g, w, rtol=RTOL[dt], atol=tol)
        else:
            np.testing.assert_array_equal(g, w)
    return kernel
