"""Static memory planning: liveness of a function's tensors and offsets in one arena.

A step of a model runs its ops in order; every intermediate tensor lives from the op that
writes it to the last op that reads it. Two tensors whose live ranges overlap must not share
memory; two that do not may. `plan_offsets` packs buffers into one arena by greedy first fit
(each buffer at the lowest offset that does not collide with an already placed buffer live at
the same time) in several orders, keeping the best: "greedy by size" (largest first, which
TFLite and MNN use for the same job), by size times lifetime, by lifetime and in program
order. It is never worse than giving every buffer its own memory (`naive`) nor than greedy by
size alone, and never better than `lower_bound` (the most bytes live at once); on the
examples' training steps it is within 5% of that bound (docs/memory.md).

`memory_report` says where a step's bytes live at its peak: arguments by role, outputs, the
arena and its lower bound, workspaces, and saved activations (forward values the backward pass
reads) by call site: `nfc stats --memory` and the `memory:` line of `nfc compile`.

The analysis knows nothing about code generation: the artifact builder (nfc.codegen.artifact)
decides which values live in the arena (not arguments, not caller-provided outputs) and adds
the scratch workspace of each kernel as a buffer live during that kernel only.

The pass `memplan` records the plan's numbers on each function as an attribute
`nf.memory = {arena = <peak bytes>, naive = <sum of sizes>, buffers = <count>}`, with every
op result that is not returned counted as an arena buffer.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from nfc.ir import Func, KernelOp, Module, Op, ReturnOp, Value
from nfc.passmanager import Context, ModulePass

#: Every buffer starts at a multiple of this many bytes (a cache line; the widest vector).
ALIGN = 64


def round_up(x: int, m: int = ALIGN) -> int:
    """`x` rounded up to a multiple of `m`."""
    return (x + m - 1) // m * m


@dataclass(frozen=True)
class LiveBuffer:
    """A buffer of `size` bytes live from op position `start` to `end` (both inclusive)."""

    key: Hashable
    size: int
    start: int
    end: int

    def overlaps(self, other: LiveBuffer) -> bool:
        """Whether the two live ranges share an op position."""
        return self.start <= other.end and other.start <= self.end


@dataclass(frozen=True)
class MemoryPlan:
    """Offsets of buffers in one arena."""

    offsets: dict[Hashable, int]
    """Byte offset of each buffer, by key; every offset is a multiple of ALIGN."""
    peak: int
    """Bytes of arena the plan needs."""
    naive: int
    """Bytes needed with no reuse at all: the sum of the (aligned) buffer sizes."""


def _greedy(buffers: Sequence[LiveBuffer], order: Sequence[int], align: int
            ) -> tuple[dict[Hashable, int], int]:
    """Place the buffers in `order`, each at the lowest aligned offset whose byte range
    collides with no placed buffer of an overlapping live range (first fit)."""
    placed: list[tuple[int, int, LiveBuffer]] = []  # (offset, aligned size, buffer)
    offsets: dict[Hashable, int] = {}
    peak = 0
    for n in order:
        b = buffers[n]
        size = round_up(max(b.size, 1), align)
        busy = sorted((off, off + sz) for off, sz, o in placed if o.overlaps(b))
        offset = 0
        for lo, hi in busy:
            if offset + size <= lo:
                break
            offset = max(offset, round_up(hi, align))
        placed.append((offset, size, b))
        offsets[b.key] = offset
        peak = max(peak, offset + size)
    return offsets, peak


#: The orders `plan_offsets` tries, by name: the first is the historical one.
STRATEGIES: dict[str, Any] = {
    # TFLite's / MNN's "greedy by size": biggest first
    "size": lambda b, n: (-b.size, b.start, n),
    # "greedy by breadth": the buffers holding the most byte-steps first
    "area": lambda b, n: (-round_up(max(b.size, 1)) * (b.end - b.start + 1), b.start, n),
    # the longest lived first (saved activations), then by size: long-lived buffers end up
    # at the bottom and the short backward temporaries stack above them
    "lifetime": lambda b, n: (-(b.end - b.start), -b.size, b.start, n),
    # in program order, biggest first among those starting together
    "start": lambda b, n: (b.start, -b.size, n),
}


def plan_offsets(buffers: Sequence[LiveBuffer], align: int = ALIGN,
                 strategies: Sequence[str] | None = None) -> MemoryPlan:
    """Place `buffers` in one arena so that no two buffers live at the same time overlap.

    Greedy first fit in several orders (`STRATEGIES`: by size, the historical "greedy by
    size" of TFLite and MNN; by size times lifetime; by lifetime; in program order), keeping
    the smallest arena (ties: the earlier strategy). Every order yields a valid plan, so the
    result is never larger than greedy by size alone, and the plan is deterministic. Stops
    early when a plan reaches the lower bound (`lower_bound`).
    """
    keys = [b.key for b in buffers]
    if len(set(keys)) != len(keys):
        raise ValueError("buffer keys must be unique")
    bound = lower_bound(buffers, align)
    best: tuple[dict[Hashable, int], int] | None = None
    for name in strategies or STRATEGIES:
        key = STRATEGIES[name]
        order = sorted(range(len(buffers)), key=lambda n: key(buffers[n], n))
        offsets, peak = _greedy(buffers, order, align)
        if best is None or peak < best[1]:
            best = (offsets, peak)
        if best[1] <= bound:
            break
    assert best is not None
    naive = sum(round_up(max(b.size, 1), align) for b in buffers)
    return MemoryPlan(best[0], best[1], naive)


def lower_bound(buffers: Sequence[LiveBuffer], align: int = ALIGN) -> int:
    """The most (aligned) bytes live at one op position: no plan can use less arena."""
    events: dict[int, int] = {}
    for b in buffers:
        size = round_up(max(b.size, 1), align)
        events[b.start] = events.get(b.start, 0) + size
        events[b.end + 1] = events.get(b.end + 1, 0) - size
    live = peak = 0
    for t in sorted(events):
        live += events[t]
        peak = max(peak, live)
    return peak


def check_plan(buffers: Sequence[LiveBuffer], plan: MemoryPlan) -> None:
    """Assert that no two buffers live at the same time share a byte and all fit the peak."""
    spans = [(b, plan.offsets[b.key], plan.offsets[b.key] + max(b.size, 1)) for b in buffers]
    for b, lo, hi in spans:
        assert lo >= 0 and hi <= plan.peak, (b, lo, hi, plan.peak)
    for i, (a, alo, ahi) in enumerate(spans):
        for b, blo, bhi in spans[i + 1:]:
            if a.overlaps(b):
                assert ahi <= blo or bhi <= alo, f"{a} and {b} alias"


def op_positions(func: Func) -> dict[int, int]:
    """id(value) -> position of the top-level op that defines it (arguments: -1)."""
    pos: dict[int, int] = {id(a): -1 for a in func.args}
    for n, op in enumerate(func.body.ops):
        for r in op.results:
            pos[id(r)] = n
    return pos


def last_uses(func: Func) -> dict[int, int]:
    """id(value) -> position of the last top-level op reading it (the return op included:
    it sits at position len(ops) - 1). Values nobody reads are absent."""
    last: dict[int, int] = {}
    for n, op in enumerate(func.body.ops):
        for v in op.operands:
            last[id(v)] = n
    return last


def liveness(func: Func, values: Sequence[Value] | None = None) -> list[LiveBuffer]:
    """Live buffers of op results (default: every result of every top-level op other than
    the return), keyed by the Value, sized by its type. A value nobody reads lives only
    while its op runs."""
    pos = op_positions(func)
    last = last_uses(func)
    if values is None:
        values = [r for op in func.body.ops if not isinstance(op, ReturnOp) for r in op.results]
    out = []
    for v in values:
        start = pos[id(v)]
        out.append(LiveBuffer(v, v.type.nbytes, start, max(start, last.get(id(v), start))))
    return out


def function_buffers(func: Func) -> list[LiveBuffer]:
    """The live buffers of every op result that the function does not return (what the IR
    level arena holds; the artifact adds kernel workspaces and staging buffers)."""
    returned = {id(v) for v in func.ret.values}
    values = [r for op in func.body.ops if not isinstance(op, ReturnOp)
              for r in op.results if id(r) not in returned]
    return liveness(func, values)


def function_plan(func: Func) -> MemoryPlan:
    """The arena plan of every op result that the function does not return."""
    return plan_offsets(function_buffers(func))


#: Phases of the ops of a training step that run after the forward pass.
LATE_PHASES = frozenset({"backward", "update"})


def op_site(op: Op) -> str:
    """Where an op comes from in the user's model: its `nf.callsite` (the op call in the
    model file), else its location, else `?`."""
    site = op.attrs.get("nf.callsite")
    if site:
        return str(site)
    if op.loc is not None:
        return str(op.loc)
    return "?"


@dataclass(frozen=True)
class MemoryReport:
    """Where the bytes of one step of a function live at its peak (see docs/memory.md).

    `params`, `opt_state`, `state`, `inputs` are the caller's argument buffers by role;
    `outputs` the caller's buffers of results not updated in place; `arena` the planned
    scratch arena, `lower_bound` the most bytes its buffers ever hold at once; `workspace`
    the most kernel-workspace bytes live at once (inside the arena); `saved` the saved
    activations (forward values read by the backward pass or the update) by call site, which
    live in the arena (or are returned) across the whole backward pass.
    """

    func: str
    params: int
    opt_state: int
    state: int
    inputs: int
    outputs: int
    arena: int
    lower_bound: int
    naive: int
    workspace: int
    saved: dict[str, int]

    @property
    def saved_total(self) -> int:
        """Bytes of all saved activations."""
        return sum(self.saved.values())

    @property
    def total(self) -> int:
        """Every byte the step touches: arguments, outputs and the arena."""
        return (self.params + self.opt_state + self.state + self.inputs + self.outputs
                + self.arena)

    @property
    def gap(self) -> float:
        """arena / lower bound (1.0: the plan is optimal)."""
        return self.arena / self.lower_bound if self.lower_bound else 1.0

    def summary(self) -> str:
        """One line: total, arena against its lower bound, the biggest parts."""
        return (f"peak {fmt_bytes(self.total)}: arena {fmt_bytes(self.arena)} (lower bound "
                f"{fmt_bytes(self.lower_bound)}, {self.gap:.2f}x), params "
                f"{fmt_bytes(self.params)}, optimizer state {fmt_bytes(self.opt_state)}, "
                f"saved activations {fmt_bytes(self.saved_total)}")

    def lines(self, top: int = 12) -> list[str]:
        """The table of `nfc stats --memory`."""
        rows = [("parameters", self.params), ("optimizer state", self.opt_state),
                ("state", self.state), ("inputs", self.inputs), ("outputs", self.outputs),
                ("arena", self.arena)]
        out = [f"@{self.func} memory"]
        out += [f"  {name:<28} {n:>14,} B  {fmt_bytes(n):>10}" for name, n in rows]
        out.append(f"  {'total':<28} {self.total:>14,} B  {fmt_bytes(self.total):>10}")
        out.append(f"  arena lower bound {self.lower_bound:,} B (gap {self.gap:.2f}x), "
                   f"without reuse {self.naive:,} B, workspace {self.workspace:,} B")
        if self.saved:
            out.append(f"  saved activations {self.saved_total:,} B "
                       f"({fmt_bytes(self.saved_total)}) by call site:")
            ranked = sorted(self.saved.items(), key=lambda kv: (-kv[1], kv[0]))
            for site, n in ranked[:top]:
                out.append(f"    {n:>14,} B  {site}")
            if len(ranked) > top:
                rest = sum(n for _, n in ranked[top:])
                out.append(f"    {rest:>14,} B  ({len(ranked) - top} more sites)")
        return out


def fmt_bytes(n: float) -> str:
    """`n` bytes with a binary unit: `1.50 MiB`."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"


