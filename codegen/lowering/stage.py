"""One stage: a compute and its schedule become a loop nest writing one buffer.

The steps, each in its own module: the schedule's loops (`axes`), what their tails do
(`tails`), the packed operands (`packing`), then the body: loads become buffer loads (clamped
where a tail reads past the end, from the panels when packed), axes become their loop
variables, and `nfc.simplify.simplify_divisions` resolves the block structure (`(8*j.0 + j.1)
// 8` is `j.0`). An elementwise stage stores the body; a reduction goes through an
accumulator (`reductions`). Parallel loops are fused last.
"""

from __future__ import annotations

from collections.abc import Sequence

from nfc.codegen.loops import Buffer, BufLoad, Stmt, Store
from nfc.codegen.lowering.axes import fuse_parallel, stage_loops
from nfc.codegen.lowering.packing import Packed, plan_packs, with_packs
from nfc.codegen.lowering.reductions import reduction_nest
from nfc.codegen.lowering.tails import Tails, conjunction, guarded, plan_tails
from nfc.codegen.schedule import Schedule
from nfc.ir import ComputeOp, Expr, Index, Load, Value, substitute_indices
from nfc.simplify import simplify_divisions


def lower_stage(op: ComputeOp, sched: Schedule, out: Buffer, bufs: dict[int, Buffer],
                operands: Sequence[Value], used_names: set[str]) -> Stmt:
    """The loop nest computing `op` into `out`; `bufs` maps id(value) to its buffer and
    `operands` gives the numbering `Pack.operand` refers to. Names of new buffers and loops
    avoid (and join) `used_names`. Raises ScheduleError when `sched` does not fit `op`."""
    loops = stage_loops(op, sched)
    tails = plan_tails(op, loops, {s.axis: s.tail for s in sched.splits})
    packs = plan_packs(op, sched, tails, bufs, operands, used_names)
    axis_exprs, ranges = loops.axis_exprs(), loops.ranges()

    def finish(e: Expr) -> Expr:
        return simplify_divisions(substitute_indices(e, axis_exprs), ranges)

    packed = dict(packs)  # by id(value); a twice packed operand is read from its last panels
    body = finish(op.body.map(lambda e: _load(e, bufs, packed, tails)))
    out_idx = tuple(finish(Index(a.name)) for a in op.dims)
    guards = (conjunction([finish(c) for c in tails.bounds(reduce=False)]),
              conjunction([finish(c) for c in tails.bounds(reduce=True)]))
    if op.reduce is None:
        store = Store(out, out_idx, body)
        if tails.peeled is not None:
            main = tails.peel(store, guards[0])
        else:
            main = tails.nest(loops.order, guarded(guards[0], store))
    else:
        main = reduction_nest(op, sched, tails, out, out_idx, body, guards, used_names)
    return with_packs(fuse_parallel(main, loops, used_names), packs)


def _load(e: Expr, bufs: dict[int, Buffer], packs: dict[int, Packed],
          tails: Tails) -> Expr | None:
    """A load of the compute as a load of its buffer, or of its panels when packed."""
    if not isinstance(e, Load):
        return None
    pack = packs.get(id(e.tensor))
    idx = tails.clamp(e.indices, bufs[id(e.tensor)].shape, -1 if pack is None else pack.dim)
    if pack is not None:
        return pack.load(idx)
    return BufLoad(bufs[id(e.tensor)], tuple(idx))
