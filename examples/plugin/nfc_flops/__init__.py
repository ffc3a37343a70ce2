"""An out-of-tree nfc pass, registered through the `nfc.passes` entry-point group.

    pip install -e examples/plugin
    nfc opt model.nf -p 'annotate-flops{attr=my.flops}'
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from nfc.ir import Binary, Call, ComputeOp, Expr, Load, Module, Select, Unary
from nfc.passmanager import Context, ModulePass

__all__ = ["AnnotateFlops", "body_flops"]


def body_flops(e: Expr) -> int:
    """Arithmetic operations in one evaluation of a compute body; index arithmetic inside
    loads is address computation, not FLOPs, so it is not counted."""
    if isinstance(e, Load):
        return 0
    own = 1 if isinstance(e, Binary | Unary | Call | Select) else 0
    return own + sum(body_flops(c) for c in e.children())


@dataclass(frozen=True)
class AnnotateFlops(ModulePass):
    """Attach the number of floating-point operations of each compute as an attribute.

    A compute over dims D with reduction axes R costs |D|·|R|·(ops in the body + 1 for the
    reduction), where |D| and |R| are the products of the extents. The module gets the total.

    Before:  %y = nf.compute [i: 4] sum [k: 8] (%x[i, k] * 2.0) : tensor<4xf32>
    After:   %y = nf.compute [i: 4] sum [k: 8] (%x[i, k] * 2.0) {nf.flops = 64} : tensor<4xf32>
    """

    name: ClassVar[str] = "annotate-flops"

    attr: str = "nf.flops"
    """The attribute name the count is written to."""
    min_flops: int = 0
    """Computes cheaper than this are left without the attribute."""
    total: bool = True
    """Also write the module's total to the module attribute of the same name."""

    def apply(self, ctx: Context, module: Module) -> None:
        """Annotate every compute of every function."""
        if self.min_flops < 0:
            ctx.error(f"annotate-flops: min-flops must be >= 0, got {self.min_flops}")
            return
        grand = 0
        for func in module.funcs:
            for op in func.walk():
                if not isinstance(op, ComputeOp):
                    continue
                points = math.prod(a.extent for a in op.all_axes)
                flops = points * (body_flops(op.body) + (1 if op.reduce else 0))
                grand += flops
                if flops >= self.min_flops:
                    op.attrs[self.attr] = flops
        if self.total:
            module.attrs[self.attr] = grand
