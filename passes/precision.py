"""The `precision` pass: mixed-precision contractions (bf16 or f16 operands, f32 sums)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from nfc.contraction import match_contraction
from nfc.diagnostics import CompileError, Diagnostic
from nfc.ir import (
    Axis,
    Block,
    Cast,
    ComputeOp,
    DType,
    Expr,
    Index,
    Load,
    Module,
    Op,
    TensorType,
    Value,
)
from nfc.passmanager import Context, ModulePass
from nfc.rewrite import Rewriter

#: The storage types the pass may round operands to.
DTYPES = {"bf16": DType.BF16, "f16": DType.F16}


@dataclass(frozen=True)
class Precision(ModulePass):
    """Read the operands of every f32 contraction (matmuls, and convolutions once im2col made
    them matmuls; forward and gradients alike) in a 16-bit format, summing in f32.

    Before:  %y = nf.compute [i: 64, j: 128] sum [k: 256] (%x[i, k] * %w[k, j]) : tensor<64x128xf32>
    After:   %x16 = nf.compute [d0: 64, d1: 256] (bf16(%x[d0, d1])) : tensor<64x256xbf16>
             %w16 = nf.compute [d0: 256, d1: 128] (bf16(%w[d0, d1])) : tensor<256x128xbf16>
             %y = nf.compute [i: 64, j: 128] sum [k: 256]
                      (f32(%x16[i, k]) * f32(%w16[k, j])) : tensor<64x128xf32>

    Mixed-precision training as frameworks do it: the parameters (master weights), the
    optimizer state and every other computation stay f32; a contraction reads its operands
    rounded to `dtype` (nearest even), multiplies them (exactly, in f32: two 8-bit
    significands) and accumulates in f32, into an f32 result. A tensor read by several
    contractions of a function (a weight by the forward product and the input gradient, an
    activation by the forward product and the weight gradient) is rounded once. The casts
    are computes of their own, so the contraction stays one (`nfc.contraction` sees through
    a widening cast of a 16-bit load) and keeps its GEMM schedule; codegen reads the 16-bit
    tensors (half the bytes) and widens them in registers. Run it after `training-functions`
    and `inline`, so that the gradient contractions exist; `nfc train --precision bf16`
    inserts it there. bf16 keeps f32's exponent range, so gradients need no loss scaling;
    f16 does not (its smallest normal number is 6e-5), use it for inference.
    """

    name: ClassVar[str] = "precision"

    dtype: str = "bf16"
    """The format contraction operands are read in: bf16 or f16."""

    def apply(self, ctx: Context, module: Module) -> None:
        """Round the operands of the f32 contractions of every function."""
        if self.dtype not in DTYPES:
            raise CompileError([Diagnostic(
                "error", f"option 'dtype' of pass 'precision' must be bf16 or f16, got "
                f"'{self.dtype}'", None)])
        dt = DTYPES[self.dtype]
        rewriter = Rewriter()
        done = casts = 0
        for func in module.funcs:
            rounded: dict[int, Value] = {}
            for op in list(func.body.ops):
                if isinstance(op, ComputeOp) and _eligible(op):
                    casts += _round_operands(op, dt, rounded, func.body, rewriter)
                    done += 1
        ctx.remarks[self.name] = (f"{done} contractions read {self.dtype} operands "
                                  f"({casts} tensors rounded)")


def _eligible(op: ComputeOp) -> bool:
    """An f32 contraction of two f32 tensors, loaded plainly (not through casts)."""
    c = match_contraction(op)
    return (c is not None and op.result.dtype is DType.F32 and len(_operand_loads(op)) == 2
            and c.a.tensor.dtype is DType.F32 and c.b.tensor.dtype is DType.F32)


def _round_operands(op: ComputeOp, dt: DType, rounded: dict[int, Value], block: Block,
                    rewriter: Rewriter) -> int:
    """Make `op` read its two operands through `dt` copies (made before `op` unless an
    earlier contraction of `block` made them); the number of copies made."""
    made = 0
    subst: dict[int, Value] = {}
    for ld in _operand_loads(op):
        v = ld.tensor
        if id(v) not in rounded:
            cast = _cast_compute(v, dt, op)
            rewriter.insert_op_before(cast, op)
            rounded[id(v)] = cast.result
            made += 1
        subst[id(v)] = rounded[id(v)]

    def fn(e: Expr) -> Expr | None:
        if isinstance(e, Load) and id(e.tensor) in subst:
            return Cast(DType.F32, Load(subst[id(e.tensor)], e.indices))
        return None
    rewriter.update(op, body=op.body.map(fn))
    return made


def _operand_loads(op: ComputeOp) -> list[Load]:
    body = op.body
    return [x for x in (body.a, body.b) if isinstance(x, Load)]  # type: ignore[attr-defined]


def _cast_compute(v: Value, dt: DType, user: Op) -> ComputeOp:
    """`%v16 = nf.compute [d0: .., ...] (dt(%v[d0, ...]))`."""
    axes = tuple(Axis(f"d{n}", e) for n, e in enumerate(v.shape))
    body = Cast(dt, Load(v, tuple(Index(a.name) for a in axes)))
    return ComputeOp(TensorType(v.shape, dt), axes, body, loc=user.loc,
                     name=f"{v.name or 'x'}_{dt}")


def with_precision(pipeline: str, dtype: str) -> str:
    """`pipeline` with `precision{dtype=...}` inserted after `inline` (after
    `training-functions` without one, first without either): where the gradient
    contractions exist and before `cse` and `fuse`. Unchanged for f32 or when the pipeline
    already has the pass."""
    from nfc.passmanager import build_pipeline, format_pipeline

    passes = build_pipeline(pipeline) if pipeline else []
    names = [p.name for p in passes]
    if dtype == "f32" or Precision.name in names:
        return pipeline
    at = next((names.index(n) + 1 for n in ("inline", "training-functions") if n in names), 0)
    passes.insert(at, Precision(dtype=dtype))
    return format_pipeline(passes)
