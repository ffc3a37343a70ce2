"""Static memory planning: liveness of a function's tensors and offsets in one arena.

A step of a model runs its ops in order; every intermediate tensor lives from the op that
writes it to the last op that reads it. Two tensors whose live ranges overlap must not share
memory; two that do not may. `plan_offsets` packs buffers into one arena with the
"greedy by size" heuristic (largest buffer first, each at the lowest offset that does not
collide with an already placed buffer live at the same time), which TFLite and MNN use for the
same job: it is never worse than giving every buffer its own memory (`naive`), and for the
chains of a training step it usually reuses most of it.

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
from typing import ClassVar

from nfc.ir import Func, Module, Op, ReturnOp, Value
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


def plan_offsets(buffers: Sequence[LiveBuffer], align: int = ALIGN) -> MemoryPlan:
    """Place `buffers` in one arena so that no two buffers live at the same time overlap.

    Greedy by size: biggest first (ties: earlier start first, then input order, so the plan
    is deterministic), each at the lowest aligned offset whose byte range collides with no
    placed buffer of an overlapping live range.
    """
    keys = [b.key for b in buffers]
    if len(set(keys)) != len(keys):
        raise ValueError("buffer keys must be unique")
    order = sorted(range(len(buffers)),
                   key=lambda n: (-buffers[n].size, buffers[n].start, n))
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
    naive = sum(round_up(max(b.size, 1), align) for b in buffers)
    return MemoryPlan(offsets, peak, naive)


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


def function_plan(func: Func) -> MemoryPlan:
    """The arena plan of every op result that the function does not return."""
    returned = {id(v) for v in func.ret.values}
    values = [r for op in func.body.ops if not isinstance(op, ReturnOp)
              for r in op.results if id(r) not in returned]
    return plan_offsets(liveness(func, values))


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
