"""Reductions: the accumulator of `C[dims] = R_raxes body`.

The accumulator `acc` spans the output loops from `cache_write` inward (TVM's `cache_write`;
default: the first reduction loop). It is initialised to the reduction's identity before
those loops, updated innermost with a reducing store and written back after them. It lives in
registers when every loop it spans is unrolled or vectorized and it is small, else in local
memory. When a reduction loop lies outside it (blocked reductions such as the K blocks of a
GEMM), the write-back adds to what earlier blocks left in the output (`if k.0 == 0 then =
else +=`). A vectorized reduction loop keeps per-lane partial sums (rfactor), reduced across
the lanes at the write-back.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from nfc.codegen.loops import (
    Allocate,
    Buffer,
    BufLoad,
    For,
    If,
    LoopKind,
    Scope,
    Seq,
    Stmt,
    Store,
    unique_name,
)
from nfc.codegen.lowering.axes import Loops
from nfc.codegen.lowering.tails import Tails, conjunction, guarded
from nfc.codegen.schedule import Schedule
from nfc.ir import Binary, ComputeOp, Const, DType, Expr, Index

#: Register accumulators up to this many bytes (a zmm register file holds 2 KiB).
REGISTER_BYTES = 2048


def identity(reduce: str, dtype: DType) -> Const:
    """The neutral element of a reduction in `dtype`."""
    if reduce == "sum":
        return Const(0.0 if dtype.is_float else 0, dtype)
    if reduce == "prod":
        return Const(1.0 if dtype.is_float else 1, dtype)
    big = math.inf if dtype.is_float else (2**31 - 1 if dtype is DType.I32 else 2**63 - 1)
    if reduce == "max":
        return Const(-big if dtype.is_float else -big - 1, dtype)
    return Const(big, dtype)


def reduction_nest(op: ComputeOp, sched: Schedule, tails: Tails, out: Buffer,
                   out_idx: tuple[Expr, ...], body: Expr, guards: tuple[Expr | None, Expr | None],
                   used_names: set[str]) -> Stmt:
    """The nest of a reduction storing `body` reduced into `out[out_idx]`; `guards` are the
    bounds of overshooting (output, reduction) axes."""
    assert op.reduce is not None
    loops = tails.loops
    order, vec = loops.order, loops.vectorized
    red_loops = [loop for loop in order if loops.owner[loop].reduce]
    q = order.index(sched.cache_write) if sched.cache_write else order.index(red_loops[0])
    acc_loops = [loop for loop in order[q:] if not loops.owner[loop].reduce or loop == vec]
    acc = _accumulator(loops, acc_loops, out.dtype, used_names)
    acc_idx = tuple(Index(loop) for loop in acc_loops)
    ident = identity(op.reduce, out.dtype)
    init = tails.nest(acc_loops, Store(acc, acc_idx, ident))
    update = tails.nest(order[q:], guarded(guards[1], Store(acc, acc_idx, body, op.reduce)))
    outer_red = [loop for loop in order[:q] if loops.owner[loop].reduce]
    write = _writer(op.reduce, out, out_idx, outer_red, guards[0])
    if vec is not None and loops.owner[vec].reduce:  # rfactor: per-lane partial results
        red = Buffer(unique_name("red", used_names, "red"), (), out.dtype, Scope.REGISTER)
        lane = For(vec, Const(loops.const(vec)), LoopKind.VECTORIZED,
                   Store(red, (), BufLoad(acc, acc_idx), op.reduce))
        wb_inner: Stmt = Allocate(red, Seq((Store(red, (), ident), lane,
                                           write(BufLoad(red, ())))))
        writeback = tails.nest(acc_loops[:-1], wb_inner)
    else:
        writeback = tails.nest(acc_loops, write(BufLoad(acc, acc_idx)))
    return tails.nest(order[:q], Allocate(acc, Seq((init, update, writeback))))


def _accumulator(loops: Loops, acc_loops: Sequence[str], dtype: DType,
                 used_names: set[str]) -> Buffer:
    shape = tuple(loops.const(loop) for loop in acc_loops)
    in_regs = all(loops.kinds[loop] in (LoopKind.UNROLLED, LoopKind.VECTORIZED)
                  for loop in acc_loops)
    nbytes = math.prod(shape) * dtype.itemsize
    scope = Scope.REGISTER if in_regs and nbytes <= REGISTER_BYTES else Scope.LOCAL
    return Buffer(unique_name("acc", used_names, "acc"), shape, dtype, scope)


def _writer(reduce: str, out: Buffer, out_idx: tuple[Expr, ...], outer_red: Sequence[str],
            guard: Expr | None) -> Callable[[Expr], Stmt]:
    """The write-back of a value: stored, or accumulated after the first block of the
    reduction loops outside the accumulator; guarded when an output axis overshoots."""
    def write(v: Expr) -> Stmt:
        s: Stmt = Store(out, out_idx, v)
        if outer_red:
            first = conjunction([Binary("==", Index(loop), Const(0)) for loop in outer_red])
            assert first is not None
            s = If(first, s, Store(out, out_idx, v, reduce))
        return guarded(guard, s)
    return write
