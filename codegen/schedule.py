"""Schedules as data: how a compute's loops are split, ordered, vectorized, unrolled,
parallelized, where its accumulator lives and which operands are repacked.

The algorithm (an `nf.compute`) says what to compute; a `Schedule` says how, in the Halide/TVM
vocabulary, and is plain JSON-able data (`to_dict`/`from_dict`) so the tuner and the tuning
cache can store and replay it. Loop names: an axis `i` that is not split is the loop `i`; one
split with block sizes `(s1, ..., sn)` (each divisible by the next) gives loops `i.0 .. i.n`,
`i.0` over blocks of `s1`, ..., `i.n` over single elements inside a block of `sn`.

A `GroupSchedule` covers a group of computes that form one kernel (`nf.kernel`): which
producers are inlined into their consumers, and a `Schedule` for each remaining stage.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

#: Version of the schedule format and of the meaning of schedule-space parameters; part of the
#: tuning cache's category, so records of another version are never reused (a record of
#: another version is in another category: lookups never see it, imports keep it apart).
#: 3: the GEMM template's `pack_b` and `swap` and the loop template's `parallel_reduce`
#: parameters, and the loop template's default for strided-window gradients.
SCHEDULE_VERSION = "nfc-cpu-sched-3"


@dataclass(frozen=True)
class Split:
    """Split `axis` into nested loops over blocks of `sizes` (outermost first)."""

    axis: str
    sizes: tuple[int, ...]
    tail: str = "auto"
    """What the loops do when the blocks do not divide the axis (Halide's `TailStrategy`,
    nfc.codegen.lowering.tails): `auto` (inner serial loops shrink, unrolled and vectorized
    ones guard, an elementwise nest peels its ragged vectorized axis), `shrink` (the same
    without peeling), `guard` (every loop keeps its constant extent, the body is guarded) or
    `peel` (required, an error where it cannot be done)."""

    def loop_names(self) -> tuple[str, ...]:
        """The loops this split creates, outermost first."""
        return tuple(f"{self.axis}.{n}" for n in range(len(self.sizes) + 1))


@dataclass(frozen=True)
class Pack:
    """Repack operand number `operand` (in kernel operand order) before the main loop nest:
    its dimension `dim` is split into blocks of `factor` that move innermost, so
    `B[K, N]` packed on dim 1 by 16 becomes `Bp[ceil(N/16), K, 16]` (zero-padded panels).
    With `kind` "phase" the dimension is split into its `factor` phases instead (a polyphase
    layout): `X[H, W]` on dim 1 by 2 becomes `Xp[H, 2, ceil(W/2)]`, `Xp[h, p, q] =
    X[h, 2q + p]`, so a stride-2 read `X[h, 2j + e]` is `Xp[h, e % 2, j + e // 2]`,
    contiguous in j."""

    operand: int
    dim: int
    factor: int
    kind: str = "panel"


@dataclass(frozen=True)
class Schedule:
    """How to run one compute. Unset fields mean the natural choice (no split, axis order,
    scalar, serial)."""

    splits: tuple[Split, ...] = ()
    """Axis splits; see the module docstring for loop names."""
    order: tuple[str, ...] = ()
    """Every loop, outermost first; empty means output axes then reduction axes."""
    vectorize: str | None = None
    """The innermost loop, executed as one SIMD vector (its extent is the width)."""
    unroll: tuple[str, ...] = ()
    """Loops unrolled completely (their extent must be constant)."""
    parallel: tuple[str, ...] = ()
    """Outermost output loops, fused and spread over threads."""
    cache_write: str | None = None
    """Loop at which the accumulator starts: it spans the output loops from there inward and
    lives in registers when small (TVM's `cache_write`). None: at the first reduction loop."""
    pack: tuple[Pack, ...] = ()
    """Operands repacked into vector panels before the main nest."""
    parallel_reduce: int = 0
    """A reduction spread over threads (for a reduction that is the whole work: a sum to a
    scalar or to a few outputs, where `parallel` finds no output loops to spread): one
    reduction loop of the accumulator is cut into this many chunks, a parallel loop over
    the chunks leaves a partial result per chunk in the workspace, and the partials are
    combined in chunk order after it, so the result does not depend on the thread count
    (nfc.codegen.lowering.reductions). 0: none. Excludes `parallel`."""
    version: str = SCHEDULE_VERSION

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict; `from_dict` inverts it."""
        return {
            "kind": "compute", "version": self.version,
            "splits": [{"axis": s.axis, "sizes": list(s.sizes),
                        **({"tail": s.tail} if s.tail != "auto" else {})} for s in self.splits],
            "order": list(self.order), "vectorize": self.vectorize,
            "unroll": list(self.unroll), "parallel": list(self.parallel),
            "cache_write": self.cache_write,
            "pack": [{"operand": p.operand, "dim": p.dim, "factor": p.factor,
                      **({"kind": p.kind} if p.kind != "panel" else {})}
                     for p in self.pack],
            **({"parallel_reduce": self.parallel_reduce} if self.parallel_reduce else {}),
        }

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Schedule:
        """The schedule `to_dict` produced; raises ValueError on another version."""
        _check_version(d)
        return Schedule(
            splits=tuple(Split(s["axis"], tuple(int(x) for x in s["sizes"]),
                               str(s.get("tail", "auto"))) for s in d.get("splits", [])),
            order=tuple(d.get("order", [])), vectorize=d.get("vectorize"),
            unroll=tuple(d.get("unroll", [])), parallel=tuple(d.get("parallel", [])),
            cache_write=d.get("cache_write"),
            pack=tuple(Pack(int(p["operand"]), int(p["dim"]), int(p["factor"]),
                            str(p.get("kind", "panel"))) for p in d.get("pack", [])),
            parallel_reduce=int(d.get("parallel_reduce", 0)),
            version=d.get("version", SCHEDULE_VERSION))

    def split_of(self, axis: str) -> tuple[int, ...]:
        """Block sizes of `axis` (empty when not split)."""
        for s in self.splits:
            if s.axis == axis:
                return s.sizes
        return ()


@dataclass(frozen=True)
class GroupSchedule:
    """How to run a group of computes as one kernel.

    `inline` lists positions (in the group's compute order) of producers substituted into
    their consumers (`compute_inline`); every other compute is a stage, materialised in the
    kernel's workspace (or an output) and run by its own loop nest with `stages[n]`
    (None = default). `compute_at` of a stage inside a consumer loop is not supported yet."""

    inline: tuple[int, ...] = ()
    stages: tuple[Schedule | None, ...] = field(default_factory=tuple)
    version: str = SCHEDULE_VERSION

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict; `from_dict` inverts it."""
        return {"kind": "group", "version": self.version, "inline": list(self.inline),
                "stages": [None if s is None else s.to_dict() for s in self.stages]}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> GroupSchedule:
        """The schedule `to_dict` produced."""
        _check_version(d)
        return GroupSchedule(
            inline=tuple(int(x) for x in d.get("inline", [])),
            stages=tuple(None if s is None else Schedule.from_dict(s)
                         for s in d.get("stages", [])),
            version=d.get("version", SCHEDULE_VERSION))


def schedule_from_dict(d: dict[str, Any]) -> Schedule | GroupSchedule:
    """A `Schedule` or `GroupSchedule` from its dict (dispatching on `kind`)."""
    if d.get("kind", "compute") == "group":
        return GroupSchedule.from_dict(d)
    return Schedule.from_dict(d)


def _check_version(d: dict[str, Any]) -> None:
    v = d.get("version", SCHEDULE_VERSION)
    if v != SCHEDULE_VERSION:
        raise ValueError(f"schedule version '{v}' is not '{SCHEDULE_VERSION}'")


def replace(s: Schedule, **changes: Any) -> Schedule:
    """A copy of `s` with fields changed (dataclasses.replace, typed)."""
    values = {f.name: getattr(s, f.name) for f in fields(s)}
    values.update(changes)
    return Schedule(**values)
