"""Training checkpoints: data only (.npz and JSON, never pickle), written atomically.

A checkpoint directory holds, for a step s,

    ckpt-<s>.npz    every persistent tensor (parameters, state, optimizer state) by name
    ckpt-<s>.json   {"step", "format", "npz", "sha256" of the npz, "tensors" (name, shape,
                     dtype), plus what the trainer adds: data order, epoch, seed, ...}
    latest.json     {"checkpoint": "ckpt-<s>.json"}

Each file is written to a temporary name, flushed and fsync'ed, then renamed over its final
name, and the directory is fsync'ed: a crash (even SIGKILL or power loss) leaves either the old
or the new checkpoint complete, never half of one. `latest.json` moves only after both files
of the new checkpoint are in place, and the npz is verified against its hash when loaded.
Older checkpoints beyond `keep` are deleted after the new one is recorded.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

FORMAT = 1
_NAME = re.compile(r"^ckpt-(\d+)\.json$")


class CheckpointError(ValueError):
    """A missing, corrupt or mismatching checkpoint."""


def _fsync_dir(path: Path) -> None:
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


def atomic_write(path: Path, data: bytes) -> None:
    """Write `data` to `path` atomically (temp file, fsync, rename, fsync the directory)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _npz_bytes(arrays: Mapping[str, np.ndarray]) -> bytes:
    import io

    buf = io.BytesIO()
    np.savez(buf, **{k: np.ascontiguousarray(v) for k, v in arrays.items()})
    return buf.getvalue()


def save(directory: str | os.PathLike[str], step: int, tensors: Mapping[str, np.ndarray],
         info: Mapping[str, Any] | None = None, keep: int = 3) -> Path:
    """Save a checkpoint of `tensors` at `step` with the JSON-able `info`; returns the path
    of its JSON file."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    stem = f"ckpt-{step:09d}"
    data = _npz_bytes(tensors)
    atomic_write(d / f"{stem}.npz", data)
    meta = dict(info or {})
    meta.update({
        "format": FORMAT, "step": int(step), "npz": f"{stem}.npz",
        "sha256": hashlib.sha256(data).hexdigest(),
        "tensors": [{"name": k, "shape": list(v.shape), "dtype": str(v.dtype)}
                    for k, v in tensors.items()],
    })
    atomic_write(d / f"{stem}.json", json.dumps(meta, indent=1, sort_keys=True).encode())
    atomic_write(d / "latest.json", json.dumps({"checkpoint": f"{stem}.json"}).encode())
    _prune(d, keep)
    return d / f"{stem}.json"


def _prune(d: Path, keep: int) -> None:
    steps = sorted(int(m.group(1)) for p in d.iterdir() if (m := _NAME.match(p.name)))
    for s in steps[:-keep] if keep > 0 else []:
        for suffix in (".json", ".npz"):
            with contextlib.suppress(FileNotFoundError):
                (d / f"ckpt-{s:09d}{suffix}").unlink()


def latest(directory: str | os.PathLike[str]) -> Path | None:
    """The JSON file of the newest complete checkpoint in `directory`, or None."""
    d = Path(directory)
    pointer = d / "latest.json"
    if not pointer.exists():
        return None
    try:
        name = json.loads(pointer.read_text())["checkpoint"]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise CheckpointError(f"'{pointer}' is corrupt: {exc}") from None
    path = d / name
    if not path.exists():
        raise CheckpointError(f"'{pointer}' points to missing '{name}'")
    return path


def load(path: str | os.PathLike[str]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """(tensors, info) of the checkpoint whose JSON file is `path`, verified."""
    p = Path(path)
    try:
        meta = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"cannot read checkpoint '{p}': {exc}") from None
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"'{p}' has checkpoint format {meta.get('format')}, "
                              f"expected {FORMAT}")
    npz = p.parent / meta["npz"]
    data = npz.read_bytes()
    if hashlib.sha256(data).hexdigest() != meta.get("sha256"):
        raise CheckpointError(f"'{npz}' does not match the hash recorded in '{p}'")
    import io

    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        tensors = {k: z[k] for k in z.files}
    return tensors, meta
