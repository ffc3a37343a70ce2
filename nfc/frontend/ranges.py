"""Index-range inference for one comprehension statement (Tensor Comprehensions style).

An index's extent is the size of every tensor dimension where the index appears alone as the
subscript. Several such uses must agree; with none, the index needs an explicit range
(`sum(k in 0..N)`, `t[i in 0..N] = ...`). Explicit ranges may start anywhere (`lo..hi`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from nfc.diagnostics import error, note
from nfc.frontend import ast


@dataclass(frozen=True)
class Range:
    """Index values lo, lo + 1, ..., lo + extent - 1."""

    lo: int
    extent: int


#: (id of the binding node, index name) -> range; the binding node is the comprehension
#: statement for its output indices and the Reduce node for reduction indices.
RangeTable = dict[tuple[int, str], Range]


@dataclass(frozen=True)
class _Use:
    size: int
    access: ast.Subscript
    dim: int


def explicit(lo: ast.Expr, hi: ast.Expr, name: str, loc: ast.Node,
             ct_int: Callable[[ast.Expr, str], int]) -> Range:
    """The range `lo..hi` (hi excluded); it must not be empty."""
    a, b = ct_int(lo, "a range bound"), ct_int(hi, "a range bound")
    if b <= a:
        raise error(f"range {a}..{b} of index '{name}' is empty", loc.loc)
    return Range(a, b - a)


def infer(stmt: ast.Node, lhs: list[tuple[str, ast.Node, Range | None]], value: ast.Expr,
          shape_of: Callable[[str], tuple[int, ...] | None],
          ct_int: Callable[[ast.Expr, str], int]) -> RangeTable:
    """Ranges of the output indices `lhs` (name, node, range if known) and of every reduction
    index inside `value`. Raises a CompileError for missing or conflicting ranges."""
    table: RangeTable = {}
    binders: list[tuple[int, str, ast.Node, str]] = []  # key, name, node, kind of binder
    uses: dict[tuple[int, str], list[_Use]] = {}
    seen: set[str] = set()
    for name, node, rng in lhs:
        if name in seen:
            raise error(f"index '{name}' appears twice on the left-hand side", node.loc)
        seen.add(name)
        if rng is not None:
            table[(id(stmt), name)] = rng
        else:
            binders.append((id(stmt), name, node, "output"))

    def resolve(name: str, scopes: list[tuple[int, set[str]]]) -> int | None:
        for key, names in reversed(scopes):
            if name in names:
                return key
        return None

    def walk(e: ast.Expr, scopes: list[tuple[int, set[str]]]) -> None:
        if isinstance(e, ast.Subscript):
            shape = None if resolve(e.name, scopes) is not None else shape_of(e.name)
            for d, ix in enumerate(e.indices):
                if isinstance(ix, ast.Name) and shape is not None and d < len(shape):
                    key = resolve(ix.id, scopes)
                    if key is not None:
                        uses.setdefault((key, ix.id), []).append(_Use(shape[d], e, d))
                walk(ix, scopes)
            return
        if isinstance(e, ast.Reduce):
            names: set[str] = set()
            for ri in e.indices:
                if ri.name in names:
                    raise error(f"index '{ri.name}' appears twice in '{e.op}'", ri.loc)
                names.add(ri.name)
                if ri.lo is not None and ri.hi is not None:
                    table[(id(e), ri.name)] = explicit(ri.lo, ri.hi, ri.name, ri, ct_int)
                else:
                    binders.append((id(e), ri.name, ri, e.op))
            walk(e.body, [*scopes, (id(e), names)])
            return
        for c in e.children():
            walk(c, scopes)

    walk(value, [(id(stmt), seen)])
    for key, name, node, kind in binders:
        found = uses.get((key, name), [])
        if not found:
            example = (f"`{kind}({name} in 0..N)`" if kind != "output"
                       else f"`t[{name} in 0..N] = ...`")
            raise error(f"cannot infer the range of index '{name}': it is never used alone as "
                        f"a subscript; give its range explicitly, e.g. {example}", node.loc)
        first = found[0]
        for u in found[1:]:
            if u.size != first.size:
                raise error(
                    f"conflicting ranges for index '{name}': '{first.access.name}' dimension "
                    f"{first.dim} has size {first.size} but '{u.access.name}' dimension {u.dim} "
                    f"has size {u.size}", u.access.indices[u.dim].loc,
                    note(f"'{name}' ranges over {first.size} here",
                         first.access.indices[first.dim].loc))
        table[(key, name)] = Range(0, first.size)
    return table
