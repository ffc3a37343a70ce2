"""Packing: operands copied into vector panels before the main nest (`Schedule.pack`).

`Pack(operand, dim, factor)` splits dimension `dim` of an operand into zero-padded panels of
`factor` moved innermost: `B[K, N]` packed on dim 1 by 16 becomes `B_pack[N/16, K, 16]`, which
the micro-kernel reads with unit stride; a load `B[k, j]` becomes `B_pack[j // 16, k, j % 16]`
(the split loops of `j` then resolve the division). The panels live in the workspace, filled
by a nest of their own (vectorized along the panel, parallel over panels when the stage is
parallel).

A phase pack (`Pack.kind` "phase", a polyphase layout) splits dimension `dim` into its
`factor` phases instead: `X[H, W]` on dim 1 by 2 becomes `X_pack[H, 2, ceil(W/2)]` holding
`X[h, 2q + p]` at `[h, p, q]`, and a load `X[.., ix]` becomes `X_pack[.., ix % 2, ix // 2]`;
for a strided read `ix = 2j + e` that is `[.., (e) % 2, j + e // 2]` once simplified, unit
stride in `j` where the original was a gather (a stride-2 convolution's window).

A large panel pack is filled per iteration of the outermost loops when they are batch loops
that index the operand (`local_loops`): a convolution over im2col columns `cols[n, k, j]` with
the batch `n` outermost packs `cols[n]` inside the `n` loop, into a workspace of one image's
panels instead of all of them (the panels of a batch of 32 capsule columns: 95.6 MB whole, 3 MB
per image). Every element is still packed once and the main nest reads the same values in the
same order (results bit for bit those of the whole pack); the loops around a fill run serially
(one buffer), the parallel loops inside them stay parallel.

The panels of a virtual operand (`nfc.contraction.GatherView`, the im2col columns of an
implicit convolution GEMM) are filled by evaluating its element expression, a gather from the
image, instead of a load: the columns exist only as panels, per batch element when the rule
above applies, and the main nest reads them exactly as it reads the panels of stored columns.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from nfc.codegen.loops import (
    Allocate,
    Buffer,
    BufLoad,
    Clamp,
    For,
    LoopKind,
    Scope,
    Seq,
    Stmt,
    Store,
    unique_name,
)
from nfc.codegen.lowering.axes import Loops, ScheduleError, fuse_parallel
from nfc.codegen.lowering.tails import Tails
from nfc.codegen.schedule import Pack, Schedule
from nfc.contraction import GatherView
from nfc.ir import Binary, ComputeOp, Const, Expr, Index, Load, Value
from nfc.simplify import simplify_divisions


@dataclass(frozen=True)
class Packed:
    """A packed operand: its panel buffer and the nest that fills it."""

    buffer: Buffer
    dim: int
    factor: int
    fill: Stmt
    phase: bool = False
    """A phase pack (module docstring)."""
    padded: bool = True
    """Whether the layout covers every index a tail reads past the end of `dim` (panels
    always; a phase pack when the reads' bounds are known), so that dimension is not
    clamped."""
    outer: tuple[str, ...] = ()
    """The outermost loops the panels are filled inside, one fill per iteration (module
    docstring); empty: filled once before the nest."""
    drop: tuple[int, ...] = ()
    """The operand's dimensions those loops index (parallel to `outer`): not in the panels."""

    @property
    def keep(self) -> int:
        """The dimension whose reads past the end the layout pads (not clamped); -1: none."""
        return self.dim if self.padded else -1

    def load(self, indices: Sequence[Expr]) -> BufLoad:
        """The panel element holding the operand's element at `indices`."""
        d, f = self.dim, self.factor
        ix = indices[d]
        if self.drop:
            assert not self.phase
            return BufLoad(self.buffer, (Binary("//", ix, Const(f)), *(
                x for k, x in enumerate(indices) if k != d and k not in self.drop),
                Binary("%", ix, Const(f))))
        if self.phase:
            return BufLoad(self.buffer, (*indices[:d], Binary("%", ix, Const(f)),
                                         Binary("//", ix, Const(f)), *indices[d + 1:]))
        return BufLoad(self.buffer, (Binary("//", ix, Const(f)), *indices[:d],
                                     *indices[d + 1:], Binary("%", ix, Const(f))))


def plan_packs(op: ComputeOp, sched: Schedule, tails: Tails, bufs: dict[int, Buffer],
               operands: Sequence[Value], used_names: set[str]) -> list[tuple[int, Packed]]:
    """The packed operands of a stage as (id(value), packing), in `sched.pack` order."""
    packs: list[tuple[int, Packed]] = []
    for p in sched.pack:
        src_val = operands[p.operand]
        src = bufs[id(src_val)]
        parallel = bool(tails.loops.parallel)
        if p.kind == "phase":
            if isinstance(src_val, GatherView):
                raise ScheduleError("a phase pack reads a stored operand")
            packs.append((id(src_val), _phase_pack(p, src, _reach(op, p, src_val, tails),
                                                   parallel, used_names)))
            continue
        if p.kind != "panel":
            raise ScheduleError(f"unknown pack kind '{p.kind}'")
        _check(op, p, src_val, src, tails)
        outer = {} if sched.parallel_reduce else local_loops(op, p, src_val, src, tails)
        read, inner = None, 0
        if isinstance(src_val, GatherView):
            read, inner = _gather_reader(src_val, bufs), src_val.inner[p.dim]
        packs.append((id(src_val), _pack(p, src, parallel, used_names, outer, read, inner)))
    return packs


def _gather_reader(gv: GatherView, bufs: dict[int, Buffer]) -> Callable[[Sequence[Expr]], Expr]:
    """The fill's value of the element of virtual operand `gv` at given indices: its
    expression, loads read from the buffers of the tensors it gathers from (every index in
    range: the fill's indices are, and a padding guard selects around its load)."""
    def read(indices: Sequence[Expr]) -> Expr:
        def fn(e: Expr) -> Expr | None:
            if isinstance(e, Load):
                return BufLoad(bufs[id(e.tensor)], e.indices)
            return None
        return gv.element(indices).map(fn)
    return read


def local_loops(op: ComputeOp, p: Pack, src_val: Value, src: Buffer,
                tails: Tails) -> dict[str, int]:
    """The loops (outermost first, with the operand dimension each indexes) inside which
    the panels of `p` are filled per iteration: the longest prefix of the nest's loops that
    are unsplit output axes read as a plain index of one dimension of every load of the
    operand (so no element is packed twice), when the whole panels take at least
    `LOCAL_PACK_BYTES` and the parallel loops left inside run at least `LOCAL_MIN_PARALLEL`
    iterations (none were parallel, or enough stay so). Empty: the whole operand at once."""
    loops = tails.loops
    nblk = -(-src.shape[p.dim] // p.factor)
    whole = nblk * p.factor * math.prod(src.shape) // src.shape[p.dim] * src.dtype.itemsize
    if whole < LOCAL_PACK_BYTES:
        return {}
    loads = [ld for ld in op.body.walk() if isinstance(ld, Load) and ld.tensor is src_val]
    out: dict[str, int] = {}
    for loop in loops.order:
        ax = loops.owner[loop]
        if ax.reduce or ax.sizes or loops.kinds[loop] not in (LoopKind.SERIAL,
                                                             LoopKind.PARALLEL):
            break
        dims = {next((d for d, ix in enumerate(ld.indices) if ix == Index(loop)), -1)
                for ld in loads}
        if len(dims) != 1 or -1 in dims or p.dim in dims or set(dims) & set(out.values()):
            break
        out[loop] = dims.pop()
    while out and loops.parallel:
        left = [lp for lp in loops.parallel if lp not in out]
        if math.prod(loops.const(lp) for lp in left) >= LOCAL_MIN_PARALLEL:
            break
        out.popitem()  # keep more batch loops parallel: smaller savings, same work split
    return out


#: Panel packs of at least this many bytes (whole) are filled per batch iteration when their
#: operand allows it (`local_loops`); smaller ones stay whole, as before (they cost little
#: memory, and their kernels stay exactly as they were).
LOCAL_PACK_BYTES = 4 << 20
#: Fewest parallel iterations a local fill may leave a parallel stage (its loops around the
#: fill become serial).
LOCAL_MIN_PARALLEL = 8


def with_packs(main: Stmt, packs: Sequence[tuple[int, Packed]], loops: Loops,
               used_names: set[str]) -> Stmt:
    """`main` (the stage's nest, parallel loops not yet fused) with its parallel loops fused
    and the nests that fill the panels before it, inside their allocations: whole packs
    before the nest, local ones (`Packed.outer`) inside their loops, which run serially."""
    depth = max((len(pk.outer) for _, pk in packs), default=0)
    if depth == 0:
        main = fuse_parallel(main, loops, used_names)
        for _, pk in reversed(packs):
            main = Allocate(pk.buffer, Seq((pk.fill, main)))
        return main
    fors: list[For] = []
    for name in loops.order[:depth]:
        assert isinstance(main, For) and main.var == name, (name, main)
        fors.append(main)
        main = main.body
    serial = set(loops.order[:depth])
    main = fuse_parallel(main, replace(loops, parallel=[lp for lp in loops.parallel
                                                        if lp not in serial]), used_names)
    for level in reversed(range(depth + 1)):
        for _, pk in reversed(packs):
            if len(pk.outer) == level:
                main = Allocate(pk.buffer, Seq((pk.fill, main)))
        if level:
            f = fors[level - 1]
            main = For(f.var, f.extent, LoopKind.SERIAL, main)
    return main


def _check(op: ComputeOp, p: Pack, src_val: Value, src: Buffer, tails: Tails) -> None:
    axes = tails.loops.axes
    for ld in op.body.walk():
        if isinstance(ld, Load) and ld.tensor is src_val:
            ix = ld.indices[p.dim]
            if not (isinstance(ix, Index) and ix.name in axes and not axes[ix.name].reduce):
                raise ScheduleError("a packed dimension must be indexed by an output axis")
            if tails.reach[ix.name] > -(-src.shape[p.dim] // p.factor) * p.factor:
                raise ScheduleError("tiles of a packed axis must fit the packed panels")


def _pack(p: Pack, src: Buffer, parallel: bool, used_names: set[str],
          outer: dict[str, int] | None = None,
          read: Callable[[Sequence[Expr]], Expr] | None = None, inner: int = 0) -> Packed:
    shape = src.shape
    outer = outer or {}
    drop = {d: loop for loop, d in outer.items()}
    nblk = -(-shape[p.dim] // p.factor)
    rest = [shape[d] for d in range(len(shape)) if d != p.dim and d not in drop]
    pbuf = Buffer(unique_name(f"{src.name}_pack", used_names, "pack"),
                  (nblk, *rest, p.factor), src.dtype, Scope.GLOBAL)
    pvars = [f"{pbuf.name}.{n}" for n in range(len(pbuf.shape))]
    pos = Binary("+", Binary("*", Index(pvars[0]), Const(p.factor)), Index(pvars[-1]))
    kept = iter(pvars[1:-1])
    src_idx: list[Expr] = [
        (pos if shape[d] % p.factor == 0 else Clamp(pos, shape[d] - 1)) if d == p.dim
        else Index(drop[d]) if d in drop else Index(next(kept)) for d in range(len(shape))]
    if read is None:
        st: Stmt = Store(pbuf, tuple(Index(v) for v in pvars), BufLoad(src, tuple(src_idx)))
    else:
        st = _gather_fill(p, pbuf, pvars, src_idx, read, inner, shape[p.dim] % p.factor == 0)
    for n in reversed(range(len(pvars))):
        kind = LoopKind.SERIAL
        if n == len(pvars) - 1 and p.factor <= 64:
            kind = LoopKind.VECTORIZED
        elif n == 0 and parallel and nblk > 1:
            kind = LoopKind.PARALLEL
        if n == len(pvars) - 1 and isinstance(st, For) and st.var.startswith(pvars[n]):
            st = For(f"{pvars[n]}h", Const(p.factor // st.extent.value), LoopKind.SERIAL, st)
            continue  # a lane loop split by `_gather_fill`
        st = For(pvars[n], Const(pbuf.shape[n]), kind, st)
    return Packed(pbuf, p.dim, p.factor, st, outer=tuple(outer), drop=tuple(outer.values()))


def _gather_fill(p: Pack, pbuf: Buffer, pvars: Sequence[str], src_idx: Sequence[Expr],
                 read: Callable[[Sequence[Expr]], Expr], inner: int, even: bool) -> Stmt:
    """The store filling one panel element of a virtual operand, its position along the
    packed dimension written so that the splits of merged axes resolve (`simplify_divisions`):
    a dimension merged from runs `[i, j]` is read at `pos // J`, `pos % J` (J = `inner`), which
    for the lane `l` of panel `b` (pos = F*b + l) are lane-uniform and unit-stride when J
    divides into whole panels (`(b // (J/F)) * J + (b % (J/F)) * F + l`) or the panels into
    whole rows of J lanes (the lane loop split into `F/J` rows of J, returned as that loop)."""
    f, blk, lane = p.factor, Index(pvars[0]), Index(pvars[-1])
    ranges = {v: (0, n - 1) for v, n in zip(pvars, pbuf.shape, strict=True)}
    split = None
    pos: Expr = Binary("+", Binary("*", blk, Const(f)), lane)
    if even and inner > f and inner % f == 0:
        m = inner // f
        pos = Binary("+", Binary("+", Binary("*", Binary("//", blk, Const(m)), Const(inner)),
                                 Binary("*", Binary("%", blk, Const(m)), Const(f))), lane)
    elif even and 1 < inner < f and f % inner == 0:
        hi, lo = Index(f"{pvars[-1]}h"), Index(f"{pvars[-1]}l")
        ranges.update({hi.name: (0, f // inner - 1), lo.name: (0, inner - 1)})
        lane = Binary("+", Binary("*", hi, Const(inner)), lo)
        pos = Binary("+", Binary("*", blk, Const(f)), lane)
        split = lo.name
    if not even:
        return Store(pbuf, tuple(Index(v) for v in pvars), read(src_idx))
    idx = list(src_idx)
    idx[p.dim] = pos
    value = simplify_divisions(read(idx), ranges)
    st: Stmt = Store(pbuf, (*[Index(v) for v in pvars[:-1]], lane), value)
    if split is not None:
        st = For(split, Const(inner), LoopKind.VECTORIZED, st)
    return st


def _reach(op: ComputeOp, p: Pack, src_val: Value, tails: Tails) -> int | None:
    """One past the largest index of dimension `p.dim` the loads of `src_val` take when the
    tails overshoot (at least the extent), or None when unknown."""
    from nfc.affine import interval

    if not 0 <= p.dim < len(src_val.type.shape):
        raise ScheduleError("a phase pack splits a dimension of the operand")
    ranges = {a.name: (0, tails.reach.get(a.name, a.extent) - 1) for a in op.all_axes}
    hi = src_val.type.shape[p.dim]
    for ld in op.body.walk():
        if isinstance(ld, Load) and ld.tensor is src_val:
            iv = interval(ld.indices[p.dim], ranges)
            if iv is None:
                return None
            hi = max(hi, iv[1] + 1)
    return hi


def _phase_pack(p: Pack, src: Buffer, reach: int | None, parallel: bool,
                used_names: set[str]) -> Packed:
    shape = src.shape
    if not 0 <= p.dim < len(shape) or p.factor < 2:
        raise ScheduleError("a phase pack splits a dimension of the operand by at least 2")
    n, f = shape[p.dim], p.factor
    # positions for every index the tails read (their lanes are masked or discarded)
    pbuf = Buffer(unique_name(f"{src.name}_phase", used_names, "pack"),
                  (*shape[:p.dim], f, -(-(reach or n) // f), *shape[p.dim + 1:]), src.dtype,
                  Scope.GLOBAL)
    pvars = [f"{pbuf.name}.{k}" for k in range(len(pbuf.shape))]
    pos = Binary("+", Binary("*", Index(pvars[p.dim + 1]), Const(f)), Index(pvars[p.dim]))
    src_idx: list[Expr] = [Index(v) for v in pvars[:p.dim] + pvars[p.dim + 2:]]
    src_idx.insert(p.dim, pos if f * pbuf.shape[p.dim + 1] == n else Clamp(pos, n - 1))
    st: Stmt = Store(pbuf, tuple(Index(v) for v in pvars), BufLoad(src, tuple(src_idx)))
    for k in reversed(range(len(pvars))):
        kind = LoopKind.SERIAL
        if k == len(pvars) - 1 and pbuf.shape[k] in (4, 8, 16):
            kind = LoopKind.VECTORIZED
        elif k == 0 and parallel and pbuf.shape[0] > 1:
            kind = LoopKind.PARALLEL
        st = For(pvars[k], Const(pbuf.shape[k]), kind, st)
    return Packed(pbuf, p.dim, f, st, phase=True, padded=reach is not None)
