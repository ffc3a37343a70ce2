"""Fault injection into the tuning cache.

- The database truncated and bit-flipped at a handful of offsets (the header, page 1, the
  tables' pages, the last page): `nfc cache list` and `verify` give a clear error (exit 1)
  or a correct answer, compiling with the cache warns and falls back to default schedules or
  uses valid schedules only, and a compiled model computes what an untuned build computes.
  Never a traceback, a hang or a wrong result.
- `nfc tune` killed with SIGKILL at two moments (its first committed measurement, later in a
  resumed run): the cache stays sound, nothing stored before is lost or changed, nothing the
  killed run committed is lost, its measuring worker goes away, and a rerun completes.

A handful of offsets run by default (well under a minute on two cores); `NFC_FAULT_LONG=1`
adds many more, drawn with a fixed seed. In-process checks run under an alarm (a hang fails
the test); the command line runs in subprocesses with a timeout.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nfc.cli import cache_cmd
from nfc.codegen.space import schedule_problem, schedule_space
from nfc.ir import ComputeOp
from nfc.runtime.tuning.cache import TuningCache
from nfc.runtime.tuning.category import default_category
from nfc.runtime.tuning.driver import build_model
from nfc.runtime.tuning.kernels import (
    apply_cached_schedules,
    canonical_compute,
    collect_kernels,
)

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "tests" / "runtime" / "models" / "tiny.nf")
LONG = os.environ.get("NFC_FAULT_LONG", "") == "1"
#: Seconds one nfc command may take (the tiny model compiles and runs in about a second).
TIMEOUT = 180
#: Seconds one in-process check may take.
ALARM = 30
PAGE = 4096
CLEAR = ("damaged", "not a tuning cache")


@contextlib.contextmanager
def _deadline(what: str) -> Iterator[None]:
    """Fail (instead of hanging) when the block takes longer than ALARM seconds."""
    def expire(signum: int, frame: Any) -> None:
        raise TimeoutError(f"{what} hung (> {ALARM} s)")
    old = signal.signal(signal.SIGALRM, expire)
    signal.alarm(ALARM)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _nfc(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run([sys.executable, "-m", "nfc", *args], capture_output=True,
                              text=True, timeout=TIMEOUT, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail(f"nfc {' '.join(args)} hung (> {TIMEOUT} s)")


@pytest.fixture(scope="module")
def tuned(tmp_path_factory) -> dict[str, Any]:
    """A tuning cache for the tiny model: per tunable kernel the default and a faster valid
    schedule (so a sound cache changes the build), plus 300 other kernels' records (so the
    file spans many pages); with the schedules stored per kernel key."""
    d = tmp_path_factory.mktemp("tuning")
    cat = default_category()
    module = build_model(TINY)
    rng = random.Random(0)
    stored: dict[str, list[dict[str, Any]]] = {}
    path = d / "good.sqlite"
    with TuningCache(path) as cache:
        for k in collect_kernels(module):
            if not isinstance(k.op, ComputeOp):
                continue
            space = schedule_space(canonical_compute(k.op))
            default = space.default()
            others = [c for c in ({n: rng.choice(v) for n, v in space.params.items()}
                                  for _ in range(400)) if space.is_valid(c) and c != default]
            cache.put(cat, k.key, default, 2e-5, naive=True, desc=k.desc)
            stored[k.key] = [default]
            for n, cfg in enumerate(others[:3]):
                cache.put(cat, k.key, cfg, 1e-5 + n * 1e-6, desc=k.desc)
                stored[k.key].append(cfg)
        for n in range(300):
            cache.put(cat, f"nfk1-{n:032x}", {"mr": 6, "nv": 2, "mc_tiles": 2, "kc": 64,
                                             "ku": 4, "pack_a": 0, "parallel": 0},
                      1e-4 + n * 1e-7, naive=True)
        assert cache.verify() == []
    env = {**os.environ, "NFC_CACHE_DIR": str(d / "nocache"), "NFC_COMPILE_JOBS": "1",
           "OMP_NUM_THREADS": "1"}
    so = d / "plain.so"
    res = _nfc(env, "compile", TINY, "--no-fuse", "--no-tuning", "-o", str(so))
    assert res.returncode == 0, res.stderr
    ref = _nfc(env, "run", str(so), "--data", "synthetic", "--json")
    assert ref.returncode == 0, ref.stderr
    return {"dir": d, "path": path, "cat": cat, "stored": stored, "env": env,
            "result": _result(ref.stdout)}


def _result(stdout: str) -> dict[str, Any]:
    res = json.loads(stdout)
    res.pop("seconds")
    return res


def _offsets(path: Path) -> tuple[list[int], list[tuple[int, int]]]:
    """(truncation lengths, (byte, bit) flips): the header (magic, format byte, page count),
    page 1's b-tree header, the records table's root page, a middle page, the last page."""
    size = path.stat().st_size
    with sqlite3.connect(path) as conn:
        root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'records'"
                            ).fetchone()[0]
    conn.close()
    middle = size // PAGE // 2 * PAGE
    cuts = [0, 50, 2 * PAGE, middle, size - PAGE + 1000]
    flips = [(0, 1), (18, 0), (28, 2), (100, 3), ((root - 1) * PAGE + 3, 6),
             (middle + 8, 4), (size - 50, 5)]
    if LONG:
        rng = random.Random(3)
        cuts += sorted(rng.randrange(size) for _ in range(20))
        flips += [(rng.randrange(size), rng.randrange(8)) for _ in range(40)]
    return cuts, flips


def _damaged_copies(path: Path, tmp: Path) -> list[tuple[str, Path]]:
    data = path.read_bytes()
    cuts, flips = _offsets(path)
    out = []
    for cut in cuts:
        p = tmp / f"cut{cut}.sqlite"
        p.write_bytes(data[:cut])
        out.append((f"truncated at {cut}", p))
    for pos, bit in flips:
        blob = bytearray(data)
        blob[pos] ^= 1 << bit
        p = tmp / f"flip{pos}_{bit}.sqlite"
        p.write_bytes(bytes(blob))
        out.append((f"bit {bit} of byte {pos} flipped", p))
    return out


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = cache_cmd.main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "internal error" not in err, (argv, err)
    assert code in (0, 1), (argv, code, err)
    return code, out, err


def test_damaged_databases_give_clear_errors_or_correct_fallbacks(tuned, tmp_path,
                                                                  capsys) -> None:
    """`nfc cache list`/`verify` and compiling with the cache, on every damaged copy."""
    cat, stored = tuned["cat"], tuned["stored"]
    damaged_seen = 0
    for what, path in _damaged_copies(tuned["path"], tmp_path):
        with _deadline(what):
            listed, _, err = _cli(capsys, "--db", str(path), "list")
            if listed:
                assert any(c in err for c in CLEAR), (what, err)
            verified, _, verr = _cli(capsys, "--db", str(path), "verify")
            assert verified == 1 or not listed, (what, "list fails but verify passes")
            if verified:
                assert "problem" in verr or any(c in verr for c in CLEAR), (what, verr)
            module = build_model(TINY)
            warnings: list[str] = []
            use = apply_cached_schedules(module, category=cat, db=path,
                                         warn=warnings.append)
        scheduled = [(k, module.func(f).body.ops[n]) for k in collect_kernels(module)
                     for f, n in k.sites if "nf.schedule" in module.func(f).body.ops[n].attrs]
        if warnings:  # not used at all: every kernel keeps its default schedule
            damaged_seen += 1
            assert use.found == 0 and use.problem and not scheduled, what
            assert str(path) in warnings[0] and "nfc cache repair" in warnings[0], what
        else:  # an empty file holds nothing to use; anything else must be sound
            assert not listed or path.stat().st_size == 0, (what, "list fails, compile uses it")
            for k, op in scheduled:  # whatever was used is a valid schedule of its op
                assert schedule_problem(op, op.attrs["nf.schedule"]) == "", what
                assert k.key in stored, what
    assert damaged_seen >= 8  # the header, page 1 and every truncation are caught


def test_compiling_with_a_damaged_cache_computes_what_an_untuned_build_does(tuned,
                                                                          tmp_path) -> None:
    """`nfc compile` + `nfc run` with the sound cache and with a damaged table page as the
    default cache: exit 0, a warning naming the file for the damaged one, and the untuned
    build's results (bit-identical when the cache was not used)."""
    _, flips = _offsets(tuned["path"])
    cases = [("sound", None), ("records page", flips[4])]
    for what, flip in cases:
        cache_dir = tmp_path / what.replace(" ", "_")
        cache_dir.mkdir()
        db = cache_dir / "tuning.sqlite"
        shutil.copyfile(tuned["path"], db)
        if flip is not None:
            with open(db, "r+b") as fp:
                fp.seek(flip[0])
                byte = fp.read(1)[0]
                fp.seek(flip[0])
                fp.write(bytes([byte ^ (1 << flip[1])]))
        env = {**tuned["env"], "NFC_CACHE_DIR": str(cache_dir)}
        so = cache_dir / "t.so"
        res = _nfc(env, "compile", TINY, "--no-fuse", "-o", str(so))
        assert res.returncode == 0, (what, res.stderr[-2000:])
        assert "Traceback" not in res.stderr and "internal error" not in res.stderr, what
        run = _nfc(env, "run", str(so), "--data", "synthetic", "--json")
        assert run.returncode == 0, (what, run.stderr[-2000:])
        got, want = _result(run.stdout), tuned["result"]
        if flip is None:
            assert "kernels found" in res.stderr and "warning" not in res.stderr
            assert got["accuracy"] == want["accuracy"]
            assert got["loss"] == pytest.approx(want["loss"], rel=1e-5)
        else:
            assert "nfc: warning:" in res.stderr and str(db) in res.stderr, what
            assert "not used (damaged)" in res.stderr, what
            assert got == want, what


