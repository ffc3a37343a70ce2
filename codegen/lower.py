"""Lowering: a compute (or a group of computes) plus a schedule becomes a loop-IR kernel.

A kernel is a compute, an `nf.kernel` group or a list of computes. `group_stages` inlines the
producers the `GroupSchedule` names (`compute_inline`); every other compute is a stage with a
loop nest of its own (`nfc.codegen.lowering`: loops, tails, packing, accumulators), writing an
output or a temporary in the workspace. A contraction scheduled on its flattened view
(`schedule_view`) is lowered on that view, its buffers seen in the view's shapes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from nfc.codegen.loops import Allocate, Buffer, LoopFunc, Scope, Seq, Stmt, unique_name
from nfc.codegen.lowering.axes import ScheduleError
from nfc.codegen.lowering.reductions import identity
from nfc.codegen.lowering.stage import lower_stage
from nfc.codegen.schedule import GroupSchedule, Schedule
from nfc.contraction import FlatContraction, flatten
from nfc.ir import (
    ComputeOp,
    Expr,
    KernelOp,
    Load,
    Value,
    YieldOp,
    substitute_indices,
)

__all__ = ["ScheduleError", "default_group_schedule", "group_of", "group_stages", "identity",
           "inline_producer", "kernel_signature", "lower", "lower_stage", "schedule_view"]


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
        view = flatten(op) if any(p.kind == "panel" for p in sched.pack) else None
        return view if view is not None and named <= {a.name for a in view.op.all_axes} else (
            None)
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
    params = [Buffer(unique_name("out" if n == 0 else f"out{n}", used, "out"), v.shape,
                     v.dtype) for n, v in enumerate(outputs)]
    params += [Buffer(unique_name(v.name, used, "in"), v.shape, v.dtype) for v in inputs]
    bufs = {id(v): b for v, b in zip([*outputs, *inputs], params, strict=True)}
    temps: list[Buffer] = []
    stmts: list[Stmt] = []
    for st, s in group_stages(op, schedule):
        if id(st.result) not in bufs:
            tb = Buffer(unique_name(st.result.name or "tmp", used, "tmp"), st.result.shape,
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
