"""The distinct kernels of an artifact: deduplicated, lowered once, compiled or taken from the
object cache.

`KernelSet.add(op, schedule)` names a kernel by its key (nfc.codegen.artifact.kcache): the
first op with a key is lowered to loop IR (cheap, and needed for the memory plan's workspace
sizes and `--emit=loops`); every later op with the same key reuses that kernel's symbol with its
own buffers. `objects()` then produces one object per distinct kernel: from the cache when it
has the key, else emitted and compiled (in parallel, nfc.codegen.artifact.parallel) and stored.

A group of several stages (an `nf.kernel` of the fuse pass) is compiled stage by stage: each
stage (a compute with its inlined producers) is a kernel of its own, deduplicated and cached like
any other, and the group becomes a *composite*: a small function of the entry module that calls
the stages in order with pointers into the group's buffers and workspace (`define_composites`).
The stages' loop nests were separate in the group's function too, so the machine code does the
same work, but the unrolled steps of an RNN or the repeated blocks of a ResNet, fused into groups
that differ, still share their stages (ResNet-18: 584 stages in 59 distinct groups, 174
distinct stages; an LSTM language model: 435 in 29, 84). Independent stages whose nests
horizontal fusion merges (nfc.codegen.lowering.horizontal) are compiled together as one kernel
of those stages (`member_kernel`), called once.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from nfc.codegen.artifact.kcache import ObjectCache, kernel_key, kernel_symbol
from nfc.codegen.artifact.parallel import KernelJob, compile_jobs, compile_text, hide, loop_cost
from nfc.codegen.cpu import CpuTarget
from nfc.codegen.jit import KernelInfo, emit_lowered, lower_kernel, new_module, resolve_schedule
from nfc.codegen.lower import group_of, group_stages, slice_plan
from nfc.codegen.lowering import horizontal
from nfc.codegen.lowering.slices import BatchSlice
from nfc.codegen.schedule import GroupSchedule
from nfc.ir import ComputeOp, KernelOp, Value
from nfc.passes.memplan import LiveBuffer, plan_offsets


@dataclass
class KernelEntry:
    """One distinct kernel: its key, the first op that has it, its schedule and loop IR."""

    key: str
    op: ComputeOp | KernelOp
    schedule: dict[str, Any] | None
    info: KernelInfo
    uses: int = 1


@dataclass
class Composite:
    """A group compiled stage by stage: its layout (the whole group's loop IR, whose workspace
    holds the intermediates first) and the stage kernels it calls, in order."""

    info: KernelInfo
    calls: list[tuple[str, KernelInfo, ComputeOp | tuple[ComputeOp, ...]]]
    """(symbol, layout for this stage's values, stage compute) per stage; the computes of
    independent stages compiled as one kernel (nfc.codegen.lowering.horizontal) share a
    call."""
    slices: list[tuple[int, int, BatchSlice]] = field(default_factory=list)
    """(first call, number of calls, slice): calls run per batch element, in a loop
    (nfc.codegen.lowering.slices)."""


@dataclass(frozen=True)
class CompositeInfo(KernelInfo):
    """A composite's buffers: the group's (`loops` is the group's loop IR), but the workspace
    its calls need (`composite_layout`), which is smaller than the group's loop IR's when
    intermediates whose lifetimes do not overlap share bytes."""

    ws_bytes: int = 0

    @property
    def workspace_bytes(self) -> int:
        return self.ws_bytes


def composite_layout(comp: Composite) -> tuple[dict[int, int], dict[int, int], int]:
    """Workspace offsets of a composite's intermediates (by value id; a one-image value of a
    batch slice by its batch tensor's) and of each call's own workspace (by call), and the
    bytes they need. An intermediate is live from the call that writes it to the last call
    that reads it, a call's workspace during that call (every call of a batch-slice loop
    counts as the whole loop); buffers whose lives do not overlap share bytes
    (nfc.passes.memplan.plan_offsets). A group whose stages each consume the previous
    stage's value, such as a chain of gradient accumulations, needs a few intermediates'
    bytes rather than all of them."""
    info = comp.info
    outer = {id(v) for v in (*info.outputs, *info.inputs)}
    whole: dict[int, Value] = {}
    span: dict[int, tuple[int, int]] = {}
    for first, count, bs in comp.slices:
        whole.update(bs.sliced)
        span.update({first + j: (first, first + count - 1) for j in range(count)})
    live: dict[int, list[int]] = {}  # value id -> [first call, last call, bytes]
    work: list[LiveBuffer] = []
    for k, (_, si, sts) in enumerate(comp.calls):
        lo, hi = span.get(k, (k, k))
        for st in sts if isinstance(sts, tuple) else (sts,):
            v = whole.get(id(st.result), st.result)
            if id(v) not in outer and id(v) not in live:
                live[id(v)] = [lo, hi, v.type.nbytes]
        for v in si.inputs:
            r = live.get(id(whole.get(id(v), v)))
            if r is not None:
                r[1] = max(r[1], hi)
        if si.workspace_bytes:
            work.append(LiveBuffer(("ws", k), si.workspace_bytes, lo, hi))
    buffers = [LiveBuffer(("v", key), size, lo, hi) for key, (lo, hi, size) in live.items()]
    plan = plan_offsets(buffers + work)
    values = {b.key[1]: plan.offsets[b.key] for b in buffers}
    calls = {b.key[1]: plan.offsets[b.key] for b in work}
    need = max((plan.offsets[b.key] + b.size for b in (*buffers, *work)), default=0)
    return values, calls, need


class KernelSet:
    """The distinct kernels of one artifact, by symbol, in first-use order."""

    def __init__(self, target: CpuTarget, cache: ObjectCache | None) -> None:
        self.target = target
        self.cache = cache
        self.entries: dict[str, KernelEntry] = {}
        """Kernels with object code of their own (stages of composites included)."""
        self.composites: dict[str, Composite] = {}
        self.called: dict[str, KernelInfo] = {}
        """What the entries call, by symbol: kernels and composites."""
        self.stats: dict[str, Any] = {"lower": 0.0}
        self._planned: dict[str, KernelInfo] = {}  # stages lowered to plan horizontal fusion

    def add(self, op: ComputeOp | KernelOp, schedule: Any) -> tuple[str, KernelInfo]:
        """The symbol of `op`'s kernel and its buffer layout for `op`'s own values. Raises
        ScheduleError when the schedule does not fit."""
        t0 = time.process_time()
        try:
            sym, info = self._add(op, schedule)
        finally:
            self.stats["lower"] += time.process_time() - t0
        self.called.setdefault(sym, self.composites[sym].info if sym in self.composites
                               else self.entries[sym].info)
        return sym, info

    def _add(self, op: ComputeOp | KernelOp, schedule: Any) -> tuple[str, KernelInfo]:
        resolved = resolve_schedule(op, schedule, self.target)
        key = kernel_key(op, resolved, self.target)
        sym = kernel_symbol(key)
        known = self.composites[sym].info if sym in self.composites else (
            self.entries[sym].info if sym in self.entries else None)
        if known is not None:
            if sym in self.entries:
                self.entries[sym].uses += 1
            _, outs, ins = group_of(op)
            return sym, dataclasses.replace(known, name=sym, outputs=tuple(outs),
                                            inputs=tuple(ins))
        planned = self._planned.pop(key, None)  # lowered for planning (maybe another op's)
        info = lower_kernel(op, resolved, name=sym, target=self.target) if planned is None else (
            KernelInfo(sym, planned.loops, *map(tuple, group_of(op)[1:])))  # checks the schedule
        if isinstance(op, KernelOp) and not op.attrs.get(horizontal.MEMBERS_ATTR) and len(
                group_stages(op, resolved)) > 1:
            from nfc.codegen.space import default_schedule

            calls: list[tuple[str, KernelInfo, ComputeOp | tuple[ComputeOp, ...]]] = []
            slices: list[tuple[int, int, BatchSlice]] = []
            # the stage's schedule made explicit: lowering the group ignores the stage's own
            # `nf.schedule`, and so must the stage kernel
            items = slice_plan(op, resolved, lambda st: default_schedule(st, self.target))
            for group in self._horizontal(op, items):
                if len(group) > 1:  # independent stages in one kernel (one nest)
                    sts = tuple(items[k][0] for k in group)  # type: ignore[index]
                    fused = horizontal.member_kernel(sts)
                    fsym, finfo = self._add(fused, GroupSchedule(
                        stages=tuple(items[k][1] for k in group)))  # type: ignore[index]
                    calls.append((fsym, KernelInfo(fsym, finfo.loops, tuple(
                        st.result for st in sts), finfo.inputs), sts))
                    continue
                item = items[group[0]]
                if isinstance(item, BatchSlice):  # one-image stages, called per batch element
                    slices.append((len(calls), len(item.stages), item))
                    for st, st_sched in item.stages:
                        ssym, sinfo = self._add(st, st_sched)
                        calls.append((ssym, sinfo, st))
                    continue
                st, st_sched = item
                ssym, sinfo = self._add(st, st_sched)
                calls.append((ssym, sinfo, st))
            comp = Composite(info, calls, slices)
            need = composite_layout(comp)[2]
            assert need <= info.workspace_bytes, (need, info.workspace_bytes)
            comp.info = info = CompositeInfo(sym, info.loops, info.outputs, info.inputs, need)
            self.composites[sym] = comp
            return sym, info
        self.entries[sym] = KernelEntry(
            key, op, None if resolved is None else resolved.to_dict(), info)
        return sym, info

    def _horizontal(self, op: KernelOp, items: list) -> list[list[int]]:
        """The group's stages (`slice_plan` items, by position) in the groups that share a
        nest, in the order they run (nfc.codegen.lowering.horizontal); one each when
        `NFC_HFUSE=0`."""
        if not horizontal.enabled() or len(items) < 2:
            return [[k] for k in range(len(items))]
        stages = [None if isinstance(it, BatchSlice) else it[0] for it in items]
        nests = [None if st is None else self._stage_loops(st, it[1]).body
                 for st, it in zip(stages, items, strict=True)]
        _, outs, ins = group_of(op)
        return horizontal.plan_groups(horizontal.stage_infos(stages, nests, outs, ins))

    def _stage_loops(self, st: ComputeOp, schedule: Any) -> Any:
        """The loop IR of stage `st`: its kernel's when known, else lowered now and kept for
        `_add` (which lowers it only if the stage is called alone)."""
        key = kernel_key(st, schedule, self.target)
        sym = kernel_symbol(key)
        if sym in self.entries:
            return self.entries[sym].info.loops
        if key not in self._planned:
            self._planned[key] = lower_kernel(st, schedule, name=sym, target=self.target)
        return self._planned[key].loops

    def define_composites(self, llmod: Any) -> None:
        """Define every composite as an internal function of `llmod` (declaring its stage
        kernels, which live in their own objects)."""
        for sym, comp in self.composites.items():
            _emit_composite(llmod, sym, comp)

    def module(self, symbol: str) -> Any:
        """A fresh llvmlite module defining the kernel `symbol` (hidden)."""
        entry = self.entries[symbol]
        module = new_module(symbol, self.target)
        emit_lowered(module, entry.info, target=self.target)
        hide(module, symbol)
        return module

    def _local(self, job: KernelJob) -> bytes:
        t0 = time.process_time()
        text = str(self.module(job.symbol))
        self.stats["emit"] = self.stats.get("emit", 0.0) + time.process_time() - t0
        obj, times = compile_text(text, self.target)
        for k, v in times.items():
            self.stats[k] = self.stats.get(k, 0.0) + v
        return obj

    def objects(self, processes: int, *, refresh: bool = False,
                before: Sequence[Callable[[], None]] = ()) -> list[bytes]:
        """Object code of every kernel, in symbol order: checked bytes from the object cache,
        else compiled now. `refresh` ignores (and overwrites) cached objects. `before` runs
        in this process once workers are started (the entry module's compilation overlaps
        theirs)."""
        from nfc.codegen.kernel_spec import kernel_spec

        hits: dict[str, bytes] = {}
        jobs: list[KernelJob] = []
        for sym, e in self.entries.items():
            obj = self.cache.get(e.key) if self.cache is not None and not refresh else None
            if obj is not None:
                hits[sym] = obj
            else:
                jobs.append(KernelJob(sym, kernel_spec(e.op)["ir"], e.schedule,
                                      loop_cost(e.info.loops.body)))
        if self.cache is not None:
            self.cache.report_damaged()
        compiled = compile_jobs(jobs, self._local, self.target, processes, self.stats,
                                before=before)
        if self.cache is not None:
            for job in jobs:
                self.cache.put(self.entries[job.symbol].key, compiled[job.symbol])
        self.stats.update(distinct=len(self.entries), cache_hits=len(hits),
                          cache_misses=len(jobs))
        return [hits[s] if s in hits else compiled[s] for s in self.entries]


def _emit_composite(llmod: Any, sym: str, comp: Composite) -> None:
    """`void sym(ptr buffers)`: the group's buffers as in `comp.info` (outputs, inputs, then
    the workspace); intermediates and the stages' own workspaces at the offsets of
    `composite_layout` (sharing bytes when their lifetimes do not overlap)."""
    from llvmlite import ir

    ptr_t, i8, i64 = ir.PointerType(), ir.IntType(8), ir.IntType(64)
    fn = llmod.globals.get(sym)
    if fn is None:
        fn = ir.Function(llmod, ir.FunctionType(ir.VoidType(), [ptr_t]), name=sym)
    fn.linkage = "internal"
    fn.attributes.add("nounwind")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    info = comp.info
    n_out, n_in = len(info.outputs), len(info.inputs)

    def param(k: int) -> ir.Value:
        return b.load(b.gep(fn.args[0], [ir.Constant(i64, k)], source_etype=ptr_t), typ=ptr_t)

    where: dict[int, ir.Value] = {}
    for k, v in enumerate([*info.outputs, *info.inputs]):
        if id(v) not in where:
            where[id(v)] = param(k)
    ws = param(n_out + n_in) if info.workspace_bytes else None
    whole: dict[int, Value] = {}  # a one-image value -> the batch tensor it is a slice of
    loop_of: dict[int, BatchSlice] = {}
    for first, count, bs in comp.slices:
        whole.update(bs.sliced)
        loop_of.update({first + j: bs for j in range(count)})
    offsets, call_ws, need = composite_layout(comp)
    assert need <= info.workspace_bytes, (need, info.workspace_bytes)
    for key, off in offsets.items():
        assert ws is not None
        where[key] = b.gep(ws, [ir.Constant(i64, off)], source_etype=i8)
    width = max(si.n_buffers for _, si, _ in comp.calls)
    arr = b.alloca(ir.ArrayType(ptr_t, width), name="buffers")
    arr.type = ptr_t  # llvmlite types allocas as typed pointers; the IR uses opaque `ptr`
    nb: ir.Value | None = None  # the batch element of the loop the calls are in
    loop = b.block
    for k, (ssym, si, _) in enumerate(comp.calls):
        bs = loop_of.get(k)
        if bs is not None and nb is None:  # open the loop over the batch
            head = b.block
            loop = fn.append_basic_block(f"slice{k}")
            b.branch(loop)
            b.position_at_end(loop)
            nb = b.phi(i64, name="nb")
            nb.add_incoming(ir.Constant(i64, 0), head)
        ptrs = []
        for v in [*si.outputs, *si.inputs]:
            if id(v) in whole:  # element nb of the batch tensor
                full = whole[id(v)]
                assert nb is not None
                step = b.mul(nb, ir.Constant(i64, full.type.nbytes // full.shape[0]))
                ptrs.append(b.gep(where[id(full)], [step], source_etype=i8))
            else:
                ptrs.append(where[id(v)])
        if si.workspace_bytes:
            assert ws is not None
            ptrs.append(b.gep(ws, [ir.Constant(i64, call_ws[k])], source_etype=i8))
        for j, p in enumerate(ptrs):
            b.store(p, b.gep(arr, [ir.Constant(i64, j)], source_etype=ptr_t))
        callee = llmod.globals.get(ssym)
        if callee is None:
            callee = ir.Function(llmod, ir.FunctionType(ir.VoidType(), [ptr_t]), name=ssym)
        b.call(callee, [arr])
        if nb is not None and loop_of.get(k + 1) is not bs:  # close the loop
            assert bs is not None
            nxt = b.add(nb, ir.Constant(i64, 1))
            nb.add_incoming(nxt, b.block)
            after = fn.append_basic_block(f"slice{k}.end")
            b.cbranch(b.icmp_unsigned("<", nxt, ir.Constant(i64, bs.extent)), loop, after)
            b.position_at_end(after)
            nb = None
    b.ret_void()
