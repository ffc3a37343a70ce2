"""The data of the tuning cache: statuses, modes, measurements, entries and the Pareto rule.

Everything here is plain JSON-able data; nothing is ever pickled or evaluated.
"""

from __future__ import annotations

import enum
import hashlib
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


class CacheError(Exception):
    """A problem the user can fix: a missing, corrupt, newer or foreign cache or export."""


class CacheDamaged(CacheError):
    """The cache file is damaged (not a database, a failed integrity check, unreadable
    pages or records). The message names the file and the ways out; `problems` lists what
    the check found."""

    def __init__(self, path: str, problems: list[str]) -> None:
        self.path = path
        self.problems = list(problems) or ["unknown damage"]
        first = self.problems[0].replace("\n", " ").strip()
        more = f" (and {len(self.problems) - 1} more problem(s))" if len(self.problems) > 1 \
            else ""
        super().__init__(
            f"'{path}' is not a usable tuning cache, it is damaged: {first}{more}\n"
            f"  `nfc cache verify --db {path}` lists the damage; `nfc cache repair --db "
            f"{path}` moves the file aside (to {path}.damaged-<time>) and rebuilds it from "
            "the records that can still be read; or move the file away yourself to start "
            "an empty cache")


MIN_TIME = 1e-9
"""The shortest time an `ok` record may claim, in seconds. One nanosecond is a few clock
cycles: no kernel call, not even an empty one through the measuring worker's function
pointer (a few hundred nanoseconds), is that fast, so a smaller time is a forged or broken
record. Imports and merges reject such records, `verify` reports them, and compiling never
picks them (it also applies a per-kernel floor, `kernels.time_floor`)."""


class Status(enum.StrEnum):
    """The outcome of measuring one schedule."""

    OK = "ok"
    """Ran, produced the reference result, and was timed."""
    FAILED = "failed"
    """Raised, crashed the worker (segfault, exit) or could not be built."""
    TIMEOUT = "timeout"
    """Took longer than the per-candidate time limit; the worker was killed."""
    WRONG = "wrong"
    """Ran but its outputs differ from the reference outputs."""


class Mode(enum.StrEnum):
    """How much measuring a tuning request may do (MegEngine's Fast Run strategies).

    Every mode first consults the cache: a kernel tuned once is never tuned again.
    """

    FULL = "full"
    """Profile every candidate the search proposes, including naive (default) schedules."""
    FAST = "fast"
    """Profile, but never measure or choose naive schedules (the default schedule and any the
    space marks with `is_naive`); cheaper when the naive ones are known to be slow."""
    HEURISTIC = "heuristic"
    """Measure nothing: the cache's best entry if there is one, otherwise the default."""


@dataclass(frozen=True)
class Measurement:
    """What measuring one schedule produced, before it is stored."""

    status: Status
    """Whether the schedule ran correctly (`ok`) or how it failed."""
    time: float | None = None
    """Median seconds of one run; required when `status` is `ok`."""
    spread: float | None = None
    """Interquartile range of the timed runs, in seconds."""
    workspace: int = 0
    """Bytes of scratch memory the schedule needs besides inputs and outputs."""
    reproducible: bool = True
    """Whether two runs on the same inputs give bitwise identical outputs."""
    error: str = ""
    """Why the schedule failed; empty when it did not."""

    def __post_init__(self) -> None:
        if self.status is Status.OK:
            assert self.time is not None and math.isfinite(self.time) and self.time >= 0, \
                f"an ok measurement needs a finite non-negative time, got {self.time!r}"
        assert self.workspace >= 0, f"negative workspace {self.workspace}"


