"""Reductions: the accumulator of `C[dims] = R_raxes body`.

The accumulator `acc` spans the output loops from `cache_write` inward (TVM's `cache_write`;
default: the first reduction loop). It is initialised to the reduction's identity before
those loops, updated innermost with a reducing store and written back after them. It lives in
registers when every loop it spans is unrolled or vectorized and it is small, else in local
memory. When a reduction loop lies outside it (blocked reductions such as the K blocks of a
GEMM), the write-back adds to what earlier blocks left in the output (`if k.0 == 0 then =
else +=`). A vectorized reduction loop keeps per-lane partial sums (rfactor), reduced across
the lanes at the write-back.

Large reductions get three more things (docs/codegen.md, "Reductions: blocked, parallel,
invariant factors"):

- **Blocked summation** (float sums). An accumulator element that would add more than
  `BLOCK_MIN` terms in a row adds them in blocks of about `BLOCK` terms: the reduction loop
  where a block ends is strip-mined if need be, and after each block the accumulator is
  flushed into a second, float64 accumulator (`acc_sum += f64(acc); acc = 0`). The rounding
  error of an f32 sum of n terms is then that of one block, at worst about `BLOCK` units of
  roundoff times the sum of |terms| instead of n (numpy's pairwise sum: blocks of 128, then a
  tree), at one flush per block.
- **Invariant factors** (float sums). A factor of the summed product that does not depend
  on the reduction loops (`sum(i) x[i] * (1/N)` from the gradient of a mean, `sum(i) x[i] / N`,
  `sum(n) x[n, c] * g[c]`) is applied once, to the sum, at the write-back (`split_factors`):
  no division or multiply per term.
- **Parallel reduction** (`Schedule.parallel_reduce = P`): one serial reduction loop of the
  accumulator is cut into P chunks; a parallel loop over the chunks leaves each chunk's
  partial result (float64 for float sums) in a workspace buffer `part[P, out...]`, and a
  serial loop combines the partials in chunk order and applies the invariant factors (each
  partial gets those that depend on the output loops). The
  chunks do not depend on the thread count, so neither does the result. Works for every
  reduction (max/min/prod/integer sums too).
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
    map_stmt,
    unique_name,
)
from nfc.codegen.lowering.axes import Loops, ScheduleError
from nfc.codegen.lowering.tails import Tails, conjunction, guarded
from nfc.codegen.schedule import Schedule
from nfc.ir import Binary, Call, Cast, ComputeOp, Const, DType, Expr, Index

#: Register accumulators up to this many bytes (a zmm register file holds 2 KiB).
REGISTER_BYTES = 2048
#: Float sums of more than this many terms per accumulator element are summed in blocks.
BLOCK_MIN = 1024
#: Terms per accumulator element in one block of a blocked sum (about; never more).
BLOCK = 128
#: Chunks of a parallel reduction (`Schedule.parallel_reduce`) in the default schedules:
#: enough for an even split over the threads of one machine, few enough that combining the
#: partials costs nothing.
PARALLEL_CHUNKS = 64
#: Reductions of at least this many terms whose output loops give fewer than
#: `PARALLEL_OUTPUTS` parallel iterations are spread over threads themselves.
PARALLEL_REDUCE_WORK = 1 << 18
PARALLEL_OUTPUTS = 8

#: A multiplicative factor of a sum's body applied to the sum instead: (operator, factor).
Factor = tuple[str, Expr]


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


def parallel_chunks(output_iterations: int, terms: int) -> int:
    """`Schedule.parallel_reduce` for a reduction of `terms` terms in all whose output loops
    give `output_iterations` parallel iterations: `PARALLEL_CHUNKS` when the reduction is the
    whole work (a sum to a scalar or a few outputs), else 0 (parallel output loops)."""
    big = terms >= PARALLEL_REDUCE_WORK and output_iterations < PARALLEL_OUTPUTS
    return PARALLEL_CHUNKS if big else 0


def split_factors(op: ComputeOp) -> tuple[Expr, tuple[Factor, ...]]:
    """`op`'s body as (core, factors) with `body = core * f1 / f2 ...`: the factors of a float
    sum's top-level product and quotient chain that do not depend on the reduction axes, to be
    applied once to the sum (`sum(i) x[i] / N` is `(sum(i) x[i]) / N`). Only where the core
    keeps the result's dtype; other reductions, and bodies without such factors, come back
    whole. Distributing the factor is exact in real arithmetic and adds one rounding where the
    body had one per term (a float sum is reassociated anyway); a sum that overflows before
    the factor scales it down (terms near the float maximum) is the one case it changes."""
    from nfc.ops import Typer

    body = op.body
    dt = op.result.dtype
    if op.reduce != "sum" or dt not in (DType.F32, DType.F64):  # f16/bf16: the sum may overflow
        return body, ()
    red = {a.name for a in op.raxes}
    typer = Typer()

    def invariant(e: Expr) -> bool:
        return not any(isinstance(x, Index) and x.name in red for x in e.walk())

    factors: list[Factor] = []
    while isinstance(body, Binary) and body.op in ("*", "/"):
        a, b = body.a, body.b
        if invariant(b) and not invariant(a):
            core, f = a, (body.op, b)
        elif body.op == "*" and invariant(a) and not invariant(b):
            core, f = b, ("*", a)
        else:
            break
        if typer.kind(core) != dt:
            break
        factors.append(f)
        body = core
    return body, tuple(reversed(factors))


def apply_factors(v: Expr, factors: Sequence[Factor]) -> Expr:
    """`v` multiplied and divided by `factors` (innermost first)."""
    for fop, f in factors:
        v = Binary(fop, v, f)
    return v


def reduction_nest(op: ComputeOp, sched: Schedule, tails: Tails, out: Buffer,
                   out_idx: tuple[Expr, ...], body: Expr, guards: tuple[Expr | None, Expr | None],
                   used_names: set[str], factors: Sequence[Factor] = ()) -> Stmt:
    """The nest of a reduction storing `body` reduced into `out[out_idx]`; `guards` are the
    bounds of overshooting (output, reduction) axes; `factors` (`split_factors`, lowered like
    the body) scale the result at the write-back."""
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

    chunks = sched.parallel_reduce
    if chunks and loops.parallel:
        raise ScheduleError("parallel_reduce excludes parallel output loops")
    if chunks < 0:
        raise ScheduleError(f"parallel_reduce {chunks} must not be negative")
    # the update's loops (names as in the update statement) and their constant extents
    upd = list(order[q:])
    consts = {lp: loops.const(lp) for lp in upd}
    reducing = {lp for lp in upd if loops.owner[lp].reduce and lp != vec}
    serial = {lp for lp in upd if loops.kinds[lp] is LoopKind.SERIAL}
    split = _chunk_loop(upd, consts, reducing & serial) if chunks else None
    if split is not None:  # each chunk of the parallel loop runs a slice of this loop
        pvar = unique_name("chunk", used_names, "chunk")
        size = -(-consts[split] // chunks)
        chunks = -(-consts[split] // size)
        new = unique_name(f"{split}.c", used_names, "c")
        update = _chunked(update, split, new, size, Index(pvar))
        upd[upd.index(split)] = new
        consts[new] = size
        reducing.add(new)
        serial.add(new)
    wide_sum = op.reduce == "sum" and out.dtype.is_float
    blocks = _block_plan(upd, consts, reducing, serial) if wide_sum else None
    # the accumulator written back: a float64 second level for blocked or chunked float sums
    final = acc
    if wide_sum and (blocks is not None or split is not None):
        final = _accumulator(loops, acc_loops, DType.F64, used_names, "acc_sum")
        init = Seq((init, tails.nest(acc_loops, Store(final, acc_idx,
                                                      identity("sum", DType.F64)))))
        if blocks is None:  # one block: the whole update
            update = Seq((update, _flush(tails, acc_loops, acc, final, acc_idx, ident)))
        else:
            loop, size = blocks
            inner_acc = [a for a in acc_loops if upd.index(a) > upd.index(loop)]
            flush = _flush(tails, inner_acc, acc, final, acc_idx, ident)
            update = _blocked(update, loop, size, flush, used_names)
    if split is not None:
        part = Buffer(unique_name("part", used_names, "part"), (chunks, *out.shape),
                      final.dtype, Scope.GLOBAL)
        # factors that depend on the output loops scale each partial, the others the result
        looped = any(isinstance(x, Index) for _, f in factors for x in f.walk())
        write = _writer(op.reduce, part, (Index(pvar), *out_idx), outer_red, guards[0],
                        lambda v: apply_factors(v, [(f, Cast(part.dtype, x))
                                                    for f, x in factors] if looped else ()))
    else:
        write = _writer(op.reduce, out, out_idx, outer_red, guards[0],
                        lambda v: _finish(v, out.dtype, factors))
    if vec is not None and loops.owner[vec].reduce:  # rfactor: per-lane partial results
        red = Buffer(unique_name("red", used_names, "red"), (), final.dtype, Scope.REGISTER)
        rid = identity(op.reduce, final.dtype)
        lane = For(vec, Const(loops.const(vec)), LoopKind.VECTORIZED,
                   Store(red, (), BufLoad(final, acc_idx), op.reduce))
        wb_inner: Stmt = Allocate(red, Seq((Store(red, (), rid), lane,
                                           write(BufLoad(red, ())))))
        writeback = tails.nest(acc_loops[:-1], wb_inner)
    else:
        writeback = tails.nest(acc_loops, write(BufLoad(final, acc_idx)))
    inner: Stmt = Seq((init, update, writeback))
    if final is not acc:
        inner = Allocate(final, inner)
    nest = tails.nest(order[:q], Allocate(acc, inner))
    if split is None:
        return nest
    return Allocate(part, Seq((For(pvar, Const(chunks), LoopKind.PARALLEL, nest),
                               _combine(op.reduce, part, out, () if looped else factors,
                                        used_names))))


def _finish(v: Expr, dtype: DType, factors: Sequence[Factor]) -> Expr:
    """An accumulated value made a result: scaled by `factors` (in the accumulator's precision,
    so one rounding, and no overflow of the unscaled sum in a narrower type) and converted to
    `dtype`."""
    have = _dtype_of(v)
    if have is None or have is dtype:
        return apply_factors(v, factors)
    return Cast(dtype, apply_factors(v, [(f, Cast(have, x)) for f, x in factors]))


def _dtype_of(v: Expr) -> DType | None:
    return v.buffer.dtype if isinstance(v, BufLoad) else None


def _accumulator(loops: Loops, acc_loops: Sequence[str], dtype: DType,
                 used_names: set[str], hint: str = "acc") -> Buffer:
    shape = tuple(loops.const(loop) for loop in acc_loops)
    in_regs = all(loops.kinds[loop] in (LoopKind.UNROLLED, LoopKind.VECTORIZED)
                  for loop in acc_loops)
    nbytes = math.prod(shape) * dtype.itemsize
    scope = Scope.REGISTER if in_regs and nbytes <= REGISTER_BYTES else Scope.LOCAL
    return Buffer(unique_name(hint, used_names, "acc"), shape, dtype, scope)


def _writer(reduce: str, out: Buffer, out_idx: tuple[Expr, ...], outer_red: Sequence[str],
            guard: Expr | None, finish: Callable[[Expr], Expr]) -> Callable[[Expr], Stmt]:
    """The write-back of a value (made a result by `finish`): stored, or accumulated after the
    first block of the reduction loops outside the accumulator; guarded when an output axis
    overshoots."""
    def write(v: Expr) -> Stmt:
        v = finish(v)
        s: Stmt = Store(out, out_idx, v)
        if outer_red:
            first = conjunction([Binary("==", Index(loop), Const(0)) for loop in outer_red])
            assert first is not None
            s = If(first, s, Store(out, out_idx, v, reduce))
        return guarded(guard, s)
    return write


# ---------------------------------------------------------------------------------------------
# blocked summation


def _block_plan(update: Sequence[str], consts: dict[str, int], reducing: set[str],
                serial: set[str]) -> tuple[str, int] | None:
    """Where a float sum's blocks end: (loop, m) for blocks of `m` iterations of `loop` (all of
    the loops inside it each time), or None when an accumulator element adds at most
    `BLOCK_MIN` terms (or no serial reduction loop can be cut). The terms of one element are
    counted over the `reducing` loops of the update (the vectorized one is not: its lanes are
    separate elements)."""
    red = [lp for lp in update if lp in reducing]
    if math.prod(consts[lp] for lp in red) <= BLOCK_MIN:
        return None
    inside = 1
    for lp in reversed(red):
        c = consts[lp]
        if inside * c > BLOCK and lp in serial:
            return lp, max(1, BLOCK // inside)
        inside *= c
    return None


def _flush(tails: Tails, acc_loops: Sequence[str], acc: Buffer, wide: Buffer,
           acc_idx: tuple[Expr, ...], ident: Const) -> Stmt:
    """`wide += acc; acc = identity` over the accumulator loops `acc_loops` (the others are
    bound by the enclosing loops)."""
    return tails.nest(acc_loops, Seq((
        Store(wide, acc_idx, Cast(wide.dtype, BufLoad(acc, acc_idx)), "sum"),
        Store(acc, acc_idx, ident))))


def _find_loop(s: Stmt, var: str) -> For | None:
    return next((x for x in s.walk() if isinstance(x, For) and x.var == var), None)


def _replace(s: Stmt, old: Stmt, new: Stmt) -> Stmt:
    """`s` with the statement `old` (by identity) replaced by `new`."""
    if s is old:
        return new
    if isinstance(s, Seq):
        return Seq(tuple(_replace(c, old, new) for c in s.body))
    if isinstance(s, For):
        return For(s.var, s.extent, s.kind, _replace(s.body, old, new))
    if isinstance(s, If):
        return If(s.cond, _replace(s.then, old, new),
                  None if s.orelse is None else _replace(s.orelse, old, new))
    if isinstance(s, Allocate):
        return Allocate(s.buffer, _replace(s.body, old, new))
    return s


def _blocked(update: Stmt, loop: str, m: int, flush: Stmt, used: set[str]) -> Stmt:
    """`update` with the loop `loop` run in blocks of `m` iterations, `flush` after each
    block (`m == 1`: after each iteration)."""
    f = _find_loop(update, loop)
    assert f is not None
    if m == 1:
        return _replace(update, f, For(f.var, f.extent, f.kind, Seq((f.body, flush))))
    outer = unique_name(f"{loop}.blk", used, "blk")
    inner_var = unique_name(f"{loop}.in", used, "in")
    ext = f.extent
    start = Binary("*", Const(m), Index(outer))
    if isinstance(ext, Const):
        n = int(ext.value)
        nblocks: Expr = Const(-(-n // m))
        inner_ext: Expr = Const(m) if n % m == 0 else Call(
            "min", (Const(m), Binary("-", Const(n), start)))
    else:
        nblocks = Binary("//", Binary("+", ext, Const(m - 1)), Const(m))
        inner_ext = Call("min", (Const(m), Binary("-", ext, start)))
    body = map_stmt(f.body, {loop: Binary("+", start, Index(inner_var))})
    new = For(outer, nblocks, LoopKind.SERIAL,
              Seq((For(inner_var, inner_ext, LoopKind.SERIAL, body), flush)))
    return _replace(update, f, new)


# ---------------------------------------------------------------------------------------------
# parallel reduction


def _chunk_loop(update: Sequence[str], consts: dict[str, int],
                cuttable: set[str]) -> str | None:
    """The reduction loop a parallel reduction cuts into chunks: the outermost serial
    reduction loop of the update with at least `PARALLEL_CHUNKS` iterations, else the longest
    one; None when none has two."""
    cands = [lp for lp in update if lp in cuttable and consts[lp] >= 2]
    if not cands:
        return None
    return next((lp for lp in cands if consts[lp] >= PARALLEL_CHUNKS),
                max(cands, key=lambda lp: consts[lp]))


def _chunked(update: Stmt, loop: str, var: str, size: int, chunk: Expr) -> Stmt:
    """`update` with `loop` restricted to chunk `chunk` of `size` iterations: `loop` becomes
    `size*chunk + var` for `var` in `0..min(size, extent - size*chunk)`."""
    f = _find_loop(update, loop)
    assert f is not None
    start = Binary("*", Const(size), chunk)
    ext: Expr = Call("min", (Const(size), Binary("-", f.extent, start)))
    body = map_stmt(f.body, {loop: Binary("+", start, Index(var))})
    return _replace(update, f, For(var, ext, LoopKind.SERIAL, body))


def _combine(reduce: str, part: Buffer, out: Buffer, factors: Sequence[Factor],
             used: set[str]) -> Stmt:
    """`out[idx] = reduce_p part[p, idx]` over every element, the partials in chunk order,
    scaled by `factors`."""
    names = [unique_name(f"o{d}", used, "o") for d in range(len(out.shape))]
    idx = tuple(Index(n) for n in names)
    pvar = unique_name("p", used, "p")
    c = Buffer(unique_name("comb", used, "comb"), (), part.dtype, Scope.REGISTER)
    s: Stmt = Allocate(c, Seq((
        Store(c, (), identity(reduce, part.dtype)),
        For(pvar, Const(part.shape[0]), LoopKind.SERIAL,
            Store(c, (), BufLoad(part, (Index(pvar), *idx)), reduce)),
        Store(out, idx, _finish(BufLoad(c, ()), out.dtype, factors)))))
    for n, ext in reversed(list(zip(names, out.shape, strict=True))):
        s = For(n, Const(ext), LoopKind.SERIAL, s)
    return s