# ---------------------------------------------------------------------------------------------
# SIGKILL


def _rows(db: Path) -> dict[tuple[str, str, str], tuple[float, float]]:
    """(category, key, schedule) -> (time, timestamp) of every record, read without nfc."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        return {(c, k, s): (t, ts) for c, k, s, t, ts in conn.execute(
            "SELECT category, key, schedule, time, timestamp FROM records")}
    finally:
        conn.close()


def _workers(marker: str) -> list[int]:
    """Pids of measuring workers started under an environment holding `marker`."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes()
            env = (proc / "environ").read_bytes()
        except OSError:
            continue
        if b"nfc.runtime.tuning.worker" in cmd and marker.encode() in env:
            found.append(int(proc.name))
    return found


def _kill_when(argv: list[str], env: dict[str, str], db: Path, new: int,
               before: int) -> dict[tuple[str, str, str], tuple[float, float]]:
    """Start `nfc tune`, SIGKILL it once the cache holds `new` more records than `before`;
    returns the records seen just before the kill."""
    proc = subprocess.Popen([sys.executable, "-m", "nfc", *argv], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    seen: dict[tuple[str, str, str], tuple[float, float]] = {}
    try:
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline and proc.poll() is None:
            with contextlib.suppress(sqlite3.Error):
                seen = _rows(db)
            if len(seen) >= before + new:
                break
            time.sleep(0.05)
        assert proc.poll() is None, ("the tuner ended before the kill",
                                     proc.stderr.read() if proc.stderr else "")
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
        if proc.stderr:
            proc.stderr.close()
    return seen


def test_sigkill_of_nfc_tune_loses_nothing(tuned, tmp_path) -> None:
    db = tmp_path / "t.sqlite"
    cat = tuned["cat"]
    foreign = {**cat, "device": "Another CPU", "features": ["sse2"]}
    with TuningCache(db) as cache:  # what earlier runs stored: must survive untouched
        for n in range(40):
            cache.put(cat, f"nfk1-{n:032x}", {"mr": 6, "nv": 2, "mc_tiles": 2, "kc": 64,
                                             "ku": 4, "pack_a": 0, "parallel": 0}, 1e-4)
            cache.put(foreign, f"nfk1-{n:032x}", {"mr": 4, "nv": 1, "mc_tiles": 2, "kc": 64,
                                                 "ku": 4, "pack_a": 0, "parallel": 0}, 2e-4)
    earlier = _rows(db)
    marker = f"nfc-fault-{os.getpid()}-{time.monotonic_ns()}"
    env = {**tuned["env"], "NFC_FAULT_MARKER": marker}
    argv = ["tune", TINY, "--db", str(db), "--trials", "12", "--top", "2", "--order", "cost",
            "--population", "4", "--patience", "100", "--quiet"]
    seen = dict(earlier)
    for moment, new in (("its first measurement", 1), ("later, in a resumed run", 6)):
        seen = _kill_when(argv, env, db, new, len(seen))
        after = _rows(db)
        with TuningCache(db, create=False) as cache:
            assert cache.verify() == [], moment
        assert all(after.get(k) == v for k, v in earlier.items()), moment  # untouched
        assert set(seen) <= set(after), moment  # nothing the killed run committed is lost
        deadline = time.monotonic() + 10  # the orphaned worker notices and exits
        while _workers(marker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _workers(marker), f"a measuring worker outlived its tuner ({moment})"
    done = _nfc(env, *argv)
    assert done.returncode == 0, done.stderr[-2000:]
    final = _rows(db)
    assert all(final.get(k) == v for k, v in earlier.items())
    assert set(seen) <= set(final)
    with TuningCache(db, create=False) as cache:
        assert cache.verify() == []
