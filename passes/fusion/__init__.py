"""The `fuse` pass: reward-based, training-aware fusion of computes into `nf.kernel` groups.

Modules: `reward` (the optimistic price of a group, mirroring the CPU backend's group rules),
`partition` (the greedy search over merges and recomputations). Device parameters live in
`nfc.passes.fusion.device`. See docs/passes-builtin.md, section "fuse".
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, fields
from typing import ClassVar

from nfc.diagnostics import error
from nfc.ir import Block, ComputeOp, Func, KernelOp, Module, Op, YieldOp
from nfc.passes.fusion.accumulate import split_sums
from nfc.passes.fusion.device import DEFAULT_DEVICE, DeviceParams, measured_device_params
from nfc.passes.fusion.partition import Decision, Group, Options, Partitioner
from nfc.passes.fusion.reward import CostModel
from nfc.passmanager import Context, ModulePass
from nfc.printer import Namer
from nfc.rewrite import Rewriter

__all__ = ["FUSION_ATTR", "Fuse", "explain_text", "fuse_func"]

#: Kernel attribute recording why a group was formed (see `Fuse`).
FUSION_ATTR = "nf.fusion"


@dataclass(frozen=True)
class Fuse(ModulePass):
    """Group computes into `nf.kernel`s where the optimistic fusion reward is positive.

    Before:  %0 = nf.compute [n: 256, m: 256] sum [k: 784] (%x[n, k] * %w[k, m]) : ...
             %1 = nf.compute [n: 256, m: 256] (%0[n, m] + %b[m]) : ...
             %2 = nf.compute [n: 256, m: 256] (max(%1[n, m], 0.0)) : ...
    After:   %2 = nf.kernel {nf.fusion = {reward_us = 40.6, ...}} {
               %0 = nf.compute [n: 256, m: 256] sum [k: 784] (%x[n, k] * %w[k, m]) : ...
               %1 = nf.compute [n: 256, m: 256] (%0[n, m] + %b[m]) : ...
               %2_1 = nf.compute [n: 256, m: 256] (max(%1[n, m], 0.0)) : ...
               nf.yield %2_1 : ...
             } : ...

    Every compute starts as its own kernel. A candidate step (merging two groups joined by
    an edge or sharing a small input, or recomputing an elementwise value inside a consumer
    group instead of reading it) is priced with `R = ΔT/P_d + ΔC/P_c + ΔK·L`: bytes of DRAM
    traffic saved, FLOPs saved (negative for recomputation), kernel calls and parallel
    regions saved, on the device described by the options. Steps with R <= 0 are rejected;
    the best remaining one is taken greedily while the merged group stays convex (the
    graph of kernels stays acyclic) and compilable by the CPU backend (see
    nfc.passes.fusion.reward). Values read outside a group, by the backward pass for
    instance, are yielded; a recomputed value carries `nf.recompute = true`.

    Groups of one compute stay plain computes. Each kernel records its reward and savings
    in `nf.fusion = {reward_us, bytes_saved, flops_saved, launches_saved, regions_saved,
    recomputed, est_us}` (estimates, µs); existing kernels and calls are left alone, so
    running the pass again changes nothing and a recorded grouping replays as it is. Large
    sums of many gradient contributions become running sums first
    (nfc.passes.fusion.accumulate), never one kernel.
    """

    name: ClassVar[str] = "fuse"

    bandwidth_gbs: float = DEFAULT_DEVICE.bandwidth_gbs
    """P_d: DRAM bandwidth of one core, GB/s (measure: python -m nfc.runtime.device_params)."""
    peak_gflops: float = DEFAULT_DEVICE.peak_gflops
    """P_c: sustained compute of one core in reductions (GEMM-like), GFLOP/s."""
    elementwise_gflops: float = DEFAULT_DEVICE.elementwise_gflops
    """Compute rate of elementwise code and of recomputed (inlined) producers, GFLOP/s."""
    launch_us: float = DEFAULT_DEVICE.launch_us
    """L: overhead of one kernel call, µs."""
    region_us: float = DEFAULT_DEVICE.region_us
    """Overhead of one parallel region (thread fork/join), µs."""
    cache_kib: int = DEFAULT_DEVICE.cache_kib
    """Intermediates up to this size stay in cache between the stages of a kernel."""
    parallel_work: int = DEFAULT_DEVICE.parallel_work
    """Iteration points from which a loop nest is marked parallel (codegen's rule)."""
    parallel_min_work: int = DEFAULT_DEVICE.parallel_min_work
    """Estimated work below which a parallel-marked nest runs serially (no region)."""
    vector_lanes: int = DEFAULT_DEVICE.vector_lanes
    """f32 lanes of a vector register, for that estimate."""
    siblings: bool = True
    """Also merge groups that only share an input (read once if it fits the cache)."""
    recompute: bool = True
    """Also consider recomputing elementwise values in their consumers' kernels."""
    max_ops: int = 32
    """Most computes in one kernel."""
    max_nodes: int = 2000
    """Largest expression a compute may have after its producers are inlined."""
    functions: str = ""
    """Comma-separated names of the functions to fuse; empty: all."""
    params: str = "auto"
    """Where P_d, P_c, L come from: `auto` (this machine's measurement when the driver gives
    one: `nfc compile`, `train` and `bench` do, measured at first use and kept in the tuning
    cache; else the options), `measured` (that measurement, or the one in the tuning cache,
    `python -m nfc.runtime.device_params`), or `builtin` (the options above: the built-in
    constants unless given). Options given explicitly win over a measurement."""
    explain: bool = False
    """Print every candidate step to stderr: taken, rejected or skipped, with R, ΔT, ΔC, ΔK."""
    veto: int = -1
    """Reject the candidate step with this number in the order `explain` lists the steps
    (-1: none): for measuring what one decision is worth (benchmarks/fusion_reward.py)."""
    force: int = -1
    """Take the rejected merge with this number in that order even though R <= 0, if it is
    still legal when its turn comes (-1: none)."""

    def device(self) -> DeviceParams:
        """The device parameters these options describe."""
        return DeviceParams(**{f.name: getattr(self, f.name) for f in fields(DeviceParams)})

    def resolve_device(self, ctx: Context | None = None) -> tuple[DeviceParams, str]:
        """The parameters the reward uses and where they came from."""
        mine = self.device()
        if self.params in ("builtin", "options"):
            return mine, "built-in constants" if mine == DEFAULT_DEVICE else "options"
        if self.params not in ("auto", "measured"):
            raise error(f"fuse: unknown params source '{self.params}' (expected 'auto', "
                        "'measured' or 'builtin')")
        given = getattr(ctx, "device_params", None)
        measured = given if isinstance(given, DeviceParams) else None
        if measured is None and self.params == "measured":
            measured = measured_device_params()
        if measured is None:
            what = "built-in constants" if mine == DEFAULT_DEVICE else "options"
            return mine, (f"{what} (nothing measured on this machine)"
                          if self.params == "measured" else what)
        # an option given explicitly (not at its default) wins over the measurement
        merged = {f.name: (getattr(mine, f.name) if getattr(mine, f.name)
                           != getattr(DEFAULT_DEVICE, f.name) else getattr(measured, f.name))
                  for f in fields(DeviceParams)}
        return DeviceParams(**merged), "measured"

    def apply(self, ctx: Context, module: Module) -> None:
        """Fuse every selected function of `module`."""
        wanted = {n.strip() for n in self.functions.split(",") if n.strip()}
        opts = Options(siblings=self.siblings, recompute=self.recompute, max_ops=self.max_ops,
                       explain=self.explain, veto=self.veto, force=self.force)
        dev, source = self.resolve_device(ctx)
        ctx.remarks[self.name] = f"device parameters: {source} ({dev.pipeline_options()})"
        steps = [0]  # steps are numbered across the module (veto/force name one)
        for func in module.funcs:
            if not wanted or func.name in wanted:
                namer = _namer(func) if self.explain else None
                decisions: list[Decision] = []
                fuse_func(func, CostModel(dev, self.max_nodes), opts, decisions, steps)
                if namer is not None:
                    print(explain_text(func.name, decisions, namer, source), file=sys.stderr)


def _namer(func: Func) -> Namer:
    namer = Namer()
    for a in func.args:
        namer.add(a)
    for op in func.walk():
        for r in op.results:
            namer.add(r)
    return namer


def explain_text(func: str, decisions: list[Decision], namer: Namer, source: str) -> str:
    """The lines `fuse{explain=true}` prints: one per candidate step, in the order decided.

        fuse: @forward: device parameters: built-in constants
        fuse: @forward: #0 take merge %0 %1: R=+12.3us dT=+1048576B dC=+0FLOP dK=+1 kernels
          +0 regions

    `#N` numbers the steps in the order decided (what `fuse{veto=N}` and `fuse{force=N}`
    name); the numbers of a run with the same module and options are the same.
    """
    lines = [f"fuse: @{func}: device parameters: {source}"]
    for d in decisions:
        names = " ".join(namer(r) for op in d.members for r in op.results[:1])
        s = d.saved
        lines.append(f"fuse: @{func}: #{d.index} {d.verdict} {d.kind} {names}: "
                     f"R={d.reward * 1e6:+.3f}us "
                     f"dT={s['bytes']:+.0f}B dC={s['flops']:+.0f}FLOP "
                     f"dK={s['kernels']:+.0f} kernels {s['regions']:+.0f} regions")
    return "\n".join(lines)


def fuse_func(func: Func, model: CostModel, opts: Options | None = None,
              decisions: list[Decision] | None = None,
              steps: list[int] | None = None) -> list[KernelOp]:
    """Partition `func`'s top-level computes into kernels in place; returns the new kernels
    (and appends the search's decisions to `decisions` when `opts.explain`). `steps` holds
    the number of the first step (`[0]` by default) and gets the next function's."""
    if sum(isinstance(op, ComputeOp) for op in func.body.ops) < 2:
        return []
    split_sums(func)  # gradient sums as running sums: contributions die early
    part = Partitioner(func, model, opts or Options(), steps[0] if steps else 0)
    part.run()
    if steps:
        steps[0] = part.next_step
    if decisions is not None:
        decisions.extend(part.decisions)
    ret = func.ret
    rewriter = Rewriter()
    kernels: list[KernelOp] = []
    placed: set[Op] = {ret}
    for g in part.ordered_groups():  # each group's op moves to the end, in this order
        if len(g.members) == 1:
            op = g.members[0]
        else:
            for member in g.members:
                if member.parent is not None:
                    rewriter.detach_op(member)
            op = _kernel(part, g)
            kernels.append(op)
        if op.parent is None:
            rewriter.insert_op_before(op, ret)
        else:
            rewriter.move_op_before(op, ret)
        placed.add(op)
    for op in [op for op in func.body.ops if op not in placed]:
        rewriter.erase_op(op)  # in no group: unread
    # readers outside a kernel read its results instead of its members' values
    for k in kernels:
        for v, r in zip(k.body.ops[-1].operands, k.results, strict=True):
            rewriter.replace_uses_with_if(v, r, lambda op, body=k.body: op.parent is not body)
    return kernels


def _kernel(part: Partitioner, g: Group) -> KernelOp:
    outs = part.outputs_of(g.members)
    values = [r for op in g.members for r in op.results if id(r) in outs]
    cost = part.group_cost(g)
    info = {
        "reward_us": round(g.reward * 1e6, 3),
        "bytes_saved": int(round(g.saved["bytes"])),
        "flops_saved": int(round(g.saved["flops"])),
        "launches_saved": int(round(g.saved["kernels"])),
        "regions_saved": int(round(g.saved["regions"])),
        "recomputed": g.recomputed,
        "est_us": round(cost.seconds(part.model.dev) * 1e6, 3),
    }
    body = Block([*g.members, YieldOp(values, loc=g.members[-1].loc)])
    return KernelOp(body, loc=g.members[-1].loc, attrs={FUSION_ATTR: info},
                    names=[v.name for v in values])
