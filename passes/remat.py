"""Rematerialisation: recompute cheap forward values in the backward pass instead of keeping
them alive across it (docs/memory.md).

A saved activation is a value a forward op produces and a backward or update op reads
(`nfc.passes.memplan.saved_activations`); it occupies the arena from the forward pass to its
last backward reader. When the op producing it is cheap (a compute with no reduction:
elementwise, broadcast, an im2col column gather), the pass clones that op just before the
first backward op that reads the value and makes the backward readers read the clone, so the
original dies with its last forward reader.

A recomputation can also lengthen the lives of the clone's own operands, so every candidate is
kept only if it lowers the function's arena lower bound (`memplan.lower_bound`, the most bytes
live at once). Candidates go largest first, until the bound is at most `budget` bytes
(`budget = 0`, the default: as low as recomputation gets it).

    nfc opt model.nf -p 'autodiff,remat{budget=1000000}'

Before:  %h = compute (max(%a[i], 0.0)) ... (forward)
         ... %dw = compute sum(...) (%h[...] * %g[...]) {nf.phase = "backward"}
After:   %h = compute (max(%a[i], 0.0)) ... (forward readers only)
         %h_r = compute (max(%a[i], 0.0)) {nf.phase = "backward", nf.remat = true}
         %dw = compute sum(...) (%h_r[...] * %g[...]) {nf.phase = "backward"}

The clone computes exactly what the original did (the same expression on the same operands),
so the results are bit for bit those without the pass. The pass runs on functions that have a
backward pass (`nf.phase`), before fusion.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from nfc.ir import ComputeOp, Func, Module, Op, ReturnOp, Value, loads
from nfc.passes.memplan import LATE_PHASES, function_buffers, lower_bound
from nfc.passmanager import Context, ModulePass


def _late(op: Op) -> bool:
    return op.attrs.get("nf.phase") in LATE_PHASES


def is_gather(op: ComputeOp) -> bool:
    """Whether the compute makes more elements than the biggest tensor it reads (an im2col
    column gather, a broadcast): recomputing it reads less than it writes."""
    sizes = [ld.tensor.type.size for ld in loads(op.body)]
    return op.result.type.size > max(sizes, default=0)


def candidates(func: Func, gathers: bool = True) -> list[Value]:
    """Saved activations produced by cheap computes (no reduction; with `gathers` False, no
    gather either), largest first (ties: program order). Returned values are excluded: they
    stay live to the end anyway."""
    returned = {id(v) for v in func.ret.values}
    out: list[tuple[int, int, Value]] = []
    for n, op in enumerate(func.body.ops):
        if (not isinstance(op, ComputeOp) or op.reduce is not None or _late(op)
                or op.attrs.get("nf.remat") or (not gathers and is_gather(op))):
            continue
        v = op.result
        if id(v) in returned:
            continue
        if any(_late(u) for u in v.uses):
            out.append((-v.type.nbytes, n, v))
    return [v for _, _, v in sorted(out, key=lambda t: (t[0], t[1]))]


def rematerialize(func: Func, value: Value) -> ComputeOp | None:
    """Clone `value`'s op before its first late reader and make the late readers read the
    clone; returns the clone (None when no late op reads `value`)."""
    op = value.owner
    assert isinstance(op, ComputeOp)
    ops = func.body.ops
    late = [u for u in value.uses if _late(u) and not isinstance(u, ReturnOp)]
    if not late:
        return None
    first = min(late, key=ops.index)
    clone = op.clone()
    assert isinstance(clone, ComputeOp)
    clone.attrs["nf.phase"] = "backward"
    clone.attrs["nf.remat"] = True
    if value.name:
        clone.result.name = f"{value.name}_r"
    func.body.insert_before(clone, first)
    chosen = set(map(id, late))
    value.replace_uses_with_if(clone.result, lambda u: id(u) in chosen)
    return clone


def remat_func(func: Func, budget: int = 0, gathers: bool = True) -> tuple[int, int, int]:
    """Rematerialise in `func` until its arena lower bound is at most `budget` bytes (or no
    candidate helps); `gathers` False leaves gathers (`is_gather`) saved. Returns (values
    recomputed, bound before, bound after)."""
    before = bound = lower_bound(function_buffers(func))
    done = 0
    if not any(_late(op) for op in func.body.ops):
        return 0, before, before
    for v in candidates(func, gathers):
        if bound <= budget:
            break
        clone = rematerialize(func, v)
        if clone is None:
            continue
        new = lower_bound(function_buffers(func))
        if new < bound:
            bound = new
            done += 1
            if not v.uses:  # every reader was late: the original is dead
                func.body.ops.remove(v.owner)
            continue
        # no gain: undo
        clone.result.replace_all_uses_with(v)
        func.body.ops.remove(clone)
    return done, before, bound


@dataclass(frozen=True)
class Remat(ModulePass):
    """Recompute cheap saved activations in the backward pass while that lowers the arena's
    lower bound, until it is at most `budget` bytes (0: as far as it goes); `gathers = false`
    recomputes no gather (im2col columns, broadcasts: see docs/memory.md). Records
    `nf.remat = {values = n, bound_before = b0, bound_after = b1}` on each changed function."""

    name: ClassVar[str] = "remat"
    budget: int = 0
    gathers: bool = True

    def apply(self, ctx: Context, module: Module) -> None:
        """Rematerialise in every function with a backward pass."""
        notes = []
        for f in module.funcs:
            if not f.body.ops:
                continue
            n, b0, b1 = remat_func(f, self.budget, self.gathers)
            if n:
                f.attrs["nf.remat"] = {"values": n, "bound_before": b0, "bound_after": b1}
                notes.append(f"@{f.name}: {n} values, {b0:,} -> {b1:,} bytes")
        ctx.remarks[self.name] = "; ".join(notes) or "nothing to recompute"
