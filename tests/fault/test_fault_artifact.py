"""Fault injection into compiled artifacts, cached kernel objects and cached libraries.

Each damaged file must give a clear error (exit code 1, "is not an nfc artifact" / "is truncated
or damaged") or a correct result (the damaged cache entry discarded and compiled again, the
results bit-identical to an undamaged build); never a signal (SIGBUS, SIGSEGV, SIGILL), an
internal error or a hang. Everything that could crash runs in a subprocess with a timeout.

A handful of truncation offsets and bit positions run by default (well under a minute on two
cores); `NFC_FAULT_LONG=1` adds many more, drawn with a fixed seed.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from nfc.codegen.artifact.container import FOOTER, read_artifact
from nfc.codegen.artifact.kcache import OBJ_HEADER

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "tests" / "runtime" / "models" / "tiny.nf")
LONG = os.environ.get("NFC_FAULT_LONG", "") == "1"
#: Seconds any one command may take (a tiny model compiles and runs in about a second).
TIMEOUT = 180
CLEAR = ("is not an nfc artifact", "is truncated or damaged", "has unreadable metadata")


def _nfc(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run([sys.executable, "-m", "nfc", *args], capture_output=True,
                              text=True, timeout=TIMEOUT, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail(f"nfc {' '.join(args)} hung (> {TIMEOUT} s)")


def _refused(res: subprocess.CompletedProcess[str], what: str) -> None:
    """Exit code 1 with one clear line: no signal, no internal error, no traceback."""
    assert res.returncode == 1, (what, res.returncode, res.stderr[-2000:])
    assert any(c in res.stderr for c in CLEAR), (what, res.stderr[-2000:])
    assert "Traceback" not in res.stderr and "internal error" not in res.stderr, what


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A compiled tiny model (one kernel per compute), the environment of nfc subprocesses
    (a private cache, one compile process, one thread) and the undamaged artifact's results."""
    d = tmp_path_factory.mktemp("fault")
    env = {**os.environ, "NFC_CACHE_DIR": str(d / "cache"), "NFC_COMPILE_JOBS": "1",
           "OMP_NUM_THREADS": "1"}
    so = d / "tiny.so"
    res = _nfc(env, "compile", TINY, "--no-fuse", "-o", str(so))
    assert res.returncode == 0, res.stderr
    ref = _nfc(env, "run", str(so), "--data", "synthetic", "--json")
    assert ref.returncode == 0, ref.stderr
    return {"dir": d, "env": env, "so": so, "sealed": read_artifact(so),
            "result": _result(ref.stdout)}


def _result(stdout: str) -> dict[str, object]:
    res = json.loads(stdout)
    res.pop("seconds")
    return res


