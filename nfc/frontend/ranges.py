"""Index-range inference for one comprehension statement (Tensor Comprehensions style).

An index's extent is the size of every tensor dimension where the index appears alone as the
subscript. Several such uses must agree; with none, the index needs an explicit range
(`sum(k in 0..N)`, `t[i in 0..N] = ...`). Explicit ranges may start anywhere (`lo..hi`).

A bare use inside a branch of `a if c else b` whose condition `c` mentions the same index
does not decide alone: the branch holds only where `c` allows. When every bare use is guarded
like that, the range is the union over the branches of the values each reads in bounds
(nfc.frontend.guards), e.g. 0..I + H for `x[n, k] if k < I else h[n, k - I]`. When that union
is unbounded (`x[k] if k < I else 0.0`), the bare uses decide as before.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from nfc.diagnostics import error, note
from nfc.frontend import ast
from nfc.frontend.guards import Domain, Scopes, bounded


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
    guarded: bool
    """Whether an enclosing condition mentions the index (then the use does not decide)."""


def explicit(lo: ast.Expr, hi: ast.Expr, name: str, loc: ast.Node,
             ct_int: Callable[[ast.Expr, str], int]) -> Range:
    """The range `lo..hi` (hi excluded); it must not be empty."""
    a, b = ct_int(lo, "a range bound"), ct_int(hi, "a range bound")
    if b <= a:
        raise error(f"range {a}..{b} of index '{name}' is empty", loc.loc)
    return Range(a, b - a)


def _no_names(name: str) -> object:
    return None


def infer(stmt: ast.Node, lhs: list[tuple[str, ast.Node, Range | None]], value: ast.Expr,
          shape_of: Callable[[str], tuple[int, ...] | None],
          ct_int: Callable[[ast.Expr, str], int],
          const_of: Callable[[str], object] = _no_names,
          on_failure: Callable[[list[ast.Subscript]], None] | None = None) -> RangeTable:
    """Ranges of the output indices `lhs` (name, node, range if known) and of every reduction
    index inside `value`. Raises a CompileError for missing or conflicting ranges.

    `const_of(name)` gives the value of a compile-time name (None otherwise), for guards;
    `on_failure(accesses)` runs before an inference error is raised, so that the caller can
    report a more fundamental problem with the accessed tensors instead (unknown or failed).
    """
    table: RangeTable = {}
    # key, name, node, kind of binder, the expression it binds in and the scopes around that
    binders: list[tuple[int, str, ast.Node, str, ast.Expr, Scopes | None]] = []
    uses: dict[tuple[int, str], list[_Use]] = {}
    accesses: list[ast.Subscript] = []
    guard_keys: set[tuple[int, str]] = set()  # indices that some condition mentions
    seen: set[str] = set()
    for name, node, rng in lhs:
        if name in seen:
            raise error(f"index '{name}' appears twice on the left-hand side", node.loc)
        seen.add(name)
        if rng is not None:
            table[(id(stmt), name)] = rng
        else:
            binders.append((id(stmt), name, node, "output", value, None))

    mentioned: dict[tuple[int, str, int], bool] = {}

    def guarded(key: int, name: str, conds: tuple[tuple[ast.Expr, Scopes], ...]) -> bool:
        # memoised per condition: every use below a condition asks about it again
        for c, sc in conds:
            k = (key, name, id(c))
            if k not in mentioned:
                mentioned[k] = Domain(key, name, shape_of, const_of).mentions(c, sc)
            if mentioned[k]:
                return True
        return False

    def walk(e: ast.Expr, scopes: Scopes, conds: tuple[tuple[ast.Expr, Scopes], ...]) -> None:
        if isinstance(e, ast.Subscript):
            is_index = Domain.binder(e.name, scopes) is not None
            if not is_index:
                accesses.append(e)
            shape = None if is_index else shape_of(e.name)
            for d, ix in enumerate(e.indices):
                if isinstance(ix, ast.Name) and shape is not None and d < len(shape):
                    key = Domain.binder(ix.id, scopes)
                    if key is not None:
                        uses.setdefault((key, ix.id), []).append(
                            _Use(shape[d], e, d, guarded(key, ix.id, conds)))
                walk(ix, scopes, conds)
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
                    binders.append((id(e), ri.name, ri, e.op, e, scopes))
            walk(e.body, [*scopes, (id(e), frozenset(names))], conds)
            return
        if isinstance(e, ast.IfExp):
            for key, names_ in scopes:
                for n in names_:
                    if Domain(key, n, shape_of, const_of).mentions(e.cond, scopes):
                        guard_keys.add((key, n))
            walk(e.cond, scopes, conds)
            walk(e.a, scopes, (*conds, (e.cond, scopes)))
            walk(e.b, scopes, (*conds, (e.cond, scopes)))
            return
        for c in e.children():
            walk(c, scopes, conds)

    top: Scopes = [(id(stmt), frozenset(seen))]
    walk(value, top, ())
    for key, name, node, kind, body, around in binders:
        found = uses.get((key, name), [])
        plain = [u for u in found if not u.guarded]
        example = (f"`{kind}({name} in 0..N)`" if kind != "output"
                   else f"`t[{name} in 0..N] = ...`")
        if not plain and (key, name) in guard_keys:
            rng = _union_range(Domain(key, name, shape_of, const_of), body,
                               top if around is None else around, name, node, example)
            if rng is not None:
                table[(key, name)] = rng
                continue
            plain = found
        if not plain:
            if on_failure is not None:
                on_failure(accesses)
            raise error(f"cannot infer the range of index '{name}': it is never used alone as "
                        f"a subscript; give its range explicitly, e.g. {example}", node.loc)
        first = plain[0]
        for u in plain[1:]:
            if u.size != first.size:
                if on_failure is not None:
                    on_failure(accesses)
                raise error(
                    f"conflicting ranges for index '{name}': '{first.access.name}' dimension "
                    f"{first.dim} has size {first.size} but '{u.access.name}' dimension {u.dim} "
                    f"has size {u.size}", u.access.indices[u.dim].loc,
                    note(f"'{name}' ranges over {first.size} here",
                         first.access.indices[first.dim].loc))
        table[(key, name)] = Range(0, first.size)
    return table


def _union_range(dom: Domain, body: ast.Expr, scopes: Scopes, name: str, node: ast.Node,
                 example: str) -> Range | None:
    """The range of the values that some branch reads in bounds; None when unbounded."""
    s = dom.dom(body, scopes)
    if not bounded(s):
        return None
    if len(s) > 1:
        parts = " and ".join(f"{lo}..{hi + 1}" for lo, hi in s)
        raise error(f"cannot infer the range of index '{name}': the branches read in bounds "
                    f"for {parts}, which is not one range; give its range explicitly, e.g. "
                    f"{example}", node.loc)
    lo, hi = s[0]
    return Range(lo, hi - lo + 1)
