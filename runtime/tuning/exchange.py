"""Records as they travel between caches: JSON lines export and import, and the checks
`TuningCache.verify` runs. Only JSON is read and written; nothing is evaluated.
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import IO, Any

from nfc.runtime.tuning.model import (
    CacheError,
    Entry,
    Measurement,
    Status,
    canonical_json,
    category_id,
)

EXPORT_FORMAT = "nfc-tuning-cache"
"""The `format` of the header line of an export."""
EXPORT_VERSION = 1
"""Version of the export format; a newer export is refused."""


@dataclass(frozen=True)
class Record:
    """One measurement together with everything naming it: category, key and schedule."""

    category: dict[str, Any]
    """The category dict (the id is recomputed from it, never trusted)."""
    key: str
    """The kernel's key."""
    desc: str
    """Human-readable description of the kernel."""
    schedule: str
    """The schedule's canonical JSON text."""
    measurement: Measurement
    """Status, time, spread, workspace, reproducibility and error text."""
    naive: bool
    """Whether the schedule is a naive one."""
    timestamp: float
    """When it was measured (seconds since the epoch)."""

    @classmethod
    def from_entry(cls, category: dict[str, Any], key: str, desc: str, e: Entry) -> Record:
        """The record of a cache entry."""
        m = Measurement(e.status, e.time, e.spread, e.workspace, e.reproducible, e.error)
        return cls(category, key, desc, canonical_json(e.schedule), m, e.naive, e.timestamp)

    def to_json(self) -> dict[str, Any]:
        """The JSON object of one export line."""
        m = self.measurement
        return {"category": self.category, "category_id": category_id(self.category),
                "key": self.key, "desc": self.desc, "schedule": json.loads(self.schedule),
                "status": str(m.status), "time": m.time, "spread": m.spread,
                "workspace": m.workspace, "reproducible": m.reproducible, "naive": self.naive,
                "error": m.error, "timestamp": self.timestamp}

    @classmethod
    def from_json(cls, obj: Any, where: str) -> Record:
        """Validate one export line; raises CacheError naming `where` on any mistake."""
        def need(name: str, types: type | tuple[type, ...], optional: bool = False) -> Any:
            value = obj.get(name)
            if value is None and optional:
                return None
            if not isinstance(value, types) or (isinstance(value, bool) and bool not in (
                    types if isinstance(types, tuple) else (types,))):
                raise CacheError(f"{where}: field '{name}' is missing or has the wrong type")
            return value

        if not isinstance(obj, dict):
            raise CacheError(f"{where}: a record must be a JSON object")
        cat = need("category", dict)
        if "category_id" in obj and obj["category_id"] != category_id(cat):
            raise CacheError(f"{where}: 'category_id' does not match the category")
        try:
            status = Status(need("status", str))
        except ValueError:
            raise CacheError(f"{where}: unknown status '{obj['status']}'") from None
        t = need("time", (int, float), optional=True)
        spread = need("spread", (int, float), optional=True)
        ws = need("workspace", int)
        if ws < 0 or any(v is not None and not (math.isfinite(v) and v >= 0) for v in (t, spread)):
            raise CacheError(f"{where}: negative or non-finite time, spread or workspace")
        if status is Status.OK and t is None:
            raise CacheError(f"{where}: an ok record needs a time")
        m = Measurement(status, None if t is None else float(t),
                        None if spread is None else float(spread), ws,
                        need("reproducible", bool), need("error", str, optional=True) or "")
        return cls(cat, need("key", str), need("desc", str, optional=True) or "",
                   canonical_json(need("schedule", dict)), m, need("naive", bool),
                   float(need("timestamp", (int, float))))


def write_jsonl(fp: IO[str], records: Iterable[Record]) -> int:
    """Write a header line and one line per record; returns the number of records."""
    fp.write(canonical_json({"format": EXPORT_FORMAT, "version": EXPORT_VERSION}) + "\n")
    n = 0
    for rec in records:
        fp.write(canonical_json(rec.to_json()) + "\n")
        n += 1
    return n


