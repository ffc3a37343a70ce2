"""The `canonicalize` pass: simplify compute bodies and remove computes that only copy."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from nfc.ir import (
    Axis,
    ComputeOp,
    Const,
    Expr,
    Index,
    Load,
    Module,
    Op,
    Value,
    substitute_indices,
)
from nfc.passmanager import Context, ModulePass
from nfc.rewrite import PatternRewriteWalker, RewritePattern, Rewriter
from nfc.simplify import simplify


def canonical_form(op: ComputeOp, *, fast: bool = False
                   ) -> tuple[Expr, str | None, tuple[Axis, ...]]:
    """`op`'s (body, reduce, raxes) canonicalised: reduction axes of extent 1 dropped (and,
    for max/min, axes the body does not mention: repeating a value changes neither), then the
    body simplified with the axes' ranges."""
    body, reduce = op.body, op.reduce
    names = {e.name for e in body.walk() if isinstance(e, Index)}
    keep = []
    for a in op.raxes:
        if a.extent == 1:
            body = substitute_indices(body, {a.name: Const(0)})
        elif reduce in ("max", "min") and a.name not in names:
            pass
        else:
            keep.append(a)
    raxes = op.raxes
    if len(keep) != len(op.raxes):
        raxes = tuple(keep)
        if not keep:
            reduce = None
    ranges = {a.name: (0, a.extent - 1) for a in op.dims + raxes}
    return simplify(body, ranges, fast=fast), reduce, raxes


def canonicalize_compute(op: ComputeOp, *, fast: bool = False) -> None:
    """Canonicalise one compute (in no block, or where nothing tracks changes) in place."""
    op.body, op.reduce, op.raxes = canonical_form(op, fast=fast)


def copy_source(op: ComputeOp) -> Value | None:
    """The tensor `op` copies unchanged (`%b[i, j] = %a[i, j]`, same type), if it does."""
    body = op.body
    if op.reduce is not None or not isinstance(body, Load):
        return None
    if body.tensor.type != op.result.type:
        return None
    if body.indices != tuple(Index(a.name) for a in op.dims):
        return None
    return body.tensor


@dataclass(frozen=True)
class Canonicalize(ModulePass):
    """Simplify every compute body (nfc.simplify: constant folding, identities, canonical
    index expressions, guards decided from the axes' ranges) and replace computes that copy
    a tensor unchanged by that tensor.

    Before:  %a = nf.compute [i: 4, j: 8] (%x[i, j] * 1.0 - 0.0) : tensor<4x8xf32>
             %b = nf.compute [i: 4, j: 8] (%a[i, j]) : tensor<4x8xf32>
             %c = nf.compute [i: 4] sum [k: 8, u: 1] (%b[(i * 8 + k) // 8, k + u]) ...
    After:   %c = nf.compute [i: 4] sum [k: 8] (%x[i, k]) ...

    Reductions over an axis of extent 1 lose that axis; a max/min reduction also loses axes
    its body does not mention. Nothing that could change a float result is done unless
    `fast` is set (see nfc.simplify). Ops left without uses are removed by `dce`, except the
    removed copies.
    """

    name: ClassVar[str] = "canonicalize"

    fast: bool = False
    """Allow float rewrites that assume finite, non-NaN values (`x * 0.0 -> 0.0`)."""

    def apply(self, ctx: Context, module: Module) -> None:
        """Canonicalise every function of `module`."""
        PatternRewriteWalker(CanonicalizeCompute(self.fast)).rewrite_module(module)


class CanonicalizeCompute(RewritePattern):
    """Bring a compute to canonical form (`canonical_form`), then replace it by its source
    if it only copies one."""

    def __init__(self, fast: bool = False) -> None:
        self.fast = fast
        self.done: dict[Op, Expr] = {}  # op -> the canonical body it was given

    def match_and_rewrite(self, op: Op, rewriter: Rewriter) -> None:
        if not isinstance(op, ComputeOp):
            return
        if self.done.get(op) is not op.body:  # else nothing changed since: skip simplify
            body, reduce, raxes = canonical_form(op, fast=self.fast)
            if (body, reduce, raxes) != (op.body, op.reduce, op.raxes):
                rewriter.update(op, body=body, reduce=reduce, raxes=raxes)
            self.done[op] = op.body
        src = copy_source(op)
        if src is not None:
            rewriter.replace_op(op, [], [src])
