"""Training checkpoints: data only (.npz and JSON, never pickle), written atomically, verified.

A checkpoint directory holds, for a step s,

    ckpt-<s>.npz    every persistent tensor (parameters, state, optimizer state) by name,
                    one `.npy` member each, 0-d scalars (Adam's step counter) included
    ckpt-<s>.json   {"format", "step", "npz", "sha256" of the npz, "tensors" (name, shape,
                     dtype), what the trainer adds (data order, epoch, seed, ...), and
                     "meta_sha256", the hash of all of that}
    latest.json     {"checkpoint": "ckpt-<s>.json"}

Writing: every file goes through `nfc.fsutil.atomic_write` (a uniquely named temporary file,
fsync'ed, renamed over the final name, the directory fsync'ed), the npz first, then its JSON,
then `latest.json`; a crash at any moment, SIGKILL or power loss, leaves complete checkpoints
only. Then checkpoints newer than the new one (a run this one replaces, or damaged ones a
resume fell back past) and npz files without their JSON (a writer killed between the two) are
deleted, and only the `keep` newest of the rest kept; temporaries that killed writers left
behind are deleted once they are `STALE_TMP_S` old.

Reading checks everything a damaged or foreign file could get wrong, and says which file and
what: the JSON parses and matches its own hash, every name in it is a file of this directory
(never a path elsewhere), the npz matches its hash, parses without pickle, and holds exactly
the tensors, shapes and dtypes the JSON records; against a model, the tensors are those the
model has, with its shapes and dtypes. `load_latest` falls back from a damaged checkpoint to
the newest intact one, with a warning. `CheckpointCorrupt` (damaged: an older checkpoint may
serve) and `CheckpointMismatch` (intact, but for another model) are both `CheckpointError`s,
which the CLI reports as user errors.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import struct
import sys
import time
import zipfile
import zlib
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from nfc import fsutil

#: The format `save` writes. Format 1 (no JSON hash; 0-d tensors stored as 1-d, the shape
#: recorded in the JSON) is still read.
FORMAT = 2
READABLE_FORMATS = (1, 2)
#: A temporary file in a checkpoint directory untouched for this long belongs to a killed
#: writer: a live one writes its file in one go, milliseconds to seconds before renaming it.
STALE_TMP_S = 600.0
LATEST = "latest.json"

_NAME = re.compile(r"^ckpt-(\d+)\.json$")
_NPZ = re.compile(r"^ckpt-(\d+)\.npz$")
_ANY = re.compile(r"^ckpt-(\d+)\.(?:json|npz)$")
#: Temporaries of nfc versions before nfc.fsutil (`.<name>.<pid>.tmp`).
_LEGACY_TMP = re.compile(r"^\.(?:ckpt-\d+\.(?:json|npz)|latest\.json)\.\d+\.tmp$")
_HASH = re.compile(r"^[0-9a-f]{64}$")
#: Keys `save` writes itself; the trainer's `info` cannot override them.
_RESERVED = ("format", "step", "npz", "sha256", "tensors", "meta_sha256")
#: dtype kinds a checkpoint may hold: bool, integers, floats (never objects).
_KINDS = "biuf"
#: Fixed zip timestamps, so that equal tensors give equal npz bytes.
_ZIP_DATE = (1980, 1, 1, 0, 0, 0)
#: What numpy's npz reader raises on a damaged archive or member.
_NPZ_ERRORS = (ValueError, OSError, EOFError, KeyError, SyntaxError, MemoryError,
               NotImplementedError, zipfile.BadZipFile, zlib.error, struct.error)

#: The shape and dtype a model expects of a tensor.
Spec = tuple[tuple[int, ...], np.dtype[Any]]


class CheckpointError(ValueError):
    """A checkpoint that cannot be used or written; the message names the file and why."""


class CheckpointCorrupt(CheckpointError):
    """A damaged or incomplete checkpoint: an older intact one may be used instead."""


class CheckpointMismatch(CheckpointError):
    """An intact checkpoint made for another model (other tensors, shapes or dtypes)."""


@dataclass(frozen=True)
class Loaded:
    """A verified checkpoint."""

    path: Path
    """Its JSON file."""
    tensors: dict[str, np.ndarray]
    info: dict[str, Any]
    """The JSON content: what `save` recorded plus the trainer's `info`."""

    @property
    def step(self) -> int:
        """The step the checkpoint was taken at."""
        return int(self.info["step"])


