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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

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
from nfc.codegen.lowering.axes import ScheduleError
from nfc.codegen.lowering.tails import Tails
from nfc.codegen.schedule import Pack, Schedule
from nfc.ir import Binary, ComputeOp, Const, Expr, Index, Load, Value


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

    @property
    def keep(self) -> int:
        """The dimension whose reads past the end the layout pads (not clamped); -1: none."""
        return self.dim if self.padded else -1

    def load(self, indices: Sequence[Expr]) -> BufLoad:
        """The panel element holding the operand's element at `indices`."""
        d, f = self.dim, self.factor
        ix = indices[d]
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
            packs.append((id(src_val), _phase_pack(p, src, _reach(op, p, src_val, tails),
                                                   parallel, used_names)))
            continue
        if p.kind != "panel":
            raise ScheduleError(f"unknown pack kind '{p.kind}'")
        _check(op, p, src_val, src, tails)
        packs.append((id(src_val), _pack(p, src, parallel, used_names)))
    return packs


def with_packs(main: Stmt, packs: Sequence[tuple[int, Packed]]) -> Stmt:
    """`main` preceded by the nests that fill the panels, inside their allocations."""
    for _, pk in reversed(packs):
        main = Allocate(pk.buffer, Seq((pk.fill, main)))
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


def _pack(p: Pack, src: Buffer, parallel: bool, used_names: set[str]) -> Packed:
    shape = src.shape
    nblk = -(-shape[p.dim] // p.factor)
    rest = shape[:p.dim] + shape[p.dim + 1:]
    pbuf = Buffer(unique_name(f"{src.name}_pack", used_names, "pack"),
                  (nblk, *rest, p.factor), src.dtype, Scope.GLOBAL)
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
        elif n == 0 and parallel and nblk > 1:
            kind = LoopKind.PARALLEL
        st = For(pvars[n], Const(pbuf.shape[n]), kind, st)
    return Packed(pbuf, p.dim, p.factor, st)


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
