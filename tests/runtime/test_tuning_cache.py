"""The tuning cache: categories, the Pareto rule, failures, sharing, schema and verification."""

from __future__ import annotations

import io
import json
import re
import sqlite3
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tuning_fakes import CATEGORY, OTHER_CPU, OTHER_VERSION

from nfc.runtime.tuning.cache import SCHEMA_VERSION, TuningCache, default_cache_path
from nfc.runtime.tuning.category import cpu_category, cuda_category
from nfc.runtime.tuning.model import CacheError, Status, category_id


@pytest.fixture
def cache(tmp_path: Path):
    with TuningCache(tmp_path / "t.sqlite") as c:
        yield c


def test_category_id_is_canonical_and_sensitive() -> None:
    reordered = dict(reversed(list(CATEGORY.items())))
    assert category_id(reordered) == category_id(CATEGORY)
    assert len({category_id(c) for c in (CATEGORY, OTHER_CPU, OTHER_VERSION)}) == 3


def test_category_probes_name_what_a_time_depends_on() -> None:
    cpu = cpu_category()
    assert {"backend", "device", "machine", "features", "cores", "schedule_space"} <= set(cpu)
    assert category_id(cpu_category()) == category_id(cpu)  # stable from call to call
    assert category_id(cpu_category(schedule_space="other")) != category_id(cpu)
    cuda = {"device": "GPU", "compute_capability": (8, 0), "runtime_version": "12.4",
            "schedule_space": "cuda-1"}
    a = cuda_category(driver_version="550.1", **cuda)
    b = cuda_category(driver_version="560.2", **cuda)
    assert a["compute_capability"] == "8.0" and category_id(a) != category_id(b)


def test_fast_run_rule_prunes_slower_entries_unless_they_use_less_memory(cache) -> None:
    cache.put(CATEGORY, "k", {"s": "fast-big"}, 1.0, workspace=100)
    slow_small = cache.put(CATEGORY, "k", {"s": "slow-small"}, 2.0, workspace=10)
    slow_big = cache.put(CATEGORY, "k", {"s": "slow-big"}, 3.0, workspace=100)
    assert not slow_small.pruned and slow_big.pruned
    front = cache.entries(CATEGORY, "k")
    assert [e.schedule["s"] for e in front] == ["fast-big", "slow-small"]
    # a new entry faster and smaller than everything prunes the whole old front
    cache.put(CATEGORY, "k", {"s": "winner"}, 0.5, workspace=5)
    assert [e.schedule["s"] for e in cache.entries(CATEGORY, "k")] == ["winner"]
    # pruned entries still count as measured, so a search never measures them again
    assert cache.has(CATEGORY, "k", {"s": "slow-big"})
    assert cache.lookup(CATEGORY, "k", {"s": "fast-big"}).time == 1.0
    assert cache.verify() == []


def test_workspace_limit_picks_the_fastest_that_fits(cache) -> None:
    cache.put(CATEGORY, "k", {"s": 1}, 1.0, workspace=1000)
    cache.put(CATEGORY, "k", {"s": 2}, 2.0, workspace=100)
    cache.put(CATEGORY, "k", {"s": 3}, 4.0, workspace=0)
    assert cache.best(CATEGORY, "k").schedule == {"s": 1}
    assert cache.best(CATEGORY, "k", workspace_limit=500).schedule == {"s": 2}
    assert cache.best(CATEGORY, "k", workspace_limit=0).schedule == {"s": 3}


def test_failed_entries_are_kept_but_never_best(cache) -> None:
    cache.put(CATEGORY, "k", {"s": "crash"}, None, status=Status.FAILED, error="SIGSEGV")
    assert cache.best(CATEGORY, "k") is None
    assert cache.has(CATEGORY, "k", {"s": "crash"})
    cache.put(CATEGORY, "k", {"s": "wrong"}, 0.1, status="wrong", error="differs")
    cache.put(CATEGORY, "k", {"s": "ok"}, 5.0)
    assert cache.best(CATEGORY, "k").schedule == {"s": "ok"}
    statuses = {e.schedule["s"]: e.status for e in cache.entries(CATEGORY, "k")}
    assert statuses == {"crash": Status.FAILED, "wrong": Status.WRONG, "ok": Status.OK}


def test_attributes_keep_entries_a_filter_still_needs(cache) -> None:
    cache.put(CATEGORY, "k", {"s": "fast-nondet"}, 1.0, reproducible=False)
    cache.put(CATEGORY, "k", {"s": "slow-det"}, 2.0, reproducible=True)
    cache.put(CATEGORY, "k", {"s": "naive"}, 0.5, naive=True)
    assert cache.best(CATEGORY, "k").schedule == {"s": "naive"}
    assert cache.best(CATEGORY, "k", include_naive=False).schedule == {"s": "fast-nondet"}
    assert cache.best(CATEGORY, "k", reproducible=True).schedule == {"s": "naive"}
    assert cache.best(CATEGORY, "k", reproducible=True, include_naive=False).schedule == \
        {"s": "slow-det"}


