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
form.

**Implicit columns** (`implicit`): the gather is marked `nf.implicit` and, once the gradient
functions exist (the `training-functions` pass calls `implicit_columns`), substituted back into
the GEMMs that read it, the forward contraction and the weight gradient:

             %y = nf.compute [n, o, i, j] sum [c, r, s]
                  (select(guard, %x[n, c, i*S + r - P, j*S + s - P], 0.0) * %k[o, c, r, s])
                  {nf.implicit = ["n", "c", "r", "s", "i", "j"]}

The CPU code generator still runs them as GEMMs over the columns (nfc.contraction,
`implicit`: the gather is a virtual operand whose panels are packed straight from the image),
so the columns are neither stored nor saved for the backward pass; the input gradient keeps
its column-gradient GEMM and the gather's adjoint. `implicit=auto` (the default) does this for
columns of at least `implicit_elements` elements, `true` for all, `false` for none.

Computes the pass leaves alone: a reading factor with more than one load or none, both
factors plain already, an output axis both factors read (grouped and depthwise convolutions),
and a reduction axis either factor ignores.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import ClassVar

from nfc.contraction import longest_run, match_contraction, squeezed_names
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
    substitute_indices,
)
from nfc.passmanager import Context, ModulePass
from nfc.rewrite import PatternRewriteWalker, RewritePattern, Rewriter
from nfc.simplify import simplify

__all__ = ["GatherColumns", "Im2Col", "im2col_func", "im2col_split", "implicit_columns"]

#: Attribute of a column gather (and of a GEMM it was substituted into) that is implicit.
IMPLICIT = "nf.implicit"
#: `implicit=auto`: columns of at least this many elements (the whole batch's) are implicit.
IMPLICIT_ELEMENTS = 1 << 22


@dataclass(frozen=True)
class Im2Col(ModulePass):
    """Gather convolution windows into columns so convolutions run as GEMMs (see the module
    docstring). Options: `min_m` (output channels, default 4), `min_k` (window size times
    input channels, default 8), `max_elements` (largest column tensor, default 2**26),
    `implicit` (`auto`, `true` or `false`: columns left implicit, module docstring) and
    `implicit_elements` (the smallest implicit columns under `auto`)."""

    name: ClassVar[str] = "im2col"
    min_m: int = 4
    min_k: int = 8
    max_elements: int = 1 << 26
    implicit: str = "auto"
    implicit_elements: int = IMPLICIT_ELEMENTS

    def apply(self, ctx: Context, module: Module) -> None:
        """Rewrite the convolutions of every function."""
        if self.implicit not in ("auto", "true", "false"):
            ctx.error(f"im2col: implicit must be auto, true or false, not '{self.implicit}'")
            return
        least = {"auto": self.implicit_elements, "true": 0, "false": -1}[self.implicit]
        for func in module.funcs:
            im2col_func(func, min_m=self.min_m, min_k=self.min_k,
                        max_elements=self.max_elements, implicit_elements=least)


def im2col_func(func: Func, *, min_m: int = 4, min_k: int = 8,
                max_elements: int = 1 << 26, implicit_elements: int = -1) -> int:
    """Rewrite the convolutions of `func` in place; returns how many were rewritten. Columns
    of at least `implicit_elements` elements (none when negative) are marked implicit."""
    pattern = GatherColumns(min_m, min_k, max_elements, implicit_elements)
    PatternRewriteWalker(pattern).rewrite_func(func)
    return pattern.done


def implicit_columns(func: Func) -> int:
    """Substitute each implicit column gather (`nf.implicit`) into the contractions that read
    it, when the result is still a contraction with a gather factor (nfc.contraction,
    `implicit`), and drop the gather once nothing reads it. Returns how many reads were
    substituted. Run after autodiff, so the input gradient keeps its column GEMM."""
    done = 0
    for cols in list(func.body.ops):
        if not (isinstance(cols, ComputeOp) and cols.attrs.get(IMPLICIT)
                and cols.reduce is None):
            continue
        for use in list(cols.result.uses):
            if not isinstance(use, ComputeOp) or match_contraction(use) is None:
                continue
            reads = [e for e in use.body.walk() if isinstance(e, Load) and e.tensor is cols.result]
            # the columns' dimension order, in `use`'s axes: the order its GEMM sees them in
            order = [x.name for x in reads[0].indices if isinstance(x, Index)]
            body = use.body.map(functools.partial(_substitute, cols))
            trial = ComputeOp(use.result.type, use.dims, body, reduce=use.reduce,
                              raxes=use.raxes, attrs={IMPLICIT: order})
            if len(reads) != 1 or match_contraction(trial, implicit=True) is None:
                continue
            use.body = body
            use.attrs = {**use.attrs, IMPLICIT: order}
            done += 1
        if not cols.result.uses:
            func.body.ops.remove(cols)
    return done


def _substitute(cols: ComputeOp, e: Expr) -> Expr | None:
    """A load of `cols` as its expression (for `Expr.map`)."""
    if isinstance(e, Load) and e.tensor is cols.result:
        names = [a.name for a in cols.dims]
        return substitute_indices(cols.body, dict(zip(names, e.indices, strict=True)))
    return None


@dataclass
class GatherColumns(RewritePattern):
    """Split a convolution into a column gather, placed before it, and a contraction over
    the columns (`im2col_split`)."""

    min_m: int = 4
    min_k: int = 8
    max_elements: int = 1 << 26
    implicit_elements: int = -1
    """Columns of at least this many elements are marked implicit (none when negative)."""
    done: int = 0
    """Convolutions rewritten so far."""

    def match_and_rewrite(self, op: Op, rewriter: Rewriter) -> None:
        if not isinstance(op, ComputeOp):
            return
        split = im2col_split(op, min_m=self.min_m, min_k=self.min_k,
                             max_elements=self.max_elements)
        if split is not None:
            cols, body = split
            if 0 <= self.implicit_elements <= math.prod(cols.result.shape):
                cols.attrs = {**cols.attrs, IMPLICIT: True}
            rewriter.insert_op_before(cols, op)
            rewriter.update(op, body=body)
            self.done += 1


def _gather_load(e: Expr) -> Load | None:
    """The one load of a gathering factor (`x[affine]` or `select(c, x[affine], 0)`)."""
    lds = [x for x in e.walk() if isinstance(x, Load)]
    if len(lds) != 1 or squeezed_names(e) is not None:
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
        wn = squeezed_names(weight)  # `%k1[o, 0, r, s]`: a 1-channel weight, canonicalized
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
