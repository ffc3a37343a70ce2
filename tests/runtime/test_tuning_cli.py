"""`nfc cache`: every action, and user errors as `nfc: error: ...` without a traceback."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest
from tuning_fakes import CATEGORY, OTHER_CPU

from nfc.cli import cache_cmd
from nfc.runtime.tuning.cache import TuningCache


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "t.sqlite"
    with TuningCache(path) as cache:
        cache.put(CATEGORY, "conv", {"tile": 8}, 1e-3, spread=1e-5, workspace=64, desc="conv")
        cache.put(CATEGORY, "conv", {"tile": 16}, 2e-3, workspace=128)  # dominated
        cache.put(CATEGORY, "conv", {"tile": 4}, None, status="failed", error="SIGSEGV")
        cache.put(OTHER_CPU, "conv", {"tile": 8}, 5e-4)
    return path


def nfc_cache(capsys, *argv: str) -> tuple[int, str, str]:
    code = cache_cmd.main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


def test_list_and_show(db: Path, capsys) -> None:
    code, out, _ = nfc_cache(capsys, "--db", str(db), "list")
    assert code == 0 and "2 kernel(s)" in out and "Test CPU 9000" in out
    code, out, _ = nfc_cache(capsys, "show", "conv", "--db", str(db))  # --db after the action
    assert code == 0 and '"tile": 8' in out and '"tile": 16' not in out and "SIGSEGV" in out
    code, out, _ = nfc_cache(capsys, "--db", str(db), "show", "conv", "--all")
    assert '"tile": 16' in out
    cid = TuningCache.category_id(OTHER_CPU)[:6]
    code, out, _ = nfc_cache(capsys, "--db", str(db), "list", "--category", cid)
    assert code == 0 and "1 kernel(s)" in out


def test_export_import_merge_prune_verify(db: Path, tmp_path: Path, capsys) -> None:
    dump, copy = tmp_path / "dump.jsonl", tmp_path / "copy.sqlite"
    code, _, err = nfc_cache(capsys, "--db", str(db), "export", "-o", str(dump))
    assert code == 0 and "exported 4 record(s)" in err
    cat_file = tmp_path / "cat.json"
    cat_file.write_text(json.dumps(CATEGORY))
    code, _, err = nfc_cache(capsys, "--db", str(copy), "import", str(dump),
                             "--category", f"@{cat_file}")
    assert code == 1 and "nfc: error:" in err and "--allow-foreign-category" in err
    assert not copy.exists()  # a refused import leaves nothing behind
    code, out, _ = nfc_cache(capsys, "--db", str(copy), "import", str(dump),
                             "--category", f"@{cat_file}", "--allow-foreign-category")
    assert code == 0 and "imported 4 new" in out
    code, out, _ = nfc_cache(capsys, "--db", str(copy), "merge", str(db))
    assert code == 0 and "4 skipped" in out
    code, out, _ = nfc_cache(capsys, "--db", str(copy), "prune", "--failed")
    assert code == 0 and "deleted 2 record(s)" in out
    code, out, _ = nfc_cache(capsys, "--db", str(copy), "verify")
    assert code == 0 and out.strip() == "ok"


def test_user_errors_are_diagnostics(tmp_path: Path, db: Path, capsys) -> None:
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"\x00garbage" * 512)
    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(b"\xff\xfe\x80" * 100)
    bad_json = tmp_path / "bad.jsonl"
    bad_json.write_text("{not json\n")
    cases = [
        (["--db", str(tmp_path / "missing.sqlite"), "list"], "no tuning cache"),
        (["--db", str(junk), "verify"], "1 problem(s)"),
        (["--db", str(db), "import", str(tmp_path / "nope.jsonl")], "nope.jsonl"),
        (["--db", str(db), "import", str(bad_json)], "not JSON"),
        (["--db", str(db), "import", str(bad_json), "--category", "[1"], "not JSON"),
        (["--db", str(db), "merge", str(junk)], "not a usable tuning cache"),
        (["--db", str(db), "import", str(binary)], "not UTF-8"),
        (["--db", str(db), "import", str(tmp_path)], str(tmp_path)),
        (["--db", str(db), "show", "nothing"], "no records"),
        (["--db", str(db), "list", "--category", "zzzz"], "no category"),
    ]
    for argv, message in cases:
        code, _, err = nfc_cache(capsys, *argv)
        assert code == 1 and err.startswith("nfc: error:") and message in err, (argv, err)


def test_verify_fails_on_a_broken_invariant(db: Path, capsys) -> None:
    import sqlite3

    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE records SET pruned = 0")
    code, out, err = nfc_cache(capsys, "--db", str(db), "verify")
    assert code == 1 and "dominated by" in out and "1 problem(s)" in err


def test_plugs_into_the_main_cli_parser(db: Path, capsys) -> None:
    parser = argparse.ArgumentParser(prog="nfc")
    cache_cmd.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["cache", "--db", str(db), "list"])
    assert args.func(args) == 0 and "2 kernel(s)" in capsys.readouterr().out
    args = parser.parse_args(["cache"])
    assert args.func(args) == 1  # no action: help on stderr


def test_runs_standalone_as_a_module(db: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "nfc.cli.cache_cmd", "--db", str(db), "verify"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