# ------------------------------------------------------------------------------ writing


def npz_bytes(tensors: Mapping[str, np.ndarray]) -> bytes:
    """The tensors as an uncompressed npz archive (what `np.load` reads), written member by
    member: `np.savez(**tensors)` would turn 0-d arrays into 1-d ones on the way
    (`np.ascontiguousarray`) and clash with tensors named `file` or `allow_pickle`."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        for name, value in tensors.items():
            arr = np.asarray(value)
            if arr.dtype.kind not in _KINDS:
                raise CheckpointError(f"tensor '{name}' has dtype {arr.dtype}, which a "
                                      "checkpoint cannot hold")
            member = io.BytesIO()
            np.lib.format.write_array(member, arr, allow_pickle=False)
            zf.writestr(zipfile.ZipInfo(f"{name}.npy", date_time=_ZIP_DATE), member.getvalue())
    return buf.getvalue()


def _canonical(meta: Mapping[str, Any]) -> bytes:
    """The bytes `meta_sha256` hashes: every key but itself, sorted, compact."""
    body = {k: v for k, v in meta.items() if k != "meta_sha256"}
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def save(directory: str | os.PathLike[str], step: int, tensors: Mapping[str, np.ndarray],
         info: Mapping[str, Any] | None = None, keep: int = 3) -> Path:
    """Save a checkpoint of `tensors` at `step` with the JSON-able `info`, keep the `keep`
    newest (0: all) and return the path of its JSON file; CheckpointError when the directory
    cannot be written (the message names it and the system's reason)."""
    if isinstance(step, bool) or int(step) < 0:
        raise ValueError(f"checkpoint step must be a non-negative integer, got {step!r}")
    d = Path(directory)
    stem = f"ckpt-{int(step):09d}"
    data = npz_bytes(tensors)
    meta = {k: v for k, v in (info or {}).items() if k not in _RESERVED}
    meta.update({
        "format": FORMAT, "step": int(step), "npz": f"{stem}.npz",
        "sha256": hashlib.sha256(data).hexdigest(),
        "tensors": [{"name": k, "shape": list(np.shape(v)), "dtype": str(np.asarray(v).dtype)}
                    for k, v in tensors.items()],
    })
    meta["meta_sha256"] = hashlib.sha256(_canonical(meta)).hexdigest()
    text = json.dumps(meta, indent=1, sort_keys=True).encode()
    try:
        d.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(d)
        fsutil.atomic_write(d / f"{stem}.npz", data)
        fsutil.atomic_write(d / f"{stem}.json", text)
        fsutil.atomic_write(d / LATEST, json.dumps({"checkpoint": f"{stem}.json"}).encode())
        _prune(d, int(step), keep)
    except OSError as exc:
        where = exc.filename or d
        raise CheckpointError(f"cannot write checkpoint {stem} in '{d}': "
                              f"{exc.strerror or exc} ('{where}')") from None
    return d / f"{stem}.json"


def _prune(d: Path, step: int, keep: int) -> None:
    """Delete the checkpoints after `step` (superseded by it), the npz files a killed writer
    left without their JSON, and all but the `keep` newest checkpoints up to `step` (`keep`
    <= 0: none of those). Never the one at `step`."""
    files: dict[int, list[Path]] = {}
    for p in d.iterdir():
        if m := _ANY.match(p.name):
            files.setdefault(int(m.group(1)), []).append(p)
    complete = sorted(s for s, ps in files.items()
                      if s < step and any(p.suffix == ".json" for p in ps))
    drop = [s for s in files if s > step or (s < step and s not in complete)]
    if keep > 0:
        drop += complete[:max(0, len(complete) - (keep - 1))]
    for s in drop:
        for p in sorted(files[s], key=lambda q: q.suffix != ".json"):  # the JSON first
            with contextlib.suppress(FileNotFoundError):
                p.unlink()


def remove_stale_temporaries(directory: str | os.PathLike[str],
                             older_than_s: float = STALE_TMP_S) -> int:
    """Delete the temporary files killed writers left in a checkpoint directory (nfc.fsutil's
    and those of older nfc versions) once untouched for `older_than_s`; returns how many."""
    removed = fsutil.remove_stale_temporaries(directory, older_than_s)
    cutoff = time.time() - older_than_s
    with contextlib.suppress(OSError):
        for p in Path(directory).iterdir():
            if _LEGACY_TMP.match(p.name):
                with contextlib.suppress(OSError):
                    if p.stat().st_mtime < cutoff:
                        p.unlink()
                        removed += 1
    return removed


# ------------------------------------------------------------------------------ reading


def _member(d: Path, name: Any, pattern: re.Pattern[str], source: Path, what: str) -> Path:
    """The file `name` that `source` names, confined to the directory `d`."""
    if not isinstance(name, str):
        raise CheckpointCorrupt(f"'{source}' names no {what} (got {name!r})")
    if "/" in name or "\\" in name or name in (".", "..") or os.path.isabs(name):
        raise CheckpointCorrupt(f"'{source}' points to '{name}', outside the checkpoint "
                                f"directory '{d}'; refusing to read it")
    if not pattern.match(name):
        raise CheckpointCorrupt(f"'{source}' names '{name}', which is not a {what} file name")
    path = d / name
    with contextlib.suppress(OSError):
        if path.resolve().parent != d.resolve():
            raise CheckpointCorrupt(f"'{path}' is a link to '{path.resolve()}', outside the "
                                    f"checkpoint directory '{d}'; refusing to read it")
    return path


def latest(directory: str | os.PathLike[str]) -> Path | None:
    """The JSON file `latest.json` of `directory` points to, or None without a `latest.json`;
    CheckpointCorrupt when it is damaged or points to a missing file or outside `directory`.
    (The checkpoint itself is not verified: see `load`, `load_latest`.)"""
    d = Path(directory)
    pointer = d / LATEST
    try:
        raw = pointer.read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise CheckpointCorrupt(f"cannot read '{pointer}': {exc.strerror or exc}") from None
    try:
        doc = json.loads(raw)
    except ValueError:
        raise CheckpointCorrupt(f"'{pointer}' is not valid JSON (truncated or damaged)"
                                ) from None
    if not isinstance(doc, dict) or "checkpoint" not in doc:
        raise CheckpointCorrupt(f"'{pointer}' has no \"checkpoint\" entry (damaged)")
    path = _member(d, doc["checkpoint"], _NAME, pointer, "checkpoint")
    if not path.is_file():
        raise CheckpointCorrupt(f"'{pointer}' points to '{path.name}', which does not exist")
    return path


def checkpoints(directory: str | os.PathLike[str]) -> list[Path]:
    """The checkpoint JSON files of `directory`, newest (highest step) first; unverified."""
    found: list[tuple[int, Path]] = []
    with contextlib.suppress(OSError):
        for p in Path(directory).iterdir():
            if m := _NAME.match(p.name):
                found.append((int(m.group(1)), p))
    return [p for _, p in sorted(found, key=lambda sp: sp[0], reverse=True)]


def _read_meta(p: Path) -> dict[str, Any]:
    """The JSON of checkpoint `p`, its structure and (format 2) its own hash checked."""
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise CheckpointCorrupt(f"cannot read checkpoint '{p}': {exc.strerror or exc}"
                                ) from None
    try:
        meta = json.loads(raw)
    except (ValueError, RecursionError):
        raise CheckpointCorrupt(f"checkpoint '{p}' is not valid JSON (truncated or damaged)"
                                ) from None
    if not isinstance(meta, dict):
        raise CheckpointCorrupt(f"checkpoint '{p}' is not a JSON object (damaged)")
    fmt = meta.get("format")
    if fmt not in READABLE_FORMATS or isinstance(fmt, bool):
        raise CheckpointCorrupt(f"checkpoint '{p}' has format {fmt!r}; this nfc reads "
                                f"formats {', '.join(map(str, READABLE_FORMATS))}")
    if fmt >= 2:
        want = meta.get("meta_sha256")
        if not isinstance(want, str) or hashlib.sha256(_canonical(meta)).hexdigest() != want:
            raise CheckpointCorrupt(f"checkpoint '{p}' does not match its own hash "
                                    "(\"meta_sha256\"): the file is damaged")
    step = meta.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise CheckpointCorrupt(f"checkpoint '{p}' has no valid \"step\" (got {step!r})")
    m = _NAME.match(p.name)
    if m and int(m.group(1)) != step:
        raise CheckpointCorrupt(f"checkpoint '{p}' records step {step}, not the step of its "
                                "name")
    if not isinstance(meta.get("sha256"), str) or not _HASH.match(meta["sha256"]):
        raise CheckpointCorrupt(f"checkpoint '{p}' has no valid \"sha256\" of its tensors")
    records = meta.get("tensors")
    if not isinstance(records, list) or not all(_valid_record(r) for r in records):
        raise CheckpointCorrupt(f"checkpoint '{p}' has no valid \"tensors\" list")
    return meta


def _valid_record(r: Any) -> bool:
    return (isinstance(r, dict) and isinstance(r.get("name"), str)
            and isinstance(r.get("dtype"), str) and isinstance(r.get("shape"), list)
            and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0
                    for n in r["shape"]))


