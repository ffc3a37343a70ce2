"""Finding rows: the built-in table, rows registered at run time, and plugin entry points.

A plugin package adds an intrinsic by naming a row in the `nfc.intrinsics` entry-point group:

    [project.entry-points."nfc.intrinsics"]
    softsign = "nfc_softsign:SOFTSIGN"          # an nfc.ops.Op with name "softsign"

The entry point is loaded when the name is first looked up (the parser, the verifier or the
frontend meets `softsign(...)`), or by `load_entry_points()`; `register(row)` adds a row
directly. A name registered twice by different sources is an error naming both.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import os
from collections.abc import Iterable, Iterator, Mapping
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any

from nfc.diagnostics import CompileError, Diagnostic
from nfc.ir import Binary, Call, Cast, Expr, Select, Unary
from nfc.ops.lattice import CLASSES
from nfc.ops.table import ROWS, Op

#: The entry-point group intrinsic plugins register in.
ENTRY_POINT_GROUP = "nfc.intrinsics"

#: The built-in rows by name.
BUILTIN: dict[str, Op] = {r.name: r for r in ROWS}
_added: dict[str, tuple[Op, str]] = {}
_eps: dict[str, EntryPoint] | None = None
_clashes: dict[str, list[str]] = {}  # names two distributions register (an error when used)
#: Names an intrinsic may not take: the IR's other call-like spellings.
RESERVED = frozenset({"select", "cast", "neg", "not", "and", "or", "f16", "bf16", "f32", "f64",
                      "i1", "i32", "i64", "sum", "prod"})


def _fail(message: str) -> CompileError:
    return CompileError([Diagnostic("error", message, None)])


def _describe(ep: EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    return f"{ep.value} (from {dist.name})" if dist is not None else ep.value


def entry_points() -> dict[str, EntryPoint]:
    """The `nfc.intrinsics` entry points by name (nothing is imported)."""
    global _eps
    if _eps is None:
        found: dict[str, EntryPoint] = {}
        for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            prev = found.get(ep.name)
            if prev is not None and prev.value != ep.value:
                _clashes[ep.name] = sorted([_describe(prev), _describe(ep)])
            found.setdefault(ep.name, ep)
        _eps = found
    return _eps


def _validate(row: object, source: str, name: str | None = None) -> Op:
    if not isinstance(row, Op):
        raise _fail(f"{source} is not an nfc.ops.Op")
    if name is not None and row.name != name:
        raise _fail(f"entry point '{name}' loads {source}, whose name is '{row.name}'")
    if not row.name.isidentifier() or row.name in RESERVED:
        raise _fail(f"{source}: '{row.name}' cannot name an intrinsic")
    if row.node is not Call or row.arity < 1 or row.operands not in CLASSES:
        raise _fail(f"{source}: an intrinsic row has node Call, an arity of at least 1 and an "
                    f"operand class from nfc.ops.lattice, got {row.node.__name__}, "
                    f"{row.arity}, {row.operands!r}")
    if row.numpy is None:
        raise _fail(f"{source}: intrinsic '{row.name}' has no numpy semantics (the interpreter "
                    "is the oracle every backend is checked against)")
    return row


def register(row: Op, source: str = "") -> Op:
    """Add an intrinsic row (a plugin's, or a test's) under its name."""
    source = source or f"intrinsic '{row.name}'"
    _validate(row, source)
    prev = BUILTIN.get(row.name) or (_added.get(row.name, (None, ""))[0])
    if prev is row:
        return row
    if prev is not None:
        other = "nfc" if row.name in BUILTIN else _added[row.name][1]
        raise _fail(f"intrinsic '{row.name}' is registered twice: by {other} and by {source}")
    _added[row.name] = (row, source)
    return row


def unregister(name: str) -> None:
    """Remove a row added with `register` (tests)."""
    _added.pop(name, None)


def load_entry_point(name: str) -> Op | None:
    """The row the entry point `name` names, loaded and registered; None if there is none."""
    ep = entry_points().get(name)
    if ep is None:
        return None
    if name in _clashes:
        first, second = _clashes[name]
        raise _fail(f"intrinsic '{name}' is registered twice: by {first} and by {second}")
    try:
        obj = ep.load()
    except Exception as exc:  # noqa: BLE001 - a broken plugin is the user's to fix
        raise _fail(f"cannot load intrinsic '{name}' from {_describe(ep)}: "
                    f"{type(exc).__name__}: {exc}") from None
    return register(_validate(obj, _describe(ep), name), _describe(ep))


def load_entry_points() -> list[Op]:
    """Load every `nfc.intrinsics` entry point (explicitly, e.g. for a listing)."""
    out = []
    for name in entry_points():
        row = get(name)
        if row is not None:
            out.append(row)
    return out


def load_plugin(spec: str) -> Op:
    """Register the row named by `module:attribute`."""
    mod, _, attr = spec.partition(":")
    if not mod or not attr:
        raise _fail(f"expected module:attribute, got '{spec}'")
    try:
        obj: Any = getattr(importlib.import_module(mod), attr)
    except (ImportError, AttributeError) as exc:
        raise _fail(f"cannot load intrinsic from '{spec}': {exc}") from None
    return register(_validate(obj, spec), spec)


def get(name: str) -> Op | None:
    """The row named `name`: built in, registered, or from an entry point (loaded now)."""
    row = BUILTIN.get(name)
    if row is not None:
        return row
    hit = _added.get(name)
    if hit is not None:
        return hit[0]
    return load_entry_point(name) if name.isidentifier() else None


def plugin_fingerprint(names: Iterable[str]) -> str:
    """A hash of the code of the non-built-in rows among `names` (their modules and hooks'
    sources), "" when there is none: part of a compiled kernel's cache key, so that a changed
    plugin never reuses objects compiled with its old code."""
    h = hashlib.sha256()
    found = False
    for name in sorted(set(names)):
        hit = _added.get(name)
        if hit is None:
            continue
        found = True
        row, source = hit
        h.update(f"{name}\0{source}\0".encode())
        mods = {getattr(row.numpy, "__module__", None), getattr(row.grad, "__module__", None)}
        mods |= {str(v).partition(":")[0] for v in row.lower.values() if isinstance(v, str)}
        mods |= {getattr(v, "__module__", None) for v in row.lower.values()}
        for mod in sorted(m for m in mods if m):
            spec = importlib.util.find_spec(mod)
            origin = spec.origin if spec is not None else None
            if origin and os.path.exists(origin):
                h.update(mod.encode() + b"\0" + Path(origin).read_bytes())
    return h.hexdigest() if found else ""


def key(e: Expr) -> str | None:
    """The row name of an operator node; None for leaves (literals, indices, loads)."""
    if isinstance(e, Binary | Unary):
        return e.op
    if isinstance(e, Call):
        return e.fn
    if isinstance(e, Select):
        return "select"
    if isinstance(e, Cast):
        return "cast"
    return None


def find(e: Expr) -> Op | None:
    """The row of the operator node `e`; None for a leaf or an unknown operator."""
    name = key(e)
    if name is None:
        return None
    row = BUILTIN.get(name) if not isinstance(e, Call) else get(name)
    return row if row is not None and isinstance(e, row.node) else None


def intrinsic_names() -> list[str]:
    """Every intrinsic name: built in (table order), registered, then not yet loaded plugins."""
    names = [r.name for r in ROWS if r.node is Call]
    names += [n for n in _added if n not in names]
    names += [n for n in entry_points() if n not in names]
    return names


class Intrinsics(Mapping[str, int]):
    """Intrinsic name -> number of arguments, over the table (plugins loaded on lookup).

    With `surface`, only the intrinsics `.nf` source may call (not `philox`)."""

    def __init__(self, *, surface: bool = False) -> None:
        self.surface = surface

    def _row(self, name: str) -> Op | None:
        row = get(name) if isinstance(name, str) else None
        if row is None or row.node is not Call or (self.surface and not row.surface):
            return None
        return row

    def __getitem__(self, name: str) -> int:
        row = self._row(name)
        if row is None:
            raise KeyError(name)
        return row.arity

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self._row(name) is not None

    def __iter__(self) -> Iterator[str]:
        return iter([n for n in intrinsic_names() if self._row(n) is not None])

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __repr__(self) -> str:
        return f"Intrinsics({dict(self)!r})"
