"""Greedy reward-based partitioning of a function's computes into kernel groups.

Every top-level compute starts as its own group (NeoFlow's partition: one op per subgraph);
calls and existing `nf.kernel`s are fixed groups that are never merged. Candidates:

- **merge** two groups joined by an edge (producer → consumer: GEMM epilogues, elementwise
  chains, reductions of elementwise producers) or, with `siblings`, two groups reading the
  same input that fits the cache (the input is read once);
- **recompute** an elementwise compute P of group A inside a consumer group G instead of
  reading it (training-aware: a forward value the backward reads is yielded by its kernel by
  default; this candidate recomputes it in the backward kernel instead, and wins only when
  the reward says recomputing beats writing and reading it back).

Each candidate's reward is `t(before) - t(after)` with the optimistic group costs of
`nfc.passes.fusion.reward` (`ΔT/P_d + ΔC/P_c + ΔK·L`). Candidates with a positive reward go into
a heap; the best is taken if it is still current and legal, the groups it touched get new
candidates, until none is left. Legality: the merged group must be convex in the DAG (no
path leaves it and comes back, so the quotient graph stays acyclic), it must satisfy the
codegen rules (`CostModel.group`), and it has at most `max_ops` computes.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

import networkx as nx

from nfc.ir import ComputeOp, Func, Op, ReturnOp
from nfc.passes.fusion.accumulate import ACCUMULATE_ATTR
from nfc.passes.fusion.reward import EMPTY, CostModel, GroupCost
from nfc.passes.memplan import LATE_PHASES

#: The consumer id standing for the function's `nf.return`.
RETURN = -1


def _sums(members: list[Op]) -> set[str]:
    """The running sums (`nf.accumulate`, nfc.passes.fusion.accumulate) `members` add to."""
    return {str(op.attrs[ACCUMULATE_ATTR]) for op in members
            if isinstance(op, ComputeOp) and ACCUMULATE_ATTR in op.attrs}


@dataclass
class Group:
    """A set of computes that will be one kernel, with the reward that formed it."""

    gid: int
    members: list[Op]
    fixed: bool = False
    """A call or an existing kernel: never merged."""
    version: int = 0
    reward: float = 0.0
    """Seconds saved by the steps that formed this group (estimated)."""
    saved: dict[str, float] = field(default_factory=lambda: {
        "bytes": 0.0, "flops": 0.0, "kernels": 0.0, "regions": 0.0})
    recomputed: int = 0


@dataclass(frozen=True)
class Options:
    """Knobs of the greedy search (the pass's options)."""

    siblings: bool = True
    recompute: bool = True
    max_ops: int = 32
    min_reward: float = 0.0
    """Smallest reward (seconds) a step must have to be taken."""
    explain: bool = False
    """Record every candidate step and what became of it in `Partitioner.decisions`."""
    veto: int = -1
    """Number (`Decision.index`) of a step to reject although it would be taken, and with it
    every later step that would put its two sides in one kernel (-1: none)."""
    force: int = -1
    """Number of a rejected merge or recompute to take first anyway, if still legal."""


@dataclass(frozen=True)
class Decision:
    """One candidate step of the search and its fate (`fuse{explain=true}`)."""

    verdict: str
    """`take`, `reject` (R <= min reward) or `skip` (no longer convex, or a recompute that
    would have to run after an in-place update, when its turn came); `veto` (a step the
    `veto` option rejected) or `force` (a rejected step the `force` option queued first)."""
    kind: str
    """`merge` or `recompute`."""
    members: tuple[Op, ...]
    """The computes of the groups involved (for a recompute: the producer first)."""
    reward: float
    """R in seconds: the estimated time before minus after."""
    saved: dict[str, float]
    """ΔT (`bytes`), ΔC (`flops`), ΔK (`kernels`, `regions`) saved by the step."""
    index: int = 0
    """The step's number in the search (0, 1, ...): what `veto`/`force` refer to."""


class Partitioner:
    """The greedy search over one function (see the module docstring)."""

    def __init__(self, func: Func, model: CostModel, opts: Options, first_step: int = 0
                 ) -> None:
        self.func = func
        self.model = model
        self.opts = opts
        self.groups: dict[int, Group] = {}
        self.group_of: dict[int, int] = {}  # id(op) -> gid
        self.pos: dict[int, tuple[int, int]] = {}  # id(op) -> program-order key
        self.ops: dict[int, Op] = {}
        self.users: dict[int, set[int]] = {}  # id(value) -> ids of consumer ops (RETURN)
        self.producer: dict[int, Op] = {}
        self._gids = itertools.count()
        self._seq = itertools.count()
        self._costs: dict[tuple[frozenset[int], frozenset[int]], GroupCost] = {}
        self._outs: dict[tuple[int, int], frozenset[int]] = {}
        self.decisions: list[Decision] = []
        self.next_step = first_step
        """The number of the next step (steps are numbered across the functions of a module:
        `first_step` is where the previous function's search stopped)."""
        self._apart: list[tuple[frozenset[int], frozenset[int]]] = []  # vetoed (see _vetoed)
        for n, op in enumerate(func.body.ops):
            if isinstance(op, ReturnOp):
                for v in op.operands:
                    self.users.setdefault(id(v), set()).add(RETURN)
                continue
            self._add_op(op, (n, 0))
            gid = next(self._gids)
            self.groups[gid] = Group(gid, [op], fixed=not isinstance(op, ComputeOp))
            self.group_of[id(op)] = gid
        self.after = self._inplace_order()
        self._rebuild_graph()

    def _inplace_order(self) -> list[tuple[int, int]]:
        """(reader, writer) op ids: a result the function returns in place of an argument
        (`nf.inplace`, the optimizer's updates) is written into that argument's buffer, so
        its producer must stay after every other reader of the argument."""
        inplace = self.func.attrs.get("nf.inplace")
        if not isinstance(inplace, dict):
            return []
        ops = [op for op in self.func.body.ops if not isinstance(op, ReturnOp)]
        data = nx.DiGraph()
        data.add_nodes_from(id(op) for op in ops)
        for op in ops:
            for v in op.operands:
                if id(v) in self.producer:
                    data.add_edge(id(self.producer[id(v)]), id(op))
        names = {a.name: a for a in self.func.args}
        out = []
        for index, name in inplace.items():
            try:
                value = self.func.ret.values[int(index)]
            except (ValueError, IndexError):
                continue
            writer, arg = self.producer.get(id(value)), names.get(str(name))
            if writer is None or arg is None:
                continue
            later = nx.descendants(data, id(writer))
            out += [(r, id(writer)) for r in self.users.get(id(arg), ())
                    if r != RETURN and r != id(writer) and r not in later]
        return out

    # -- the graph

    def _add_op(self, op: Op, pos: tuple[int, int]) -> None:
        self.ops[id(op)] = op
        self.pos[id(op)] = pos
        for r in op.results:
            self.producer[id(r)] = op
            self.users.setdefault(id(r), set())
        for v in op.operands:
            self.users.setdefault(id(v), set()).add(id(op))

    def _rebuild_graph(self) -> None:
        """The quotient graph from scratch: an edge between groups for every value one
        produces and the other reads, and for every in-place ordering (`self.after`)."""
        succ: dict[int, set[int]] = {gid: set() for gid in self.groups}
        pred: dict[int, set[int]] = {gid: set() for gid in self.groups}
        pairs = [(id(self.producer[vid]), u) for vid, users in self.users.items()
                 if vid in self.producer for u in users if u != RETURN]
        for x, y in pairs + self.after:  # ordering only along `after`: no data flows
            if x in self.group_of and y in self.group_of:
                a, b = self.group_of[x], self.group_of[y]
                if a != b:
                    succ[a].add(b)
                    pred[b].add(a)
        self.succ, self.pred = succ, pred
        self._topo: dict[int, int] | None = None

    def _contract(self, a: int, b: int, g: int) -> None:
        """Replace groups a and b by g in the quotient graph (a convex merge: no cycle)."""
        succ = (self.succ.pop(a) | self.succ.pop(b)) - {a, b}
        pred = (self.pred.pop(a) | self.pred.pop(b)) - {a, b}
        for x in succ:
            self.pred[x] -= {a, b}
            self.pred[x].add(g)
        for x in pred:
            self.succ[x] -= {a, b}
            self.succ[x].add(g)
        self.succ[g], self.pred[g] = succ, pred
        self._topo = None

    @property
    def topo(self) -> dict[int, int]:
        """A topological numbering of the quotient graph (recomputed after a change)."""
        if self._topo is None:
            indeg = {g: len(p) for g, p in self.pred.items()}
            ready = deque(g for g, d in indeg.items() if d == 0)
            order: dict[int, int] = {}
            while ready:
                x = ready.popleft()
                order[x] = len(order)
                for y in self.succ[x]:
                    indeg[y] -= 1
                    if indeg[y] == 0:
                        ready.append(y)
            assert len(order) == len(self.succ), "the quotient graph has a cycle"
            self._topo = order
        return self._topo

    def _reaches(self, src: int, dst: int, skip_direct: bool) -> bool:
        """Whether a path src ⇝ dst exists (of length ≥ 2 when `skip_direct`)."""
        topo = self.topo
        limit = topo[dst]
        starts = [s for s in self.succ[src] if not (skip_direct and s == dst)]
        seen = set(starts)
        stack = [s for s in starts if topo[s] <= limit]
        while stack:
            x = stack.pop()
            if x == dst:
                return True
            for s in self.succ[x]:
                if s not in seen and topo[s] <= limit:
                    seen.add(s)
                    stack.append(s)
        return False

    def convex_merge(self, a: int, b: int) -> bool:
        """Whether merging groups a and b keeps the quotient graph acyclic."""
        return not (self._reaches(a, b, True) or self._reaches(b, a, True))

    # -- costs

    def _first(self, gid: int) -> tuple[int, int]:
        """Program position of group gid's first op."""
        return min(self.pos[id(op)] for op in self.groups[gid].members)

    def _sorted(self, ops: list[Op]) -> list[Op]:
        return sorted(ops, key=lambda op: self.pos[id(op)])

    def outputs_of(self, members: list[Op], users: dict[int, set[int]] | None = None
                 ) -> frozenset[int]:
        """Ids of member results read outside `members` (or by nobody: kept, dce's job)."""
        inside = {id(op) for op in members}
        out = set()
        for op in members:
            for r in op.results:
                us = (users or {}).get(id(r), self.users[id(r)])
                if not us or any(u == RETURN or u not in inside for u in us):
                    out.add(id(r))
        return frozenset(out)

    def cost(self, members: list[Op], outputs: frozenset[int]) -> GroupCost:
        """The (memoised) cost of `members` as one kernel."""
        if not members:
            return EMPTY
        key = (frozenset(id(op) for op in members), outputs)
        got = self._costs.get(key)
        if got is None:
            cops = [op for op in members if isinstance(op, ComputeOp)]
            assert len(cops) == len(members)
            got = self._costs[key] = self.model.group(cops, set(outputs))
        return got

    def group_outputs(self, g: Group) -> frozenset[int]:
        """`outputs_of(g.members)`, memoised per group version."""
        key = (g.gid, g.version)
        got = self._outs.get(key)
        if got is None:
            got = self._outs[key] = self.outputs_of(g.members)
        return got

    def group_cost(self, g: Group) -> GroupCost:
        """The current cost of group g."""
        return self.cost(g.members, self.group_outputs(g))

    # -- candidates

    def _merge_candidate(self, a: int, b: int) -> tuple[float, dict[str, float]] | None:
        ga, gb = self.groups[a], self.groups[b]
        if ga.fixed or gb.fixed or len(ga.members) + len(gb.members) > self.opts.max_ops:
            return None
        if _sums(ga.members) & _sums(gb.members):
            return None  # two steps of one running sum (nfc.passes.fusion.accumulate)
        merged = self._sorted(ga.members + gb.members)
        # only a value one of them yields can be yielded by the union
        inside = {id(op) for op in merged}
        outs = frozenset(
            vid for vid in self.group_outputs(ga) | self.group_outputs(gb)
            if not self.users[vid] or any(u == RETURN or u not in inside
                                          for u in self.users[vid]))
        after = self.cost(merged, outs)
        if after.illegal:
            return None
        return self._delta([self.group_cost(ga), self.group_cost(gb)], [after])

    def _delta(self, before: list[GroupCost], after: list[GroupCost]
               ) -> tuple[float, dict[str, float]]:
        dev = self.model.dev
        reward = sum(c.seconds(dev) for c in before) - sum(c.seconds(dev) for c in after)
        saved = {k: float(sum(getattr(c, k) for c in before) - sum(getattr(c, k) for c in after))
                 for k in ("bytes", "flops", "kernels", "regions")}
        return reward, saved

    def _recompute_plan(self, p: ComputeOp, g: int
                        ) -> tuple[list[Op], dict[int, set[int]], list[Op]]:
        """(A's members after, hypothetical users, G's members after) for recomputing p in g."""
        a = self.group_of[id(p)]
        gg = self.groups[g]
        inside = {id(op) for op in gg.members}
        users = {id(p.result): {u for u in self.users[id(p.result)] if u not in inside}}
        for v in self.model.operands(p):
            # the copy in g reads p's operands; a stand-in consumer id that is outside A
            users[id(v)] = self.users[id(v)] | {id(gg.members[0])}
        a_after = [op for op in self.groups[a].members
                   if op is not p or users[id(p.result)]]
        return a_after, users, self._sorted([*gg.members, p])

    def _recompute_candidate(self, p: ComputeOp, g: int
                             ) -> tuple[float, dict[str, float]] | None:
        a = self.group_of[id(p)]
        ga, gg = self.groups[a], self.groups[g]
        if (a == g or gg.fixed or p.reduce is not None
                or len(gg.members) + 1 > self.opts.max_ops or _sums([p]) & _sums(gg.members)):
            return None
        inside = {id(op) for op in gg.members}
        if any(u == RETURN or (u not in inside and self.group_of.get(u) != a)
               for u in self.users[id(p.result)]):
            # p stays yielded for another kernel: the copy saves g's read of p at best, and
            # pays for reading p's operands that g does not read yet
            read = {id(v) for op in gg.members for v in self.model.operands(op)}
            new = sum(v.type.nbytes for v in self.model.operands(p) if id(v) not in read)
            if new >= p.result.type.nbytes:
                return None
        a_after, users, g_after = self._recompute_plan(p, g)
        # in g the copy is private: its uses are g's own, so it is never an output
        g_out = self.group_outputs(gg) - {id(p.result)}
        after_g = self.cost(g_after, g_out)
        if after_g.illegal:
            return None
        after_a = self.cost(a_after, self.outputs_of(a_after, users)) if a_after else EMPTY
        if after_a.illegal:
            return None
        return self._delta([self.group_cost(ga), self.group_cost(gg)], [after_a, after_g])

    def _candidates_of(self, gid: int) -> Iterator[tuple[str, tuple]]:
        for kind, args in self._all_candidates_of(gid):
            if kind == "merge" and self._undoes_remat(*args):
                continue
            yield kind, args

    def _undoes_remat(self, a: int, b: int) -> bool:
        """Whether merging groups a and b puts a recomputation (`nf.remat`, made by the remat
        pass for the backward) into a forward kernel: the value would be live from the
        forward on again, which is what recomputing it was to avoid."""
        ga, gb = self.groups.get(a), self.groups.get(b)
        if ga is None or gb is None:
            return False
        return (_has_remat(ga) and _has_forward(gb)) or (_has_remat(gb) and _has_forward(ga))

    def _all_candidates_of(self, gid: int) -> Iterator[tuple[str, tuple]]:
        g = self.groups[gid]
        if g.fixed:
            return
        for p in sorted(self.pred[gid]):
            yield "merge", (p, gid)
        for s in sorted(self.succ[gid]):
            yield "merge", (gid, s)
        if self.opts.siblings:
            for v in {id(v): v for op in g.members for v in self.model.operands(op)}.values():
                if id(v) in self.producer and self.group_of[id(self.producer[id(v)])] == gid:
                    continue
                if v.type.nbytes > self.model.dev.cache_bytes:
                    continue
                # the nearest other readers of v in program order, before and after g (a
                # weight read by every step of an unrolled RNN would otherwise pair all)
                readers = sorted({self.group_of[u] for u in self.users[id(v)] if u != RETURN},
                                 key=lambda x: self._first(x))
                at = readers.index(gid)
                for other in readers[max(0, at - 1):at] + readers[at + 1:at + 2]:
                    yield "merge", tuple(sorted((gid, other)))
        if self.opts.recompute:
            inside = {id(op) for op in g.members}
            for op in g.members:
                # members of g recomputed in their consumers elsewhere
                if isinstance(op, ComputeOp) and op.reduce is None:
                    for u in self.users[id(op.result)]:
                        if u != RETURN and u not in inside and not self.groups[
                                self.group_of[u]].fixed:
                            yield "recompute", (op, self.group_of[u])
                # producers elsewhere recomputed in g
                for v in self.model.operands(op):
                    prod = self.producer.get(id(v))
                    if (isinstance(prod, ComputeOp) and prod.reduce is None
                            and id(prod) not in inside):
                        yield "recompute", (prod, gid)

    def _push(self, heap: list, gids: list[int], pushed: set) -> None:
        for gid in gids:
            if gid not in self.groups:
                continue
            for kind, args in self._candidates_of(gid):
                if kind == "merge":
                    a, b = args
                    if a == b:
                        continue
                    key = ("merge", a, b, self.groups[a].version, self.groups[b].version)
                    involved = (a, b)
                else:
                    p, g = args
                    a = self.group_of[id(p)]
                    key = ("recompute", id(p), a, g, self.groups[a].version,
                           self.groups[g].version)
                    involved = (a, g)
                if key in pushed:
                    continue
                pushed.add(key)
                got = (self._merge_candidate(*args) if kind == "merge"
                       else self._recompute_candidate(*args))
                if got is None:
                    continue
                priority = -got[0]
                if got[0] <= self.opts.min_reward:
                    forced = self.next_step == self.opts.force
                    self._explain("force" if forced else "reject", kind, args, got[0], got[1])
                    if not forced:
                        continue
                    priority = -math.inf  # taken next, before every positive step
                versions = tuple(self.groups[x].version for x in involved)
                heapq.heappush(heap, (priority, next(self._seq), kind, args, involved,
                                      versions, got[1], got[0]))

    # -- the search

    def run(self) -> None:
        """Take the best positive candidate until none is left."""
        heap: list = []
        pushed: set = set()
        self._push(heap, list(self.groups), pushed)
        while heap:
            _, _, kind, args, involved, versions, saved, reward = heapq.heappop(heap)
            if any(x not in self.groups for x in involved) or versions != tuple(
                    self.groups[x].version for x in involved):
                continue
            if kind == "merge":
                a, b = args
                if not self.convex_merge(a, b):
                    self._explain("skip", kind, args, reward, saved)
                    continue
                if self._vetoed(kind, args, reward, saved):
                    continue
                touched = [self._merge(a, b, reward, saved)]
                self._contract(a, b, touched[0])
            else:
                p, g = args
                if self.group_of.get(id(p)) != involved[0] or any(
                        r == id(p) and self._reaches(self.group_of[w], g, False)
                        for r, w in self.after):
                    if self.group_of.get(id(p)) is not None:
                        self._explain("skip", kind, args, reward, saved)
                    continue  # gone, or the copy would have to run after an in-place update
                if self._vetoed(kind, args, reward, saved):
                    continue
                touched = self._recompute(p, g, reward, saved)
                self._rebuild_graph()
            # every candidate involving a group is found from that group, and candidates of
            # untouched groups keep their rewards (a group's cost depends on it alone)
            self._push(heap, touched, pushed)

    def _vetoed(self, kind: str, args: tuple, reward: float, saved: dict[str, float]) -> bool:
        """Record a step about to be taken: False to take it, True when `veto` names it or
        it would put together computes a vetoed step would have (a vetoed merge is not
        brought about by another route, such as moving the producer into the consumer)."""
        if kind == "merge":
            x, y = (frozenset(id(op) for op in self.groups[g].members) for g in args)
        else:
            p, g = args
            x, y = frozenset((id(p),)), frozenset(id(op) for op in self.groups[g].members)
        vetoed = self.next_step == self.opts.veto
        if vetoed:
            self._apart.append((x, y))
        vetoed = vetoed or any((x & a and y & b) or (x & b and y & a) for a, b in self._apart)
        self._explain("veto" if vetoed else "take", kind, args, reward, saved)
        return vetoed

    def _explain(self, verdict: str, kind: str, args: tuple, reward: float,
                 saved: dict[str, float]) -> None:
        index = self.next_step
        self.next_step += 1
        if not self.opts.explain:
            return
        if kind == "merge":
            members = tuple(op for gid in args for op in self.groups[gid].members)
        else:
            p, g = args
            members = (p, *self.groups[g].members)
        self.decisions.append(Decision(verdict, kind, members, reward, dict(saved), index))

    def _merge(self, a: int, b: int, reward: float, saved: dict[str, float]) -> int:
        ga, gb = self.groups.pop(a), self.groups.pop(b)
        gid = next(self._gids)
        g = Group(gid, self._sorted(ga.members + gb.members),
                  reward=ga.reward + gb.reward + reward,
                  saved={k: ga.saved[k] + gb.saved[k] + saved[k] for k in saved},
                  recomputed=ga.recomputed + gb.recomputed)
        self.groups[gid] = g
        for op in g.members:
            self.group_of[id(op)] = gid
        return gid

    def _recompute(self, p: ComputeOp, g: int, reward: float, saved: dict[str, float]
                   ) -> list[int]:
        """Apply a recompute step: g gets a copy of p; when g held p's last readers, p itself
        moves into g instead (nothing is computed twice)."""
        a = self.group_of[id(p)]
        ga, gg = self.groups[a], self.groups[g]
        inside = {id(op) for op in gg.members}
        gg.version += 1
        ga.version += 1
        gg.reward += reward
        for key in saved:
            gg.saved[key] += saved[key]
        if self.users[id(p.result)] <= inside:  # a move
            ga.members = [op for op in ga.members if op is not p]
            gg.members = self._sorted([*gg.members, p])
            self.group_of[id(p)] = g
            if not ga.members:
                del self.groups[a]
            return [a, g]
        clone = p.clone()
        clone.attrs["nf.recompute"] = True
        readers = [op for op in gg.members if id(op) in self.users[id(p.result)]]
        for op in readers:
            op.replace_uses({p.result: clone.result})
            assert isinstance(op, ComputeOp)
            self.model.forget(op)
        self.users[id(p.result)] -= inside
        n, k = self.pos[id(p)]
        self._add_op(clone, (n, k + 1 + next(self._seq)))
        self.users[id(clone.result)] = {id(op) for op in readers}
        self.after += [(id(clone), w) for r, w in self.after if r == id(p)]
        gg.members = self._sorted([*gg.members, clone])
        self.group_of[id(clone)] = g
        gg.recomputed += 1
        return [a, g]

    # -- the result

    def ordered_groups(self) -> list[Group]:
        """Groups in a topological order of the quotient graph, program order preferred (a
        group holding a recomputation is placed right before its first consumer, not where
        its first op's position would put it, in the forward)."""
        first = {gid: min(self.pos[id(op)] for op in g.members) for gid, g in self.groups.items()}
        for gid, g in self.groups.items():  # a recomputation runs just before its first consumer
            if _has_remat(g) and self.succ[gid]:
                first[gid] = (min(first[s] for s in self.succ[gid])[0] - 0.5, -1)
        indeg = {gid: len(self.pred[gid]) for gid in self.groups}
        ready = [(first[gid], gid) for gid, d in indeg.items() if d == 0]
        heapq.heapify(ready)
        out = []
        while ready:
            _, gid = heapq.heappop(ready)
            out.append(self.groups[gid])
            for s in self.succ[gid]:
                indeg[s] -= 1
                if indeg[s] == 0:
                    heapq.heappush(ready, (first[s], s))
        assert len(out) == len(self.groups), "the quotient graph has a cycle"
        return out


def _has_remat(g: Group) -> bool:
    return any(op.attrs.get("nf.remat") for op in g.members)


def _has_forward(g: Group) -> bool:
    return any(op.attrs.get("nf.phase") not in LATE_PHASES for op in g.members)
