"""Index-range inference for one comprehension statement (Tensor Comprehensions style).

An index's extent is the size of every tensor dimension where the index appears alone as the
subscript. Several such uses must agree; with none, the index needs an explicit range
(`sum(k in 0..N)`, `t[i in 0..N] = ...`). Explicit ranges may start anywhere (`lo..hi`).

A bare use inside a branch of `a if c else b` whose condition `c` mentions the same index
does not decide alone: the branch holds only where `c` allows. When every bare use is guarded
like that, the range is the union over the branches of the values each reads in bounds
(nfc.frontend.guards), e.g. 0..I + H for `x[n, k] if k < I else h[n, k - I]`. When that union
is unbounded (`x[k] if k < I else 0.0`), the bare uses decide as before.

The explicit range of a reduction index may depend on enclosing indices (and on earlier
indices of its own head): `sum(j in 0..i + 1)`. Its range is then the hull of the bounds'
values over the ranges of those indices (by interval arithmetic), and `Range.bounds` keeps the
bounds so that lowering guards the body with `lo <= j < hi` (the reduction's identity
elsewhere).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

from nfc.diagnostics import error, note
from nfc.frontend import ast
from nfc.frontend.guards import Domain, Scopes, bounded
from nfc.frontend.shapes import names_in


@dataclass(frozen=True)
class Range:
    """Index values lo, lo + 1, ..., lo + extent - 1."""

    lo: int
    extent: int
    bounds: tuple[ast.Expr | None, ast.Expr | None] | None = None
    """The bounds `lo..hi` as written when they depend on other indices: the range above is
    their hull, and the reduction's body is guarded by `lo <= j < hi` (None: a constant side,
    which needs no guard)."""


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
             ct_int: Callable[[ast.Expr, str], int],
             indices: Collection[str] = ()) -> Range:
    """The range `lo..hi` (hi excluded) of an output index; it must not be empty, and its
    bounds cannot mention the other output `indices` (an output is a box)."""
    for bound in (lo, hi):
        used = [n for n in names_in(bound) if n in indices and n != name]
        if used:
            raise error(f"the range of output index '{name}' depends on index '{used[0]}'; the "
                        "ranges of output indices must be compile-time constants: give the "
                        f"whole range and guard the value, e.g. `t[{used[0]}, {name}] = "
                        f"(... if {name} < {used[0]} + 1 else 0.0)`", bound.loc)
    return _constant(lo, hi, name, loc, ct_int)


def _constant(lo: ast.Expr, hi: ast.Expr, name: str, loc: ast.Node,
              ct_int: Callable[[ast.Expr, str], int]) -> Range:
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
                around = [*scopes, (id(e), frozenset(names))]
                names.add(ri.name)
                if ri.lo is not None and ri.hi is not None:
                    if _uses(ri.lo, around) or _uses(ri.hi, around):
                        dependent.append((id(e), ri, around))
                    else:
                        table[(id(e), ri.name)] = _constant(ri.lo, ri.hi, ri.name, ri, ct_int)
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

    dependent: list[tuple[int, ast.RedIndex, Scopes]] = []
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
    _dependent_ranges(dependent, table, ct_int)
    return table


class _Pending(Exception):
    """A bound uses an index whose range is not known yet."""


def _dependent_ranges(dependent: list[tuple[int, ast.RedIndex, Scopes]], table: RangeTable,
                      ct_int: Callable[[ast.Expr, str], int]) -> None:
    """The ranges of reduction indices whose bounds use other indices: the hull of the
    bounds over those indices' ranges (in dependency order)."""
    while dependent:
        progress = False
        for item in list(dependent):
            key, ri, scopes = item
            assert ri.lo is not None and ri.hi is not None
            try:
                lo = _interval(ri.lo, scopes, table, ct_int)[0]
                hi = _interval(ri.hi, scopes, table, ct_int)[1]
            except _Pending:
                continue
            if hi <= lo:
                raise error(f"range of index '{ri.name}' is empty for every value of the "
                            f"indices its bounds use (at most {lo}..{hi})", ri.loc)
            # a constant side is the hull's own bound: only the other needs a guard
            table[(key, ri.name)] = Range(lo, hi - lo, (
                ri.lo if _uses(ri.lo, scopes) else None, ri.hi if _uses(ri.hi, scopes) else None))
            dependent.remove(item)
            progress = True
        if not progress:  # bounds that use each other
            ri = dependent[0][1]
            raise error(f"the bounds of index '{ri.name}' depend on an index whose range "
                        "depends on them", ri.loc)


def _uses(e: ast.Expr, scopes: Scopes) -> bool:
    """Whether `e` uses an index of `scopes`."""
    return any(Domain.binder(n, scopes) is not None for n in names_in(e))


def _interval(e: ast.Expr, scopes: Scopes, table: RangeTable,
              ct_int: Callable[[ast.Expr, str], int]) -> tuple[int, int]:
    """Smallest and largest value of the bound `e` over the ranges of the indices it uses."""
    if not _uses(e, scopes):
        v = ct_int(e, "a range bound")
        return v, v
    if isinstance(e, ast.Name):
        key = Domain.binder(e.id, scopes)
        rng = table.get((key, e.id)) if key is not None else None
        if rng is None:
            raise _Pending
        return rng.lo, rng.lo + rng.extent - 1
    if isinstance(e, ast.Unary) and e.op == "neg":
        lo, hi = _interval(e.x, scopes, table, ct_int)
        return -hi, -lo
    if isinstance(e, ast.BinOp):
        a = _interval(e.a, scopes, table, ct_int)
        b = _interval(e.b, scopes, table, ct_int)
        if e.op == "+":
            return a[0] + b[0], a[1] + b[1]
        if e.op == "-":
            return a[0] - b[1], a[1] - b[0]
        if e.op == "*":
            products = [x * y for x in a for y in b]
            return min(products), max(products)
        if e.op in ("//", "%") and b[0] == b[1] and b[0] > 0:
            return (a[0] // b[0], a[1] // b[0]) if e.op == "//" else (0, b[0] - 1)
    raise error("a range bound that uses indices must be affine in them (`+ - *`, and `//` "
                "or `%` by a positive constant)", e.loc)


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
