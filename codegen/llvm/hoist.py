"""Loop-invariant values of the LLVM emitter, and which expressions may be evaluated
speculatively.

A kernel's buffers are plain pointers without alias information (a result may be computed in
place of an input), so LLVM keeps every load after a store where it is and recomputes what
depends on it: the `rsqrt(var[c] + eps) * g[c]` of an elementwise batch-norm gradient over
`c, h, w` ran per element, a square root and a division each. The emitter knows better: a
loop stores only into the buffers its statements name, and an in-place result reads its input
at the element it writes (nfc.codegen.artifact.plan.inplace_ok), which depends on every loop.
So `hoisted` computes such values once, in the block before the outermost serial loop they are
invariant in (`Hoist`: one per serial loop being emitted), when `speculable` allows it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from llvmlite import ir

from nfc.affine import interval
from nfc.codegen.loops import BufLoad, Clamp
from nfc.ir import Binary, Const, DType, Expr, Index


@dataclass
class Hoist:
    """A serial loop being emitted: the block before it (`pre`, ending in the jump into the
    loop), the loop variables bound in it (its own and its nested loops'), the buffers stored
    in it, and the invariant values computed in `pre` so far (`ExprEmitter.hoisted`)."""

    pre: ir.Block
    bound: frozenset[str]
    written: frozenset[str]
    values: dict[tuple[Expr, DType], ir.Value] = field(default_factory=dict)


def hoisted(em: Any, e: Expr, dt: DType) -> ir.Value | None:
    """`e` computed once before the outermost enclosing serial loop it is invariant in
    (`Hoist`), or None to compute it here. Candidates read memory or compute a call or a
    division (`rsqrt(var[c] + eps) * g[c]` in an elementwise nest over `c, h, w`): the
    kernel's buffers carry no alias information, so LLVM reloads and recomputes them
    after every store. Invariant: no loop variable bound in the loops it leaves, no
    buffer stored there, and `speculable` (the loop may run no iteration). The same
    expression tree is evaluated, only earlier: the value is the same bits."""
    costly = False
    names: set[str] = set()
    bufs: set[str] = set()
    for x in e.walk():
        if isinstance(x, Index):
            names.add(x.name)
        elif isinstance(x, BufLoad):
            bufs.add(x.buffer.name)
            costly = True
        elif not isinstance(x, Const | Clamp) and (
                not isinstance(x, Binary) or x.op == "/"):
            costly = True  # a call, a division
    if not costly:
        return None
    at = None
    for n in range(len(em.hoists) - 1, -1, -1):
        h = em.hoists[n]
        if names & h.bound or bufs & h.written:
            break
        at = n
    if at is None:
        return None
    target = em.hoists[at]
    key = (e, dt)
    if key in target.values:
        return target.values[key]
    if em.lane is not None and em.lane in names or not speculable(em, e):
        return None
    b = em.b
    here = b.block
    # where the builder is: the end of `here`, or before its jump when `here` is the
    # block before a loop (a part of a hoisted value hoisted in turn)
    before = here.instructions[b._anchor] if b._anchor < len(here.instructions) else None
    saved = (em.hoists, em.lane, em.width, em.mask)
    em.hoists = em.hoists[:at]  # its parts may go further out
    em.lane, em.width, em.mask = None, 1, None
    b.position_before(target.pre.terminator)
    try:
        v = em.emit(e, dt)
    finally:
        if before is None:
            b.position_at_end(here)
        else:
            b.position_before(before)
        em.hoists, em.lane, em.width, em.mask = saved
    target.values[key] = v
    return v


def speculable(em: Any, e: Expr) -> bool:
    """Whether `e` may be evaluated whatever guards it: every load's indices provably
    inside its buffer over the loop ranges in force (`em.ranges`), and no integer
    division or remainder by a non-constant."""
    for x in e.walk():
        if isinstance(x, BufLoad):
            shape = x.buffer.shape
            if len(x.indices) != len(shape):
                return False
            for ix, n in zip(x.indices, shape, strict=True):
                iv = interval(ix, em.ranges)
                if iv is None or iv[0] < 0 or iv[1] >= n:
                    return False
        elif isinstance(x, Clamp) or (isinstance(x, Binary) and x.op in ("//", "%")
                                      and not isinstance(x.b, Const)):
            return False
    return True