def _read_npz(data: bytes, npz: Path) -> dict[str, np.ndarray]:
    """The members of an npz archive by name, read without pickle. Member by member rather
    than with `np.load`, whose lookup confuses a tensor `x.npy` with a tensor `x`."""
    tensors: dict[str, np.ndarray] = {}
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            for member in zf.infolist():
                name = member.filename.removesuffix(".npy")
                if name == member.filename or name in tensors:
                    raise ValueError(f"unexpected member '{member.filename}'")
                with zf.open(member) as fh:
                    tensors[name] = np.lib.format.read_array(fh, allow_pickle=False)
    except _NPZ_ERRORS as exc:
        raise CheckpointCorrupt(f"'{npz}' is not a readable npz archive: {exc}") from None
    return tensors


def _describe(shape: tuple[int, ...] | list[int], dtype: Any) -> str:
    return f"{np.dtype(dtype) if isinstance(dtype, np.dtype) else dtype}{list(shape)}"


def _check_record(tensors: dict[str, np.ndarray], meta: Mapping[str, Any], p: Path,
                  npz: Path) -> None:
    """The npz holds exactly what the JSON records (format 1: 0-d tensors stored as 1-d are
    given back their shape)."""
    records = {r["name"]: r for r in meta["tensors"]}
    if len(records) != len(meta["tensors"]) or records.keys() != tensors.keys():
        raise CheckpointCorrupt(f"'{npz}' holds tensors {_names(sorted(tensors))} but '{p}' "
                                f"records {_names(sorted(records))}")
    for name, r in records.items():
        arr = tensors[name]
        if meta["format"] == 1 and r["shape"] == [] and arr.shape == (1,):
            arr = tensors[name] = arr.reshape(())
        if arr.dtype.kind not in _KINDS:
            raise CheckpointCorrupt(f"'{npz}' holds '{name}' as {arr.dtype}, which a "
                                    "checkpoint never holds")
        if list(arr.shape) != r["shape"] or str(arr.dtype) != r["dtype"]:
            raise CheckpointCorrupt(f"'{npz}' holds '{name}' as "
                                    f"{_describe(arr.shape, arr.dtype)} but '{p}' records "
                                    f"{_describe(r['shape'], r['dtype'])}")


