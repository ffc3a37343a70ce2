"""The `dce` pass: remove ops whose results nobody reads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from nfc.ir import Func, KernelOp, Module, Op
from nfc.passmanager import Context, ModulePass
from nfc.rewrite import PatternRewriteWalker, RewritePattern, Rewriter


def is_dead(op: Op) -> bool:
    """Whether removing `op` changes nothing: no result is read and it is no terminator.
    Every op of the IR is pure, so that is all it takes."""
    return not op.is_terminator and not any(r.has_uses for r in op.results)


class RemoveDeadOps(RewritePattern):
    """Erase a dead op; drop the unread results of a kernel that keeps some."""

    def match_and_rewrite(self, op: Op, rewriter: Rewriter) -> None:
        if is_dead(op):
            rewriter.erase_op(op)
        elif isinstance(op, KernelOp):
            rewriter.erase_results(op, [n for n, r in enumerate(op.results) if not r.has_uses])


@dataclass(frozen=True)
class DCE(ModulePass):
    """Remove ops whose results are all unused; a kernel loses the yielded results nobody
    reads, and goes away when that is all of them.

    Before:  %a = nf.compute [i: 4] (exp(%x[i])) : tensor<4xf32>
             %b = nf.compute [i: 4] (%x[i] * 2.0) : tensor<4xf32>
             nf.return %b : tensor<4xf32>
    After:   %b = nf.compute [i: 4] (%x[i] * 2.0) : tensor<4xf32>
             nf.return %b : tensor<4xf32>

    Returns and yields always stay, and so do function arguments (the signature is kept).
    Every op of the IR is pure, so a call without used results is removed as well. One walk
    from the last op to the first (a kernel before its body) finds every dead op: the
    readers of a value come after it.
    """

    name: ClassVar[str] = "dce"

    def apply(self, ctx: Context, module: Module) -> None:
        """Remove dead ops from every function of `module`."""
        for func in module.funcs:
            dce_func(func)


def dce_func(func: Func) -> None:
    """Remove dead ops from one function."""
    PatternRewriteWalker(RemoveDeadOps(), walk_reverse=True).rewrite_func(func)
