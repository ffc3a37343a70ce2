"""The loops of one stage: a schedule's splits, loop order and loop kinds, checked.

An axis `i` split by `(s1, ..., sn)` runs as the loops `i.0 .. i.n`; its value is
`s1*i.0 + ... + sn*i.(n-1) + i.n` (`Axis.expr`). Every loop has a constant extent here, the
one a full block gives it (`Axis.const`); what the last, partial block of an axis does is the
business of `nfc.codegen.lowering.tails`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from nfc.affine import Affine, affine_to_expr
from nfc.codegen.loops import For, LoopKind, Stmt, map_stmt, unique_name
from nfc.codegen.schedule import Schedule
from nfc.ir import Binary, ComputeOp, Const, Expr, Index

#: Longest unrolled loop and widest vector (in elements) a schedule may ask for.
MAX_UNROLL, MAX_VECTOR = 256, 64


class ScheduleError(ValueError):
    """A schedule that does not fit its compute (an internal error or a bad tuner config)."""


@dataclass
class Axis:
    """An axis of a compute with the block sizes of its split (empty: not split)."""

    name: str
    extent: int
    reduce: bool
    sizes: tuple[int, ...]

    @property
    def loops(self) -> list[str]:
        """Its loops, outer to inner: `i`, or `i.0 .. i.n` when split."""
        if not self.sizes:
            return [self.name]
        return [f"{self.name}.{n}" for n in range(len(self.sizes) + 1)]

    @property
    def blocks(self) -> tuple[int, ...]:
        """The block size each loop steps over (1 for the innermost)."""
        return (*self.sizes, 1)

    def const(self, level: int) -> int:
        """Constant extent of loop `level`."""
        if not self.sizes:
            return self.extent
        if level == 0:
            return -(-self.extent // self.sizes[0])
        return self.blocks[level - 1] // self.blocks[level]

    @property
    def padded(self) -> int:
        """The extent rounded up to whole outermost blocks."""
        return self.const(0) * self.sizes[0] if self.sizes else self.extent

    @property
    def ragged(self) -> bool:
        """Whether the last outermost block is partial."""
        return self.padded > self.extent

    def expr(self) -> Expr:
        """The axis value in terms of its loop variables."""
        if not self.sizes:
            return Index(self.name)
        terms = [(loop, self.blocks[n]) for n, loop in enumerate(self.loops)]
        return affine_to_expr(Affine.make(terms))

    def base(self, level: int) -> Affine:
        """Where the block of loop `level` starts: the loops outside it, scaled."""
        return Affine.make((self.loops[m], self.blocks[m]) for m in range(level))


@dataclass
class Loops:
    """The loops of a stage under a schedule: order (outermost first), kinds, and the axis
    and level of each loop."""

    axes: dict[str, Axis]
    """Output axes, then reduction axes."""
    order: list[str]
    kinds: dict[str, LoopKind]
    reordered: set[str]
    """Output axes with an inner block loop outside an outer one (a residue split)."""
    vectorized: str | None
    """The vectorized (innermost) loop, if any."""
    parallel: list[str]
    """The parallel loops (an outermost prefix of output loops)."""
    owner: dict[str, Axis] = field(init=False)
    level: dict[str, int] = field(init=False)

    def __post_init__(self) -> None:
        self.owner = {loop: ax for ax in self.axes.values() for loop in ax.loops}
        self.level = {loop: n for ax in self.axes.values() for n, loop in enumerate(ax.loops)}

    def const(self, loop: str) -> int:
        """Constant extent of `loop`."""
        return self.owner[loop].const(self.level[loop])

    def ranges(self) -> dict[str, tuple[int, int]]:
        """Inclusive range of every loop variable."""
        return {loop: (0, self.const(loop) - 1) for loop in self.order}

    def axis_exprs(self) -> dict[str, Expr]:
        """Every axis in terms of its loop variables."""
        return {name: ax.expr() for name, ax in self.axes.items()}


def stage_loops(op: ComputeOp, sched: Schedule) -> Loops:
    """The loops of `op` under `sched`; raises ScheduleError when they do not fit."""
    axes = {a.name: Axis(a.name, a.extent, False, sched.split_of(a.name)) for a in op.dims}
    axes.update({a.name: Axis(a.name, a.extent, True, sched.split_of(a.name))
                 for a in op.raxes})
    for s in sched.splits:
        if s.axis not in axes:
            raise ScheduleError(f"split of unknown axis '{s.axis}'")
        if any(x < 1 for x in s.sizes) or any(
                a % b for a, b in zip(s.sizes, s.sizes[1:], strict=False)):
            raise ScheduleError(f"split sizes {s.sizes} of '{s.axis}' must divide each other")
    names = [loop for ax in axes.values() for loop in ax.loops]
    order = list(sched.order) or names
    if sorted(order) != sorted(names):
        raise ScheduleError(f"order {order} is not a permutation of the loops {names}")
    loops = Loops(axes, order, {}, _reordered(axes, order), sched.vectorize,
                  list(sched.parallel))
    loops.kinds = _kinds(loops, sched)
    for loop in order:
        limit = {LoopKind.UNROLLED: MAX_UNROLL, LoopKind.VECTORIZED: MAX_VECTOR}.get(
            loops.kinds[loop])
        if limit is not None and loops.const(loop) > limit:
            raise ScheduleError(f"loop '{loop}' is too long to unroll or vectorize")
    return loops


def _reordered(axes: dict[str, Axis], order: list[str]) -> set[str]:
    """The loops of an axis run outer to inner, except that an output axis may put an inner
    block loop outside (a residue split: `w = 2*(8*w.0 + w.1) + w.2` with `w.2` outside the
    vectorized `w.1` makes `w // 2` contiguous in the lanes); such an axis runs full blocks,
    guarded by its bound, never a tight remainder loop."""
    reordered: set[str] = set()
    for ax in axes.values():
        pos = [order.index(loop) for loop in ax.loops]
        if pos != sorted(pos):
            if ax.reduce or pos[0] != min(pos):
                raise ScheduleError(f"loops of axis '{ax.name}' must stay outer to inner")
            reordered.add(ax.name)
    return reordered


def _kinds(loops: Loops, sched: Schedule) -> dict[str, LoopKind]:
    order = loops.order
    kinds = {loop: LoopKind.SERIAL for loop in order}
    for loop in sched.unroll:
        kinds[loop] = LoopKind.UNROLLED
    vec = loops.vectorized
    if vec is not None:
        if order[-1] != vec:
            raise ScheduleError(f"vectorized loop '{vec}' must be innermost")
        kinds[vec] = LoopKind.VECTORIZED
    par = loops.parallel
    if par != order[:len(par)] or any(loops.owner[p].reduce for p in par):
        raise ScheduleError(f"parallel loops {par} must be outermost output loops")
    for loop in par:
        kinds[loop] = LoopKind.PARALLEL
    return kinds


def fuse_parallel(s: Stmt, loops: Loops, used: set[str]) -> Stmt:
    """`s` with its perfectly nested outermost parallel loops fused into one parallel loop
    (GOMP gets one flat iteration space)."""
    par = loops.parallel
    if len(par) <= 1:
        return s
    inner = s
    for _ in par:
        assert isinstance(inner, For)
        inner = inner.body
    fused = unique_name("fused", used, "fused")
    consts = {p: loops.const(p) for p in par}
    total = math.prod(consts.values())
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