def _producers(op: Op) -> list[Op]:
    """The op that computes each result of `op`: itself, or for a fused kernel the inner op
    whose value the kernel yields."""
    if isinstance(op, KernelOp):
        term = op.body.ops[-1]
        return [v.owner if isinstance(v.owner, Op) else op for v in term.operands]
    return [op] * len(op.results)


def _late_reads(op: Op) -> set[int]:
    """ids of the outer values a backward or update op reads (for a fused kernel: that its
    backward or update computes read)."""
    if isinstance(op, KernelOp):
        inner = [o for o in op.body.ops[:-1]]
        own = {id(r) for o in inner for r in o.results}
        return {id(v) for o in inner if o.attrs.get("nf.phase") in LATE_PHASES
                for v in o.operands if id(v) not in own}
    if op.attrs.get("nf.phase") in LATE_PHASES:
        return {id(v) for v in op.operands}
    return set()


def saved_activations(func: Func) -> dict[str, int]:
    """Bytes of the values forward ops produce and backward or update ops read, by the call
    site of the producing op (`op_site`; inside a fused kernel, the inner compute's). Empty
    for a function with no backward pass."""
    late_readers: set[int] = set()
    for op in func.body.ops:
        late_readers |= _late_reads(op)
    out: dict[str, int] = {}
    for op in func.body.ops:
        if isinstance(op, ReturnOp):
            continue
        for r, src in zip(op.results, _producers(op), strict=True):
            if id(r) in late_readers and src.attrs.get("nf.phase") not in LATE_PHASES:
                site = op_site(src)
                out[site] = out.get(site, 0) + r.type.nbytes
    return out


