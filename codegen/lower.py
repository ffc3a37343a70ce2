"""Lowering: a compute (or a group of computes) plus a schedule becomes a loop-IR kernel.

A kernel is a compute, an `nf.kernel` group or a list of computes. `group_stages` inlines the
producers the `GroupSchedule` names (`compute_inline`); every other compute is a stage with a
loop nest of its own (`nfc.codegen.lowering`: loops, tails, packing, accumulators), writing an
output or a temporary in the workspace. A contraction scheduled on its flattened view
(`schedule_view`) is lowered on that view, its buffers seen in the view's shapes. Two stages
with a large temporary between them, both over the same batch, may run per batch element
(`slice_plan`, nfc.codegen.lowering.slices): the temporary is then one element large.
Independent stages whose outer loops agree then share one nest (nfc.codegen.lowering.
horizontal; `NFC_HFUSE=0` switches it off).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace

from nfc.codegen.loops import Allocate, Buffer, LoopFunc, Scope, Seq, Stmt, unique_name
from nfc.codegen.lowering import horizontal
from nfc.codegen.lowering.axes import ScheduleError
from nfc.codegen.lowering.reductions import identity
from nfc.codegen.lowering.slices import BatchSlice, lower_slice, slice_stages
from nfc.codegen.lowering.stage import lower_stage
from nfc.codegen.schedule import GroupSchedule, Schedule
from nfc.contraction import FlatContraction, GatherView, flatten
from nfc.ir import (
    Binary,
    ComputeOp,
    Const,
    Expr,
    KernelOp,
    Load,
    TensorType,
    Value,
    YieldOp,
    index_names,
    substitute_indices,
)

__all__ = ["ScheduleError", "default_group_schedule", "group_of", "group_stages", "identity",
           "inline_producer", "kernel_signature", "lower", "lower_stage", "schedule_view",
           "slice_plan"]


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
        # the same axes; a view that only drops dimensions indexed by a constant 0 (extent
        # 1) is where the GEMM template's panel packs name their dimensions
        view = flatten(op, implicit=True) if any(
            p.kind == "panel" for p in sched.pack) else None
        return view if view is not None and named <= {a.name for a in view.op.all_axes} else (
            None)
    view = flatten(op, implicit=True)
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
    params = [Buffer(unique_name("out" if n == 0 else f"out{n}", used, "out"), v.shape,
                     v.dtype) for n, v in enumerate(outputs)]
    params += [Buffer(unique_name(v.name, used, "in"), v.shape, v.dtype) for v in inputs]
    bufs = {id(v): b for v, b in zip([*outputs, *inputs], params, strict=True)}
    temps: list[Buffer] = []
    stmts: list[Stmt] = []
    stages: list[ComputeOp | None] = []  # per statement: its stage (None: a batch slice)
    for item in slice_plan(op, schedule, pick):
        if isinstance(item, BatchSlice):  # stages run per batch element
            stmts.append(lower_slice(item, bufs, temps, used, lambda st, s, b: _lower_one(
                st, s, b, used)))
            stages.append(None)
            continue
        st, sched = item
        if id(st.result) not in bufs:
            tb = Buffer(unique_name(st.result.name or "tmp", used, "tmp"), st.result.shape,
                        st.result.dtype, Scope.GLOBAL)
            temps.append(tb)
            bufs[id(st.result)] = tb
        stmts.append(_lower_one(st, sched, bufs, used))
        stages.append(st)
    if len(stmts) > 1 and horizontal.enabled():  # independent stages share nests
        stmts = horizontal.fuse_stmts(stmts, horizontal.stage_infos(
            stages, stmts, outputs, inputs, inplace=not (
                isinstance(op, KernelOp) and op.attrs.get(horizontal.MEMBERS_ATTR))))
    body: Stmt = stmts[0] if len(stmts) == 1 else Seq(tuple(stmts))
    for tb in reversed(temps):
        body = Allocate(tb, body)
    return LoopFunc(name, tuple(params), len(outputs), body)


def slice_plan(op: ComputeOp | KernelOp | Sequence[ComputeOp],
               schedule: Schedule | GroupSchedule | None, pick: Callable[[ComputeOp], Schedule]
               ) -> list[tuple[ComputeOp, Schedule] | BatchSlice]:
    """The stages of `op` (`group_stages`) with their schedules (`pick(stage)` for those left
    unset), pairs that run per batch element as their `BatchSlice`
    (nfc.codegen.lowering.slices): only those whose one-image stages lower."""
    _, outputs, _ = group_of(op)
    stages = [(st, s if s is not None else pick(st)) for st, s in group_stages(op, schedule)]
    if len(stages) < 2:
        return list(stages)
    items: list[tuple[ComputeOp, Schedule] | BatchSlice] = []
    for item in slice_stages(stages, outputs):
        if isinstance(item, BatchSlice) and not _slice_lowers(item):
            items += item.whole
        else:
            items.append(item)
    return items


def _slice_lowers(bs: BatchSlice) -> bool:
    """Whether the one-image stages of `bs` lower (on buffers of their own)."""
    used: set[str] = set()
    bufs: dict[int, Buffer] = {}
    for st, _ in bs.stages:
        for v in st.operands:
            full = bs.sliced.get(id(v), v)
            if id(full) not in bufs:
                bufs[id(full)] = Buffer(unique_name(full.name, used, "in"), full.shape,
                                        full.dtype)
    try:
        lower_slice(bs, bufs, [], used, lambda st, s, b: _lower_one(st, s, b, used))
    except ScheduleError:
        return False
    return True


def _lower_one(st: ComputeOp, sched: Schedule, bufs: dict[int, Buffer], used: set[str]) -> Stmt:
    """The nest of one stage (its result's buffer in `bufs`)."""
    view = schedule_view(st, sched)
    if view is None:
        return lower_stage(st, sched, bufs[id(st.result)], bufs, list(st.operands), used)
    # a contraction scheduled on its flattened view: the same memory seen as the view's
    # shapes (buffers keep their names, so they bind to the same pointers)
    vbufs = dict(bufs)
    for vid, fv in view.values.items():
        vbufs[id(fv)] = replace(bufs[vid], shape=fv.shape)
    vop = view.op
    operands = list(vop.operands)
    for n, gv in enumerate(operands):
        if not isinstance(gv, GatherView):
            continue
        if any(p.operand == n and p.kind == "panel" for p in sched.pack):
            # an implicit operand's panels are filled from the tensors it gathers from
            # (nfc.codegen.lowering.packing); its own buffer is never allocated or bound
            vbufs[id(gv)] = Buffer(unique_name(gv.name or "view", used, "view"),
                                   gv.shape, gv.dtype, Scope.GLOBAL)
        else:  # read in place: the gather's expression where the view is loaded
            vop = _read_in_place(vop, gv, vbufs)
    return lower_stage(vop, sched, vbufs[id(view.op.result)], vbufs, operands, used)


def _read_in_place(op: ComputeOp, gv: GatherView, bufs: dict[int, Buffer]) -> ComputeOp:
    """`op` with its loads of the virtual operand `gv` replaced by their expressions, each
    load of a stored tensor in them read through its flat view (`_flat_load`); the views'
    buffers join `bufs`."""
    def fn(e: Expr) -> Expr | None:
        if isinstance(e, Load) and e.tensor is gv:
            return gv.element(e.indices).map(lambda x: _flat_load(x, bufs))
        return None
    new = ComputeOp(op.result.type, op.dims, op.body.map(fn), reduce=op.reduce,
                    raxes=op.raxes, loc=op.loc, attrs=op.attrs, name=op.result.name)
    new.results[0] = op.result
    return new


def _terms(e: Expr) -> list[Expr]:
    """The additive terms of an index expression (constant factors distributed)."""
    if isinstance(e, Binary) and e.op in ("+", "-"):
        rest = _terms(e.b)
        if e.op == "-":
            rest = [Binary("*", Const(-1), t) for t in rest]
        return _terms(e.a) + rest
    if isinstance(e, Binary) and e.op == "*":
        for c, x in ((e.a, e.b), (e.b, e.a)):
            if isinstance(c, Const) and not c.is_float:
                return [Binary("*", c, t) for t in _terms(x)]
    return [e]


def _flat_load(e: Expr, bufs: dict[int, Buffer]) -> Expr | None:
    """A load of a stored tensor as a load of its flat view (the same buffer, one dimension),
    the row-major offset summed by groups of terms over the same axes: a gather read in place
    inside a GEMM's micro-kernel (`x[n, gm // 9, 2 * (gk // 6) + gm % 9, ...]`) then costs one
    offset of the row axes, hoisted out of the k loop, plus one of k per step, instead of the
    whole index arithmetic per element."""
    if not isinstance(e, Load) or id(e.tensor) not in bufs or not e.indices:
        return None
    shape = e.tensor.shape
    groups: dict[tuple[str, ...], list[Expr]] = {}
    for d, ix in enumerate(e.indices):
        stride = math.prod(shape[d + 1:])
        for t in _terms(ix):
            tt = t if stride == 1 else Binary("*", t, Const(stride))
            groups.setdefault(tuple(sorted(index_names(t))), []).append(tt)
    offset: Expr | None = None
    for key in sorted(groups):
        part = groups[key][0]
        for t in groups[key][1:]:
            part = Binary("+", part, t)
        offset = part if offset is None else Binary("+", offset, part)
    assert offset is not None
    flat = Value(TensorType((math.prod(shape),), e.tensor.dtype), e.tensor.name)
    bufs[id(flat)] = replace(bufs[id(e.tensor)], shape=flat.shape)
    return Load(flat, (offset,))


def default_group_schedule(ops: Sequence[ComputeOp], outputs: Sequence[Value]) -> GroupSchedule:
    """Inline every elementwise producer that is not an output; default stage schedules."""
    out_ids = {id(v) for v in outputs}
    inline = tuple(n for n, o in enumerate(ops[:-1])
                   if o.reduce is None and id(o.result) not in out_ids)
    return GroupSchedule(inline=inline)
