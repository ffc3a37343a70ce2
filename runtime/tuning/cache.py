"""The persistent tuning cache: every measured schedule, per category and kernel, in SQLite.

Several processes may tune into one database at once: it runs in WAL mode, every write is a
`BEGIN IMMEDIATE` transaction retried while the database is busy, and each measurement is
committed on its own, so a killed tuner loses at most the candidate it was measuring.
See docs/tuning-cache.md for the model (category, key, value, the Pareto rule).

Opening a cache checks it (`health_problems`): the SQLite header, then SQLite's own
`integrity_check` (files up to `FULL_CHECK_BYTES`) or `quick_check` (larger files). A damaged
file raises `CacheDamaged`, and so does damage met later by a read or a write; the compiler
then falls back to default schedules with a warning (`kernels.open_cache`), `nfc tune` and
`nfc cache` stop with an error, and `nfc cache repair` salvages what can still be read.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sqlite3
import time as _time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any, TypeVar

from nfc.fsutil import private_dir
from nfc.runtime.tuning import exchange
from nfc.runtime.tuning.model import (
    CacheDamaged,
    CacheError,
    Entry,
    KeyInfo,
    Measurement,
    MergeStats,
    Status,
    canonical_json,
    category_id,
    dominated_rows,
    dominates,
)
from nfc.runtime.tuning.sqlite_util import (
    COLUMNS,
    R_COLUMNS,
    SCHEMA,
    SCHEMA_VERSION,
    RowDamaged,
    has_table,
    is_damage,
    retry_busy,
    row_entry,
    write_transaction,
)

_T = TypeVar("_T")

CategoryLike = Mapping[str, Any] | str
"""A category dict, or the id `category_id` computed from one."""


def default_cache_path() -> Path:
    """`$NFC_CACHE_DIR/tuning.sqlite`, else `~/.cache/nfc/tuning.sqlite`."""
    root = os.environ.get("NFC_CACHE_DIR")
    base = Path(root) if root else Path.home() / ".cache" / "nfc"
    return base / "tuning.sqlite"


FULL_CHECK_BYTES = 8 << 20
"""Files up to this size get SQLite's full `integrity_check` when opened (it also checks
every index against its table); larger files get `quick_check`, which skips only that
cross-check. Measured on this (shared, 2-core) machine with warm files: opening 12,800
records (6.3 MB) takes 25-30 ms with the full check; 100,000 records (49 MB) 55-65 ms with
the quick one, where the full check would take 120-240 ms. A tuned model is typically about
a thousand records (under 1 MB: a few ms). `nfc cache verify` always runs the full check."""

_SQLITE_MAGIC = b"SQLite format 3\x00"


def header_problem(path: Path) -> str:
    """What is wrong with the 100-byte SQLite header of `path` (empty when nothing is, or when
    the file is empty, which SQLite reads as an empty database). Catches what SQLite lets
    pass until later: format bytes that make the file read-only, a page size it would
    reject, a file cut short."""
    try:
        size = path.stat().st_size
        if size == 0:
            return ""
        with open(path, "rb") as fp:
            head = fp.read(100)
    except FileNotFoundError:
        return ""  # a new cache
    except OSError as err:
        return f"cannot read it: {err.strerror or err}"
    if len(head) < 100 or not head.startswith(_SQLITE_MAGIC):
        return "not an SQLite database (a wrong path?)"
    page = int.from_bytes(head[16:18], "big")
    page = 65536 if page == 1 else page
    if page < 512 or page & (page - 1):
        return f"the header gives page size {page}"
    if head[18] not in (1, 2) or head[19] not in (1, 2) or head[21:24] != b"\x40\x20\x20":
        return "the header's format bytes are damaged"
    if size % page:
        return f"its size ({size} bytes) is not a whole number of {page}-byte pages (cut short)"
    pages = int.from_bytes(head[28:32], "big")
    if head[24:28] == head[92:96] and pages * page > size:
        return f"the header counts {pages} pages but the file holds {size // page} (cut short)"
    return ""


class TuningCache:
    """A tuning cache database; one connection, for use by one thread.

    `create=False` refuses a missing file instead of creating an empty cache.
    `lock_timeout` bounds how long a write waits for other writers, in seconds.
    `check=False` skips the check of the file on opening (`nfc cache verify` and repair use
    it to look at a damaged file); CacheDamaged is raised when the check fails.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None, *, create: bool = True,
                 lock_timeout: float = 30.0, check: bool = True) -> None:
        self.path = Path(path) if path is not None else default_cache_path()
        self.lock_timeout = lock_timeout
        memory = str(self.path) == ":memory:"
        if not memory and not self.path.exists():
            if not create:
                raise CacheError(f"no tuning cache at '{self.path}'")
            parent = self.path.parent
            if not parent.exists() or parent == default_cache_path().parent:
                private_dir(parent)  # nfc's own directory: owner only
        if check and not memory and (why := header_problem(self.path)):
            raise CacheDamaged(str(self.path), [why])
        try:
            self._conn = sqlite3.connect(str(self.path), timeout=lock_timeout,
                                         isolation_level=None)
        except sqlite3.Error as err:
            raise CacheError(f"cannot open tuning cache '{self.path}': {err}") from None
        try:
            self._open(create, check and not memory)
        except sqlite3.DatabaseError as err:
            self._conn.close()
            if is_damage(err):
                raise CacheDamaged(str(self.path), [str(err)]) from None
            raise CacheError(f"'{self.path}' is not a usable tuning cache: {err}") from None
        except BaseException:
            self._conn.close()
            raise

    def _open(self, create: bool, check: bool) -> None:
        self._conn.execute(f"PRAGMA busy_timeout = {int(self.lock_timeout * 1000)}")
        if check:
            problems = self.health_problems()
            if problems:
                raise CacheDamaged(str(self.path), problems)
        tables = {r[0] for r in self._conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "records" not in tables and not create:
            if not tables:
                raise CacheError(f"'{self.path}' is empty, not a tuning cache yet (a run of "
                                 "`nfc tune` stopped before its first write?)")
            raise CacheError(f"'{self.path}' is an SQLite database but not a tuning cache")
        if "schema_version" in tables:
            self._check_version(self._conn)
        # WAL lets readers run beside a writer; NORMAL sync survives a killed process.
        # Both, and the schema, are written only when missing, so reading needs no write.
        if self._conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
            self._retry(lambda: self._conn.execute("PRAGMA journal_mode = WAL").fetchone())
        self._conn.execute("PRAGMA synchronous = NORMAL")
        if not {"schema_version", "categories", "kernels", "records"} <= tables:
            self._write(self._init_schema)

    def health_problems(self, *, full: bool | None = None) -> list[str]:
        """What SQLite's integrity check finds (empty when the file is sound): the full
        `integrity_check` when `full`, else `quick_check`; None picks by the file's size
        (`FULL_CHECK_BYTES`). At most 20 problems are listed."""
        if full is None:
            try:
                full = self.path.stat().st_size <= FULL_CHECK_BYTES
            except OSError:
                full = True
        pragma = "integrity_check" if full else "quick_check"
        try:
            rows = self._retry(lambda: self._conn.execute(f"PRAGMA {pragma}(20)").fetchall())
        except sqlite3.DatabaseError as err:
            if is_damage(err):
                return [str(err)]
            raise
        return [" ".join(str(r[0]).split()) for r in rows if r[0] != "ok"]

    def _check_version(self, conn: sqlite3.Connection) -> None:
        version = conn.execute("SELECT max(version) FROM schema_version").fetchone()[0]
        if version is not None and version > SCHEMA_VERSION:
            raise CacheError(
                f"tuning cache '{self.path}' has schema version {version}, newer than the "
                f"{SCHEMA_VERSION} this nfc understands; upgrade nfc or use another --db")

    def _init_schema(self, conn: sqlite3.Connection) -> None:
        if has_table(conn, "schema_version"):  # another process may have just made it
            self._check_version(conn)
        # statement by statement: executescript would commit our transaction
        for stmt in filter(str.strip, SCHEMA.split(";")):
            conn.execute(stmt)
        if conn.execute("SELECT max(version) FROM schema_version").fetchone()[0] is None:
            conn.execute("INSERT INTO schema_version VALUES (?)", (SCHEMA_VERSION,))

    # -- plumbing --------------------------------------------------------------------------

    def close(self) -> None:
        """Close the connection (committed data is already on disk)."""
        self._conn.close()

    def __enter__(self) -> TuningCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _retry(self, fn: Callable[[], _T]) -> _T:
        return retry_busy(fn, self.lock_timeout)

    @contextlib.contextmanager
    def _guard(self) -> Iterator[None]:
        """Turn damage met while reading or writing into CacheDamaged."""
        try:
            yield
        except sqlite3.DatabaseError as err:
            if is_damage(err):
                raise CacheDamaged(str(self.path), [str(err)]) from None
            raise
        except RowDamaged as err:
            raise CacheDamaged(str(self.path), [str(err)]) from None

    def _write(self, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        """Run `fn` in one `BEGIN IMMEDIATE` transaction, retried while the DB is busy."""
        with self._guard():
            return write_transaction(self._conn, fn, self.lock_timeout)

    def _rows(self, sql: str, params: Any = ()) -> list[Any]:
        """All rows of a query; damage raises CacheDamaged."""
        with self._guard():
            return self._conn.execute(sql, params).fetchall()

    def _entry(self, row: tuple[Any, ...]) -> Entry:
        with self._guard():
            return row_entry(row)

    @staticmethod
    def category_id(category: CategoryLike) -> str:
        """The id (hash of the canonical JSON) of a category dict; an id is returned as is."""
        return category if isinstance(category, str) else category_id(category)

    # -- writing ---------------------------------------------------------------------------

    def put(self, category: Mapping[str, Any], key: str, schedule: Mapping[str, Any],
            time: float | None = None, *, spread: float | None = None, workspace: int = 0,
            reproducible: bool = True, naive: bool = False, status: Status | str = Status.OK,
            error: str = "", desc: str = "", timestamp: float | None = None) -> Entry:
        """Record one measurement (replacing an earlier one of the same schedule) and prune
        the entries it dominates; returns the stored entry (`pruned` if it is dominated)."""
        m = Measurement(Status(status), time, spread, workspace, reproducible, error)
        return self.put_measurement(category, key, schedule, m, naive=naive, desc=desc,
                                    timestamp=timestamp)

    def put_measurement(self, category: Mapping[str, Any], key: str,
                        schedule: Mapping[str, Any], m: Measurement, *, naive: bool = False,
                        desc: str = "", timestamp: float | None = None) -> Entry:
        """`put` taking a `Measurement`; each call is its own committed transaction."""
        assert isinstance(category, Mapping), "put needs the category dict, not its id"
        rec = exchange.Record(
            category=dict(category), key=key, desc=desc, schedule=canonical_json(dict(schedule)),
            measurement=m, naive=naive,
            timestamp=_time.time() if timestamp is None else timestamp)
        self._write(lambda conn: self._store(conn, rec, newer_only=False))
        found = self.lookup(category, key, schedule)
        assert found is not None
        return found

    def _store(self, conn: sqlite3.Connection, rec: exchange.Record, *,
               newer_only: bool) -> str:
        """Insert or update one record inside a transaction: 'added', 'updated' or 'skipped'."""
        cid = category_id(rec.category)
        conn.execute("INSERT OR IGNORE INTO categories VALUES (?, ?)",
                     (cid, canonical_json(rec.category)))
        conn.execute("INSERT OR IGNORE INTO kernels VALUES (?, ?, ?)", (cid, rec.key, rec.desc))
        if rec.desc:
            conn.execute("UPDATE kernels SET desc = ? WHERE category = ? AND key = ?",
                         (rec.desc, cid, rec.key))
        old = conn.execute("SELECT timestamp FROM records WHERE category = ? AND key = ? "
                           "AND schedule = ?", (cid, rec.key, rec.schedule)).fetchone()
        if old is not None and newer_only and old[0] >= rec.timestamp:
            return "skipped"
        m = rec.measurement
        conn.execute(
            "INSERT INTO records (category, key, schedule, status, time, spread, workspace, "
            "reproducible, naive, error, timestamp) VALUES (?,?,?,?,?,?,?,?,?,?,?) "
            "ON CONFLICT (category, key, schedule) DO UPDATE SET status = excluded.status, "
            "time = excluded.time, spread = excluded.spread, workspace = excluded.workspace, "
            "reproducible = excluded.reproducible, naive = excluded.naive, "
            "error = excluded.error, timestamp = excluded.timestamp, pruned = 0",
            (cid, rec.key, rec.schedule, str(m.status), m.time, m.spread, m.workspace,
             int(m.reproducible), int(rec.naive), m.error, rec.timestamp))
        self._refresh_front(conn, cid, rec.key)
        return "added" if old is None else "updated"

    @staticmethod
    def _refresh_front(conn: sqlite3.Connection, cid: str, key: str) -> None:
        rows = conn.execute("SELECT id, time, workspace, reproducible, naive, pruned FROM "
                            "records WHERE category = ? AND key = ? AND status = 'ok'",
                            (cid, key)).fetchall()
        dominated = dominated_rows([r[:5] for r in rows])
        changed = [(int(r[0] in dominated), r[0]) for r in rows
                   if bool(r[5]) != (r[0] in dominated)]
        conn.executemany("UPDATE records SET pruned = ? WHERE id = ?", changed)

    # -- reading ---------------------------------------------------------------------------

    def lookup(self, category: CategoryLike, key: str,
               schedule: Mapping[str, Any]) -> Entry | None:
        """The stored measurement of `schedule` (pruned and failed ones too), if any."""
        rows = self._rows(
            f"SELECT {COLUMNS} FROM records WHERE category = ? AND key = ? AND schedule = ?",
            (self.category_id(category), key, canonical_json(dict(schedule))))
        return self._entry(rows[0]) if rows else None

    def has(self, category: CategoryLike, key: str, schedule: Mapping[str, Any]) -> bool:
        """Whether `schedule` was already measured (ok, failed or pruned) for this kernel."""
        return self.lookup(category, key, schedule) is not None

    def best(self, category: CategoryLike, key: str, *, reproducible: bool = False,
             workspace_limit: int | None = None, include_naive: bool = True) -> Entry | None:
        """The fastest ok entry meeting the filters; never a failed or foreign one."""
        sql = (f"SELECT {COLUMNS} FROM records WHERE category = ? AND key = ? "
               "AND status = 'ok' AND pruned = 0")
        params: list[Any] = [self.category_id(category), key]
        if reproducible:
            sql += " AND reproducible = 1"
        if not include_naive:
            sql += " AND naive = 0"
        if workspace_limit is not None:
            sql += " AND workspace <= ?"
            params.append(workspace_limit)
        rows = self._rows(sql + " ORDER BY time, workspace, id LIMIT 1", params)
        return self._entry(rows[0]) if rows else None

    def entries(self, category: CategoryLike, key: str, *, include_failed: bool = True,
                include_pruned: bool = False) -> list[Entry]:
        """The Pareto front sorted by time, then (optionally) pruned and failed entries."""
        rows = self._rows(
            f"SELECT {COLUMNS} FROM records WHERE category = ? AND key = ? "
            "ORDER BY status != 'ok', pruned, time, workspace, timestamp",
            (self.category_id(category), key))
        out = [self._entry(r) for r in rows]
        return [e for e in out if (include_failed or e.status is Status.OK)
                and (include_pruned or not e.pruned)]

    def categories(self) -> dict[str, dict[str, Any]]:
        """Every category the cache holds records for, by id."""
        out: dict[str, dict[str, Any]] = {}
        for cid, text in self._rows("SELECT id, json FROM categories ORDER BY id"):
            try:
                cat = json.loads(text)
            except (ValueError, TypeError, RecursionError):
                cat = None
            if not isinstance(cat, dict):
                raise CacheDamaged(str(self.path), [f"category {cid} does not read back"])
            out[cid] = cat
        return out

    def list_keys(self, category: CategoryLike | None = None, *,
                  prefix: str = "") -> list[KeyInfo]:
        """A summary per tuned kernel, optionally of one category and keys with a prefix."""
        sql = ("SELECT r.category, r.key, coalesce(k.desc, ''), "
               "sum(r.status = 'ok' AND r.pruned = 0), sum(r.status = 'ok' AND r.pruned = 1), "
               "sum(r.status != 'ok'), min(CASE WHEN r.status = 'ok' THEN r.time END) "
               "FROM records r LEFT JOIN kernels k ON k.category = r.category AND k.key = r.key "
               "WHERE substr(r.key, 1, ?) = ?")
        params: list[Any] = [len(prefix), prefix]
        if category is not None:
            sql += " AND r.category = ?"
            params.append(self.category_id(category))
        rows = self._rows(sql + " GROUP BY r.category, r.key ORDER BY r.category, r.key", params)
        return [KeyInfo(c, k, d, int(a), int(p), int(f), t) for c, k, d, a, p, f, t in rows]

    def records(self, category: CategoryLike | None = None,
                key: str | None = None) -> Iterator[exchange.Record]:
        """Every record (the export view), ordered by category, key and time. CacheDamaged
        when a row does not read back as a record."""
        cats = self.categories()
        sql = (f"SELECT r.category, r.key, coalesce(k.desc, ''), {R_COLUMNS} FROM records r "
               "LEFT JOIN kernels k ON k.category = r.category AND k.key = r.key WHERE 1")
        params: list[Any] = []
        if category is not None:
            sql += " AND r.category = ?"
            params.append(self.category_id(category))
        if key is not None:
            sql += " AND r.key = ?"
            params.append(key)
        for row in self._rows(sql + " ORDER BY r.category, r.key, r.time", params):
            if row[0] not in cats:
                raise CacheDamaged(str(self.path), [
                    f"a record of '{row[1]}' names unknown category {row[0]}"])
            e = self._entry(row[3:])
            if e.workspace < 0 or e.status is Status.OK and not (
                    isinstance(e.time, float | int) and math.isfinite(e.time) and e.time >= 0):
                raise CacheDamaged(str(self.path), [
                    f"a record of '{row[1]}' has time {e.time!r}, workspace {e.workspace!r}"])
            yield exchange.Record.from_entry(cats[row[0]], row[1], row[2], e)

    # -- sharing and housekeeping ----------------------------------------------------------

    def export_jsonl(self, fp: IO[str], *, category: CategoryLike | None = None,
                     key: str | None = None) -> int:
        """Write every record (with its category dict) as JSON lines; returns the count."""
        return exchange.write_jsonl(fp, self.records(category, key))

    def import_jsonl(self, fp: IO[str], *, allow_foreign_category: bool = False,
                     current_category: Mapping[str, Any] | None = None,
                     source: str | None = None) -> MergeStats:
        """Add the records of an export.

        A malformed file is refused as a whole (CacheError, nothing imported), and so is one
        with a record whose category differs from `current_category`, unless
        `allow_foreign_category`; with no current category given, every category is accepted
        (lookups still never return a foreign record). Implausible records (a time below
        `MIN_TIME`, an invalid schedule; see `exchange.record_problem`) are left out and
        listed in the result's `rejected`. Of two measurements of one schedule the newer is
        kept. `source` names the input in messages (default: the file's name).
        """
        recs, rejected = exchange.read_jsonl(
            fp, source=source or getattr(fp, "name", "<input>"))
        if current_category is not None and not allow_foreign_category:
            exchange.check_categories(recs, current_category)
        stats = self._store_all(recs)
        return MergeStats(stats.added, stats.updated, stats.skipped, tuple(rejected))

    def merge(self, other_path: str | os.PathLike[str]) -> MergeStats:
        """Add every record of another cache file (any category); the newer measurement of a
        schedule wins. Implausible records are left out and listed, as for an import."""
        other_path = Path(other_path)
        if self.path.exists() and other_path.exists() and self.path.samefile(other_path):
            return MergeStats()
        with TuningCache(other_path, create=False) as other:
            recs, rejected = [], []
            for rec in other.records():
                why = exchange.record_problem(rec)
                if why:
                    rejected.append(f"{other_path}: a record of '{rec.key}': {why}")
                else:
                    recs.append(rec)
        stats = self._store_all(recs)
        return MergeStats(stats.added, stats.updated, stats.skipped, tuple(rejected))

    def _store_all(self, recs: list[exchange.Record]) -> MergeStats:
        def store(conn: sqlite3.Connection) -> MergeStats:
            counts = {"added": 0, "updated": 0, "skipped": 0}
            for rec in recs:
                counts[self._store(conn, rec, newer_only=True)] += 1
            return MergeStats(**counts)
        return self._write(store)

    def prune(self, *, dominated: bool = True, failed: bool = False,
              older_than: float | None = None, category: CategoryLike | None = None,
              vacuum: bool = False) -> int:
        """Delete records: dominated ones, failed ones, ones older than `older_than` seconds,
        optionally only in one category; returns how many. Deleted measurements will be
        measured again by a later search."""
        conds = []
        if dominated:
            conds.append("(status = 'ok' AND pruned = 1)")
        if failed:
            conds.append("status != 'ok'")
        params: list[Any] = []
        if older_than is not None:
            conds.append("timestamp < ?")
            params.append(_time.time() - older_than)
        if not conds:
            return 0
        sql = "DELETE FROM records WHERE (" + " OR ".join(conds) + ")"
        if category is not None:
            sql += " AND category = ?"
            params.append(self.category_id(category))

        def delete(conn: sqlite3.Connection) -> int:
            n = conn.execute(sql, params).rowcount
            for cid, key in conn.execute("SELECT category, key FROM kernels").fetchall():
                self._refresh_front(conn, cid, key)
            conn.execute("DELETE FROM kernels WHERE NOT EXISTS (SELECT 1 FROM records r "
                         "WHERE r.category = kernels.category AND r.key = kernels.key)")
            conn.execute("DELETE FROM categories WHERE NOT EXISTS (SELECT 1 FROM records r "
                         "WHERE r.category = categories.id)")
            return n
        n = self._write(delete)
        if vacuum:
            with self._guard():
                self._retry(lambda: self._conn.execute("VACUUM"))
        return n

    def verify(self) -> list[str]:
        """Check the file and the invariants; returns the problems found (empty when sound):
        the header, SQLite's full `integrity_check`, every stored JSON field, every record's
        plausibility (`exchange.record_problem`) and the Pareto rule."""
        problems = [] if str(self.path) == ":memory:" else [
            p for p in [header_problem(self.path)] if p]
        problems += self.health_problems(full=True)
        try:
            return problems + exchange.check_invariants(self._conn, dominates)
        except sqlite3.DatabaseError as err:
            return [*problems, f"database error: {err}"]