def _truncations(n_elf: int, size: int) -> list[int]:
    cuts = [0, 4, 63, n_elf // 3, n_elf - 1, n_elf + 7, size - FOOTER.size, size - 1]
    if LONG:
        rng = random.Random(1)
        cuts += sorted(rng.randrange(size) for _ in range(40))
    return cuts


def _flips(n_elf: int, size: int) -> list[tuple[int, int]]:
    """(byte, bit): the ELF magic and machine, a program header, the code, the metadata, the
    footer's lengths, digest and magic."""
    flips = [(0, 1), (18, 0), (0x48, 3), (n_elf // 2, 5), (n_elf + 5, 2), (size - 56, 0),
             (size - 40, 7), (size - 3, 4)]
    if LONG:
        rng = random.Random(2)
        flips += [(rng.randrange(size), rng.randrange(8)) for _ in range(60)]
    return flips


def _damaged_copies(built, tmp: Path) -> list[tuple[str, Path]]:
    data = built["sealed"].data
    n_elf = len(built["sealed"].elf)
    out = []
    for cut in _truncations(n_elf, len(data)):
        p = tmp / f"cut{cut}.so"
        p.write_bytes(data[:cut])
        out.append((f"truncated at {cut}", p))
    for pos, bit in _flips(n_elf, len(data)):
        blob = bytearray(data)
        blob[pos] ^= 1 << bit
        p = tmp / f"flip{pos}_{bit}.so"
        p.write_bytes(bytes(blob))
        out.append((f"bit {bit} of byte {pos} flipped", p))
    return out


def test_damaged_artifacts_are_refused_by_the_cli(built, tmp_path):
    """`nfc run --info`, `nfc run` (and `nfc train` on some) on every damaged copy."""
    for k, (what, path) in enumerate(_damaged_copies(built, tmp_path)):
        _refused(_nfc(built["env"], "run", str(path), "--info"), f"run --info, {what}")
        _refused(_nfc(built["env"], "run", str(path), "--data", "synthetic"), f"run, {what}")
        if k % 4 == 0 or LONG:
            _refused(_nfc(built["env"], "train", str(path), "--data", "synthetic",
                          "--max-steps", "1", "--quiet", "--no-eval"), f"train, {what}")


def test_damaged_artifacts_are_refused_by_the_api(built, tmp_path):
    """`nfc.load` and `read_metadata` on every damaged copy, in one subprocess."""
    copies = _damaged_copies(built, tmp_path)
    script = """
import json, sys
from nfc.runtime.loader import ArtifactError, load, read_metadata
for path in sys.argv[1:]:
    for fn in (read_metadata, load):
        try:
            fn(path)
            print(json.dumps([path, fn.__name__, "loaded"]), flush=True)
        except ArtifactError as exc:
            print(json.dumps([path, fn.__name__, str(exc)]), flush=True)
"""
    try:
        res = subprocess.run([sys.executable, "-c", script, *(str(p) for _, p in copies)],
                             capture_output=True, text=True, timeout=TIMEOUT,
                             env=built["env"])
    except subprocess.TimeoutExpired:
        pytest.fail("loading damaged artifacts hung")
    lines = [json.loads(x) for x in res.stdout.splitlines()]
    assert res.returncode == 0, (res.returncode, lines[-1:], res.stderr[-2000:])
    assert len(lines) == 2 * len(copies)
    for path, fn, msg in lines:
        assert any(c in msg for c in CLEAR), (path, fn, msg)


def _damage_objects(objects: list[Path], round_: int) -> None:
    """Damage every cached object, each in another way: round 0 flips bits (header magic,
    digest, length, ELF header, code, last byte), round 1 truncates, later rounds (long mode)
    flip random bits."""
    rng = random.Random(round_)
    for k, p in enumerate(objects):
        data = bytearray(p.read_bytes())
        n = len(data)
        if round_ == 0:
            pos = [0, 12, OBJ_HEADER.size - 3, OBJ_HEADER.size + 17, n // 2, n - 1][k % 6]
            data[pos] ^= 1 << (k % 8)
        elif round_ == 1:
            data = data[:[0, 10, OBJ_HEADER.size - 1, OBJ_HEADER.size, n // 2, n - 1][k % 6]]
        else:
            data[rng.randrange(n)] ^= 1 << rng.randrange(8)
        p.write_bytes(bytes(data))


def _own_cache(built, tmp: Path) -> dict[str, str]:
    """The environment with a fresh cache of this test's own (filled right before it is
    damaged, so that the keys are those of the code under test)."""
    return {**built["env"], "NFC_CACHE_DIR": str(tmp / "cache")}


def test_damaged_cached_objects_are_compiled_again(built, tmp_path):
    """Bit flips and truncations in every cached kernel object: the next compile warns once,
    compiles those kernels again, and the artifact is the very same (so are its results)."""
    env = _own_cache(built, tmp_path)
    ref = tmp_path / "ref.so"
    res = _nfc(env, "compile", TINY, "--no-fuse", "-o", str(ref))
    assert res.returncode == 0, res.stderr[-2000:]
    digest = read_artifact(ref).digest
    objects = sorted((tmp_path / "cache" / "objects").glob("*.nfo"))
    assert len(objects) >= 6
    for round_ in range(6 if LONG else 2):
        _damage_objects(objects, round_)
        out = tmp_path / f"again{round_}.so"
        res = _nfc(env, "compile", TINY, "--no-fuse", "-o", str(out))
        assert res.returncode == 0, res.stderr[-2000:]
        assert res.stderr.count("warning") == 1, res.stderr
        assert f"discarded {len(objects)} damaged cached kernel object(s)" in res.stderr
        assert read_artifact(out).digest == digest
        run = _nfc(env, "run", str(out), "--data", "synthetic", "--json")
        assert run.returncode == 0 and _result(run.stdout) == built["result"], run.stderr
        # the cache was repaired: no warning the next time
        res = _nfc(env, "compile", TINY, "--no-fuse", "-o", str(out))
        assert res.returncode == 0 and "warning" not in res.stderr, res.stderr


def test_damaged_library_cache_entry_is_rebuilt_by_train(built, tmp_path):
    """`nfc train model.nf` with a truncated or bit-flipped entry in its library cache: a
    warning, a rebuild, the same losses; the entry is whole again afterwards."""
    env = _own_cache(built, tmp_path)
    argv = ("train", TINY, "--data", "synthetic", "--max-steps", "3", "--quiet", "--no-eval")
    first = _nfc(env, *argv)
    assert first.returncode == 0, first.stderr[-2000:]
    losses = [x for x in first.stdout.splitlines() if x.startswith("loss:")]
    assert losses
    entries = list((tmp_path / "cache" / "artifacts").glob("*.so"))
    assert len(entries) == 1
    entry = entries[0]
    good = entry.read_bytes()
    damages = [good[:len(good) // 2], good[:0], good[:4096] + bytes([good[4096] ^ 8]) + good[4097:]]
    if LONG:
        rng = random.Random(3)
        for _ in range(10):
            pos = rng.randrange(len(good))
            damages.append(good[:pos] + bytes([good[pos] ^ (1 << rng.randrange(8))])
                           + good[pos + 1:])
    for damage in damages:
        entry.write_bytes(damage)
        res = _nfc(env, *argv)
        assert res.returncode == 0, res.stderr[-2000:]
        assert "warning: cached library unusable" in res.stderr
        assert [x for x in res.stdout.splitlines() if x.startswith("loss:")] == losses
        assert entry.read_bytes() == good
