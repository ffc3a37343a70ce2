"""`nfc cache repair`: rebuild a damaged tuning cache from the records that still read back.

    result = repair_cache(path)      # path.damaged-<time> keeps the old file
    print(result.message())

The damaged file is copied (with its `-wal`), the copy's 100-byte header is mended where it
can be (the magic string, the page size, the format bytes, a page count that a cut-short file
no longer holds: SQLite refuses the whole file for any of these), and the copy is read table
by table in ranges of row ids, so one unreadable page costs the rows on it, not the rest.
Every row that reads is checked as an import checks a record (`exchange.record_problem`)
and stored into a new database written beside the old one. Then
the old file (and its `-wal`/`-shm` companions) is renamed to `<name>.damaged-<time>` and the
new one renamed into its place: at every moment one of them holds every record that was
readable, and nothing is deleted. Run it when no tuner is writing into the cache.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nfc.fsutil import TMP_SUFFIX, fsync_dir
from nfc.runtime.tuning import exchange
from nfc.runtime.tuning.model import (
    CacheDamaged,
    CacheError,
    Measurement,
    Status,
    canonical_json,
    category_id,
)
from nfc.runtime.tuning.sqlite_util import RowDamaged, row_entry

#: Row ids read per query; a range that fails is read row by row.
CHUNK = 256
#: When the largest row id cannot be read, stop after this many empty ranges in a row.
EMPTY_CHUNKS = 64


@dataclass(frozen=True)
class RepairResult:
    """What `repair_cache` did."""

    path: Path
    """The cache file (now the rebuilt one, unless nothing needed repair)."""
    problems: tuple[str, ...]
    """What `verify` found before the repair (empty: nothing was done)."""
    aside: Path | None = None
    """Where the damaged file was moved."""
    kept: int = 0
    """Records stored in the rebuilt cache."""
    rejected: tuple[str, ...] = ()
    """Records that read back but were implausible (left out), as `where: why`."""
    unreadable: int = 0
    """Rows (or whole ranges of rows) that could not be read."""
    notes: tuple[str, ...] = field(default_factory=tuple)
    """Other things worth saying (a table that could not be read at all)."""

    def message(self) -> str:
        """A short human-readable summary."""
        if not self.problems:
            return f"'{self.path}' has no problems; nothing to repair"
        text = (f"rebuilt '{self.path}' with {self.kept} record(s); the damaged file is now "
                f"'{self.aside}'")
        if self.rejected:
            text += f"\n{len(self.rejected)} implausible record(s) left out"
        if self.unreadable:
            text += f"\n{self.unreadable} unreadable row(s) or range(s) lost"
        return "\n".join([text, *self.notes])


def _salvage(conn: sqlite3.Connection, table: str, columns: str
             ) -> tuple[list[tuple[Any, ...]], int]:
    """The rows of `table` that read back, and how many rows or ranges did not."""
    try:
        top = conn.execute(f"SELECT max(rowid) FROM {table}").fetchone()[0]
        hi: int | None = int(top) if top is not None else 0
    except sqlite3.DatabaseError:
        hi = None
    rows: list[tuple[Any, ...]] = []
    failed, lo, empty = 0, 0, 0
    sql = f"SELECT {columns} FROM {table} WHERE rowid >= ? AND rowid < ?"
    while (hi is not None and lo <= hi) or (hi is None and empty < EMPTY_CHUNKS):
        try:
            got = conn.execute(sql, (lo, lo + CHUNK)).fetchall()
        except sqlite3.DatabaseError:
            got = []
            misses = 0
            for rid in range(lo, lo + CHUNK):
                try:
                    got += conn.execute(sql, (rid, rid + 1)).fetchall()
                    misses = 0
                except sqlite3.DatabaseError:
                    failed += 1
                    misses += 1
                    if misses >= 16:  # a whole unreadable page: skip the rest of the range
                        break
        empty = empty + 1 if not got else 0
        rows += got
        lo += CHUNK
    return rows, failed


def _mend_header(copy: Path, has_wal: bool) -> None:
    """Make the header of `copy` one SQLite accepts, keeping what is plausible."""
    size = copy.stat().st_size
    if size < 100:
        return  # no page 1: nothing to read
    with open(copy, "r+b") as fp:
        head = bytearray(fp.read(100))
        head[0:16] = b"SQLite format 3\x00"
        page = int.from_bytes(head[16:18], "big")
        page = 65536 if page == 1 else page
        if page < 512 or page > 65536 or page & (page - 1):
            page = 4096  # SQLite's default, and what nfc's caches use
            head[16:18] = page.to_bytes(2, "big")
        head[18] = head[19] = 2 if has_wal else 1
        head[21:24] = b"\x40\x20\x20"
        # a page count the file cannot hold: make SQLite count the pages itself
        if int.from_bytes(head[28:32], "big") * page != size - size % page:
            head[92:96] = (int.from_bytes(head[24:28], "big") ^ 1).to_bytes(4, "big")
        fp.seek(0)
        fp.write(head)
        fp.truncate(size - size % page)


def _read(path: Path) -> tuple[list[exchange.Record], list[str], int, list[str]]:
    """(records, rejected, unreadable, notes) salvaged from the file at `path` (read from a
    mended copy; the file itself is not touched)."""
    with tempfile.TemporaryDirectory(prefix="nfc-repair-") as tmp:
        copy = Path(tmp) / "copy.sqlite"
        shutil.copyfile(path, copy)
        wal = path.with_name(path.name + "-wal")
        if wal.exists():
            shutil.copyfile(wal, copy.with_name("copy.sqlite-wal"))
        _mend_header(copy, wal.exists())
        return _read_rows(copy)


def _read_rows(path: Path) -> tuple[list[exchange.Record], list[str], int, list[str]]:
    conn = sqlite3.connect(str(path), isolation_level=None)
    try:
        cats_rows, bad_c = _salvage(conn, "categories", "id, json")
        kern_rows, bad_k = _salvage(conn, "kernels", "category, key, desc")
        rec_rows, bad_r = _salvage(
            conn, "records", "category, key, schedule, status, time, spread, workspace, "
            "reproducible, naive, error, timestamp, pruned")
    finally:
        conn.close()
    notes = []
    if not cats_rows and not rec_rows:
        notes.append("no record could be read")
    cats: dict[str, dict[str, Any]] = {}
    for cid, text in cats_rows:
        with contextlib.suppress(ValueError, TypeError, RecursionError, AttributeError):
            cat = json.loads(text)
            if isinstance(cat, dict) and category_id(cat) == cid:
                cats[cid] = cat
    descs = {(c, k): d for c, k, d in kern_rows if isinstance(d, str)}
    recs: list[exchange.Record] = []
    rejected: list[str] = []
    unreadable = bad_c + bad_k + bad_r
    for row in rec_rows:
        cid, key = row[0], row[1]
        try:
            e = row_entry(row[2:])
        except RowDamaged:
            unreadable += 1
            continue
        if cid not in cats or not isinstance(key, str):
            unreadable += 1  # its category did not survive: it could never be used
            continue
        why = exchange.measurement_problem(e.status, e.time, e.spread, e.workspace) or \
            exchange.schedule_problem(cats[cid], key, e.schedule)
        if not why and not isinstance(e.timestamp, float | int):
            why = f"timestamp {e.timestamp!r} is not a time"
        if why:
            rejected.append(f"a record of '{key}': {why}")
            continue
        try:
            text = canonical_json(e.schedule)
        except (ValueError, TypeError, RecursionError):
            unreadable += 1
            continue
        m = Measurement(Status(e.status), e.time, e.spread, e.workspace, e.reproducible,
                        e.error)
        recs.append(exchange.Record(cats[cid], key, descs.get((cid, key), ""), text, m,
                                    e.naive, float(e.timestamp)))
    return recs, rejected, unreadable, notes


def _aside_name(path: Path) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    aside = path.with_name(f"{path.name}.damaged-{stamp}")
    n = 1
    while aside.exists():
        n += 1
        aside = path.with_name(f"{path.name}.damaged-{stamp}-{n}")
    return aside


def _companions(path: Path) -> Iterator[tuple[Path, str]]:
    for suffix in ("-wal", "-shm"):
        p = path.with_name(path.name + suffix)
        if p.exists():
            yield p, suffix


def repair_cache(path: str | os.PathLike[str], *, force: bool = False) -> RepairResult:
    """Rebuild the cache at `path` from its readable, plausible records when `verify` finds
    problems (or always with `force`); see the module docstring."""
    from nfc.runtime.tuning.cache import TuningCache

    path = Path(path)
    if not path.exists():
        raise CacheError(f"no tuning cache at '{path}'")
    try:
        with TuningCache(path, create=False, check=False) as cache:
            problems = cache.verify()
    except CacheDamaged as err:
        problems = err.problems
    except CacheError as err:
        problems = [str(err)]
    if not problems and not force:
        return RepairResult(path, ())
    recs, rejected, unreadable, notes = _read(path)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TMP_SUFFIX,
                                    dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        with TuningCache(tmp) as fresh:
            kept = fresh._store_all(recs)  # noqa: SLF001 - one transaction, newest wins
        aside = _aside_name(path)
        os.replace(path, aside)
        for companion, suffix in _companions(path):
            os.replace(companion, aside.with_name(aside.name + suffix))
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return RepairResult(path, tuple(problems or ["rebuilt on request"]), aside,
                        kept.added + kept.updated, tuple(rejected), unreadable, tuple(notes))
