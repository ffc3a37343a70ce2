"""Activation offload on the CUDA target: saved activations leave the device after the forward
pass and come back before their backward readers, so the arena holds them only while needed.

    step = build_cuda_step(module, offload=True)         # the h100/pcie5 plan of passes/offload.py
    step = build_cuda_step(module, offload=OffloadOptions(min_bytes=0, hidden_only=False, lead=1))
    step.funcs["train_step"].offload                      # [Offloaded(...)], launch indices

Which values: `nfc.passes.offload.plan_offload` on the function being built (after fusion: a
candidate is the result of a top-level forward op, kept in the arena, read by a later
backward op; values inside a fused group are workspace temporaries and stay), with the
options' device and link; by default only the values whose round trip the cost model hides
behind compute (`hidden_only`), or the named `values`.

What happens to one value `v` produced by op `n` (positions are top-level ops):
- after op `n`, the compute stream records an event; the copy stream waits for it and copies
  `v` to a pinned host buffer (D2H), then records `sent`;
- before op `release` (the op after the last forward reader, or later while the D2H still
  needs time in the cost model), the compute stream waits for `sent`: only then may the
  arena reuse `v`'s bytes;
- before op `fetch` the compute stream records an event; the copy stream waits for it (every
  buffer that shared the fetched copy's bytes is dead by then) and copies `v` back (H2D) into
  its second slot, then records `fetched`;
- before the first backward reader the compute stream waits for `fetched`; every backward
  reader reads the fetched slot.
So `v` has two lifetimes in the arena plan: `[n, release - 1]` and `[fetch, last use]`; the
plan is re-made with them (`apply_offload`). `fetch` is `lead` ops before the first backward
reader, or (cost model) the latest op from which the remaining compute covers one transfer.
A value for which `release >= fetch` gains nothing and stays. Every copy-stream operation is
waited for by the compute stream before the step ends, so a step is one CUDA Graph (the copy
stream forks from and joins the capturing stream through the events).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from nfc.codegen.artifact.plan import Copy, FuncPlan, KernelCall, Slot
from nfc.diagnostics import CompileError, error
from nfc.ir import Func
from nfc.passes.memplan import LiveBuffer, plan_offsets

__all__ = ["OffloadOptions", "Offloaded", "apply_offload", "choose_offload"]


@dataclass(frozen=True)
class OffloadOptions:
    """What to offload: the candidates of `plan_offload(func, device, link, min_bytes)`; with
    `hidden_only` only those whose round trip the cost model hides, with `values` (names of
    IR values, without `%`) exactly those. `lead`: the prefetch starts this many ops before
    the first backward reader (None: from the cost model)."""

    device: str = "h100"
    link: str = "pcie5"
    min_bytes: int = 1 << 16
    values: tuple[str, ...] | None = None
    hidden_only: bool = True
    lead: int | None = None


@dataclass(frozen=True)
class Offloaded:
    """One offloaded value of a step. Op positions (`producer`, `release`, `fetch`,
    `first_use`) are the function's top-level ops; the `*_launch` fields are the launch
    indices the runtime acts at: D2H after launch `send_after`, wait for it before launch
    `release_before`, H2D before launch `fetch_before`, wait for it before `use_before`.
    `src` and `dst` are the arena offsets of the value and of its fetched copy."""

    name: str
    nbytes: int
    src: int
    dst: int
    producer: int
    release: int
    fetch: int
    first_use: int
    send_after: int = -1
    release_before: int = -1
    fetch_before: int = -1
    use_before: int = -1

    def to_json(self) -> dict[str, Any]:
        """A JSON object."""
        return dict(self.__dict__)

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> Offloaded:
        """From `to_json`."""
        return Offloaded(str(d["name"]), *(int(d[k]) for k in (
            "nbytes", "src", "dst", "producer", "release", "fetch", "first_use", "send_after",
            "release_before", "fetch_before", "use_before")))

    def at_launches(self, first: Sequence[int], last: Sequence[int]) -> Offloaded:
        """With the launch indices of the op positions (`first[n]`/`last[n]`: the first and
        the last launch of op `n`)."""
        return replace(self, send_after=last[self.producer],
                       release_before=first[self.release], fetch_before=first[self.fetch],
                       use_before=first[self.first_use])


@dataclass(frozen=True)
class _Choice:
    value_id: int
    name: str
    nbytes: int
    producer: int
    release: int
    fetch: int
    first_use: int


def choose_offload(func: Func, options: OffloadOptions) -> list[_Choice]:
    """The values of `func` to offload, with their release and fetch positions."""
    from nfc.passes.offload import DEVICES, LINKS, plan_offload

    if options.device not in DEVICES or options.link not in LINKS:
        raise CompileError(error(
            f"offload: device must be one of {', '.join(DEVICES)} and link one of "
            f"{', '.join(LINKS)} (got device={options.device}, link={options.link})",
            func.loc).diagnostics)
    if not any(_late_op(op) for op in func.body.ops):
        return []
    plan = plan_offload(func, options.device, options.link, options.min_bytes)
    gbs, lat_us = LINKS[options.link]
    prefix = plan.prefix
    if options.values is not None:
        wanted = set(options.values)
        cands = [c for c in plan.candidates if c.value.name in wanted]
        missing = wanted - {c.value.name for c in cands}
        if missing:
            raise CompileError(error(
                f"@{func.name}: cannot offload {', '.join('%' + m for m in sorted(missing))}: "
                "not a saved activation (a forward value in the arena read by the backward "
                f"pass, at least {options.min_bytes} bytes)", func.loc).diagnostics)
    else:
        cands = plan.chosen if options.hidden_only else plan.candidates
    out = []
    for c in sorted(cands, key=lambda c: c.producer):
        one_way = c.nbytes / (gbs * 1e9) + lat_us * 1e-6
        lf, fb, n = c.last_forward, c.first_backward, c.producer
        if options.lead is not None:
            release, fetch = lf + 1, max(lf + 1, fb - options.lead)
        else:  # the D2H gets until the compute after `n` covers it, the H2D likewise
            release = next((r for r in range(lf + 1, fb) if prefix[r] - prefix[n + 1] >= one_way),
                           lf + 1)
            fetch = next((p for p in range(fb, lf, -1) if prefix[fb] - prefix[p] >= one_way),
                         lf + 1)
        if release < fetch:
            out.append(_Choice(id(c.value), c.value.name or f"v{n}", c.nbytes, n, release,
                               fetch, fb))
    return out


def _late_op(op: Any) -> bool:
    from nfc.passes.offload import _late

    return _late(op)


def apply_offload(func: Func, plan: FuncPlan, options: OffloadOptions
                  ) -> tuple[FuncPlan, list[Offloaded]]:
    """`plan` with the chosen values of `func` offloaded: their arena buffers split in two
    lifetimes, the arena re-planned, every kernel and copy moved to the new offsets (backward
    readers to the fetched copy). Positions only: `Offloaded.at_launches` adds the launch
    indices. Nothing chosen: `plan` itself and []."""
    choices = [c for c in choose_offload(func, options)
               if ("v", c.value_id) in plan.memory.offsets]
    if not choices:
        return plan, []
    split = {c.value_id: c for c in choices}
    buffers: list[LiveBuffer] = []
    for b in plan.buffers:
        c = split.get(b.key[1]) if b.key[0] == "v" else None
        if c is None:
            buffers.append(b)
        else:
            buffers.append(LiveBuffer(b.key, b.size, b.start, c.release - 1))
            buffers.append(LiveBuffer(("fetch", c.value_id), b.size, c.fetch, b.end))
    memory = plan_offsets(buffers)
    by_offset: dict[int, list[LiveBuffer]] = {}
    for b in plan.buffers:
        by_offset.setdefault(plan.memory.offsets[b.key], []).append(b)

    def key_at(offset: int, pos: int) -> Hashable:
        live = [b for b in by_offset[offset] if b.start <= pos <= b.end]
        assert len(live) == 1, (offset, pos, live)
        key = live[0].key
        c = split.get(key[1]) if key[0] == "v" else None  # type: ignore[index]
        return ("fetch", c.value_id) if c is not None and pos >= c.fetch else key

    def moved(slot: Slot, pos: int) -> Slot:
        if slot.kind != "arena":
            return slot
        return Slot("arena", memory.offsets[key_at(slot.index, pos)])

    end = len(func.body.ops) - 1
    kernels = [KernelCall(k.symbol, k.op_index, tuple(moved(s, k.op_index) for s in k.buffers),
                          k.label) for k in plan.kernels]
    copies = [Copy(moved(c.src, end), moved(c.dst, end), c.nbytes) for c in plan.copies]
    where = dict(plan.where)
    for b in plan.buffers:
        if b.key[0] == "v":
            where[b.key[1]] = Slot("arena", memory.offsets[b.key])  # type: ignore[index]
    new = replace(plan, kernels=kernels, copies=copies, memory=memory, where=where,
                  buffers=buffers)
    return new, [Offloaded(c.name, c.nbytes, memory.offsets[("v", c.value_id)],
                           memory.offsets[("fetch", c.value_id)], c.producer, c.release,
                           c.fetch, c.first_use) for c in choices]
