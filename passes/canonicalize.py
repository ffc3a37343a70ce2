"""The `canonicalize` pass: simplify compute bodies and remove computes that only copy."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from nfc.ir import Block, ComputeOp, Const, Func, Index, Load, Module, Value, substitute_indices
from nfc.passmanager import Context, ModulePass
from nfc.simplify import simplify


def axis_ranges(op: ComputeOp) -> dict[str, tuple[int, int]]:
    """The inclusive range of every index variable of `op` (output and reduction axes)."""
    return {a.name: (0, a.extent - 1) for a in op.all_axes}


def canonicalize_compute(op: ComputeOp, *, fast: bool = False) -> None:
    """Canonicalise one compute in place: drop reduction axes of extent 1 (and, for max/min,
    axes the body does not mention: repeating a value changes neither), then simplify the
    body with the axes' ranges."""
    names = {e.name for e in op.body.walk() if isinstance(e, Index)}
    keep = []
    for a in op.raxes:
        if a.extent == 1:
            op.body = substitute_indices(op.body, {a.name: Const(0)})
        elif op.reduce in ("max", "min") and a.name not in names:
            pass
        else:
            keep.append(a)
    if len(keep) != len(op.raxes):
        op.raxes = tuple(keep)
        if not keep:
            op.reduce = None
    op.body = simplify(op.body, axis_ranges(op), fast=fast)


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
        for func in module.funcs:
            copies: dict[Value, Value] = {}
            self._block(func, func.body, copies)
            if copies:
                func.replace_all_uses(copies)

    def _block(self, func: Func, block: Block, copies: dict[Value, Value]) -> None:
        ops = []
        for op in block.ops:
            for region in op.regions():
                self._block(func, region, copies)
            if isinstance(op, ComputeOp):
                if copies:
                    op.replace_uses(copies)
                canonicalize_compute(op, fast=self.fast)
                src = copy_source(op)
                if src is not None:
                    copies[op.result] = src
                    continue
            ops.append(op)
        block.ops = ops
