"""Memory options that change only where values live must not change how a sum adds.

`remat` and `compress-activations` are exact at the IR level (a recomputed value, a comparison
made earlier into a mask), but they change how `fuse` groups kernels, and the default schedule
of a stage (vector axis, register tile, split of a reduction: the order in which a float sum
adds its terms) is chosen from the stage's body after its producers are inlined. So one float
sum could add in another order in the option's build than in the build without the option,
and training ended with other bits (docs/memory.md, "Batch doubling under a budget").

The build (nfc.runtime.build.build_module) therefore builds, beside a module whose pipeline
has such passes, its *reference*: the module as it is before the first of them, copied, then
through the rest of the pipeline without them, i.e. what the build without the options
makes. Every float sum present before the options is tracked by its result value into both
(`SumTracker`; the copy maps each value to its twin, and a `remat` clone of a sum counts as
the sum it recomputes, nfc.passes.remat.recomputed_from). `reference_orders` takes, for every
tracked sum, the schedule of its stage as the artifact would compile the reference (its
`nf.schedule`, a stage schedule of its group, else codegen's default for the stage with its
producers inlined); `force_orders` gives each tracked sum of the option's module that schedule
wherever its own stage would be scheduled otherwise and the reference's schedule lowers on it
(the axes are the sum's own, so it does unless it names a flattened view or packs another
body's operands). The schedules are chosen by the same code for both builds, so whatever
codegen's defaults are, the option's sums add in the reference's order; the build without
options is not touched.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from nfc.ir import ComputeOp, KernelOp, Module, Value

__all__ = ["SumTracker", "force_orders", "reference_orders", "run_reference"]


def _float_sum(op: Any) -> bool:
    return isinstance(op, ComputeOp) and op.reduce == "sum" and op.result.dtype.is_float


def _computes(module: Module) -> Iterator[ComputeOp]:
    for f in module.funcs:
        for op in f.body.ops:
            if isinstance(op, ComputeOp):
                yield op
            elif isinstance(op, KernelOp):
                yield from (o for o in op.body.ops if isinstance(o, ComputeOp))


@dataclass
class SumTracker:
    """The float sums of a module by number, through their result values (kept alive here
    so that their ids stay theirs)."""

    values: dict[int, tuple[Value, int]] = field(default_factory=dict)

    @staticmethod
    def of(module: Module) -> SumTracker:
        """Every float sum of `module`, numbered in order."""
        t = SumTracker()
        for n, op in enumerate(o for o in _computes(module) if _float_sum(o)):
            t.values[id(op.result)] = (op.result, n)
        return t

    def number(self, v: Value) -> int | None:
        """The number of the sum whose result is `v` (or that `v` recomputes: a clone made
        by `remat`), None when `v` is not tracked."""
        from nfc.passes.remat import recomputed_from

        for w in (v, recomputed_from(v)):
            hit = self.values.get(id(w))
            if hit is not None and hit[0] is w:
                return hit[1]
        return None

    def mapped(self, mapping: dict[Value, Value]) -> SumTracker:
        """The same numbers for the twins of the values (`Func.clone`'s mapping)."""
        t = SumTracker()
        for v, n in self.values.values():
            w = mapping.get(v)
            if w is not None:
                t.values[id(w)] = (w, n)
        return t


def copy_module(module: Module) -> tuple[Module, dict[Value, Value]]:
    """A deep copy of `module` and its value mapping (old value -> copy)."""
    import copy

    mapping: dict[Value, Value] = {}
    funcs = [f.clone(mapping=mapping) for f in module.funcs]
    return Module(module.name, funcs, attrs=copy.deepcopy(module.attrs)), mapping


def run_reference(module: Module, passes: Sequence[Any], ctx: Any) -> tuple[Module, SumTracker,
                                                                            SumTracker]:
    """The reference of `module` (the module before the first memory-trading pass): a copy
    run through `passes` without the memory-trading ones, under a copy of `ctx`; with the
    trackers of `module`'s float sums and of their twins in the reference."""
    from nfc.diagnostics import DiagnosticEngine
    from nfc.passmanager import Context, PassManager

    tracker = SumTracker.of(module)
    ref, mapping = copy_module(module)
    rest = [p for p in passes if not getattr(p, "uses_memory_model", False)]
    rctx = (Context(verify=False) if ctx is None else dataclasses.replace(
        ctx, diagnostics=DiagnosticEngine(), remarks={}, memory_model=None, verify=False))
    PassManager(rest, verify=False).run(ref, rctx)
    return ref, tracker, tracker.mapped(mapping)


def _group_schedule(op: KernelOp, target: Any) -> Any:
    """The GroupSchedule the artifact compiles `op` with (nfc.codegen.artifact.assemble)."""
    from nfc.codegen.artifact.assemble import _stage_schedules
    from nfc.codegen.jit import SCHEDULE_ATTR, resolve_schedule
    from nfc.codegen.lower import default_group_schedule, group_of
    from nfc.codegen.schedule import GroupSchedule

    sched = resolve_schedule(op, op.attrs.get(SCHEDULE_ATTR) or _stage_schedules(op, target),
                             target)
    if isinstance(sched, GroupSchedule):
        return sched
    cops, outs, _ = group_of(op)
    return default_group_schedule(cops, outs)


def _stages(module: Module, target: Any) -> Iterator[tuple[Any, int, ComputeOp, Any, Any]]:
    """(op, stage number, stage compute, its schedule as compiled, group schedule or None)
    for every stage of every kernel op of `module`."""
    from nfc.codegen.jit import resolve_schedule
    from nfc.codegen.lower import group_stages
    from nfc.codegen.space import default_schedule

    for f in module.funcs:
        for op in f.body.ops:
            if isinstance(op, ComputeOp):
                s = resolve_schedule(op, None, target)
                yield op, 0, op, s if s is not None else default_schedule(op, target), None
            elif isinstance(op, KernelOp):
                gs = _group_schedule(op, target)
                for n, (st, s) in enumerate(group_stages(op, gs)):
                    yield op, n, st, s if s is not None else default_schedule(st, target), gs


def reference_orders(ref: Module, tracker: SumTracker, target: Any) -> dict[int, Any]:
    """Sum number -> the Schedule of its stage in the reference's artifact."""
    out: dict[int, Any] = {}
    for _, _, st, s, _ in _stages(ref, target):
        n = tracker.number(st.result)
        if n is not None and _float_sum(st):
            out[n] = s
    return out


@dataclass
class ForceReport:
    """What `force_orders` did: sums tracked into the option's module, given the reference's
    schedule, and left as they were because it did not lower on their stage."""

    tracked: int = 0
    forced: int = 0
    unfit: list[str] = field(default_factory=list)

    def message(self) -> str:
        """One line for the build's remarks (`Context.remarks["sum-orders"]`)."""
        text = (f"sum orders: {self.forced} of {self.tracked} float sums scheduled as in the "
                "build without the memory options")
        if self.unfit:
            text += f"; {len(self.unfit)} could not be ({', '.join(self.unfit[:4])})"
        return text


def force_orders(module: Module, tracker: SumTracker, orders: dict[int, Any],
                 target: Any) -> ForceReport:
    """Give every tracked float sum of `module` whose stage would be scheduled otherwise its
    reference schedule (`orders`), as an `nf.schedule` on the compute or in its group's
    GroupSchedule, where that schedule lowers on the stage."""
    from nfc.codegen.jit import SCHEDULE_ATTR
    from nfc.codegen.lower import lower
    from nfc.codegen.lowering.axes import ScheduleError
    from nfc.codegen.schedule import GroupSchedule

    report = ForceReport()
    groups: dict[int, tuple[KernelOp, Any, dict[int, Any]]] = {}
    stages = list(_stages(module, target))
    compiled = {(id(op), n): own for op, n, _, own, _ in stages}
    for op, n, st, own, gs in stages:
        k = tracker.number(st.result)
        if k is None or k not in orders or not _float_sum(st):
            continue
        report.tracked += 1
        want = orders[k]
        if want.to_dict() == own.to_dict():
            continue
        try:
            lower(st, want)
        except (ScheduleError, ValueError, KeyError, AssertionError):
            report.unfit.append(st.result.name or "?")
            continue
        report.forced += 1
        if gs is None:
            op.attrs[SCHEDULE_ATTR] = _attr(want.to_dict())
        else:
            groups.setdefault(id(op), (op, gs, {}))[2][n] = want
    for op, gs, new in groups.values():
        # every stage explicit (as the artifact compiles it): an attribute holds no None
        count = sum(1 for key in compiled if key[0] == id(op))
        scheds = tuple(new.get(n, compiled[id(op), n]) for n in range(count))
        op.attrs[SCHEDULE_ATTR] = _attr(GroupSchedule(inline=gs.inline,
                                                      stages=scheds).to_dict())
    return report


def _attr(d: Any) -> Any:
    """A schedule dict as an IR attribute: None entries (unset fields) left out."""
    if isinstance(d, dict):
        return {k: _attr(v) for k, v in d.items() if v is not None}
    if isinstance(d, list):
        return [_attr(x) for x in d]
    return d