def read_jsonl(fp: IO[str], *, source: str) -> list[Record]:
    """Parse and validate a whole export before anything is stored."""
    out: list[Record] = []
    header_seen = False
    for lineno, line in enumerate(fp, 1):
        if not line.strip():
            continue
        where = f"{source}:{lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as err:
            raise CacheError(f"{where}: not JSON ({err.msg})") from None
        if not header_seen:
            if not isinstance(obj, dict) or obj.get("format") != EXPORT_FORMAT:
                raise CacheError(f"{where}: not an nfc tuning cache export "
                                    f"(the first line should name format '{EXPORT_FORMAT}')")
            version = obj.get("version")
            if not isinstance(version, int) or version > EXPORT_VERSION:
                raise CacheError(f"{where}: export version {version!r} is newer than the "
                                    f"{EXPORT_VERSION} this nfc reads")
            header_seen = True
            continue
        out.append(Record.from_json(obj, where))
    if not header_seen:
        raise CacheError(f"{source}: empty file, not an nfc tuning cache export")
    return out


def check_categories(records: list[Record], current: Mapping[str, Any]) -> None:
    """Raise CacheError when any record's category differs from `current`."""
    cid = category_id(current)
    foreign = [r for r in records if category_id(r.category) != cid]
    if not foreign:
        return
    first = foreign[0].category
    fields = sorted(k for k in set(first) | set(current) if first.get(k) != current.get(k))
    raise CacheError(
        f"{len(foreign)} of {len(records)} records belong to another category than the "
        f"current one (they differ in {', '.join(repr(f) for f in fields)}); "
        "pass --allow-foreign-category (allow_foreign_category=True) to import them anyway")


def check_invariants(conn: sqlite3.Connection,
                     dominates: Callable[[Entry, Entry], bool]) -> list[str]:
    """Problems with stored JSON, categories, statuses and the Pareto rule."""
    problems: list[str] = []
    for cid, text in conn.execute("SELECT id, json FROM categories"):
        try:
            if category_id(json.loads(text)) != cid:
                problems.append(f"category {cid}: id does not match its JSON")
        except (ValueError, TypeError, AttributeError):
            problems.append(f"category {cid}: JSON does not parse to an object")
    known = {r[0] for r in conn.execute("SELECT id FROM categories")}
    groups: dict[tuple[str, str], list[Entry]] = defaultdict(list)
    for row in conn.execute(
            "SELECT id, category, key, schedule, status, time, spread, workspace, "
            "reproducible, naive, error, timestamp, pruned FROM records"):
        rid, cid, key, sched, status, t, spread, ws, repro, naive, error, stamp, pruned = row
        where = f"record {rid} ({key!r})"
        try:
            parsed = json.loads(sched)
            if not isinstance(parsed, dict) or canonical_json(parsed) != sched:
                problems.append(f"{where}: schedule is not a canonical JSON object")
                continue
        except ValueError:
            problems.append(f"{where}: schedule JSON does not parse")
            continue
        if cid not in known:
            problems.append(f"{where}: unknown category {cid}")
        if status not in {s.value for s in Status}:
            problems.append(f"{where}: unknown status {status!r}")
            continue
        if status == "ok" and (not isinstance(t, float | int) or not math.isfinite(t) or t < 0):
            problems.append(f"{where}: ok record without a valid time")
            continue
        if not isinstance(ws, int) or ws < 0:
            problems.append(f"{where}: invalid workspace {ws!r}")
            continue
        if status == "ok":
            groups[cid, key].append(Entry(parsed, Status.OK, float(t), spread, ws, bool(repro),
                                          bool(naive), error, stamp, bool(pruned)))
    for (cid, key), entries in groups.items():
        front = [e for e in entries if not e.pruned]
        for i, a in enumerate(front):
            for j, b in enumerate(front):
                if i != j and dominates(a, b):
                    problems.append(f"{cid}/{key!r}: front entry {canonical_json(b.schedule)} "
                                    f"is dominated by {canonical_json(a.schedule)}")
        for e in entries:
            if e.pruned and not any(dominates(a, e) for a in front):
                problems.append(f"{cid}/{key!r}: pruned entry {canonical_json(e.schedule)} "
                                "is dominated by no front entry")
    return problems
