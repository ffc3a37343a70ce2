"""The `dce` pass: remove ops whose results nobody reads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from nfc.ir import Block, Func, KernelOp, Module, ReturnOp, YieldOp
from nfc.passmanager import Context, ModulePass


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
    Every op of the IR is pure, so a call without used results is removed as well.
    """

    name: ClassVar[str] = "dce"

    def apply(self, ctx: Context, module: Module) -> None:
        """Remove dead ops from every function of `module`."""
        for func in module.funcs:
            dce_func(func)


def dce_func(func: Func) -> None:
    """Remove dead ops from one function."""
    live: set[int] = set()
    _sweep(func.body, live)


def _sweep(block: Block, live: set[int]) -> None:
    """Walk `block` backwards: an op is kept when it is a terminator or one of its results is
    live; the operands of kept ops become live. `live` holds ids of values read later."""
    kept = []
    for op in reversed(block.ops):
        if isinstance(op, KernelOp):
            if not _trim_kernel(op, live):
                continue
            _sweep(op.body, live)
            live.update(id(v) for v in op.operands)
        elif isinstance(op, ReturnOp) or any(id(r) in live for r in op.results):
            live.update(id(v) for v in op.operands)
        else:
            continue
        kept.append(op)
    block.ops = kept[::-1]


def _trim_kernel(op: KernelOp, live: set[int]) -> bool:
    """Drop the kernel's unused results from its yield; False when none is used."""
    term = op.body.ops[-1]
    assert isinstance(term, YieldOp)
    used = [n for n, r in enumerate(op.results) if id(r) in live]
    if not used:
        return False
    if len(used) != len(op.results):
        term.values = [term.values[n] for n in used]
        op.results = [op.results[n] for n in used]
        for n, r in enumerate(op.results):
            r.index = n
    return True
