"""Rematerialisation: recompute forward values in the backward pass instead of keeping them
alive across it, as far as that lowers the step's memory or until it fits a budget
(docs/memory.md).

A saved activation is a value a forward op produces and a backward or update op reads
(`nfc.passes.memplan.saved_activations`); it occupies the arena from the forward pass to its
last backward reader. Recomputing it means cloning the op that produced it just before the
first backward op that reads it and making the backward readers read the clone, so the
original dies with its last forward reader.

Candidates are *cheap* computes first (no reduction: elementwise, broadcasts, im2col column
gathers; largest first), then, only when a budget asks for more or with `reductions = true`,
computes with a reduction (convolutions, matrix products), the fewest flops per byte saved
first. A clone reads the clones of its operands that already exist before it; a recomputed
reduction also recomputes its cheap operands that only the forward pass reads (two levels),
so recomputing a convolution does not keep its columns alive.

**Hoisting.** With `hoist` (the default), each backward op moves as early as its operands
allow when that lowers the arena's lower bound (`hoist_func`): a weight gradient that is the
last reader of the saved columns runs before the ops that make the columns' gradient, so the
two are never live together. Update ops stay where they are.

**Choosing.** A recomputation can lengthen the lives of the clone's own operands, so a greedy
walk over the candidates (on a hoisted copy of the function) keeps each one only if it lowers
the arena's lower bound (`memplan.lower_bound`, the most bytes live at once). That gives an
ordered list of recomputations. The pass then measures, with a *memory model*, the function as
it is and hoisted with prefixes of that list (all of them; every prefix when there are at
most 6; else also n/8, n/4, n/2 and 3n/4 of them when all is no better than none or misses
the budget) and applies the best: the fewest recomputations that meet the budget (bisecting
between the measured prefixes around the first that fits), or without a budget the smallest
arena (ties: the unchanged function, then fewer recomputations). The model is
`Context.memory_model` when the driver provides one: the build (nfc.runtime.build) gives the
arena of the final artifact (the rest of the pipeline, fusion and every kernel's workspace
included), so with the build the pass never makes the arena larger. Without it (`nfc opt`),
the IR level plan (`memplan.memory_report`, no workspaces) decides.

Budgets (all optional; `0` means none):
- `budget`: bytes of arena (`arena <= budget`);
- `peak`: bytes of the whole step (parameters, optimizer state, inputs, outputs and arena,
  `MemoryReport.total`: what `nfc compile --memory-budget` sets);
- `fraction`: the whole step's peak as a fraction of what it is without recomputation.
A budget no prefix meets is an error naming the smallest peak the pass can reach.

    nfc opt model.nf -p 'autodiff,remat{budget=1000000}'

Before:  %h = compute (max(%a[i], 0.0)) ... (forward)
         ... %dw = compute sum(...) (%h[...] * %g[...]) {nf.phase = "backward"}
After:   %h = compute (max(%a[i], 0.0)) ... (forward readers only)
         %h_r = compute (max(%a[i], 0.0)) {nf.phase = "backward", nf.remat = true}
         %dw = compute sum(...) (%h_r[...] * %g[...]) {nf.phase = "backward"}

The clone computes exactly what the original did (the same expression on the same operands),
so the interpreter's results are bit for bit those without the pass; compiled, a recomputed
reduction may be scheduled differently from the original (another fused group), which can
change its rounding. The pass runs on functions that have a backward pass (`nf.phase`), after
`cse` (which would merge the clones back) and before fusion.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from nfc.ir import ComputeOp, Func, Module, Op, ReturnOp, Value, loads
from nfc.passes.memplan import (
    LATE_PHASES,
    MemoryReport,
    fmt_bytes,
    function_buffers,
    lower_bound,
    memory_report,
)
from nfc.passmanager import Context, ModulePass

#: What the pass measures a candidate function with: its memory report (the function may be
#: changed by the model, which gets a copy).
MemoryModel = Callable[[Func], MemoryReport]


def _late(op: Op) -> bool:
    return op.attrs.get("nf.phase") in LATE_PHASES


def is_gather(op: ComputeOp) -> bool:
    """Whether the compute makes more elements than the biggest tensor it reads (an im2col
    column gather, a broadcast): recomputing it reads less than it writes."""
    sizes = [ld.tensor.type.size for ld in loads(op.body)]
    return op.result.type.size > max(sizes, default=0)


def recompute_flops(op: ComputeOp) -> float:
    """The flops of recomputing `op` once (nfc.cost)."""
    from nfc.cost import compute_cost

    return compute_cost(op).flops


def _saved(func: Func, op: Op) -> Value | None:
    """The result of `op` when it is a forward compute whose value a late op reads and the
    function does not return."""
    if not isinstance(op, ComputeOp) or _late(op) or op.attrs.get("nf.remat"):
        return None
    v = op.result
    if any(v is r for r in func.ret.values) or not any(_late(u) for u in v.uses):
        return None
    return v


def candidates(func: Func, gathers: bool = True, reductions: bool = False) -> list[Value]:
    """Saved activations worth recomputing, in the order the pass tries them: those of cheap
    computes (no reduction; with `gathers` False, no gather either), largest first (ties:
    program order); then with `reductions`, those of computes with a reduction, fewest flops
    per byte first. Returned values are excluded: they stay live to the end anyway."""
    cheap: list[tuple[int, int, Value]] = []
    heavy: list[tuple[float, int, Value]] = []
    for n, op in enumerate(func.body.ops):
        v = _saved(func, op)
        if v is None:
            continue
        assert isinstance(op, ComputeOp)
        if op.reduce is None:
            if gathers or not is_gather(op):
                cheap.append((-v.type.nbytes, n, v))
        elif reductions:
            heavy.append((recompute_flops(op) / max(v.type.nbytes, 1), n, v))
    return ([v for *_, v in sorted(cheap, key=lambda t: (t[0], t[1]))]
            + [v for *_, v in sorted(heavy, key=lambda t: (t[0], t[1]))])


def _cheap_forward(v: Value) -> ComputeOp | None:
    """The op of `v` when it is a forward compute with no reduction (a recomputation may clone
    it as a private operand)."""
    op = v.owner
    if isinstance(op, ComputeOp) and op.reduce is None and not _late(op):
        return op
    return None


#: A recomputed value -> the value it recomputes (`recomputed_from`).
_RECOMPUTES: weakref.WeakKeyDictionary[Value, Value] = weakref.WeakKeyDictionary()


def recomputed_from(v: Value) -> Value:
    """The value a clone made by this pass recomputes (through clones of clones); `v` itself
    when it is none: nfc.runtime.sum_orders schedules a recomputed float sum as the sum it
    recomputes is scheduled in the build without `remat`."""
    while v in _RECOMPUTES:
        v = _RECOMPUTES[v]
    return v


def _clone_before(func: Func, op: ComputeOp, first: Op, clones: dict[int, Value],
                  at: dict[int, int], depth: int) -> list[ComputeOp]:
    """Clones of `op` inserted before `first` (phase backward, `nf.remat`), the last one
    being `op`'s: operands with a clone placed before `first` are read from it; with `depth`
    left, operands made by a cheap forward compute that no late op reads are recomputed too
    (a private clone), so recomputing a convolution does not keep its columns alive."""
    mapping: dict[Value, Value] = {}
    out: list[ComputeOp] = []
    for v in op.operands:
        c = clones.get(id(v))
        if c is not None and c.owner is not None and at.get(id(c.owner), 1 << 62) < at[id(first)]:
            mapping[v] = c
            continue
        src = _cheap_forward(v)
        if depth and src is not None and not any(_late(u) for u in v.uses):
            sub = _clone_before(func, src, first, clones, at, depth - 1)
            out += sub
            mapping[v] = sub[-1].result
    clone = op.clone(mapping)
    assert isinstance(clone, ComputeOp)
    clone.attrs["nf.phase"] = "backward"
    clone.attrs["nf.remat"] = True
    _RECOMPUTES[clone.result] = op.result
    if op.result.name:
        clone.result.name = f"{op.result.name}_r"
    func.body.insert_before(clone, first)
    return [*out, clone]


def rematerialize(func: Func, value: Value, clones: dict[int, Value] | None = None,
                  depth: int = 0) -> list[ComputeOp]:
    """Clone `value`'s op before its first late reader and make the late readers read the
    clone; returns the ops inserted, the clone last (none when no late op reads `value`).
    `clones` maps id(original) to the clone of earlier recomputations: the new clone reads
    those of its operands that exist before it, and records itself there. With `depth`, cheap
    operands only the forward pass reads are recomputed as well (that many levels)."""
    op = value.owner
    assert isinstance(op, ComputeOp)
    ops = func.body.ops
    late = [u for u in value.uses if _late(u) and not isinstance(u, ReturnOp)]
    if not late:
        return []
    at = {id(o): n for n, o in enumerate(ops)}
    first = min(late, key=lambda u: at[id(u)])
    clones = {} if clones is None else clones
    new = _clone_before(func, op, first, clones, at, depth)
    chosen = set(map(id, late))
    value.replace_uses_with_if(new[-1].result, lambda u: id(u) in chosen)
    clones[id(value)] = new[-1].result
    return new


def _undo(func: Func, value: Value, new: list[ComputeOp], clones: dict[int, Value]) -> None:
    new[-1].result.replace_all_uses_with(value)
    for op in reversed(new):
        func.body.ops.remove(op)
    clones.pop(id(value), None)


#: Levels of cheap operands a recomputed reduction recomputes with it.
CHAIN_DEPTH = 2


def greedy_order(func: Func, budget: int = 0, gathers: bool = True,
                 reductions: bool = False) -> list[Value]:
    """Recompute in `func` (in place) each candidate that lowers the arena's lower bound, until
    the bound is at most `budget` bytes (0: as far as it goes); returns the recomputed values
    (the originals) in order."""
    bound = lower_bound(function_buffers(func))
    done: list[Value] = []
    clones: dict[int, Value] = {}
    for v in candidates(func, gathers, reductions):
        if budget and bound <= budget:
            break
        if v.owner is None or not any(_late(u) for u in v.uses):
            continue
        op = v.owner
        assert isinstance(op, ComputeOp)
        new_ops = rematerialize(func, v, clones, 0 if op.reduce is None else CHAIN_DEPTH)
        if not new_ops:
            continue
        new = lower_bound(function_buffers(func))
        if new < bound:
            bound = new
            done.append(v)
            continue
        _undo(func, v, new_ops, clones)
    return done


def apply_order(func: Func, values: Sequence[Value]) -> list[ComputeOp]:
    """Recompute `values` of `func` in this order (no checks); originals left without readers
    are removed. Returns the clones."""
    clones: dict[int, Value] = {}
    out = []
    for v in values:
        op = v.owner
        assert isinstance(op, ComputeOp)
        out += rematerialize(func, v, clones, 0 if op.reduce is None else CHAIN_DEPTH)
    for v in values:
        if not v.uses and v.owner is not None and v.owner in func.body.ops:
            func.body.ops.remove(v.owner)
    return out


def hoist_func(func: Func) -> int:
    """Move each backward op as early as its operands allow when that lowers the arena's
    lower bound (`memplan.lower_bound`), in program order; returns the ops moved. An op that
    is the last reader of big values (a weight gradient reading the saved columns) then runs
    before the ops that make new big values (the columns' gradient), instead of after. Ops
    stay after the forward pass; update ops stay where they are (moving one before another
    reader of its parameter would cost the in-place update)."""
    ops = func.body.ops
    late = [n for n, op in enumerate(ops) if _late(op)]
    if not late:
        return 0
    bound = lower_bound(function_buffers(func))
    moved = 0
    for op in [o for o in ops if o.attrs.get("nf.phase") == "backward"]:
        pos = {id(o): n for n, o in enumerate(ops)}
        start = min(n for n, o in enumerate(ops) if _late(o))
        p = pos[id(op)]
        earliest = max([start, *(pos[id(v.owner)] + 1 for v in op.operands
                                 if v.owner is not None and id(v.owner) in pos)])
        if earliest >= p or not any(
                all(pos.get(id(u), -1) <= p for u in v.uses) for v in op.operands):
            continue  # only the last reader of a value can lower the bound by moving up
        ops.pop(p)
        ops.insert(earliest, op)
        new = lower_bound(function_buffers(func))
        if new < bound:
            bound = new
            moved += 1
        else:
            ops.pop(earliest)
            ops.insert(p, op)
    return moved


def ir_model(func: Func) -> MemoryReport:
    """The IR level memory model: the plan of `memplan.memory_report` (no kernel
    workspaces)."""
    return memory_report(func)


def sample_points(n: int) -> list[int]:
    """The prefix lengths measured first: 0, n and n/8, n/4, n/2, 3n/4 (all when n <= 6)."""
    if n <= 6:
        return list(range(n + 1))
    return sorted({0, n, *(max(1, round(n * f)) for f in (0.125, 0.25, 0.5, 0.75))})


@dataclass
class RematResult:
    """What `remat_func` did: `values` recomputed (of `ordered` found by the greedy walk), the
    measured reports without (`before`) and with (`after`) them, the recompute flops, every
    measurement taken (`tried`: prefix length -> report) and, when a budget was given and
    nothing met it, `infeasible` (the budget, in bytes of the measured quantity)."""

    values: int
    ordered: int
    before: MemoryReport
    after: MemoryReport
    flops: float
    tried: dict[int, MemoryReport] = field(default_factory=dict)
    infeasible: int = 0
    measure: str = "arena"
    hoisted: bool = False
    """Whether backward ops were moved (`hoist_func`)."""


def _cost(func: Func, values: Sequence[Value]) -> float:
    return sum(recompute_flops(v.owner) for v in values if isinstance(v.owner, ComputeOp))


def transform(func: Func, values: Sequence[Value], hoist: bool = True) -> int:
    """What the pass does to `func` for a chosen prefix: hoist backward ops (`hoist_func`),
    recompute `values` (`apply_order`), hoist again (the clones open new chances). Returns
    the number of moves."""
    moved = hoist_func(func) if hoist else 0
    apply_order(func, values)
    return moved + (hoist_func(func) if hoist else 0)


def remat_func(func: Func, budget: int = 0, gathers: bool = True, *, peak: int = 0,
               fraction: float = 0.0, reductions: bool = False, hoist: bool = True,
               model: MemoryModel | None = None) -> RematResult:
    """Rematerialise in `func` (see the module doc): the greedy order on a copy, then the best
    prefix by `model` (default `ir_model`) under `budget` (arena bytes), `peak` (whole-step
    bytes) or `fraction` (of the whole-step peak without recomputation); with `hoist`, backward
    ops move earlier where that helps (`hoist_func`) before and after recomputing. The
    function as it is counts as a candidate, so the measured arena never grows. A budget
    that no prefix meets leaves `func` unchanged with `infeasible` set."""
    model = model or ir_model
    targeted = bool(peak or fraction)
    if not any(_late(op) for op in func.body.ops):
        rep = model(func.clone())
        return RematResult(0, 0, rep, rep, 0.0)
    mapping: dict[Value, Value] = {}
    copy = func.clone(mapping=mapping)
    back = {id(new): old for old, new in mapping.items()}
    if hoist:
        hoist_func(copy)
    chosen = greedy_order(copy, 0, gathers, reductions or targeted)
    order = [back[id(v)] for v in chosen]

    def measure(k: int) -> MemoryReport:
        m: dict[Value, Value] = {}
        trial = func.clone(mapping=m)
        if k >= 0:
            transform(trial, [m[v] for v in order[:k]], hoist)
        return model(trial)

    #: -1: the function as it is; k >= 0: hoisted with the first k recomputations
    tried: dict[int, MemoryReport] = {-1: measure(-1)}
    base = tried[-1]
    if fraction:
        peak = int(base.total * fraction)
    measure_of: Callable[[MemoryReport], int]
    if peak:
        limit, what = peak, "peak"
        measure_of = lambda r: r.total  # noqa: E731
    else:
        limit, what = budget, "arena"
        measure_of = lambda r: r.arena  # noqa: E731

    def get(k: int) -> MemoryReport:
        if k not in tried:
            tried[k] = measure(k)
        return tried[k]

    n = len(order)
    if not (limit and measure_of(base) <= limit):
        get(n)  # usually the best; the other prefixes when it is not (all of few)
        if n <= 6 or ((measure_of(tried[n]) > limit) if limit
                      else (tried[n].arena >= base.arena)):
            for k in sample_points(n):
                get(k if k or hoist else -1)
    if limit:
        if hoist and measure_of(base) > limit:
            get(0)
        fits = sorted(k for k, r in tried.items() if measure_of(r) <= limit)
        if not fits:
            return RematResult(0, n, base, base, 0.0, tried, limit, what)
        hi = fits[0]
        lo = max((k for k in tried if k < hi), default=-1)
        while hi - lo > 1:  # fewer recomputations that still fit (the measure need not be
            mid = (lo + hi) // 2  # monotone: this finds a first fit between two samples)
            if measure_of(get(mid)) <= limit:
                hi = mid
            else:
                lo = mid
        best = hi
    else:
        best = min(tried, key=lambda k: (tried[k].arena, k))
    moved = transform(func, order[:best], hoist) if best >= 0 else 0
    k = max(best, 0)
    return RematResult(k, n, base, tried[best], _cost(func, order[:k]), tried, 0, what,
                       hoisted=moved > 0)


@dataclass(frozen=True)
class Remat(ModulePass):
    """Recompute saved activations in the backward pass and move backward ops earlier while
    that lowers the step's memory, or until it fits a budget (see the module doc): `budget`
    bytes of arena, `peak` bytes of the whole step, or `fraction` of the step's peak without
    the pass (0: none: as low as it gets the arena). `gathers = false` recomputes no gather
    (im2col columns, broadcasts); `reductions = true` also tries computes with a reduction
    without a budget; `hoist = false` moves no op. Measures with `Context.memory_model` when
    the driver gives one (the final artifact's plan), else the IR level plan. Records
    `nf.remat = {values = n, hoisted = h, bound_before = b0, bound_after = b1, arena_before =
    a0, arena_after = a1, peak_before = p0, peak_after = p1, flops = f}` on each changed
    function (arena and peak as measured)."""

    name: ClassVar[str] = "remat"
    uses_memory_model: ClassVar[bool] = True
    budget: int = 0
    gathers: bool = True
    peak: int = 0
    fraction: float = 0.0
    reductions: bool = False
    hoist: bool = True

    def apply(self, ctx: Context, module: Module) -> None:
        """Rematerialise in every function with a backward pass."""
        if self.fraction < 0 or self.fraction > 1 or self.budget < 0 or self.peak < 0:
            ctx.error(f"remat: budgets must be positive and fraction within [0, 1] (got "
                      f"budget={self.budget}, peak={self.peak}, fraction={self.fraction})")
            return
        model = getattr(ctx, "memory_model", None)
        notes = []
        for f in module.funcs:
            if not f.body.ops or not any(_late(op) for op in f.body.ops):
                continue
            b0 = lower_bound(function_buffers(f))
            res = remat_func(f, self.budget, self.gathers, peak=self.peak,
                             fraction=self.fraction, reductions=self.reductions,
                             hoist=self.hoist, model=model)
            if res.infeasible:
                best = min(res.tried.values(), key=lambda r: (r.total, r.arena))
                ctx.error(
                    f"@{f.name}: memory budget of {res.infeasible:,} bytes "
                    f"({fmt_bytes(res.infeasible)}) of {res.measure} cannot be met: without "
                    f"recomputation the step needs {res.before.total:,} bytes (arena "
                    f"{res.before.arena:,}); the smallest feasible budget is "
                    f"{best.total:,} bytes ({fmt_bytes(best.total)}) of peak, arena "
                    f"{best.arena:,} bytes ({res.ordered} values can be recomputed)",
                    f.loc or f.body.ops[0].loc)
                continue
            if res.values or res.hoisted:
                b1 = lower_bound(function_buffers(f))
                f.attrs["nf.remat"] = {
                    "values": res.values, "hoisted": res.hoisted, "bound_before": b0,
                    "bound_after": b1, "arena_before": res.before.arena,
                    "arena_after": res.after.arena, "peak_before": res.before.total,
                    "peak_after": res.after.total, "flops": int(res.flops)}
                notes.append(f"@{f.name}: {res.values} values recomputed "
                             f"({math.ceil(res.flops):,} flops)"
                             + (", backward ops moved" if res.hoisted else "")
                             + f", arena {res.before.arena:,} -> {res.after.arena:,} bytes, "
                             f"peak {res.before.total:,} -> {res.after.total:,} bytes")
        ctx.remarks[self.name] = "; ".join(notes) or "nothing to recompute"


_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "k": 2**10, "kib": 2**10,
          "m": 2**20, "mib": 2**20, "g": 2**30, "gib": 2**30}


def parse_budget(text: str) -> tuple[int, float]:
    """A memory budget as `--memory-budget` spells it: bytes (`250000000`, `200MB`, `1.5GiB`;
    KB/MB/GB are powers of 10, K/M/G and KiB/MiB/GiB of 2) or a percentage of the step's
    peak without recomputation (`50%`). Returns (bytes, fraction), one of them 0; raises
    ValueError with the reason."""
    t = text.strip().lower().replace(" ", "").replace("_", "")
    if t.endswith("%"):
        try:
            pct = float(t[:-1])
        except ValueError:
            raise ValueError(f"'{text}' is not a percentage") from None
        if not 0 < pct <= 100:
            raise ValueError(f"'{text}': a percentage must be in (0, 100]")
        return 0, pct / 100
    n = len(t)
    while n and t[n - 1].isalpha():
        n -= 1
    unit = _UNITS.get(t[n:])
    try:
        value = float(t[:n])
    except ValueError:
        value = -1.0
    if unit is None or value <= 0 or not math.isfinite(value):
        raise ValueError(f"'{text}' is not a memory budget (bytes, e.g. 200MB, 1.5GiB, or a "
                         "percentage of the peak, e.g. 50%)")
    return max(1, int(value * unit)), 0.0


def with_memory_budget(pipeline: str, budget: str) -> str:
    """`pipeline` with `remat{peak=...}` (or `{fraction=...}`) for `--memory-budget`: the
    budget set on the pipeline's `remat` when it has one, else a `remat` inserted before
    `apply-tuning` (before `fuse` without it, last without either). Raises ValueError for a
    bad budget."""
    import dataclasses

    from nfc.passmanager import build_pipeline, format_pipeline

    peak, fraction = parse_budget(budget)
    passes = build_pipeline(pipeline) if pipeline else []
    names = [p.name for p in passes]
    if Remat.name in names:
        at = names.index(Remat.name)
        passes[at] = dataclasses.replace(passes[at], peak=peak, fraction=fraction, budget=0)
        return format_pipeline(passes)
    at = next((names.index(n) for n in ("apply-tuning", "fuse") if n in names), len(passes))
    passes.insert(at, Remat(peak=peak, fraction=fraction))
    return format_pipeline(passes)
