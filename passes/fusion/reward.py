"""The optimistic cost of a kernel group, as the CPU backend would run it.

A group of computes becomes one kernel (nfc.codegen.lower with the default GroupSchedule):
every elementwise compute that is not a kernel output is inlined into the computes that read
it (`compute_inline`, recomputed at every read), every other compute is a *stage* with its
own loop nest, materialised in the kernel's workspace or written to an output. This module
mirrors that rule (passes may not import codegen) and prices a group with the device
parameters of `nfc.passes.fusion.device`:

- traffic T: every input read once, every output written once; an intermediate stage (or an
  output read back by a later stage) that fits the cache (`cache_kib`) costs nothing more,
  a bigger one is written and read back through DRAM, and a big input read by several
  stages is read by each of them;
- compute C: the FLOPs of every stage after inlining (nfc.cost rules), so an inlined
  producer read many times is paid many times (recomputation); transcendental functions in
  elementwise code run at `elementwise_gflops`, every other FLOP at `peak_gflops`;
- launches K: one kernel call, plus one parallel region per stage big enough for codegen to
  run it on threads (marked parallel by its schedule and not serialised by the emitter for
  too little work: `CostModel._parallel`).

`t(g) = T/P_d + C/P_c + launch + regions·region`, and the reward of a merge is
`t(a) + t(b) - t(a ∪ b) = ΔT/P_d + ΔC/P_c + ΔK·L`.

Two rules of codegen's decide whether a group may be formed at all: a GEMM-like compute must
stay GEMM-like after its producers are inlined (else it loses its micro-kernel and the
inlined producer is recomputed for every column), and inlined expressions stay small.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from nfc.contraction import match_contraction
from nfc.cost import compute_cost
from nfc.ir import (
    Binary,
    Call,
    ComputeOp,
    Expr,
    Load,
    Select,
    Value,
    loads,
    substitute_indices,
)
from nfc.passes.fusion.device import DeviceParams


@dataclass(frozen=True)
class GroupCost:
    """The priced group: traffic, FLOPs, launches, or why it cannot be one kernel."""

    bytes: float
    flops: float
    kernels: int
    regions: int
    illegal: str = ""
    """Non-empty when codegen should not compile the group as one kernel (the reason)."""
    elementwise_flops: float = 0.0
    """The part of `flops` that is transcendental functions (`exp`, `tanh`, ... each one
    FLOP by nfc.cost) in elementwise code (elementwise stages and inlined producers): a
    polynomial of about 20 instructions each, run at `elementwise_gflops`; the arithmetic
    around them runs at the peak like any other vectorised FLOP."""

    def seconds(self, dev: DeviceParams) -> float:
        """The optimistic run time on `dev`."""
        return dev.seconds(self.bytes, self.flops, self.kernels, self.regions,
                           self.elementwise_flops)


@dataclass(frozen=True)
class _Stage:
    """One stage of a group: why it is illegal, FLOPs, 1 if parallel, (id, bytes) of the
    values it reads, bytes of its result."""

    illegal: str
    flops: float
    elementwise_flops: float
    parallel: int
    reads: tuple[tuple[int, int], ...]
    nbytes: int


#: The cost of no group at all (a group emptied by recomputation).
EMPTY = GroupCost(0.0, 0.0, 0, 0)


def gemm_like(op: ComputeOp) -> bool:
    """Whether codegen runs `op` with its GEMM template (nfc.codegen.space.match_gemm): a
    contraction, `sum A[..] * B[..]` over plain loads of two distinct tensors whose runs of
    axes flatten into a batched GEMM (nfc.contraction)."""
    return match_contraction(op) is not None


def inline_into(producer: ComputeOp, body: Expr) -> Expr:
    """`body` with loads of `producer` replaced by its (elementwise) body."""
    names = [a.name for a in producer.dims]

    def fn(e: Expr) -> Expr | None:
        if isinstance(e, Load) and e.tensor is producer.result:
            return substitute_indices(producer.body, dict(zip(names, e.indices, strict=True)))
        return None
    return body.map(fn)


def _size(e: Expr) -> int:
    return sum(1 for _ in e.walk())


#: Deepest body a stage may have after inlining: code generators recurse over expressions
#: (about 160 levels overflow the stack of the LLVM renderer; the frontend keeps each compute at
#: most 64 deep, so long operator chains arrive as several computes that must not merge back).
MAX_DEPTH = 128


def _depth(e: Expr) -> int:
    """Depth of `e` (1 for a leaf), without recursion."""
    best, stack = 0, [(e, 1)]
    while stack:
        x, d = stack.pop()
        best = max(best, d)
        stack.extend((c, d + 1) for c in x.children())
    return best


class CostModel:
    """Prices groups of computes; memoises the FLOPs of inlined stages.

    `max_nodes` bounds the expression size of a stage after inlining.
    """

    def __init__(self, dev: DeviceParams, max_nodes: int = 2000) -> None:
        self.dev = dev
        self.max_nodes = max_nodes
        self._flops: dict[tuple[int, frozenset[int]], tuple[float, float]] = {}
        self._gemm: dict[int, bool] = {}
        self._gemm_kept: dict[tuple[int, frozenset[int]], bool] = {}
        self._ops: dict[int, tuple[list[Value], int, list[int]]] = {}
        self._weights: dict[int, dict[int, float]] = {}
        self._stages: dict[tuple[int, frozenset[int]], _Stage] = {}
        self._depths: dict[int, int] = {}

    def forget(self, op: ComputeOp) -> None:
        """Drop what is memoised about `op` (its body was rewritten)."""
        self._ops.pop(id(op), None)
        self._depths.pop(id(op), None)
        self._gemm.pop(id(op), None)
        self._weights.pop(id(op), None)
        for memo in (self._flops, self._gemm_kept, self._stages):
            for key in [k for k in memo if k[0] == id(op) or id(op) in k[1]]:
                del memo[key]

    def operands(self, op: ComputeOp) -> list[Value]:
        """`op.operands`, memoised (it walks the body)."""
        return self._info(op)[0]

    def _info(self, op: ComputeOp) -> tuple[list[Value], int, list[int]]:
        """(operands, body size, ids of the tensors of every load) of `op`, memoised."""
        got = self._ops.get(id(op))
        if got is None:
            got = self._ops[id(op)] = (op.operands, _size(op.body),
                                       [id(ld.tensor) for ld in loads(op.body)])
        return got

    def group(self, members: Sequence[ComputeOp], outputs: set[int]) -> GroupCost:
        """The cost of `members` (in program order) as one kernel; `outputs` holds ids of the
        member results the kernel must yield."""
        by_value = {id(op.results[0]): op for op in members}
        inlined = {id(op.results[0]) for op in members[:-1]
                   if op.reduce is None and id(op.results[0]) not in outputs}
        reads: dict[int, int] = {}
        nbytes: dict[int, int] = {}
        flops = slow = 0.0
        regions = 0
        traffic = 0.0
        cache = self.dev.cache_bytes
        # the inlined producers ending up in each compute, in one pass (members are in
        # program order, so a producer's set is known before its readers')
        closure: dict[int, frozenset[int]] = {}
        for op in members:
            acc: set[int] = set()
            for v in self._info(op)[0]:
                if id(v) in inlined:
                    acc.add(id(v))
                    acc |= closure[id(v)]
            closure[id(op.results[0])] = frozenset(acc)
        for st in members:
            rid = id(st.results[0])
            if rid in inlined:
                continue
            feeders = closure[rid]
            sc = self._stage(st, feeders, by_value)
            if sc.illegal:
                return GroupCost(0, 0, 0, 0, sc.illegal)
            flops += sc.flops
            slow += sc.elementwise_flops
            regions += sc.parallel
            for vid, b in sc.reads:
                reads[vid] = reads.get(vid, 0) + 1
                nbytes[vid] = b
            b = sc.nbytes
            if rid in outputs:
                traffic += b
            elif b > cache:
                traffic += b  # an intermediate spilled to DRAM (its reads are counted below)
        for vid, n in reads.items():
            b = nbytes[vid]
            if vid in by_value:  # a stage of this group read back by `n` later stages
                traffic += 0 if b <= cache else b * n
            else:  # an input of the kernel
                traffic += b if b <= cache else b * n
        return GroupCost(traffic, flops, 1, regions, "", slow)

    def _stage(self, st: ComputeOp, feeders: frozenset[int],
               by_value: Mapping[int, ComputeOp]) -> _Stage:
        """What stage `st` costs with the producers `feeders` inlined (memoised)."""
        key = (id(st), feeders)
        got = self._stages.get(key)
        if got is not None:
            return got
        illegal = ""
        if feeders and self._is_gemm(st) and not self._stays_gemm(st, feeders, by_value):
            illegal = f"an inlined producer would break the GEMM pattern of %{st.result.name}"
        elif feeders and self._size_with(st, by_value, set(feeders)) > self.max_nodes:
            illegal = f"the inlined body of %{st.result.name} would be too large"
        elif feeders and self._depth_with(st, by_value, set(feeders)) > MAX_DEPTH:
            illegal = f"the inlined body of %{st.result.name} would be too deep"
        reads: dict[int, int] = {}
        for op in (st, *(by_value[f] for f in feeders)):
            for v in self._info(op)[0]:
                if id(v) not in feeders:
                    reads[id(v)] = v.type.nbytes
        own, inl, slow = ((0.0, 0.0, 0.0) if illegal
                          else self._stage_flops(st, feeders, by_value))
        got = self._stages[key] = _Stage(
            illegal, own + inl, slow,
            0 if illegal else self._parallel(st, feeders, by_value),
            tuple(reads.items()), st.result.type.nbytes)
        return got

    def _parallel(self, st: ComputeOp, feeders: frozenset[int],
                  by_value: Mapping[int, ComputeOp]) -> int:
        """1 when codegen runs stage `st` as a parallel region: its schedule marks it parallel
        (iteration points, reductions included, of at least `parallel_work`) and the emitter
        keeps it parallel (estimated work of at least `parallel_min_work`: a store and its
        value's operations per point, per vector of `vector_lanes`; a loop below that runs
        serially, nfc.codegen.llvm.parallel)."""
        points = math.prod(a.extent for a in st.all_axes)
        if points < self.dev.parallel_work:
            return 0
        size = (self._size_with(st, by_value, set(feeders)) if feeders
                else self._info(st)[1])
        work = points * (1 + size) / max(1, self.dev.vector_lanes)
        return int(work >= self.dev.parallel_min_work)

    # -- helpers

    def _is_gemm(self, op: ComputeOp) -> bool:
        got = self._gemm.get(id(op))
        if got is None:
            got = self._gemm[id(op)] = gemm_like(op)
        return got

    def _stays_gemm(self, st: ComputeOp, feeders: frozenset[int],
                    by_value: Mapping[int, ComputeOp]) -> bool:
        key = (id(st), feeders)
        got = self._gemm_kept.get(key)
        if got is None:
            body = self._inlined_body(st, feeders, by_value)
            got = self._gemm_kept[key] = gemm_like(
                ComputeOp(st.result.type, st.dims, body, reduce=st.reduce, raxes=st.raxes))
        return got

    def _feeders(self, st: ComputeOp, by_value: Mapping[int, ComputeOp],
                 inlined: set[int]) -> frozenset[int]:
        """Ids of the inlined producers whose bodies end up in stage `st`."""
        out: set[int] = set()
        stack = [st]
        while stack:
            op = stack.pop()
            for v in self._info(op)[0]:
                if id(v) in inlined and id(v) not in out:
                    out.add(id(v))
                    stack.append(by_value[id(v)])
        return frozenset(out)

    def _size_with(self, st: ComputeOp, by_value: Mapping[int, ComputeOp],
                   inlined: set[int]) -> int:
        """Nodes of `st`'s body after inlining, counted without building it."""
        memo: dict[int, int] = {}

        def size(op: ComputeOp) -> int:
            if id(op) in memo:
                return memo[id(op)]
            _, n, tensors = self._info(op)
            for t in tensors:
                if t in inlined:
                    n = min(n + size(by_value[t]) - 1, 1 << 30)
            memo[id(op)] = n
            return n
        return size(st)

    def _depth_with(self, st: ComputeOp, by_value: Mapping[int, ComputeOp],
                    inlined: set[int]) -> int:
        """Depth of `st`'s body after inlining, at most (its own depth plus the deepest
        inlined producer's), counted without building it."""
        memo: dict[int, int] = {}

        def depth(op: ComputeOp) -> int:
            if id(op) not in memo:
                own = self._depths.get(id(op))
                if own is None:
                    own = self._depths[id(op)] = _depth(op.body)
                memo[id(op)] = own + max((depth(by_value[t]) for t in self._info(op)[2]
                                          if t in inlined), default=0)
            return memo[id(op)]
        return depth(st)

    def _inlined_body(self, st: ComputeOp, feeders: frozenset[int],
                      by_value: Mapping[int, ComputeOp]) -> Expr:
        body = st.body
        # substitute until no load of a feeder is left (feeders may read feeders)
        for _ in range(len(feeders) + 1):
            hit = [by_value[id(ld.tensor)] for ld in loads(body) if id(ld.tensor) in feeders]
            if not hit:
                break
            for prod in dict.fromkeys(hit):
                body = inline_into(prod, body)
        return body

    def _stage_flops(self, st: ComputeOp, feeders: frozenset[int],
                     by_value: Mapping[int, ComputeOp]) -> tuple[float, float, float]:
        """FLOPs of stage `st` with the producers `feeders` inlined: (its own, the inlined
        producers' at every evaluation, the transcendental part of both that runs in
        elementwise code: of `st`'s own only when it is elementwise).

        Composed instead of counted on the inlined expression (which can be large): every
        load of an inlined producer costs that producer's average FLOPs per point, at every
        point of the stage (`load_weights`)."""
        key = (id(st), feeders)
        got = self._flops.get(key)
        if got is not None:
            return got
        if not feeders:
            own = compute_cost(st).flops
            own_slow = own * transcendental_share(st.body) if st.reduce is None else 0.0
        else:
            own, _, own_slow = self._stage_flops(st, frozenset(), by_value)
        inl = slow = 0.0
        if feeders:
            points = math.prod(a.extent for a in st.all_axes)
            for tid, weight in self._load_weights(st).items():
                if tid in feeders:
                    prod = by_value[tid]
                    sub = self._feeders(prod, by_value, set(feeders))
                    p_own, p_inl, p_slow = self._stage_flops(prod, sub, by_value)
                    n = max(1, math.prod(a.extent for a in prod.dims))
                    inl += weight * points * (p_own + p_inl) / n
                    slow += weight * points * p_slow / n
        got = self._flops[key] = (own, inl, own_slow + slow)
        return got

    def _load_weights(self, op: ComputeOp) -> dict[int, float]:
        """id(tensor) -> expected evaluations of loads of it per point of `op`."""
        got = self._weights.get(id(op))
        if got is None:
            got = self._weights[id(op)] = load_weights(op)
        return got


