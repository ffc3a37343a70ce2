"""Horizontal fusion: independent stages of a kernel share one loop nest.

A group of several stages (an `nf.kernel` of the fuse pass) lowers to one nest per stage. Stages
with no dependence between them (the batch-norm backward's sums `sum(dy)` and `sum(dy*xhat)`
per channel, sibling parameter updates) each opened their own parallel region and re-read
their shared inputs. Here such stages are grouped (`plan_groups`) and their nests fused level
by level (`fuse_nests`):

- A stage joins the group of an earlier one when its outermost loop has the same kind
  (serial or parallel) and constant extent, and it is independent of every stage from the
  group's first one up to itself: neither reads nor writes what the other writes (it then moves
  up to the group's position, past independent stages only). A stage whose result is a kernel
  output may be written in place over an input of the same type when every other stage
  reading that input comes before it (nfc.codegen.artifact.plan, `inplace_ok`), so it counts
  as writing every such input for the stages before it. The members' loop bodies together
  stay within `MAX_FUSED_COST` (instruction cache), and fused parallel loops start no
  parallel region where the members ran serially (`_no_new_region`).
- The fused loop runs the members' bodies in order in each iteration; below it, levels where
  every member's body is again one serial loop of equal constant extent are fused too. Fusion
  stops above vectorized and unrolled loops and at accumulators (`Allocate`s): each stage keeps
  its own iterations, its own order and its own sums, so the results are bit for bit those of
  the stages one after another, and a parallel loop's chunks stay the same iterations.

`lower` (nfc.codegen.lower) fuses the nests of a group; the artifact, which compiles a group
stage by stage (nfc.codegen.artifact.kernels), compiles each planned group of stages as one
kernel (`member_kernel`). `NFC_HFUSE=0` switches it off (part of the kernel key through
`kcache.target_text`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from nfc.codegen.loops import Allocate, For, LoopKind, Seq, Stmt, map_stmt, stmt_cost
from nfc.ir import Block, ComputeOp, Index, KernelOp, Value, YieldOp

__all__ = ["MEMBERS_ATTR", "StageInfo", "enabled", "fuse_nests", "fuse_stmts", "member_kernel",
           "outer_key", "plan_groups", "stage_infos"]

#: Attribute of a kernel made of the stages of one planned group (`member_kernel`): they were
#: checked independent where the outputs' aliasing is known, so its own outputs (all of them
#: intermediates or results of the enclosing group) need not be treated as in place.
MEMBERS_ATTR = "nf.hfuse_members"
#: Loop kinds whose loops are fused.
FUSIBLE = (LoopKind.SERIAL, LoopKind.PARALLEL)
#: Most code (`stmt_cost`, about one instruction per unit) in one fused loop body: every
#: iteration runs all the members' bodies, so beyond the instruction cache they evict each
#: other (30 per-step embedding gradients of the LSTM language model fused into one body of
#: 17,000 units ran 8% slower than one after another; batch-norm sums, 100-500 units each).
MAX_FUSED_COST = 2000


def enabled() -> bool:
    """Whether horizontal fusion runs (default) or not (`NFC_HFUSE=0`, for comparisons)."""
    return os.environ.get("NFC_HFUSE", "1").strip().lower() not in ("0", "off", "no", "false")


@dataclass(frozen=True)
class StageInfo:
    """What planning needs of a stage: the values it reads and (may) write, by id, and its
    loop nest (None: never fused, nothing moves past it)."""

    reads: frozenset[int]
    writes: frozenset[int]
    nest: Stmt | None
    over: frozenset[int] = frozenset()
    """Inputs its result may be written over (in place)."""


def stage_infos(stages: Sequence[ComputeOp | None], nests: Sequence[Stmt | None],
                outputs: Sequence[Value], inputs: Sequence[Value], *,
                inplace: bool = True) -> list[StageInfo]:
    """`StageInfo`s of a group's stages (None: a stage that is not one compute, e.g. a batch
    slice: a barrier). `inplace`: a stage yielding an output may write it over an input of the
    same type."""
    out_ids = {id(v) for v in outputs}
    out: list[StageInfo] = []
    for st, nest in zip(stages, nests, strict=True):
        if st is None:
            out.append(StageInfo(frozenset(), frozenset(), None))
            continue
        over = frozenset(id(v) for v in inputs if v.type == st.result.type) if (
            inplace and id(st.result) in out_ids) else frozenset()
        out.append(StageInfo(frozenset(id(v) for v in st.operands), frozenset({id(st.result)}),
                             nest, over))
    return out


def _peel(s: Stmt) -> tuple[list[Allocate], Stmt]:
    """The allocations around a nest (outermost first) and the nest inside them."""
    allocs: list[Allocate] = []
    while isinstance(s, Allocate):
        allocs.append(s)
        s = s.body
    return allocs, s


def outer_key(nest: Stmt | None) -> tuple[LoopKind, int] | None:
    """(kind, extent) of a nest's outermost loop when it may be fused, else None."""
    if nest is None:
        return None
    _, s = _peel(nest)
    if isinstance(s, For) and s.kind in FUSIBLE and s.const_extent is not None:
        return s.kind, s.const_extent
    return None


