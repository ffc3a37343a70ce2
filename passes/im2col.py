"""The `im2col` pass: gather the windows of a convolution into columns, so that the
convolution, its weight gradient and its input gradient are all batched GEMMs.

A convolution reads its input through affine indices (`x[n, c, i*2 + r - 1, j*2 + s - 1]`,
often under a padding guard), which no GEMM micro-kernel can stream. This pass splits such a
contraction in two:

    Before:  %y = nf.compute [n, o, i, j] sum [c, r, s]
                  (select(guard, %x[n, c, i*S + r - P, j*S + s - P], 0.0) * %k[o, c, r, s])
    After:   %cols = nf.compute [n, c, r, s, i, j]
                  (select(guard, %x[n, c, i*S + r - P, j*S + s - P], 0.0))
             %y = nf.compute [n, o, i, j] sum [c, r, s] (%cols[n, c, r, s, i, j] * %k[o, c, r, s])

The new contraction indexes both operands by plain axes whose runs flatten into a GEMM
(nfc.contraction; here M = o, N = i*j, K = c*r*s per image). Run before autodiff (the model
builder does, nfc.runtime.build), it also shapes the gradients: the weight gradient contracts
`dy` with the columns (a GEMM over n, i, j), and the input gradient becomes the GEMM
`dcols = k^T dy` followed by the gradient of the gather, which sums at most KH*KW column entries
per input element instead of a reduction over every output channel.

The columns cost memory (C*KH*KW*OH*OW per image, kept for the backward pass); computes whose
columns would exceed `max_elements`, or whose GEMM would be tiny (`min_m`, `min_k`), keep their
form. Computes the pass leaves alone: a reading factor with more than one load or none, both
factors plain already, an output axis both factors read (grouped and depthwise convolutions),
and a reduction axis either factor ignores.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from nfc.contraction import longest_run, match_contraction, plain_names
from nfc.ir import (
    Axis,
    Binary,
    ComputeOp,
    Const,
    Expr,
    Func,
    Index,
    Load,
    Module,
    Op,
    Select,
    TensorType,
    index_names,
)
from nfc.passmanager import Context, ModulePass
from nfc.rewrite import PatternRewriteWalker, RewritePattern, Rewriter
from nfc.simplify import simplify

__all__ = ["GatherColumns", "Im2Col", "im2col_func", "im2col_split"]


@dataclass(frozen=True)
class Im2Col(ModulePass):
    """Gather convolution windows into columns so convolutions run as GEMMs (see the module
    docstring). Options: `min_m` (output channels, default 4), `min_k` (window size times
    input channels, default 8), `max_elements` (largest column tensor, default 2**26)."""

    name: ClassVar[str] = "im2col"
    min_m: int = 4
    min_k: int = 8
    max_elements: int = 1 << 26

    def apply(self, ctx: Context, module: Module) -> None:
        """Rewrite the convolutions of every function."""
        for func in module.funcs:
            im2col_func(func, min_m=self.min_m, min_k=self.min_k,
                        max_elements=self.max_elements)


def im2col_func(func: Func, *, min_m: int = 4, min_k: int = 8,
                max_elements: int = 1 << 26) -> int:
    """Rewrite the convolutions of `func` in place; returns how many were rewritten."""
    pattern = GatherColumns(min_m, min_k, max_elements)
    PatternRewriteWalker(pattern).rewrite_func(func)
    return pattern.done


@dataclass
class GatherColumns(RewritePattern):
    """Split a convolution into a column gather, placed before it, and a contraction over
    the columns (`im2col_split`)."""

    min_m: int = 4
    min_k: int = 8
    max_elements: int = 1 << 26
    done: int = 0
    """Convolutions rewritten so far."""

    def match_and_rewrite(self, op: Op, rewriter: Rewriter) -> None:
        if not isinstance(op, ComputeOp):
            return
        split = im2col_split(op, min_m=self.min_m, min_k=self.min_k,
                             max_elements=self.max_elements)
        if split is not None:
            cols, body = split
            rewriter.insert_op_before(cols, op)
            rewriter.update(op, body=body)
            self.done += 1


def _gather_load(e: Expr) -> Load | None:
    """The one load of a gathering factor (`x[affine]` or `select(c, x[affine], 0)`)."""
    lds = [x for x in e.walk() if isinstance(x, Load)]
    if len(lds) != 1 or plain_names(e) is not None:
        return None
    if isinstance(e, Load):
        return e
    if isinstance(e, Select) and isinstance(e.b, Const) and (
            e.b.value == 0) and isinstance(e.a, Load):
        return e.a
    return None


def im2col_split(op: ComputeOp, *, min_m: int = 4, min_k: int = 8,
                 max_elements: int = 1 << 26) -> tuple[ComputeOp, Expr] | None:
    """(the column gather, to be placed before `op`, and `op`'s new body, a contraction over
    the columns) for convolution `op`; None when `op` is not a convolution the pass handles or
    it does not pay (module docstring). `op` is left alone."""
    if op.reduce != "sum" or not op.raxes or not op.dims:
        return None
    ext = {a.name: a.extent for a in op.all_axes}
    body = simplify(op.body, {n: (0, e - 1) for n, e in ext.items()})
    if not (isinstance(body, Binary) and body.op == "*"):
        return None
    for gather, weight in ((body.a, body.b), (body.b, body.a)):
        ld = _gather_load(gather)
        wn = plain_names(weight)
        if ld is not None and wn is not None:
            break
    else:
        return None
    assert isinstance(weight, Load) and ld is not None and wn is not None
    if ld.tensor is weight.tensor:
        return None
    dims = [a.name for a in op.dims]
    red = [a.name for a in op.raxes]
    gx, gw = index_names(gather), set(wn)
    if any(r not in gx or r not in gw for r in red) or any(d in gx and d in gw for d in dims):
        return None
    if any(d not in gx and d not in gw for d in dims):
        return None
    i_axes = [d for d in dims if d in gw]
    j_axes = [d for d in dims if d in gx]
    if not i_axes or not j_axes:
        return None
    m, k = math.prod(ext[d] for d in i_axes), math.prod(ext[r] for r in red)
    n = math.prod(ext[d] for d in j_axes)
    if m < min_m or k < min_k or n * k > max_elements:
        return None
    run = longest_run(dims, set(j_axes))
    k_order = [x for x in wn if x in red]  # the weight's order: its reads stay contiguous
    cols_axes = [d for d in j_axes if d not in run] + k_order + list(run)
    x = ld.tensor
    cols = ComputeOp(TensorType(tuple(ext[a] for a in cols_axes), x.dtype),
                     tuple(Axis(a, ext[a]) for a in cols_axes), gather, loc=op.loc,
                     attrs={"nf.im2col": True},
                     name=f"{x.name or 'x'}_cols")
    col_load = Load(cols.result, tuple(Index(a) for a in cols_axes))
    new_body = Binary("*", col_load, weight) if gather is body.a else Binary(
        "*", weight, col_load)
    trial = ComputeOp(op.result.type, op.dims, new_body, reduce=op.reduce, raxes=op.raxes)
    if match_contraction(trial) is None:  # cannot happen for the shapes above; stay safe
        return None
    return cols, new_body
