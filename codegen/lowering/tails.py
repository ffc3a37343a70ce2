"""Tails: what the loops of an axis do when its blocks do not divide it.

A split axis of extent 10 in blocks of 8 runs two blocks, the second one partial. Each loop of
such a *ragged* axis gets a `TailStrategy` (Halide's name for the same choice):

- `SHRINK`: a serial inner loop stops at the end of the axis: its extent is
  `min(c, (E - base + b - 1) // b)` for blocks of `b` starting at `base`. (Halide's
  `GuardWithIf` on a serial loop, once bounds inference has turned the `if` into a bound.)
- `GUARD`: the loop keeps its constant extent (unrolled and vectorized loops must; so do the
  loops of a residue split, whose blocks interleave). Stores past the end are skipped (masked
  in vector code), reduction updates past the end are skipped, and loads past the end of an
  input read a `Clamp`ed element, in bounds and irrelevant. (Halide's `GuardWithIf` with
  predicated loads and stores.)
- `PEEL`: on the outermost loop of the one ragged output axis of an elementwise nest whose
  vectorized loop belongs to that axis: the full blocks run without guard and clamps (so
  without masked loads and stores, slow on some CPUs), the last block guarded. (Halide's loop
  partitioning of `GuardWithIf`.)

`plan_tails` picks these per loop. The schedule may ask for a strategy per split axis
(`Split.tail`): `auto`, the default above (inner serial loops shrink, the others guard, peel
where possible), `shrink` (no peeling), `guard` (no shrinking: constant extents, which the
emitter may unroll) or `peel`. Halide's `RoundUp` (run whole blocks, no guard) would need
buffers padded to whole blocks, and `ShiftInwards` (move the last block back inside the axis)
recomputes elements, wrong for accumulating write-backs and for kernels the memory plan runs
in place; neither is offered.

An axis *overshoots* when its loops reach past its end (`Tails.reach`): a guard or a clamp is
needed exactly for the overshooting axes.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from nfc.affine import Affine, affine_to_expr, interval
from nfc.codegen.loops import Clamp, For, If, LoopKind, Seq, Stmt, map_stmt, strip_clamps
from nfc.codegen.lowering.axes import Loops, ScheduleError
from nfc.ir import Binary, Call, ComputeOp, Const, Expr, Index, index_names


class TailStrategy(enum.Enum):
    """What a loop of a ragged axis does about the last, partial block (module docstring)."""

    SHRINK = "shrink"
    GUARD = "guard"
    PEEL = "peel"


@dataclass
class Tails:
    """The tail strategy of every loop of a ragged axis, and what follows from them."""

    loops: Loops
    strategy: dict[str, TailStrategy]
    """Per loop of a ragged axis (loops of axes that their blocks divide have none)."""
    reach: dict[str, int]
    """Per axis: how far its loops reach (the axis extent, or more when they overshoot)."""

    @property
    def overshoot(self) -> set[str]:
        """Axes whose loops reach past their end (guarded stores, clamped loads)."""
        return {a for a, r in self.reach.items() if r > self.loops.axes[a].extent}

    @property
    def peeled(self) -> str | None:
        """The loop whose last block is peeled, if any."""
        return next((lp for lp, s in self.strategy.items() if s is TailStrategy.PEEL), None)

    def extent(self, loop: str) -> Expr:
        """The extent of `loop`: constant, or `min(...)` for a shrinking loop."""
        ax, level = self.loops.owner[loop], self.loops.level[loop]
        c = ax.const(level)
        if self.strategy.get(loop) is not TailStrategy.SHRINK:
            return Const(c)
        rest = Affine.constant(ax.extent) - ax.base(level)
        blk = ax.blocks[level]
        left = affine_to_expr(rest + (blk - 1))
        return Call("min", (Const(c), Binary("//", left, Const(blk)) if blk > 1 else left))

    def nest(self, names: Sequence[str], inner: Stmt) -> Stmt:
        """The loops `names` (outermost first) around `inner`."""
        for loop in reversed(names):
            inner = For(loop, self.extent(loop), self.loops.kinds[loop], inner)
        return inner

    def bounds(self, reduce: bool) -> list[Expr]:
        """`a < extent` for each overshooting output (or reduction) axis `a`."""
        over = self.overshoot
        return [Binary("<", Index(a), Const(ax.extent)) for a, ax in self.loops.axes.items()
                if a in over and ax.reduce == reduce]

    def clamp(self, indices: Sequence[Expr], shape: Sequence[int],
              keep: int = -1) -> list[Expr]:
        """Indices of a load with `Clamp` around those that overshooting axes can take past
        the end of the tensor (except dimension `keep`, which packing pads instead)."""
        over = self.overshoot
        axis_range = {a: (0, r - 1) for a, r in self.reach.items()}
        out = list(indices)
        for d, ix in enumerate(out):
            if d != keep and index_names(ix) & over:
                iv = interval(ix, axis_range)
                if iv is None or iv[1] > shape[d] - 1:
                    out[d] = Clamp(ix, shape[d] - 1)
        return out

    def peel(self, store: Stmt, guard: Expr | None) -> Stmt:
        """The nest of an elementwise `store` with the last block of the peeled loop apart:
        the full blocks without clamps, the last one guarded by `guard`."""
        first = self.peeled
        assert first is not None
        loops = self.loops
        ax = loops.owner[first]
        full, blocks = ax.extent // ax.sizes[0], ax.const(0)
        pos = loops.order.index(first)
        inner = loops.order[pos + 1:]
        plain = self.nest(inner, strip_clamps(store))
        tail = map_stmt(self.nest(inner, guarded(guard, store)),
                        {first: Binary("+", Index(first), Const(full))})
        return self.nest(loops.order[:pos], Seq((
            For(first, Const(full), LoopKind.SERIAL, plain),
            For(first, Const(blocks - full), LoopKind.SERIAL, tail))))


def guarded(cond: Expr | None, s: Stmt) -> Stmt:
    """`s` under `if cond` (`s` itself without a condition)."""
    return s if cond is None else If(cond, s)


def conjunction(conds: Sequence[Expr]) -> Expr | None:
    """`c1 and c2 and ...`, None for no condition."""
    out: Expr | None = None
    for c in conds:
        out = c if out is None else Binary("and", out, c)
    return out


#: What a schedule may ask of a split (`Split.tail`).
TAIL_REQUESTS = ("auto", "shrink", "guard", "peel")


def plan_tails(op: ComputeOp, loops: Loops, requested: Mapping[str, str] | None = None
               ) -> Tails:
    """The tail strategy of every loop of a ragged axis. By default (`auto`) inner serial
    loops shrink, unrolled, vectorized and reordered ones guard, and an elementwise nest
    peels its ragged vectorized axis; `requested` (axis -> `Split.tail`) may ask for `shrink`
    (no peeling), `guard` (no shrinking, no peeling) or `peel` (an error where it cannot be
    done)."""
    requested = dict(requested or {})
    for name, want in requested.items():
        if want not in TAIL_REQUESTS:
            raise ScheduleError(f"unknown tail '{want}' of axis '{name}' "
                                f"(one of {', '.join(TAIL_REQUESTS)})")
    strategy: dict[str, TailStrategy] = {}
    for ax in loops.axes.values():
        if not ax.ragged:
            continue
        guard_all = requested.get(ax.name) == "guard"
        for n, loop in enumerate(ax.loops):
            shrink = (n > 0 and loops.kinds[loop] is LoopKind.SERIAL and not guard_all
                      and ax.name not in loops.reordered)
            strategy[loop] = TailStrategy.SHRINK if shrink else TailStrategy.GUARD
    tails = Tails(loops, strategy, _reach(loops, strategy.get))
    peel = _peelable(op, tails)
    peel_axis = None if peel is None else loops.owner[peel].name
    for name, want in requested.items():
        if want == "peel" and name != peel_axis:
            raise ScheduleError(f"the tail of axis '{name}' cannot be peeled (only the one "
                                "ragged, vectorized output axis of an elementwise nest, "
                                "with full blocks, a serial outer loop and no shrinking one)")
    if peel is not None and requested.get(peel_axis or "", "auto") in ("auto", "peel"):
        strategy[peel] = TailStrategy.PEEL
    return tails


def _reach(loops: Loops, strategy: Callable[[str], TailStrategy | None]) -> dict[str, int]:
    """How far each axis's loops reach: the innermost shrinking level (level 0 always counts)
    stops within a block of the size it iterates, the constant levels inside fill that
    block."""
    reach: dict[str, int] = {}
    for ax in loops.axes.values():
        t = max((n for n, loop in enumerate(ax.loops)
                 if n == 0 or strategy(loop) is TailStrategy.SHRINK), default=0)
        reach[ax.name] = -(-ax.extent // ax.blocks[t]) * ax.blocks[t]
    return reach


def _peelable(op: ComputeOp, tails: Tails) -> str | None:
    """The outermost loop of an elementwise nest's one ragged output axis when that axis is
    vectorized, its outermost loop serial, no inner loop of it shrinks, and it has both full
    blocks and a partial one."""
    loops = tails.loops
    vec = loops.vectorized
    ragged = [a for a in tails.overshoot if not loops.axes[a].reduce]
    if op.reduce is not None or len(ragged) != 1 or vec is None:
        return None
    ax = loops.axes[ragged[0]]
    if loops.owner[vec] is not ax:
        return None
    first = ax.loops[0]
    if loops.kinds[first] is not LoopKind.SERIAL or any(
            tails.strategy.get(lp) is TailStrategy.SHRINK for lp in ax.loops[1:]):
        return None
    return first if 0 < ax.extent // ax.sizes[0] < ax.const(0) else None