def _names(names: list[str], most: int = 8) -> str:
    more = f" and {len(names) - most} more" if len(names) > most else ""
    return ", ".join(f"'{n}'" for n in names[:most]) + more


def _check_fit(tensors: Mapping[str, np.ndarray], expect: Mapping[str, Spec], p: Path,
               extra_ok: bool, optional: Collection[str]) -> None:
    """The checkpoint holds what the model expects."""
    missing = sorted(n for n in expect if n not in tensors and n not in optional)
    extra = [] if extra_ok else sorted(n for n in tensors if n not in expect)
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"it lacks {_names(missing)}")
        if extra:
            parts.append(f"it holds {_names(extra)}, which this model does not have")
        raise CheckpointMismatch(
            f"checkpoint '{p}' does not fit this model: {'; '.join(parts)} (was it made with "
            "another model or optimizer? use the same model file and --set options)")
    for name, (shape, dtype) in expect.items():
        arr = tensors.get(name)
        if arr is not None and (arr.shape != tuple(shape) or arr.dtype != np.dtype(dtype)):
            raise CheckpointMismatch(
                f"checkpoint '{p}' does not fit this model: tensor '{name}' must be "
                f"{_describe(shape, np.dtype(dtype))}, the checkpoint has "
                f"{_describe(arr.shape, arr.dtype)}")


