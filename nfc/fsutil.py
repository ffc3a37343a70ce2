"""Durable file output shared by every layer: atomic writes, private directories, hashes.

Every file nfc persists (checkpoints, artifacts, cached objects, exported caches, datasets) is
written through `atomic_output` or `atomic_write`: the bytes go to a temporary file with a unique
name (`mkstemp`) in the destination's directory, are flushed and fsync'ed, and the file is then
renamed over the destination and the directory fsync'ed. A crash at any moment, even SIGKILL or
power loss, leaves the old file or the new one, never half of one; processes writing the same
destination at once never share a temporary file (the last rename wins, each result complete).

Temporary files are named `.<name>.<random>.nfctmp`; `remove_stale_temporaries` deletes those
that a killed process left behind.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

#: Suffix of every temporary file this module creates.
TMP_SUFFIX = ".nfctmp"
#: Permission bits of cache directories: they hold executable code, so only the owner may
#: read or write them.
PRIVATE_DIR_MODE = 0o700


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """fsync a directory so that a rename inside it survives power loss (best effort)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def private_dir(path: str | os.PathLike[str]) -> Path:
    """Create `path` (and its parents) if needed and make it owner-only (0700)."""
    p = Path(path)
    p.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR_MODE)
    with contextlib.suppress(OSError):
        if p.stat().st_mode & 0o777 != PRIVATE_DIR_MODE:
            os.chmod(p, PRIVATE_DIR_MODE)
    return p


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike[str], mode: int = 0o644) -> Iterator[BinaryIO]:
    """Yield a binary file whose content replaces `path` atomically when the block ends.

    If the block raises, the temporary file is removed and `path` is left as it was.
    `mode` gives the permission bits of the final file.
    """
    dest = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=TMP_SUFFIX, dir=dest.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, dest)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(dest.parent)


def atomic_write(path: str | os.PathLike[str], data: bytes, mode: int = 0o644) -> None:
    """Write `data` to `path` atomically (see `atomic_output`)."""
    with atomic_output(path, mode) as fh:
        fh.write(data)


def atomic_copy(src: str | os.PathLike[str], dest: str | os.PathLike[str],
                mode: int = 0o644) -> None:
    """Copy the file `src` to `dest` atomically."""
    with open(src, "rb") as inp, atomic_output(dest, mode) as out:
        while chunk := inp.read(1 << 20):
            out.write(chunk)


def remove_stale_temporaries(directory: str | os.PathLike[str],
                             older_than_s: float = 3600.0) -> int:
    """Delete this module's temporary files in `directory` older than `older_than_s` seconds
    (left by killed processes); returns how many were removed."""
    removed = 0
    cutoff = time.time() - older_than_s
    with contextlib.suppress(OSError):
        for p in Path(directory).iterdir():
            if p.name.endswith(TMP_SUFFIX) and p.name.startswith("."):
                with contextlib.suppress(OSError):
                    if p.stat().st_mtime < cutoff:
                        p.unlink()
                        removed += 1
    return removed


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Hex SHA-256 of a file's content."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()