def memory_report(func: Func, buffers: Sequence[LiveBuffer] | None = None,
                  plan: MemoryPlan | None = None, inplace: Sequence[int] = ()
                  ) -> MemoryReport:
    """The memory report of `func`. `buffers` and `plan` are the arena's (default: the IR
    level plan, `function_buffers`); workspace buffers are those keyed `("ws", ...)`.
    `inplace`: indices of results written into an argument's buffer (no output buffer)."""
    if buffers is None:
        buffers = function_buffers(func)
    if plan is None:
        plan = plan_offsets(buffers)
    by_role: dict[str, int] = {}
    for a, attrs in zip(func.args, func.arg_attrs, strict=True):
        role = str(attrs.get("nf.role", "input"))
        by_role[role] = by_role.get(role, 0) + a.type.nbytes
    if not inplace:
        marks = func.attrs.get("nf.inplace") or {}
        inplace = [int(k) for k in marks]
    outputs = sum(v.type.nbytes for n, v in enumerate(func.ret.values) if n not in set(inplace))
    ws = [b for b in buffers if isinstance(b.key, tuple) and b.key and b.key[0] == "ws"]
    return MemoryReport(
        func=func.name, params=by_role.get("param", 0), opt_state=by_role.get("opt_state", 0),
        state=by_role.get("state", 0),
        inputs=sum(n for r, n in by_role.items() if r not in ("param", "opt_state", "state")),
        outputs=outputs, arena=plan.peak, lower_bound=lower_bound(buffers), naive=plan.naive,
        workspace=lower_bound(ws), saved=saved_activations(func))


def top_level_ops(func: Func) -> list[Op]:
    """The ops a step runs, in order (the return excluded)."""
    return [op for op in func.body.ops if not isinstance(op, ReturnOp)]


@dataclass(frozen=True)
class MemPlan(ModulePass):
    """Record each function's static memory plan as `nf.memory` (an analysis: the IR is
    otherwise unchanged).

    Before:  nf.func @f(...) { %a = ...; %b = ...(%a); %c = ...(%b); nf.return %c }
    After:   nf.func @f(...) attributes {nf.memory = {arena = 2048, buffers = 2,
             naive = 4096}} { ... }   (%a and %b are never live together: one slot)
    """

    name: ClassVar[str] = "memplan"

    def apply(self, ctx: Context, module: Module) -> None:
        """Annotate every function."""
        for f in module.funcs:
            if not f.body.ops:
                continue
            plan = function_plan(f)
            f.attrs["nf.memory"] = {"arena": plan.peak, "buffers": len(plan.offsets),
                                    "naive": plan.naive}
