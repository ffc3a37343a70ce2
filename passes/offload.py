"""Offload planning: which saved activations could leave the device after their last forward
use and come back before their first backward use without the step waiting (docs/memory.md).

An analysis: the IR is unchanged; the plan is recorded as `nf.offload` on each function with a
backward pass and summarised in a remark. On the CPU target nfc does not move activations (see
docs/memory.md, "Offload": the arena already is host memory, so offload means spilling to a
file, worthwhile only for a step larger than RAM). The CUDA step builder
(`nfc.codegen.cuda.offload`, `build_cuda_step(..., offload=True)`) runs `plan_offload` on the
very function it builds and moves the chosen values to pinned host memory and back.

The cost model:
- each op takes `max(flops / peak, bytes / bandwidth)` seconds on the device (roofline, from
  nfc.cost's counts; `DEVICES`);
- a saved value's *window* is the time of the ops strictly between its last forward reader
  and its first backward reader; sending it out and fetching it back over the link
  (`LINKS`, bytes / bandwidth each way, plus a fixed latency) must fit in that window;
- the link carries one transfer at a time: values are taken largest first while the link's
  total busy time stays within the step's time;
- an offloaded value occupies the arena only from its producer to its last forward reader
  and again at its first backward reader (fetched just in time), so the plan's arena lower
  bound (`memplan.lower_bound`) is recomputed with those shorter lives.

    nfc opt model.nf -p 'im2col,training-functions,inline,cse,dce,
                         offload-plan{device=h100,link=pcie5}'
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from nfc.ir import ComputeOp, Func, KernelOp, Module, Op, ReturnOp, Value
from nfc.passes.memplan import LATE_PHASES, LiveBuffer, function_buffers, lower_bound
from nfc.passmanager import Context, ModulePass

#: name -> (peak GFLOP/s, memory bandwidth GB/s) of the device the step runs on. `cpu` is the
#: fusion pass's default device parameters (2-core Zen 3 of docs/performance.md); `h100` is
#: an H100 SXM's f32 (non tensor core) peak and HBM3 bandwidth.
DEVICES: dict[str, tuple[float, float]] = {"cpu": (80.0, 15.0), "h100": (67_000.0, 3_350.0)}
#: name -> (GB/s each way, latency in microseconds) of the link to where values go: PCIe 4/5
#: x16 to pinned host memory, an NVMe drive for a memory-mapped spill file.
LINKS: dict[str, tuple[float, float]] = {"pcie4": (25.0, 10.0), "pcie5": (50.0, 10.0),
                                         "nvme": (3.0, 100.0)}


def _late(op: Op) -> bool:
    """Whether `op` runs in the backward pass or the update (a fused kernel: when any of its
    computes does)."""
    if isinstance(op, KernelOp):
        return any(_late(o) for o in op.body.ops[:-1])
    return op.attrs.get("nf.phase") in LATE_PHASES


def op_seconds(op: Op, device: tuple[float, float]) -> float:
    """The roofline time of one op on `device` (a fused kernel: the sum over its computes;
    0 for other ops)."""
    from nfc.cost import compute_cost

    if isinstance(op, KernelOp):
        return sum(op_seconds(o, device) for o in op.body.ops[:-1])
    if not isinstance(op, ComputeOp):
        return 0.0
    c = compute_cost(op)
    gflops, gbs = device
    return max(c.flops / (gflops * 1e9), c.bytes / (gbs * 1e9))


def readers(func: Func) -> dict[int, list[int]]:
    """id(value) -> positions of the top-level ops reading it, in order (a fused kernel reads
    what its computes read from outside)."""
    out: dict[int, list[int]] = {}
    for n, op in enumerate(func.body.ops):
        for v in op.operands:
            out.setdefault(id(v), []).append(n)
    return out


@dataclass
class Candidate:
    """A saved value: bytes, its window (seconds between last forward and first backward
    reader) and the round trip over the link (seconds)."""

    value: Value
    nbytes: int
    last_forward: int
    first_backward: int
    window: float
    transfer: float
    producer: int = -1
    """Position of the op computing the value."""

    @property
    def hidden(self) -> bool:
        """Whether the round trip fits in the window."""
        return self.transfer <= self.window


@dataclass
class OffloadPlan:
    """The chosen values and what they save."""

    step_seconds: float
    chosen: list[Candidate] = field(default_factory=list)
    candidates: list[Candidate] = field(default_factory=list)
    bound_before: int = 0
    bound_after: int = 0
    prefix: list[float] = field(default_factory=list)
    """Seconds before each op position (prefix sums of the op times; one more entry)."""

    @property
    def offloaded_bytes(self) -> int:
        """Bytes sent out and back per step."""
        return sum(c.nbytes for c in self.chosen)

    @property
    def link_busy(self) -> float:
        """Seconds the link is busy per step."""
        return sum(c.transfer for c in self.chosen)


def plan_offload(func: Func, device: str = "cpu", link: str = "nvme",
                 min_bytes: int = 1 << 16) -> OffloadPlan:
    """The offload plan of `func` (see the module doc); values under `min_bytes` stay."""
    dev, (gbs, lat_us) = DEVICES[device], LINKS[link]
    ops = func.body.ops
    times = [op_seconds(op, dev) for op in ops]
    prefix = [0.0]
    for t in times:
        prefix.append(prefix[-1] + t)
    returned = {id(v) for v in func.ret.values}
    plan = OffloadPlan(prefix[-1])
    plan.prefix = prefix
    bufs = function_buffers(func)
    plan.bound_before = plan.bound_after = lower_bound(bufs)
    read = readers(func)
    for n, op in enumerate(ops):
        if _late(op) or isinstance(op, ReturnOp):
            continue
        for v in op.results:
            if id(v) in returned or v.type.nbytes < min_bytes:
                continue
            users = read.get(id(v), [])
            fwd = [p for p in users if not _late(ops[p])]
            late = [p for p in users if _late(ops[p])]
            if not late:
                continue
            lf, fb = max([n, *fwd]), min(late)
            if fb <= lf + 1:
                continue
            window = prefix[fb] - prefix[lf + 1]
            transfer = 2 * (v.type.nbytes / (gbs * 1e9) + lat_us * 1e-6)
            plan.candidates.append(Candidate(v, v.type.nbytes, lf, fb, window, transfer, n))
    busy = 0.0
    for c in sorted(plan.candidates, key=lambda c: (-c.nbytes, c.last_forward)):
        if c.hidden and busy + c.transfer <= plan.step_seconds:
            plan.chosen.append(c)
            busy += c.transfer
    if plan.chosen:
        cut = {id(c.value): c for c in plan.chosen}
        new: list[LiveBuffer] = []
        for b in bufs:
            c = cut.get(id(b.key))
            if c is None:
                new.append(b)
            else:  # resident until its last forward reader, and again when fetched back
                new.append(LiveBuffer(("out", id(b.key)), b.size, b.start, c.last_forward))
                new.append(LiveBuffer(("in", id(b.key)), b.size, c.first_backward, b.end))
        plan.bound_after = lower_bound(new)
    return plan


@dataclass(frozen=True)
class OffloadPlanPass(ModulePass):
    """Plan which saved activations could be offloaded without stalling (an analysis; see
    the module doc): `device` (cpu, h100) sets the op times, `link` (pcie4, pcie5, nvme) the
    transfer times; values under `min_bytes` stay. Records `nf.offload = {values = n, bytes =
    b, link_seconds = s, step_seconds = t, bound_before = b0, bound_after = b1}`."""

    name: ClassVar[str] = "offload-plan"
    device: str = "cpu"
    link: str = "nvme"
    min_bytes: int = 1 << 16

    def apply(self, ctx: Context, module: Module) -> None:
        """Plan every function with a backward pass."""
        if self.device not in DEVICES or self.link not in LINKS:
            ctx.error(f"offload-plan: device must be one of {', '.join(DEVICES)} and link one "
                      f"of {', '.join(LINKS)} (got device={self.device}, link={self.link})")
            return
        notes = []
        for f in module.funcs:
            if not f.body.ops or not any(_late(op) for op in f.body.ops):
                continue
            p = plan_offload(f, self.device, self.link, self.min_bytes)
            f.attrs["nf.offload"] = {
                "values": len(p.chosen), "bytes": p.offloaded_bytes,
                "link_seconds": round(p.link_busy, 9), "step_seconds": round(p.step_seconds, 9),
                "bound_before": p.bound_before, "bound_after": p.bound_after}
            notes.append(f"@{f.name}: {len(p.chosen)} of {len(p.candidates)} saved values "
                         f"({p.offloaded_bytes:,} bytes) hidden behind compute over {self.link}"
                         f"; arena lower bound {p.bound_before:,} -> {p.bound_after:,} bytes")
        ctx.remarks[self.name] = "; ".join(notes) or "no backward pass"