def _independent(a: StageInfo, b: StageInfo) -> bool:
    """Whether `b` may run with (or before) `a`, which comes before it."""
    if a.nest is None or b.nest is None:
        return False
    # an output is written over an input only when every other stage reading that input
    # comes before it (`inplace_ok`): `b`'s may be, `a`'s not when `b` reads the input
    return not (a.writes & (b.reads | b.writes)) and not ((b.writes | b.over) & a.reads)


def plan_groups(infos: Sequence[StageInfo]) -> list[list[int]]:
    """The stages (by position) in groups, in the order the groups run: each group's stages
    share one nest (module doc). Every stage that moves up is independent of each stage it
    moves past."""
    groups: list[list[int]] = []
    keys: list[tuple[LoopKind, int] | None] = []
    costs: list[float] = [_cost(i.nest) for i in infos]
    works: dict[int, int] = {}
    for b, info in enumerate(infos):
        key = outer_key(info.nest)
        for g, members in enumerate(groups):
            if key is not None and keys[g] == key and sum(
                    costs[j] for j in members) + costs[b] <= MAX_FUSED_COST and (
                    key[0] is not LoopKind.PARALLEL or _no_new_region(
                        [*members, b], infos, works)) and all(
                    _independent(infos[j], info) for j in range(members[0], b)):
                members.append(b)
                break
        else:
            groups.append([b])
            keys.append(key)
    return groups


def _no_new_region(members: list[int], infos: Sequence[StageInfo], works: dict[int, int]
                   ) -> bool:
    """Whether parallel loops fused make no region where none was: the emitter runs a
    parallel loop below `PARALLEL_MIN_WORK` serially (nfc.codegen.llvm.parallel), so fusing
    small ones could start a team of threads for work that ran on one; measured on a
    loaded machine that cost more than the regions fusion saves. Work as the emitter
    estimates it, with 16 lanes."""
    from nfc.codegen.llvm.parallel import PARALLEL_MIN_WORK, parallel_work

    for k in members:
        if k not in works:
            _, s = _peel(infos[k].nest)  # type: ignore[arg-type]
            assert isinstance(s, For) and s.const_extent is not None
            c = s.const_extent
            works[k] = c * parallel_work(s.body, {s.var: (0, max(c - 1, 0))}, 16)
    ws = [works[k] for k in members]
    return sum(ws) < PARALLEL_MIN_WORK or max(ws) >= PARALLEL_MIN_WORK


def _cost(nest: Stmt | None) -> float:
    """The code size of a nest's outermost loop body (`stmt_cost`), 0 when not fusible."""
    if outer_key(nest) is None:
        return 0.0
    _, s = _peel(nest)  # type: ignore[arg-type]
    assert isinstance(s, For)
    return stmt_cost(s.body)


def _loop_vars(s: Stmt) -> set[str]:
    return {x.var for x in s.walk() if isinstance(x, For)}


def fuse_nests(nests: Sequence[Stmt]) -> Stmt:
    """One nest running `nests` (whose outermost loops have equal `outer_key`s) in one loop,
    level by level as deep as every body is one fusible loop of the same extent (module
    doc)."""
    if len(nests) == 1:
        return nests[0]
    allocs: list[Allocate] = []
    loops: list[For] = []
    for n in nests:
        a, s = _peel(n)
        assert isinstance(s, For)
        allocs += a
        loops.append(s)
    body = _fuse_loops(loops)
    for a in reversed(allocs):
        body = Allocate(a.buffer, body)
    return body


def _fuse_loops(loops: list[For]) -> Stmt:
    inner = set().union(*(_loop_vars(x.body) for x in loops))
    var = loops[0].var
    n = 1
    while var in inner:
        var, n = f"{loops[0].var}_h{n}", n + 1
    bodies = [x.body if x.var == var else map_stmt(x.body, {x.var: Index(var)}) for x in loops]
    first = bodies[0]
    if all(isinstance(b, For) and b.kind is LoopKind.SERIAL and b.const_extent is not None
           and b.const_extent == first.const_extent for b in bodies):
        body = _fuse_loops(bodies)  # type: ignore[arg-type]
    else:
        flat: list[Stmt] = []
        for b in bodies:
            flat += b.body if isinstance(b, Seq) else [b]
        body = Seq(tuple(flat))
    return For(var, loops[0].extent, loops[0].kind, body)


def fuse_stmts(stmts: Sequence[Stmt], infos: Sequence[StageInfo]) -> list[Stmt]:
    """The statements of a group's stages with each planned group fused into one nest."""
    return [fuse_nests([stmts[k] for k in g]) for g in plan_groups(infos)]


def member_kernel(stages: Sequence[ComputeOp]) -> KernelOp:
    """A kernel of independent stages (copies reading the same outer values) yielding their
    results in order, marked as one planned group (`MEMBERS_ATTR`)."""
    mapping: dict[Value, Value] = {}
    ops = [st.clone(mapping) for st in stages]
    body = Block([*ops, YieldOp([o.results[0] for o in ops])])
    return KernelOp(body, attrs={MEMBERS_ATTR: True},
                    names=[st.result.name for st in stages])
