"""The SQLite layer under the tuning cache: the schema, row conversion, and writes that wait
for other processes (`BEGIN IMMEDIATE`, retried while the database is busy)."""

from __future__ import annotations

import json
import random
import sqlite3
import time
from collections.abc import Callable
from typing import Any, TypeVar

from nfc.runtime.tuning.model import Entry, Status

_T = TypeVar("_T")

SCHEMA_VERSION = 1
"""Version of the database layout; a database with a newer one is refused."""

SCHEMA = """
CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS categories (id TEXT PRIMARY KEY, json TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS kernels (
    category TEXT NOT NULL, key TEXT NOT NULL, desc TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (category, key));
CREATE TABLE IF NOT EXISTS records (
    id INTEGER PRIMARY KEY,
    category TEXT NOT NULL, key TEXT NOT NULL, schedule TEXT NOT NULL,
    status TEXT NOT NULL, time REAL, spread REAL, workspace INTEGER NOT NULL,
    reproducible INTEGER NOT NULL, naive INTEGER NOT NULL, error TEXT NOT NULL,
    timestamp REAL NOT NULL, pruned INTEGER NOT NULL DEFAULT 0,
    UNIQUE (category, key, schedule));
CREATE INDEX IF NOT EXISTS records_front ON records (category, key, status, pruned, time);
"""
"""The tables: categories by id, kernel descriptions, and one row per measured schedule."""

COLUMNS = ("schedule, status, time, spread, workspace, reproducible, naive, error, "
           "timestamp, pruned")
"""The columns `row_entry` reads, in order."""
R_COLUMNS = ", ".join(f"r.{c.strip()}" for c in COLUMNS.split(","))
"""`COLUMNS` qualified with the alias `r`."""


class RowDamaged(Exception):
    """A stored row that does not read back (its JSON, status or numbers are broken)."""


def row_entry(row: tuple[Any, ...]) -> Entry:
    """The entry of a row selected with `COLUMNS`; RowDamaged when it does not read back."""
    sched, status, t, spread, ws, repro, naive, error, stamp, pruned = row
    try:
        schedule = json.loads(sched)
        if not isinstance(schedule, dict):
            raise ValueError("the schedule is not a JSON object")
        st = Status(status)
        if st is Status.OK and not isinstance(t, float | int):
            raise ValueError(f"an ok record has time {t!r}")
        return Entry(schedule=schedule, status=st, time=t, spread=spread,
                     workspace=int(ws), reproducible=bool(repro), naive=bool(naive),
                     error=str(error), timestamp=stamp, pruned=bool(pruned))
    except (ValueError, TypeError, RecursionError) as err:
        raise RowDamaged(f"a stored record does not read back: {err}") from None


def has_table(conn: sqlite3.Connection, name: str) -> bool:
    """Whether the database has a table `name`."""
    return conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
                        (name,)).fetchone() is not None


#: SQLite result codes that mean the file itself is broken.
_DAMAGE_CODES = {sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB}
#: Messages of the same, for errors that carry no code (and Python's own text decoding).
_DAMAGE_TEXT = ("malformed", "not a database", "could not decode", "corrupt")


def is_damage(err: sqlite3.Error) -> bool:
    """Whether an error means the database file is damaged (not busy, not a bug of ours)."""
    code = getattr(err, "sqlite_errorcode", None)
    if code is not None and code & 0xFF in _DAMAGE_CODES:
        return True
    text = str(err).lower()
    return any(t in text for t in _DAMAGE_TEXT)


def is_busy(err: sqlite3.Error) -> bool:
    """Whether an error means another connection holds the lock (worth retrying)."""
    code = getattr(err, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
    return "locked" in str(err) or "busy" in str(err)


def retry_busy(fn: Callable[[], _T], timeout: float) -> _T:
    """Call `fn` until it does not fail with a busy database, for at most `timeout` seconds
    (with jittered exponential backoff, so competing writers do not retry in lockstep)."""
    deadline = time.monotonic() + timeout
    delay = 0.005
    while True:
        try:
            return fn()
        except sqlite3.OperationalError as err:
            if not is_busy(err) or time.monotonic() > deadline:
                raise
        time.sleep(delay * (0.5 + random.random()))
        delay = min(delay * 2, 0.25)


def write_transaction(conn: sqlite3.Connection, fn: Callable[[sqlite3.Connection], _T],
                      timeout: float) -> _T:
    """Run `fn(conn)` in one `BEGIN IMMEDIATE` transaction (the write lock is taken up
    front, so the transaction cannot fail half-way for lack of it), retried while busy.
    `conn` must be in autocommit mode (`isolation_level=None`)."""
    def attempt() -> _T:
        conn.execute("BEGIN IMMEDIATE")
        try:
            result = fn(conn)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return result
    return retry_busy(attempt, timeout)
