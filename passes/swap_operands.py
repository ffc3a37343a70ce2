"""The `swap-operands` pass: NeoFlow's tensor swapping (section 4) for narrow contractions."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from nfc.contraction import match_contraction
from nfc.ir import ComputeOp, Index, Load, Module, Op, TensorType
from nfc.passmanager import Context, ModulePass
from nfc.rewrite import PatternRewriteWalker, RewritePattern, Rewriter


@dataclass(frozen=True)
class SwapOperands(ModulePass):
    """Compute a narrow contraction transposed, so that its wide axis is the vectorised one.

    Before:  %c = nf.compute [i: 256, j: 10] sum [k: 64] (%a[i, k] * %b[k, j]) : tensor<256x10xf32>
    After:   %t = nf.compute [j: 10, i: 256] sum [k: 64] (%a[i, k] * %b[k, j]) : tensor<10x256xf32>
             %c = nf.compute [i: 256, j: 10] (%t[j, i]) : tensor<256x10xf32>

    The CPU backend vectorises a contraction `C[i, j] = sum_k A[i, k] * B[k, j]` along its
    last output axis `j` (nfc.contraction's roles). When `j` is shorter than a vector register
    (a 10-class classifier: 10 of 16 AVX-512 lanes) and `i` is at least `min-ratio` times
    longer, the pass computes `Cᵀ` instead (the same body over the output axes with `i` and
    `j` exchanged, so `i` is the last one: the operands swap roles) and a transposing copy
    gives `C` (the `fuse` pass usually inlines it into its readers). Only contractions whose
    roles are single axes (`is_gemm`) are swapped; the result is exactly the same sums.
    """

    name: ClassVar[str] = "swap-operands"

    max_cols: int = 15
    """Swap when the vectorised axis `j` has at most this many elements."""
    min_ratio: int = 2
    """... and `i` has at least this many times more."""

    def apply(self, ctx: Context, module: Module) -> None:
        """Swap the narrow contractions of every function."""
        walker = PatternRewriteWalker(SwapNarrow(self), apply_recursively=False)
        walker.rewrite_module(module)
        ctx.remarks[self.name] = f"{walker.rewrites} contractions computed transposed"


@dataclass
class SwapNarrow(RewritePattern):
    """`C = A·B` with a narrow `j` becomes `Cᵀ` and a transposing copy."""

    opts: SwapOperands

    def match_and_rewrite(self, op: Op, rewriter: Rewriter) -> None:
        if not isinstance(op, ComputeOp):
            return
        c = match_contraction(op)
        if c is None or not c.is_gemm:
            return
        names = [a.name for a in op.dims]
        pi, pj = names.index(c.i[0]), names.index(c.j[0])
        ni, nj = op.dims[pi].extent, op.dims[pj].extent
        if nj > self.opts.max_cols or ni < self.opts.min_ratio * nj or ni <= nj:
            return  # (ni > nj: a swapped compute is never swapped back)
        perm = list(range(len(names)))
        perm[pi], perm[pj] = pj, pi
        dims = tuple(op.dims[p] for p in perm)
        shape = tuple(op.result.shape[p] for p in perm)
        swapped = ComputeOp(TensorType(shape, op.result.dtype), dims, op.body,
                            reduce=op.reduce, raxes=op.raxes, loc=op.loc,
                            attrs=dict(op.attrs))
        copy = ComputeOp(op.result.type, op.dims,
                         Load(swapped.result, tuple(Index(d.name) for d in dims)),
                         loc=op.loc, name=op.result.name)
        rewriter.replace_op(op, [swapped, copy])