@dataclass(frozen=True)
class Entry:
    """One measured schedule of one kernel in one category, as the cache returns it."""

    schedule: dict[str, Any]
    """The schedule's parameters (canonical JSON form: tuples became lists)."""
    status: Status
    """`ok`, or the way it failed."""
    time: float | None
    """Median seconds of one run (`None` for most failures)."""
    spread: float | None
    """Interquartile range of the timed runs, in seconds."""
    workspace: int
    """Scratch bytes the schedule needs."""
    reproducible: bool
    """Whether the schedule's outputs are bitwise deterministic."""
    naive: bool
    """Whether this is a naive schedule (the default/heuristic choice, or a reference one)."""
    error: str
    """Why it failed; empty for ok entries."""
    timestamp: float
    """When it was measured (seconds since the epoch)."""
    pruned: bool = False
    """An ok entry dominated by another (the Pareto rule): kept only to avoid re-measuring."""

    @property
    def ok(self) -> bool:
        """Whether the entry may be chosen (measured fine and not dominated)."""
        return self.status is Status.OK and not self.pruned


@dataclass(frozen=True)
class KeyInfo:
    """A summary of one tuned kernel (one category and key) for listings."""

    category_id: str
    """Hash of the category the records belong to."""
    key: str
    """The caller's key: structural hash of the kernel plus shapes and dtypes."""
    desc: str
    """Human-readable description of the kernel."""
    n_ok: int
    """Ok entries on the Pareto front."""
    n_pruned: int
    """Ok entries dominated by the front."""
    n_failed: int
    """Failed, timed-out and wrong entries."""
    best_time: float | None
    """The fastest ok time, if any."""


@dataclass(frozen=True)
class MergeStats:
    """What an import or merge did."""

    added: int = 0
    """Records that were new."""
    updated: int = 0
    """Records that replaced an older measurement of the same schedule."""
    skipped: int = 0
    """Records older than (or as old as) the measurement already stored."""
    rejected: tuple[str, ...] = ()
    """Records refused as implausible, each as `where: why` (nothing of them is stored)."""


def _json_default(obj: object) -> Any:
    # numpy scalars reach schedules easily; they carry `.item()` to a Python number
    item = getattr(obj, "item", None)
    if callable(item):
        return item()
    raise TypeError(f"{type(obj).__name__} is not JSON-serialisable")


def canonical_json(obj: Any) -> str:
    """The canonical JSON text of `obj`: sorted keys, no spaces, no NaN, UTF-8 kept."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False, default=_json_default)


def canonical_schedule(schedule: Mapping[str, Any]) -> dict[str, Any]:
    """`schedule` as it reads back from JSON (tuples become lists, numpy scalars numbers)."""
    out = json.loads(canonical_json(dict(schedule)))
    assert isinstance(out, dict)
    return out


def category_id(category: Mapping[str, Any]) -> str:
    """The hash naming a category: SHA-256 of its canonical JSON, 32 hex digits."""
    return hashlib.sha256(canonical_json(dict(category)).encode()).hexdigest()[:32]


def dominates(a: Entry, b: Entry) -> bool:
    """Whether ok entry `a` makes ok entry `b` useless (the Fast Run rule, attribute-aware).

    `a` is at least as fast, needs at most as much workspace, and can stand in for `b` under
    every filter `best` accepts: reproducible if `b` is, not naive unless `b` is.
    """
    assert a.time is not None and b.time is not None
    return (a.time <= b.time and a.workspace <= b.workspace
            and (a.reproducible or not b.reproducible) and (b.naive or not a.naive))


Row = tuple[int, float, int, bool, bool]
"""(row id, time, workspace, reproducible, naive) of one ok record."""


def dominated_rows(rows: Iterable[Row]) -> set[int]:
    """Ids of the rows some other row dominates; ties keep the lower id (the incumbent).

    One sweep in time order keeps the least workspace seen per (reproducible, naive) class;
    a row is dominated when a class that may stand in for it has already reached its
    workspace. Equal time and workspace sort the stronger attributes first.
    """
    order = sorted(rows, key=lambda r: (r[1], r[2], not r[3], r[4], r[0]))
    least: dict[tuple[bool, bool], int] = {}
    out: set[int] = set()
    for rid, _time, ws, repro, naive in order:
        # classes that may stand in for this row: reproducible if it is, naive only if it is
        cover = [w for (r, n), w in least.items() if (r or not repro) and (naive or not n)]
        if cover and min(cover) <= ws:
            out.add(rid)
        cls = (bool(repro), bool(naive))
        least[cls] = min(least.get(cls, ws), ws)
    return out