def load(path: str | os.PathLike[str], expect: Mapping[str, Spec] | None = None, *,
         extra_ok: bool = False, optional: Collection[str] = ()
         ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """(tensors, info) of the checkpoint whose JSON file is `path`, verified (see the module
    doc). `expect`: the model's tensors by name, `(shape, dtype)`; the checkpoint must hold
    each (but those in `optional`) and, unless `extra_ok`, no other.

    Raises CheckpointCorrupt for a damaged checkpoint and CheckpointMismatch for one that
    does not fit `expect`."""
    p = Path(path)
    meta = _read_meta(p)
    npz = _member(p.parent, meta.get("npz"), _NPZ, p, "npz")
    m = _NPZ.match(npz.name)
    if m is not None and int(m.group(1)) != meta["step"]:
        raise CheckpointCorrupt(f"checkpoint '{p}' of step {meta['step']} names '{npz.name}'")
    try:
        data = npz.read_bytes()
    except OSError as exc:
        raise CheckpointCorrupt(f"cannot read '{npz}' of checkpoint '{p}': "
                                f"{exc.strerror or exc}") from None
    if hashlib.sha256(data).hexdigest() != meta["sha256"]:
        raise CheckpointCorrupt(f"'{npz}' does not match the hash recorded in '{p}' "
                                f"(truncated or damaged: {len(data)} bytes)")
    tensors = _read_npz(data, npz)
    _check_record(tensors, meta, p, npz)
    if expect is not None:
        _check_fit(tensors, expect, p, extra_ok, optional)
    return tensors, meta


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr)


def load_latest(directory: str | os.PathLike[str], expect: Mapping[str, Spec] | None = None,
                *, extra_ok: bool = False, optional: Collection[str] = (),
                warn: Callable[[str], None] = _stderr) -> Loaded | None:
    """The newest intact checkpoint of `directory`: the one `latest.json` names, else (with
    a warning through `warn` for each damaged one) the newest intact one by step. None when
    the directory holds no checkpoint; CheckpointCorrupt when none is intact;
    CheckpointMismatch (no fallback) when the one found does not fit `expect`."""
    d = Path(directory)
    if d.exists() and not d.is_dir():
        raise CheckpointError(f"'{d}' is not a checkpoint directory")
    problems: list[str] = []
    try:
        first = latest(d)
    except CheckpointCorrupt as exc:
        warn(f"nfc: warning: {exc}; looking for the newest intact checkpoint")
        problems.append(str(exc))
        first = None
    order = ([first] if first is not None else []) + [c for c in checkpoints(d) if c != first]
    for c in order:
        try:
            tensors, info = load(c, expect, extra_ok=extra_ok, optional=optional)
        except CheckpointCorrupt as exc:
            warn(f"nfc: warning: {exc}")
            problems.append(str(exc))
            continue
        if problems:
            warn(f"nfc: warning: falling back to the newest intact checkpoint '{c}' "
                 f"(step {info['step']})")
        return Loaded(c, tensors, info)
    if problems:
        raise CheckpointCorrupt(f"no intact checkpoint in '{d}': " + "; ".join(problems))
    return None