def test_records_of_another_category_are_never_returned(cache) -> None:
    for other in (OTHER_CPU, OTHER_VERSION):
        cache.put(other, "k", {"s": 1}, 1e-9, desc="measured elsewhere")
    assert cache.best(CATEGORY, "k") is None
    assert not cache.has(CATEGORY, "k", {"s": 1})
    assert cache.entries(CATEGORY, "k") == []
    assert cache.list_keys(CATEGORY) == []
    assert cache.best(OTHER_CPU, "k").time == 1e-9  # still there for its own machine


def test_schedules_are_compared_canonically(cache) -> None:
    cache.put(CATEGORY, "k", {"tile": (4, 8), "unroll": 2}, 1.0)
    assert cache.has(CATEGORY, "k", {"unroll": 2, "tile": [4, 8]})
    assert not cache.has(CATEGORY, "k", {"unroll": 2, "tile": [8, 4]})


STATUSES = st.sampled_from(["ok", "ok", "ok", "failed", "timeout"])
PUTS = st.lists(st.tuples(st.integers(0, 12), st.integers(1, 6).map(float), st.integers(0, 4),
                          st.booleans(), st.booleans(), STATUSES), max_size=30)


@settings(max_examples=60, deadline=None)
@given(PUTS)
def test_pareto_rule_holds_after_random_insertions(puts) -> None:
    latest = {}
    with tempfile.TemporaryDirectory() as tmp, TuningCache(Path(tmp) / "p.sqlite") as cache:
        for sid, t, ws, repro, naive, status in puts:
            cache.put(CATEGORY, "k", {"s": sid}, t if status == "ok" else None, workspace=ws,
                      reproducible=repro, naive=naive, status=status)
            latest[sid] = (t, ws, repro, naive, status)
        assert cache.verify() == []
        front = cache.entries(CATEGORY, "k", include_failed=False)
        for cls in {(e.reproducible, e.naive) for e in front}:
            same = [e for e in front if (e.reproducible, e.naive) == cls]
            for a, b in zip(same, same[1:], strict=False):  # sorted by time
                assert a.time < b.time and a.workspace > b.workspace
        for repro in (False, True):
            for with_naive in (True, False):
                for limit in (None, 0, 1, 2, 3, 4):
                    want = [t for t, ws, r, n, s in latest.values() if s == "ok"
                            and (r or not repro) and (with_naive or not n)
                            and (limit is None or ws <= limit)]
                    got = cache.best(CATEGORY, "k", reproducible=repro,
                                     include_naive=with_naive, workspace_limit=limit)
                    assert (got.time if got else None) == (min(want) if want else None)
        assert all(cache.has(CATEGORY, "k", {"s": sid}) for sid in latest)


def _fill(cache: TuningCache) -> None:
    cache.put(CATEGORY, "conv", {"tile": 8}, 1.0, spread=0.1, workspace=64, desc="conv 3x3")
    cache.put(CATEGORY, "conv", {"tile": 16}, 2.0, workspace=128)  # pruned
    cache.put(CATEGORY, "conv", {"tile": 4}, None, status="timeout", error="run took 1 s")
    cache.put(CATEGORY, "mm", {"k": 1}, 3.0, reproducible=False, naive=True, desc="matmul")


def _snapshot(cache: TuningCache, category=CATEGORY) -> dict:
    return {k.key: [(e.schedule, e.status, e.time, e.spread, e.workspace, e.reproducible,
                     e.naive, e.error, e.timestamp, e.pruned)
                    for e in cache.entries(category, k.key, include_pruned=True)]
            for k in cache.list_keys(category)}


def test_export_import_round_trip(cache, tmp_path: Path) -> None:
    _fill(cache)
    buf = io.StringIO()
    assert cache.export_jsonl(buf) == 4
    buf.seek(0)
    with TuningCache(tmp_path / "copy.sqlite") as copy:
        stats = copy.import_jsonl(buf, current_category=CATEGORY)
        assert (stats.added, stats.updated, stats.skipped) == (4, 0, 0)
        assert _snapshot(copy) == _snapshot(cache)
        assert {k.desc for k in copy.list_keys()} == {"conv 3x3", "matmul"}
        buf.seek(0)
        assert copy.import_jsonl(buf, current_category=CATEGORY).skipped == 4  # idempotent
        assert copy.verify() == []


def test_import_refuses_a_foreign_category_unless_asked(cache, tmp_path: Path) -> None:
    with TuningCache(tmp_path / "other.sqlite") as other:
        other.put(CATEGORY, "k", {"s": "mine"}, 2.0)
        other.put(OTHER_CPU, "k", {"s": "theirs"}, 1.0)
        buf = io.StringIO()
        other.export_jsonl(buf)
    buf.seek(0)
    with pytest.raises(CacheError, match="another category.*'device'"):
        cache.import_jsonl(buf, current_category=CATEGORY)
    assert cache.list_keys() == []  # all or nothing
    buf.seek(0)
    assert cache.import_jsonl(buf, current_category=CATEGORY,
                              allow_foreign_category=True).added == 2
    assert cache.best(CATEGORY, "k").schedule == {"s": "mine"}  # the foreign one is faster


