"""One stage: a compute and its schedule become a loop nest writing one buffer.

The steps, each in its own module: the schedule's loops (`axes`), what their tails do
(`tails`), the packed operands (`packing`), then the body: loads become buffer loads (clamped
where a tail reads past the end, from the panels when packed), axes become their loop
variables, and `nfc.simplify.simplify_divisions` resolves the block structure (`(8*j.0 + j.1)
// 8` is `j.0`). An elementwise stage stores the body; a reduction goes through an
accumulator (`reductions`). Parallel loops are fused last.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from nfc.codegen.loops import Buffer, BufLoad, Stmt, Store
from nfc.codegen.lowering.axes import stage_loops
from nfc.codegen.lowering.packing import Packed, plan_packs, with_packs
from nfc.codegen.lowering.reductions import reduction_nest, split_factors
from nfc.codegen.lowering.tails import Tails, conjunction, guarded, plan_tails
from nfc.codegen.schedule import Schedule
from nfc.ir import Binary, ComputeOp, Const, Expr, Index, Load, Value, substitute_indices
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

    def lowered(e: Expr) -> Expr:
        return finish(e.map(lambda x: _load(x, bufs, packed, tails)))
    core, factors = split_factors(op)  # a sum's invariant factors, applied once to the sum
    body = lowered(core)
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
        main = reduction_nest(op, sched, tails, out, out_idx, body, guards, used_names,
                              tuple((f, lowered(x)) for f, x in factors))
    return with_packs(main, packs, loops, used_names)


def flat_index(indices: Sequence[Expr], shape: Sequence[int]) -> Expr | None:
    """`e` when `indices` are the row-major delinearisation of one index `e` over `shape`
    (`x[k // 1000, k // 10 % 100, k % 10]` of a `[6, 100, 10]` tensor: a flattening reshape
    inlined into its consumer), else None. Such a load reads element `e` of the flat tensor:
    contiguous in `e`, where the indices look like a gather."""
    n = len(shape)
    if n < 2:
        return None
    strides = [math.prod(shape[d + 1:]) for d in range(n)]
    flat: Expr | None = None
    for ix, ext, st in zip(indices, shape, strides, strict=True):
        if ext == 1 and ix == Const(0):
            continue
        x = ix
        if flat is not None:  # an inner dimension: `(e // stride) % extent`
            if not (isinstance(x, Binary) and x.op == "%" and x.b == Const(ext)):
                return None
            x = x.a
        # the outermost read dimension (those of extent 1 before it are skipped) is
        # `e // stride` as it stands: a `%` there is part of `e` (stripping it read
        # `w[(i + 2) % 2, 0]` of a [2, 1] tensor, or `t[0, (i + 3) % 4]` of a [1, 4] one, as
        # flat element i + 2, i + 3: out of bounds)
        if st > 1:
            if not (isinstance(x, Binary) and x.op == "//" and x.b == Const(st)):
                return None
            x = x.a
        if flat is None:
            flat = x
        elif x != flat:
            return None
    return flat


def _load(e: Expr, bufs: dict[int, Buffer], packs: dict[int, Packed],
          tails: Tails) -> Expr | None:
    """A load of the compute as a load of its buffer, or of its panels when packed; a load
    through a flattening reshape (`flat_index`) as a load of the flat buffer (the same memory,
    seen as one dimension: the same name binds the same pointer)."""
    if not isinstance(e, Load):
        return None
    pack = packs.get(id(e.tensor))
    buf = bufs[id(e.tensor)]
    flat = flat_index(e.indices, buf.shape) if pack is None else None
    if flat is not None:
        view = replace(buf, shape=(buf.size,))
        return BufLoad(view, tuple(tails.clamp([flat], view.shape)))
    idx = tails.clamp(e.indices, bufs[id(e.tensor)].shape, -1 if pack is None else pack.keep)
    if pack is not None:
        return pack.load(idx)
    return BufLoad(bufs[id(e.tensor)], tuple(idx))
