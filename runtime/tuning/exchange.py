"""Records as they travel between caches: JSON lines export and import, and the checks
`TuningCache.verify` runs. Only JSON is read and written; nothing is evaluated.

An export is checked at two levels. A *malformed* file (no header, a line that is not JSON,
nested deeper than `MAX_DEPTH` or longer than `MAX_LINE`, a field of the wrong type, a forged
`category_id`) is refused as a whole: nothing of it is trusted. A well-formed record whose
content is *implausible* (`record_problem`: a time that is not finite, not positive or below
`MIN_TIME`, a negative spread or workspace, a schedule that is not one of nfc's schedule
templates) is rejected alone and reported; the other records are imported.
"""

from __future__ import annotations

import json
import math
import re
import sqlite3
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import IO, Any

from nfc.runtime.tuning.model import (
    MIN_TIME,
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
MAX_DEPTH = 16
"""Deepest nesting of JSON arrays and objects in one record (a schedule needs 4)."""
MAX_LINE = 1 << 20
"""Longest line of an export, in characters (a record takes a few hundred)."""


class RecordRejected(CacheError):
    """A well-formed record whose content is implausible: refused alone, reported."""


def json_depth(obj: Any) -> int:
    """How deeply arrays and objects nest in `obj` (0 for a scalar); iterative, so that no
    input can exhaust the stack."""
    deepest, stack = 0, [(obj, 0)]
    while stack:
        x, d = stack.pop()
        if isinstance(x, dict | list):
            deepest = max(deepest, d + 1)
            if d + 1 <= MAX_DEPTH:  # deeper than that is refused anyway
                stack.extend((v, d + 1) for v in (x.values() if isinstance(x, dict) else x))
    return deepest


#: Largest workspace a record may claim (SQLite's INTEGER is 64-bit signed).
MAX_WORKSPACE = (1 << 62) - 1


def measurement_problem(status: Status, time: Any, spread: Any, workspace: Any) -> str:
    """Why a record's numbers are implausible (empty when they are fine)."""
    def bad(v: Any) -> bool:
        if isinstance(v, bool) or not isinstance(v, int | float):
            return True
        try:
            return not math.isfinite(v)
        except OverflowError:  # an integer beyond any float
            return True
    if not isinstance(workspace, int) or isinstance(workspace, bool) or \
            not 0 <= workspace <= MAX_WORKSPACE:
        return f"workspace {workspace!r} is not a byte count"
    if spread is not None and (bad(spread) or spread < 0):
        return f"spread {spread!r} is not a non-negative number of seconds"
    if time is None:
        return "an ok record needs a time" if status is Status.OK else ""
    if bad(time) or time < 0:
        return f"time {time!r} is not a non-negative number of seconds"
    if status is Status.OK and time < MIN_TIME:
        return (f"time {time:g} s is below the {MIN_TIME:g} s floor no kernel call gets under "
                "(a forged or broken measurement)")
    return ""


#: Keys of kernels the CPU code generator tuned (nfc.runtime.tuning.kernels.KEY_PREFIX, any
#: version); other keys of the same category (device benchmarks: nfc.runtime.device_params)
#: store other data in the schedule field.
_KERNEL_KEY = re.compile(r"nfk[0-9]+-")


def schedule_problem(category: Mapping[str, Any], key: str, schedule: Any) -> str:
    """Why `schedule` cannot be a schedule of nfc's CPU code generator (empty when it can,
    or when the record is not a kernel of this nfc's CPU schedule space, whose schedules
    this nfc cannot judge and never uses). The kernel is unknown here (a key is a hash), so
    this checks the template's form and value ranges; membership in the kernel's own space
    is checked when a compile uses the record (`kernels.apply_cached_schedules`)."""
    if not isinstance(schedule, dict):
        return "the schedule is not a JSON object"
    from nfc.runtime.tuning.category import schedule_space_version

    if category.get("backend") != "llvm" or not isinstance(key, str) or \
            not _KERNEL_KEY.match(key) or \
            category.get("schedule_space") != schedule_space_version():
        return ""
    from nfc.codegen.space import template_problem

    why = template_problem(schedule)
    return f"invalid schedule: {why}" if why else ""


def record_problem(rec: Record) -> str:
    """Why a record is implausible (empty when it is fine); see the module docstring."""
    m = rec.measurement
    return measurement_problem(m.status, m.time, m.spread, m.workspace) or \
        schedule_problem(rec.category, rec.key, json.loads(rec.schedule))


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
        """Validate one export line: CacheError naming `where` when it is malformed,
        RecordRejected when it is well-formed but implausible (`record_problem`)."""
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
        try:  # canonical JSON has no NaN or infinity: such a category or schedule is forged
            cid, sched_text = category_id(cat), canonical_json(need("schedule", dict))
        except ValueError:
            raise CacheError(f"{where}: the category or schedule holds NaN or infinity") \
                from None
        if "category_id" in obj and obj["category_id"] != cid:
            raise CacheError(f"{where}: 'category_id' does not match the category")
        try:
            status = Status(need("status", str))
        except ValueError:
            raise CacheError(f"{where}: unknown status '{obj['status']}'") from None
        t = need("time", (int, float), optional=True)
        spread = need("spread", (int, float), optional=True)
        ws = need("workspace", int)
        key, sched = need("key", str), need("schedule", dict)
        repro, naive = need("reproducible", bool), need("naive", bool)
        stamp_value = need("timestamp", (int, float))
        why = measurement_problem(status, t, spread, ws) or schedule_problem(cat, key, sched)
        try:
            stamp = float(stamp_value)
        except OverflowError:
            stamp = math.inf
        if not why and not math.isfinite(stamp):
            why = f"timestamp {stamp_value!r} is not a time"
        if why:
            raise RecordRejected(why)
        desc, error = need("desc", str, optional=True) or "", need("error", str,
                                                                    optional=True) or ""
        try:  # lone surrogates (`"\\ud800"`) parse but cannot be stored as text
            "".join((key, desc, error, sched_text, canonical_json(cat))).encode("utf-8")
        except UnicodeEncodeError:
            raise CacheError(f"{where}: a text field is not valid Unicode") from None
        m = Measurement(status, None if t is None else float(t),
                        None if spread is None else float(spread), ws, repro, error)
        return cls(cat, key, desc, sched_text, m, naive, stamp)


def write_jsonl(fp: IO[str], records: Iterable[Record]) -> int:
    """Write a header line and one line per record; returns the number of records."""
    fp.write(canonical_json({"format": EXPORT_FORMAT, "version": EXPORT_VERSION}) + "\n")
    n = 0
    for rec in records:
        fp.write(canonical_json(rec.to_json()) + "\n")
        n += 1
    return n


def read_jsonl(fp: IO[str], *, source: str) -> tuple[list[Record], list[str]]:
    """Parse and validate a whole export before anything is stored: (the records, the
    rejected ones as `source:line: why`). Raises CacheError when the file is malformed."""
    out: list[Record] = []
    rejected: list[str] = []
    header_seen = False
    lineno = 0
    while line := fp.readline(MAX_LINE + 1):
        lineno += 1
        where = f"{source}:{lineno}"
        if len(line) > MAX_LINE:
            raise CacheError(f"{where}: line longer than {MAX_LINE} characters (not a record "
                             "of an nfc tuning cache export)")
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as err:
            raise CacheError(f"{where}: not JSON ({err.msg})") from None
        except RecursionError:
            raise CacheError(f"{where}: not a record: JSON nested too deeply") from None
        if json_depth(obj) > MAX_DEPTH:
            raise CacheError(f"{where}: not a record: JSON nested more than {MAX_DEPTH} "
                             "levels deep")
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
        try:
            out.append(Record.from_json(obj, where))
        except RecordRejected as why:
            rejected.append(f"{where}: {why}")
    if not header_seen:
        raise CacheError(f"{source}: empty file, not an nfc tuning cache export")
    return out, rejected


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
    cats: dict[str, dict[str, Any]] = {}
    for cid, text in conn.execute("SELECT id, json FROM categories"):
        try:
            cat = json.loads(text)
            if category_id(cat) != cid:
                problems.append(f"category {cid}: id does not match its JSON")
            else:
                cats[cid] = cat
        except (ValueError, TypeError, AttributeError, RecursionError):
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
        except (ValueError, RecursionError):
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
        why = measurement_problem(Status(status), t, spread, ws) or (
            schedule_problem(cats[cid], key, parsed) if cid in cats else "")
        if why:
            problems.append(f"{where}: {why}")
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
