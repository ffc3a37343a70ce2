"""The types GPU code computes loop-IR expressions in, shared by the renderer and the simulator.

Kinds come from the operator table (`nfc.ops.Typer` with the backend join `promote`); a weak
kind takes the type its context expects (`resolve`), as on the CPU, except that a weak integer
with no context is a 32-bit `int`: GPU index arithmetic is 32-bit (the lowering refuses buffers
of 2**31 elements or more). f16 and bf16 are storage types: values are converted to f32 when
loaded and computed in f32, and rounded back when stored or cast (the interpreter rounds bf16
at stores, and f16 per operation; the difference is within the f16 unit roundoff).
"""

from __future__ import annotations

import numpy as np

from nfc.codegen.loops import BufLoad, Clamp
from nfc.ir import Cast, Const, DType, Expr, Select
from nfc.ops import WEAK_FLOAT, WEAK_INT, Kind, Typer, find, promote

I1, I32, I64, F16, BF16, F32, F64 = (DType.I1, DType.I32, DType.I64, DType.F16, DType.BF16,
                                     DType.F32, DType.F64)


def compute_type(dt: DType) -> DType:
    """The type values of `dt` are computed in (f16 and bf16 in f32)."""
    return F32 if dt in (F16, BF16) else dt


def resolve(k: Kind | None, ctx: DType | None) -> DType:
    """The compute type of kind `k` where the context expects `ctx` (None: no expectation)."""
    if isinstance(k, DType):
        return compute_type(k)
    if k is WEAK_FLOAT:
        return ctx if ctx is not None and ctx.is_float else F32
    if k is WEAK_INT:
        return ctx if ctx is not None else I32
    raise TypeError("an expression of the loop IR has no type (ill-typed IR)")


def _leaf(e: Expr) -> Kind | None:
    if isinstance(e, BufLoad):
        return e.buffer.dtype
    if isinstance(e, Clamp):
        return WEAK_INT
    return None


class Types:
    """Compute types of the nodes of loop-IR expressions (memoised per node)."""

    def __init__(self) -> None:
        self.typer = Typer(_leaf, promote)

    def result(self, e: Expr, ctx: DType | None) -> DType:
        """The type `e` computes its value in, where the context expects `ctx`."""
        if isinstance(e, Cast):
            return compute_type(e.dtype)
        return resolve(self.typer.kind(e), ctx)

    def operand(self, e: Expr, ctx: DType | None) -> DType:
        """The type the operands of operator node `e` are converted to (for a select: its
        branches; its condition is i1)."""
        opk, _ = self.typer.kinds(e)
        if isinstance(e, Cast):
            return self.result(e.children()[0], None)
        row = find(e)
        fixed = row is not None and row.result is not None and not isinstance(e, Select)
        return resolve(opk, None if fixed else ctx)


def numpy_dtype(dt: DType) -> np.dtype:
    """The numpy dtype of a compute type (bool for i1)."""
    return np.dtype({I1: "bool", I32: "int32", I64: "int64", F32: "float32",
                     F64: "float64", F16: "float16", BF16: "float32"}[dt])


def round_to(x: np.ndarray, precision: str) -> np.ndarray:
    """f32 values rounded to `f16`, `bf16` or `tf32` precision (nearest even), kept as f32."""
    x = np.asarray(x, dtype=np.float32)
    if precision == "f16":
        with np.errstate(over="ignore"):
            return x.astype(np.float16).astype(np.float32)
    drop = {"bf16": 16, "tf32": 13}[precision]
    bits = x.view(np.uint32).astype(np.uint64)
    half = np.uint64(1 << (drop - 1))
    odd = (bits >> np.uint64(drop)) & np.uint64(1)
    finite = np.isfinite(x)
    rounded = ((bits + half - np.uint64(1) + odd) >> np.uint64(drop)) << np.uint64(drop)
    out = np.where(finite, rounded, bits).astype(np.uint32).view(np.float32)
    return out


def const_value(c: Const, dt: DType) -> int | float | bool:
    """A literal as a Python value of compute type `dt`."""
    if dt is I1:
        return bool(c.value)
    if dt.is_float:
        return float(c.value)
    return int(c.value)