#: Intrinsics the CPU backend evaluates as a polynomial or a library routine (about 20
#: instructions: `nfc.codegen.llvm.render`'s `_math` rules and `pow`), not one instruction.
TRANSCENDENTAL = frozenset({"exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "erf", "pow",
                            "softplus", "log1p", "expm1", "atan2"})
#: Intrinsics that are one or two vector instructions.
CHEAP_CALLS = frozenset({"max", "min", "abs", "isfinite"})


def transcendental_share(body: Expr) -> float:
    """The share of `body`'s float operations that are transcendental functions, counted on
    the expression (an unknown intrinsic counts as transcendental)."""
    slow = other = 0
    for e in body.walk():
        if isinstance(e, Call):
            if e.fn in CHEAP_CALLS:
                other += 1
            else:
                slow += 1
        elif isinstance(e, (Binary, Select)):
            other += 1
    return slow / (slow + other) if slow else 0.0


def load_weights(op: ComputeOp) -> dict[int, float]:
    """id(tensor) -> how many loads of it `op` evaluates per point of its iteration space.

    Every occurrence counts, under guards too: the CPU backend evaluates both sides of a
    `select` (as masked vector lanes or an LLVM select), so an inlined producer read in three
    guarded branches is computed three times at every point (unlike nfc.cost, which counts
    the FLOPs of guarded-out branches as skipped)."""
    out: dict[int, float] = {}
    for ld in loads(op.body):
        out[id(ld.tensor)] = out.get(id(ld.tensor), 0.0) + 1.0
    return out
