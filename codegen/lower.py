"""Lowering: a compute (or a group of computes) plus a schedule becomes a loop-IR kernel.

For `C[dims] = R_raxes body` the nest is built from the schedule's loops (see
nfc.codegen.schedule for names). With a reduction, an accumulator `acc` spans the output
loops from `cache_write` inward: it is initialised before those loops, updated innermost with
a reducing store and written back after them; when a reduction loop lies outside it (blocked
reductions such as the K blocks of a GEMM), the write-back adds to what earlier blocks left in
the output instead of overwriting it.

Tiles that do not divide their axis: serial loops get tight extents (`min(...)`), unrolled and
vectorized loops keep constant extents and are guarded instead: stores of elements past the
end are skipped (masked in vector code), reduction updates past the end are skipped, and loads
past the end of an input read a `Clamp`ed (in-bounds, irrelevant) element.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from nfc.affine import Affine, affine_interval, affine_to_expr, interval, to_affine
from nfc.codegen.loops import (
    Allocate,
    Buffer,
    BufLoad,
    Clamp,
    For,
    If,
    LoopFunc,
    LoopKind,
    Scope,
    Seq,
    Stmt,
    Store,
)
from nfc.codegen.schedule import GroupSchedule, Schedule
from nfc.contraction import FlatContraction, flatten
from nfc.ir import (
    Binary,
    Call,
    ComputeOp,
    Const,
    DType,
    Expr,
    Index,
    KernelOp,
    Load,
    Value,
    YieldOp,
    index_names,
    substitute_indices,
)

#: Longest unrolled loop and widest vector (in elements) a schedule may ask for.
MAX_UNROLL, MAX_VECTOR = 256, 64
#: Register accumulators up to this many bytes (a zmm register file holds 2 KiB).
REGISTER_BYTES = 2048


class ScheduleError(ValueError):
    """A schedule that does not fit its compute (an internal error or a bad tuner config)."""


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


# ---------------------------------------------------------------------------------------------
# axes and loops


@dataclass
class _Axis:
    name: str
    extent: int
    reduce: bool
    sizes: tuple[int, ...]

    @property
    def loops(self) -> list[str]:
        if not self.sizes:
            return [self.name]
        return [f"{self.name}.{n}" for n in range(len(self.sizes) + 1)]

    def const(self, level: int) -> int:
        """Constant extent of loop `level`."""
        if not self.sizes:
            return self.extent
        blocks = (*self.sizes, 1)
        if level == 0:
            return -(-self.extent // self.sizes[0])
        return blocks[level - 1] // blocks[level]

    @property
    def padded(self) -> int:
        return self.const(0) * self.sizes[0] if self.sizes else self.extent

    def expr(self) -> Expr:
        """The axis value in terms of its loop variables."""
        if not self.sizes:
            return Index(self.name)
        blocks = (*self.sizes, 1)
        terms = [(loop, blocks[n]) for n, loop in enumerate(self.loops)]
        return affine_to_expr(Affine.make(terms))

    def base(self, level: int) -> Affine:
        blocks = (*self.sizes, 1)
        return Affine.make((self.loops[m], blocks[m]) for m in range(level))


def _and(conds: Sequence[Expr]) -> Expr | None:
    out: Expr | None = None
    for c in conds:
        out = c if out is None else Binary("and", out, c)
    return out


def simplify_index(e: Expr, ranges: dict[str, tuple[int, int]]) -> Expr:
    """Resolve `x // c` and `x % c` of affine `x` whose remainder part provably stays in
    [0, c) (the block structure of splits and packs), and put affine parts in normal form."""
    def fn(node: Expr) -> Expr | None:
        if not (isinstance(node, Binary) and node.op in ("//", "%")
                and isinstance(node.b, Const) and not node.b.is_float and int(node.b.value) > 0):
            return None
        a = to_affine(node.a)
        if a is None:
            return None
        c = int(node.b.value)
        quot = [(n, k // c) for n, k in a.coeffs if k % c == 0]
        rest = Affine.make([(n, k) for n, k in a.coeffs if k % c], a.const % c)
        iv = affine_interval(rest, ranges)
        if iv is None or iv[0] < 0 or iv[1] >= c:
            if not quot:
                return None
            # (c*Q + r) // c = Q + r // c and (c*Q + r) % c = r % c for floor division:
            # the multiples of c leave the division (a lane-affine Q stays contiguous)
            if node.op == "%":
                return Binary("%", affine_to_expr(rest), node.b)
            return Binary("+", affine_to_expr(Affine.make(quot, a.const // c)),
                          Binary("//", affine_to_expr(rest), node.b))
        if node.op == "//":
            return affine_to_expr(Affine.make(quot, a.const // c))
        return affine_to_expr(rest)
    return e.map(fn)


# ---------------------------------------------------------------------------------------------
# one stage


@dataclass
class StageInfo:
    """What lowering found out about one compute (for tests and diagnostics)."""

    order: list[str]
    kinds: dict[str, LoopKind]
    overshoot: set[str]


def _unique_name(hint: str | None, used: set[str], default: str) -> str:
    base = re.sub(r"[^A-Za-z0-9_]", "_", hint or "") or default
    if base[0].isdigit():
        base = f"{default}{base}"
    name, n = base, 1
    while name in used:
        name, n = f"{base}_{n}", n + 1
    used.add(name)
    return name


def lower_stage(op: ComputeOp, sched: Schedule, out: Buffer, bufs: dict[int, Buffer],
                operands: Sequence[Value], used_names: set[str]) -> Stmt:
    """The loop nest computing `op` into `out`; `bufs` maps id(value) to its buffer and
    `operands` gives the numbering `Pack.operand` refers to."""
    axes = {a.name: _Axis(a.name, a.extent, False, sched.split_of(a.name)) for a in op.dims}
    axes.update({a.name: _Axis(a.name, a.extent, True, sched.split_of(a.name))
                 for a in op.raxes})
    for s in sched.splits:
        if s.axis not in axes:
            raise ScheduleError(f"split of unknown axis '{s.axis}'")
        if any(x < 1 for x in s.sizes) or any(
                a % b for a, b in zip(s.sizes, s.sizes[1:], strict=False)):
            raise ScheduleError(f"split sizes {s.sizes} of '{s.axis}' must divide each other")
    owner = {loop: ax for ax in axes.values() for loop in ax.loops}
    level = {loop: n for ax in axes.values() for n, loop in enumerate(ax.loops)}
    order = list(sched.order) or [loop for ax in axes.values() for loop in ax.loops]
    if sorted(order) != sorted(owner):
        raise ScheduleError(f"order {order} is not a permutation of the loops {list(owner)}")
    # the loops of an axis run outer to inner, except that an output axis may put an inner
    # block loop outside (a residue split: `w = 2*(8*w.0 + w.1) + w.2` with `w.2` outside the
    # vectorized `w.1` makes `w // 2` contiguous in the lanes); such an axis runs full blocks,
    # guarded by its bound, never a tight remainder loop
    reordered: set[str] = set()
    for ax in axes.values():
        pos = [order.index(loop) for loop in ax.loops]
        if pos != sorted(pos):
            if ax.reduce or pos[0] != min(pos):
                raise ScheduleError(f"loops of axis '{ax.name}' must stay outer to inner")
            reordered.add(ax.name)

    kinds = {loop: LoopKind.SERIAL for loop in order}
    for loop in sched.unroll:
        kinds[loop] = LoopKind.UNROLLED
    vec = sched.vectorize
    if vec is not None:
        if order[-1] != vec:
            raise ScheduleError(f"vectorized loop '{vec}' must be innermost")
        kinds[vec] = LoopKind.VECTORIZED
    par = list(sched.parallel)
    if par != order[:len(par)] or any(owner[p].reduce for p in par):
        raise ScheduleError(f"parallel loops {par} must be outermost output loops")
    for loop in par:
        kinds[loop] = LoopKind.PARALLEL

    def tight(loop: str) -> bool:
        ax = owner[loop]
        return (level[loop] > 0 and kinds[loop] is LoopKind.SERIAL and ax.padded > ax.extent
                and ax.name not in reordered)

    # how far an axis's loops reach: the innermost tight level (level 0 always is) stops
    # within a block of the size it iterates, the constant levels inside fill that block
    reach: dict[str, int] = {}
    for ax in axes.values():
        blocks = (*ax.sizes, 1)
        t = max((n for n, loop in enumerate(ax.loops) if n == 0 or tight(loop)), default=0)
        reach[ax.name] = -(-ax.extent // blocks[t]) * blocks[t]
    overshoot = {a for a, r in reach.items() if r > axes[a].extent}
    ranges = {loop: (0, owner[loop].const(level[loop]) - 1) for loop in order}
    axis_range = {a: (0, r - 1) for a, r in reach.items()}

    def extent(loop: str) -> Expr:
        ax = owner[loop]
        c = ax.const(level[loop])
        if not tight(loop):
            return Const(c)
        rest = Affine.constant(ax.extent) - ax.base(level[loop])
        blk = (*ax.sizes, 1)[level[loop]]
        left = affine_to_expr(rest + (blk - 1))
        return Call("min", (Const(c), Binary("//", left, Const(blk)) if blk > 1 else left))

    for loop in order:
        limit = {LoopKind.UNROLLED: MAX_UNROLL, LoopKind.VECTORIZED: MAX_VECTOR}.get(kinds[loop])
        if limit is not None and owner[loop].const(level[loop]) > limit:
            raise ScheduleError(f"loop '{loop}' is too long to unroll or vectorize")

    # --- packs: each packed operand gets a workspace buffer and a packing nest
    packs: dict[int, tuple[Buffer, int, int]] = {}
    pack_nests: list[tuple[Buffer, Stmt]] = []
    for p in sched.pack:
        src_val = operands[p.operand]
        src = bufs[id(src_val)]
        for ld in op.body.walk():
            if isinstance(ld, Load) and ld.tensor is src_val:
                ix = ld.indices[p.dim]
                if not (isinstance(ix, Index) and ix.name in axes and not axes[ix.name].reduce):
                    raise ScheduleError("a packed dimension must be indexed by an output axis")
                if reach[ix.name] > -(-src.shape[p.dim] // p.factor) * p.factor:
                    raise ScheduleError("tiles of a packed axis must fit the packed panels")
        shape = src.shape
        nblk = -(-shape[p.dim] // p.factor)
        rest = shape[:p.dim] + shape[p.dim + 1:]
        pbuf = Buffer(_unique_name(f"{src.name}_pack", used_names, "pack"),
                      (nblk, *rest, p.factor), src.dtype, Scope.GLOBAL)
        packs[id(src_val)] = (pbuf, p.dim, p.factor)
        pvars = [f"{pbuf.name}.{n}" for n in range(len(pbuf.shape))]
        pos = Binary("+", Binary("*", Index(pvars[0]), Const(p.factor)), Index(pvars[-1]))
        src_idx: list[Expr] = [Index(v) for v in pvars[1:-1]]
        src_idx.insert(p.dim, pos if shape[p.dim] % p.factor == 0
                       else Clamp(pos, shape[p.dim] - 1))
        st: Stmt = Store(pbuf, tuple(Index(v) for v in pvars), BufLoad(src, tuple(src_idx)))
        for n in reversed(range(len(pvars))):
            kind = LoopKind.SERIAL
            if n == len(pvars) - 1 and p.factor <= 64:
                kind = LoopKind.VECTORIZED
            elif n == 0 and par and nblk > 1:
                kind = LoopKind.PARALLEL
            st = For(pvars[n], Const(pbuf.shape[n]), kind, st)
        pack_nests.append((pbuf, st))

    def rewrite_load(e: Expr) -> Expr | None:
        if not isinstance(e, Load):
            return None
        buf = bufs[id(e.tensor)]
        idx = list(e.indices)
        packed_dim = packs[id(e.tensor)][1] if id(e.tensor) in packs else -1
        for d, ix in enumerate(idx):
            if d != packed_dim and index_names(ix) & overshoot:
                iv = interval(ix, axis_range)
                if iv is None or iv[1] > buf.shape[d] - 1:
                    idx[d] = Clamp(ix, buf.shape[d] - 1)
        if id(e.tensor) in packs:
            pbuf, d, f = packs[id(e.tensor)]
            ix = idx[d]
            idx = [Binary("//", ix, Const(f)), *idx[:d], *idx[d + 1:], Binary("%", ix, Const(f))]
            buf = pbuf
        return BufLoad(buf, tuple(idx))

    axis_expr = {name: ax.expr() for name, ax in axes.items()}

    def finish(e: Expr) -> Expr:
        return simplify_index(substitute_indices(e, axis_expr), ranges)

    body = finish(op.body.map(rewrite_load))
    out_idx = tuple(finish(Index(a.name)) for a in op.dims)
    spatial_guard = _and([finish(Binary("<", Index(a), Const(axes[a].extent)))
                          for a in axes if a in overshoot and not axes[a].reduce])
    reduce_guard = _and([finish(Binary("<", Index(a), Const(axes[a].extent)))
                         for a in axes if a in overshoot and axes[a].reduce])

    def nest(loops: Sequence[str], inner: Stmt) -> Stmt:
        for loop in reversed(loops):
            inner = For(loop, extent(loop), kinds[loop], inner)
        return inner

    def guarded(cond: Expr | None, s: Stmt) -> Stmt:
        return s if cond is None else If(cond, s)

    def peeled(store: Stmt) -> Stmt | None:
        """An elementwise nest whose one ragged output axis is vectorized: its complete
        blocks run without the bounds guard and the clamps (so without masked loads and
        stores, slow on some CPUs), the last block guarded."""
        ragged = [a for a in overshoot if not axes[a].reduce]
        if len(ragged) != 1 or vec is None or owner[vec].name != ragged[0]:
            return None
        ax = axes[ragged[0]]
        first = ax.loops[0]
        if kinds[first] is not LoopKind.SERIAL or any(tight(lp) for lp in ax.loops[1:]):
            return None
        full, blocks = ax.extent // ax.sizes[0], ax.const(0)
        if not 0 < full < blocks:
            return None
        pos = order.index(first)
        plain = nest(order[pos + 1:], _strip_clamps(store))
        tail = map_stmt(nest(order[pos + 1:], guarded(spatial_guard, store)),
                        {first: Binary("+", Index(first), Const(full))})
        return nest(order[:pos], Seq((For(first, Const(full), LoopKind.SERIAL, plain),
                                      For(first, Const(blocks - full), LoopKind.SERIAL, tail))))

    if op.reduce is None:
        st0 = Store(out, out_idx, body)
        main = peeled(st0) or nest(order, guarded(spatial_guard, st0))
    else:
        red_loops = [loop for loop in order if owner[loop].reduce]
        q = order.index(sched.cache_write) if sched.cache_write else order.index(red_loops[0])
        acc_loops = [loop for loop in order[q:] if not owner[loop].reduce or loop == vec]
        rfactor = vec is not None and owner[vec].reduce
        acc_shape = tuple(owner[loop].const(level[loop]) for loop in acc_loops)
        dtype = out.dtype
        in_regs = all(kinds[loop] in (LoopKind.UNROLLED, LoopKind.VECTORIZED)
                      for loop in acc_loops)
        nbytes = math.prod(acc_shape) * dtype.itemsize
        scope = Scope.REGISTER if in_regs and nbytes <= REGISTER_BYTES else Scope.LOCAL
        acc = Buffer(_unique_name("acc", used_names, "acc"), acc_shape, dtype, scope)
        acc_idx = tuple(Index(loop) for loop in acc_loops)
        ident = identity(op.reduce, dtype)
        init = nest(acc_loops, Store(acc, acc_idx, ident))
        update = nest(order[q:], guarded(reduce_guard, Store(acc, acc_idx, body, op.reduce)))
        outer_red = [loop for loop in order[:q] if owner[loop].reduce]

        def write(v: Expr) -> Stmt:
            s: Stmt = Store(out, out_idx, v)
            if outer_red:
                first = _and([Binary("==", Index(loop), Const(0)) for loop in outer_red])
                assert first is not None
                s = If(first, s, Store(out, out_idx, v, op.reduce))
            return guarded(spatial_guard, s)

        if rfactor:
            assert vec is not None
            red = Buffer(_unique_name("red", used_names, "red"), (), dtype, Scope.REGISTER)
            lane = For(vec, Const(owner[vec].const(level[vec])), LoopKind.VECTORIZED,
                       Store(red, (), BufLoad(acc, acc_idx), op.reduce))
            wb_inner: Stmt = Allocate(red, Seq((Store(red, (), ident), lane,
                                               write(BufLoad(red, ())))))
            writeback = nest(acc_loops[:-1], wb_inner)
        else:
            writeback = nest(acc_loops, write(BufLoad(acc, acc_idx)))
        main = nest(order[:q], Allocate(acc, Seq((init, update, writeback))))

    main = _fuse_parallel(main, par, {p: owner[p].const(level[p]) for p in par}, used_names)
    for pbuf, pnest in reversed(pack_nests):
        main = Allocate(pbuf, Seq((pnest, main)))
    return main


def _strip_clamps(s: Stmt) -> Stmt:
    """`s` with every `Clamp(x, hi)` replaced by `x` (where no index can overshoot)."""
    def ex(e: Expr) -> Expr:
        return e.map(lambda x: ex(x.x) if isinstance(x, Clamp) else None)
    return map_exprs(s, ex)


def _fuse_parallel(s: Stmt, par: list[str], consts: dict[str, int], used: set[str]) -> Stmt:
    """Replace the perfectly nested parallel loops `par` by one parallel loop."""
    if len(par) <= 1:
        return s
    inner = s
    for _ in par:
        assert isinstance(inner, For)
        inner = inner.body
    fused = _unique_name("fused", used, "fused")
    total = math.prod(consts[p] for p in par)
    mapping: dict[str, Expr] = {}
    stride = total
    for p in par:
        stride //= consts[p]
        e: Expr = Index(fused)
        if stride > 1:
            e = Binary("//", e, Const(stride))
        if stride * consts[p] < total:
            e = Binary("%", e, Const(consts[p]))
        mapping[p] = e
    return For(fused, Const(total), LoopKind.PARALLEL, map_stmt(inner, mapping))


def map_stmt(s: Stmt, mapping: dict[str, Expr]) -> Stmt:
    """`s` with index variables replaced (in every expression and loop extent)."""
    return map_exprs(s, lambda e: substitute_indices(e, mapping))


def map_exprs(s: Stmt, ex: Callable[[Expr], Expr]) -> Stmt:
    """`s` with `ex` applied to every expression and loop extent."""
    if isinstance(s, Seq):
        return Seq(tuple(map_exprs(c, ex) for c in s.body))
    if isinstance(s, For):
        return For(s.var, ex(s.extent), s.kind, map_exprs(s.body, ex))
    if isinstance(s, Store):
        return Store(s.buffer, tuple(ex(i) for i in s.indices), ex(s.value), s.reduce)
    if isinstance(s, If):
        return If(ex(s.cond), map_exprs(s.then, ex),
                  None if s.orelse is None else map_exprs(s.orelse, ex))
    if isinstance(s, Allocate):
        return Allocate(s.buffer, map_exprs(s.body, ex))
    return s


# ---------------------------------------------------------------------------------------------
# kernels


def kernel_signature(ops: Sequence[ComputeOp], outputs: Sequence[Value]) -> list[Value]:
    """Inputs of a group: values read but not produced inside, in first-use order."""
    inner = {id(op.result) for op in ops}
    seen: dict[int, Value] = {}
    for op in ops:
        for v in op.operands:
            if id(v) not in inner:
                seen.setdefault(id(v), v)
    return list(seen.values())


def group_of(op: ComputeOp | KernelOp | Sequence[ComputeOp]
             ) -> tuple[list[ComputeOp], list[Value], list[Value]]:
    """(computes, outputs, inputs) of a compute, a kernel op or a list of computes (whose
    last compute is the output)."""
    if isinstance(op, ComputeOp):
        return [op], [op.result], list(op.operands)
    if isinstance(op, KernelOp):
        ops = [o for o in op.body.ops if not isinstance(o, YieldOp)]
        if not all(isinstance(o, ComputeOp) for o in ops):
            raise ScheduleError("a kernel may only contain computes")
        term = op.body.ops[-1]
        assert isinstance(term, YieldOp)
        cops = [o for o in ops if isinstance(o, ComputeOp)]
        return cops, list(term.values), kernel_signature(cops, term.values)
    cops = list(op)
    return cops, [cops[-1].result], kernel_signature(cops, [cops[-1].result])


def inline_producer(producer: ComputeOp, consumer: ComputeOp) -> ComputeOp:
    """`consumer` with loads of `producer` replaced by its body (compute_inline)."""
    assert producer.reduce is None
    names = [a.name for a in producer.dims]

    def fn(e: Expr) -> Expr | None:
        if isinstance(e, Load) and e.tensor is producer.result:
            return substitute_indices(producer.body, dict(zip(names, e.indices, strict=True)))
        return None
    new = ComputeOp(consumer.result.type, consumer.dims, consumer.body.map(fn),
                    reduce=consumer.reduce, raxes=consumer.raxes, loc=consumer.loc,
                    attrs=consumer.attrs, name=consumer.result.name)
    new.results[0] = consumer.result  # keep the value identity consumers refer to
    return new


def group_stages(op: ComputeOp | KernelOp | Sequence[ComputeOp],
                 schedule: Schedule | GroupSchedule | None = None
                 ) -> list[tuple[ComputeOp, Schedule | None]]:
    """The stages of a compute or a group in order: each a compute with the producers the
    schedule inlines substituted into it, and its schedule (None: the default). Raises
    ScheduleError when a producer cannot be inlined."""
    ops, outputs, _ = group_of(op)
    if isinstance(schedule, Schedule):
        if len(ops) != 1:
            raise ScheduleError("a group needs a GroupSchedule")
        gs = GroupSchedule(stages=(schedule,))
    elif schedule is None:
        gs = default_group_schedule(ops, outputs)
    else:
        gs = schedule
    inl = set(gs.inline)
    out_ids = {id(v) for v in outputs}
    work = list(ops)
    for n in sorted(inl):
        prod = work[n]
        if prod.reduce is not None or id(prod.result) in out_ids:
            raise ScheduleError(f"compute {n} cannot be inlined")
        for m in range(n + 1, len(work)):
            if any(v is prod.result for v in work[m].operands):
                work[m] = inline_producer(prod, work[m])
    stages = [o for n, o in enumerate(work) if n not in inl]
    return [(st, gs.stages[n] if n < len(gs.stages) else None) for n, st in enumerate(stages)]


def schedule_view(op: ComputeOp, sched: Schedule) -> FlatContraction | None:
    """The flattened view of contraction `op` when `sched` schedules it (names its merged
    axes, as nfc.codegen.space.schedule_space's GEMM template does), else None."""
    names = {a.name for a in op.all_axes}
    named = {loop.partition(".")[0] for loop in sched.order} | {s.axis for s in sched.splits}
    if named <= names:
        return None
    view = flatten(op)
    if view is None or not named <= {a.name for a in view.op.all_axes}:
        raise ScheduleError(f"the schedule names unknown axes {sorted(named - names)}")
    return view


def lower(op: ComputeOp | KernelOp | Sequence[ComputeOp],
          schedule: Schedule | GroupSchedule | None = None, *, name: str = "kernel",
          default: object = None) -> LoopFunc:
    """The loop-IR kernel of a compute or a group. Parameters: the outputs (named `out`,
    `out1`, ...), then the inputs in `group_of(op)` order. `default(op) -> Schedule` supplies
    stage schedules left unset (nfc.codegen.space.default_schedule when None)."""
    from nfc.codegen.space import default_schedule

    pick = default or default_schedule
    _, outputs, inputs = group_of(op)
    used: set[str] = set()
    params = [Buffer(_unique_name("out" if n == 0 else f"out{n}", used, "out"), v.shape,
                     v.dtype) for n, v in enumerate(outputs)]
    params += [Buffer(_unique_name(v.name, used, "in"), v.shape, v.dtype) for v in inputs]
    bufs = {id(v): b for v, b in zip([*outputs, *inputs], params, strict=True)}
    temps: list[Buffer] = []
    stmts: list[Stmt] = []
    for st, s in group_stages(op, schedule):
        if id(st.result) not in bufs:
            tb = Buffer(_unique_name(st.result.name or "tmp", used, "tmp"), st.result.shape,
                        st.result.dtype, Scope.GLOBAL)
            temps.append(tb)
            bufs[id(st.result)] = tb
        sched = s if s is not None else pick(st)  # type: ignore[operator]
        view = schedule_view(st, sched)
        if view is None:
            stmts.append(lower_stage(st, sched, bufs[id(st.result)], bufs, list(st.operands),
                                     used))
            continue
        # a contraction scheduled on its flattened view: the same memory seen as the view's
        # shapes (buffers keep their names, so they bind to the same pointers)
        vbufs = dict(bufs)
        for vid, fv in view.values.items():
            vbufs[id(fv)] = replace(bufs[vid], shape=fv.shape)
        stmts.append(lower_stage(view.op, sched, vbufs[id(view.op.result)], vbufs,
                                 list(view.op.operands), used))
    body: Stmt = stmts[0] if len(stmts) == 1 else Seq(tuple(stmts))
    for tb in reversed(temps):
        body = Allocate(tb, body)
    return LoopFunc(name, tuple(params), len(outputs), body)


def default_group_schedule(ops: Sequence[ComputeOp], outputs: Sequence[Value]) -> GroupSchedule:
    """Inline every elementwise producer that is not an output; default stage schedules."""
    out_ids = {id(v) for v in outputs}
    inline = tuple(n for n, o in enumerate(ops[:-1])
                   if o.reduce is None and id(o.result) not in out_ids)
    return GroupSchedule(inline=inline)
