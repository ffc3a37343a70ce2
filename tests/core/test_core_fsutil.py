"""nfc.fsutil: atomic outputs, unique temporaries, private directories."""

from __future__ import annotations

import os
import stat
import threading
import time

import pytest

from nfc import fsutil


def test_atomic_write_replaces_and_leaves_no_temporary(tmp_path):
    dest = tmp_path / "out.bin"
    dest.write_bytes(b"old")
    fsutil.atomic_write(dest, b"new content", mode=0o600)
    assert dest.read_bytes() == b"new content"
    assert stat.S_IMODE(dest.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["out.bin"]


def test_failed_block_keeps_the_old_file(tmp_path):
    dest = tmp_path / "out.bin"
    dest.write_bytes(b"old")
    with pytest.raises(RuntimeError), fsutil.atomic_output(dest) as fh:
        fh.write(b"half of the new")
        raise RuntimeError("crash while writing")
    assert dest.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.bin"]


def test_concurrent_writers_never_mix(tmp_path):
    """Many threads writing one destination: the result is one writer's complete content."""
    dest = tmp_path / "same.bin"
    payloads = [bytes([i]) * 200_000 for i in range(12)]
    errors: list[BaseException] = []

    def write(data: bytes) -> None:
        try:
            fsutil.atomic_write(dest, data)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(p,)) for p in payloads]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert dest.read_bytes() in payloads
    assert [p.name for p in tmp_path.iterdir()] == ["same.bin"]


def test_private_dir_is_owner_only(tmp_path):
    d = tmp_path / "a" / "cache"
    fsutil.private_dir(d)
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    os.chmod(d, 0o755)
    fsutil.private_dir(d)
    assert stat.S_IMODE(d.stat().st_mode) == 0o700


def test_stale_temporaries_are_removed_fresh_ones_kept(tmp_path):
    old = tmp_path / ".x.abc.nfctmp"
    new = tmp_path / ".y.def.nfctmp"
    other = tmp_path / "keep.nfctmp"
    for p in (old, new, other):
        p.write_bytes(b"x")
    past = time.time() - 7200
    os.utime(old, (past, past))
    os.utime(other, (past, past))
    assert fsutil.remove_stale_temporaries(tmp_path, older_than_s=3600) == 1
    assert not old.exists() and new.exists() and other.exists()


def test_sha256_file_matches_hashlib(tmp_path):
    import hashlib

    p = tmp_path / "f"
    data = os.urandom(3 << 20)
    p.write_bytes(data)
    assert fsutil.sha256_file(p) == hashlib.sha256(data).hexdigest()