@pytest.mark.parametrize("text, message", [
    ("", "empty file"),
    ('{"format":"something-else"}\n', "not an nfc tuning cache export"),
    ('{"format":"nfc-tuning-cache","version":99}\n', "newer"),
    ('{"format":"nfc-tuning-cache","version":1}\n{oops\n', "not JSON"),
    ('{"format":"nfc-tuning-cache","version":1}\n{"category":{}}\n', "wrong type"),
])
def test_import_rejects_malformed_exports(cache, text: str, message: str) -> None:
    with pytest.raises(CacheError, match=message):
        cache.import_jsonl(io.StringIO(text))


def test_import_rejects_a_tampered_category_id(cache) -> None:
    _fill(cache)
    buf = io.StringIO()
    cache.export_jsonl(buf)
    lines = buf.getvalue().splitlines()
    rec = json.loads(lines[1])
    rec["category"]["device"] = "Forged CPU"
    with pytest.raises(CacheError, match="category_id"):
        cache.import_jsonl(io.StringIO("\n".join([lines[0], json.dumps(rec)])))


def test_merge_keeps_the_newer_measurement(cache, tmp_path: Path) -> None:
    cache.put(CATEGORY, "k", {"s": 1}, 5.0, timestamp=100.0)
    cache.put(CATEGORY, "k", {"s": 2}, 3.0, timestamp=300.0)
    with TuningCache(tmp_path / "b.sqlite") as b:
        b.put(CATEGORY, "k", {"s": 1}, 4.0, timestamp=200.0)  # newer: wins
        b.put(CATEGORY, "k", {"s": 2}, 1.0, timestamp=200.0)  # older: loses
        b.put(CATEGORY, "j", {"s": 3}, 1.0)
    stats = cache.merge(tmp_path / "b.sqlite")
    assert (stats.added, stats.updated, stats.skipped) == (1, 1, 1)
    assert cache.lookup(CATEGORY, "k", {"s": 1}).time == 4.0
    assert cache.lookup(CATEGORY, "k", {"s": 2}).time == 3.0
    assert cache.verify() == []


def test_prune_deletes_dominated_and_optionally_failed(cache) -> None:
    _fill(cache)
    assert cache.prune() == 1
    assert not cache.has(CATEGORY, "conv", {"tile": 16})
    assert cache.has(CATEGORY, "conv", {"tile": 4})
    assert cache.prune(dominated=False, failed=True) == 1
    assert cache.prune(older_than=-1.0) == 2  # everything is older than a second from now
    assert cache.list_keys() == [] and cache.categories() == {}


def test_a_newer_schema_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "new.sqlite"
    TuningCache(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION + 1,))
    with pytest.raises(CacheError, match="newer than"):
        TuningCache(path)


def test_missing_and_foreign_files_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(CacheError, match="no tuning cache"):
        TuningCache(tmp_path / "missing.sqlite", create=False)
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"this is not a database at all" * 100)
    with pytest.raises(CacheError, match="not a usable tuning cache"):
        TuningCache(junk)
    other = tmp_path / "other.sqlite"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE t (x)")
    with pytest.raises(CacheError, match="not a tuning cache"):
        TuningCache(other, create=False)


def test_verify_reports_broken_json_and_broken_pruning(cache) -> None:
    _fill(cache)
    assert cache.verify() == []
    conn = sqlite3.connect(cache.path)
    with conn:
        conn.execute("UPDATE records SET pruned = 0")  # the dominated entry rejoins the front
    assert any("dominated by" in p for p in cache.verify())
    with conn:
        conn.execute("UPDATE records SET schedule = '{broken' WHERE key = 'mm'")
    assert any("does not parse" in p for p in cache.verify())
    conn.close()


def test_wal_mode_and_default_path(cache, monkeypatch, tmp_path: Path) -> None:
    conn = sqlite3.connect(cache.path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()
    monkeypatch.setenv("NFC_CACHE_DIR", str(tmp_path / "cachedir"))
    assert default_cache_path() == tmp_path / "cachedir" / "tuning.sqlite"
    monkeypatch.delenv("NFC_CACHE_DIR")
    assert default_cache_path() == Path.home() / ".cache" / "nfc" / "tuning.sqlite"


def test_no_pickle_and_no_eval_in_the_tuning_code() -> None:
    import nfc.runtime.tuning as pkg

    banned = re.compile(r"^\s*(import|from)\s+(pickle|marshal|shelve|dill)\b|\b(eval|exec)\(",
                        re.MULTILINE)
    for path in Path(pkg.__file__).parent.glob("*.py"):
        assert not banned.search(path.read_text()), path.name
