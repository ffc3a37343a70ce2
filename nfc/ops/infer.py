"""Kinds of whole expressions by the table's rules, and constant folding of literals.

`Typer` walks an expression bottom-up with `nfc.ops.lattice.check` at every operator (a
violation is ignored, a failed join gives no kind) and memoises per node; a backend passes its
own leaves (loop-IR buffers, i64 index variables) and `promote`. The verifier and the
interpreter walk expressions themselves (they report, and evaluate), with the same `check`.

`fold` evaluates an operator on literals with the row's numpy function, in the literals' dtype
(weak integers exactly, as Python integers; weak floats in float64; a float function of a typed
literal in float64, rounded to its dtype), and refuses what must not fold: ill-typed operands,
points outside the row's `defined` domain, results no integer type can hold.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nfc.ir import Cast, Const, DType, Expr, Index, Load
from nfc.ops.lattice import (
    FLOAT,
    WEAK_FLOAT,
    WEAK_INT,
    Join,
    Kind,
    TypeClash,
    check,
    const_kind,
    ignore,
    join,
    raise_clash,
)
from nfc.ops.numerics import np
from nfc.ops.registry import find

Leaf = Callable[[Expr], Kind | None]


class Typer:
    """Lenient kinds of expressions, memoised per node (each entry pins its node, so ids are
    never reused while the Typer lives)."""

    def __init__(self, leaf: Leaf | None = None, join_fn: Join = join) -> None:
        self.leaf = leaf
        """Kinds of the leaves the IR does not know (None: not a leaf of that kind)."""
        self.join_fn = join_fn
        self.memo: dict[int, tuple[Expr, Kind | None, Kind | None]] = {}

    def kinds(self, e: Expr) -> tuple[Kind | None, Kind | None]:
        """(operand kind, result kind) of `e`; the operand kind of a leaf is None."""
        hit = self.memo.get(id(e))
        if hit is not None and hit[0] is e:
            return hit[1], hit[2]
        opk, res = self._kinds(e)
        self.memo[id(e)] = (e, opk, res)
        return opk, res

    def kind(self, e: Expr) -> Kind | None:
        """The kind of `e` (None where it is ill-typed)."""
        return self.kinds(e)[1]

    def _kinds(self, e: Expr) -> tuple[Kind | None, Kind | None]:
        if self.leaf is not None:
            k = self.leaf(e)
            if k is not None:
                return None, k
        if isinstance(e, Const):
            return None, const_kind(e)
        if isinstance(e, Index):
            return None, WEAK_INT
        if isinstance(e, Load):
            return None, e.tensor.dtype
        row = find(e)
        if row is None:
            return None, None
        return check(row, e, [self.kind(c) for c in e.children()], ignore, self.join_fn)


def kind_of(e: Expr) -> Kind | None:
    """The lenient kind of one expression (see Typer)."""
    return Typer().kind(e)


# ---------------------------------------------------------------------------------------------
# constant folding

_INT64 = (-(1 << 63), (1 << 63) - 1)


def const_of(value: Any, dtype: DType | None) -> Const | None:
    """A literal holding a numpy or Python result, None when it cannot be represented."""
    if isinstance(value, np.generic | np.ndarray):
        value = np.asarray(value).reshape(()).item()
    if isinstance(value, bool) or dtype == DType.I1:
        return Const(bool(value), DType.I1)
    if dtype is not None and dtype.is_float:
        return Const(float(value), dtype)
    if isinstance(value, float):
        return Const(value, dtype)
    if dtype is None and not _INT64[0] <= value <= _INT64[1]:
        return None  # a weak literal that no integer type can hold: leave it to the verifier
    return Const(int(value), dtype)


def _array(c: Const, k: Kind) -> Any:
    """A one-element array of literal `c` in operand kind `k`; None when it does not fit."""
    if k is WEAK_INT:
        return np.array([c.value], dtype=object)  # exact: Python integers
    dt = np.float64 if k is WEAK_FLOAT else k.numpy  # type: ignore[union-attr]
    try:
        return np.array([c.value], dtype=dt)
    except (OverflowError, ValueError):
        return None


def fold(e: Expr) -> Const | None:
    """`e`, an operator applied to literals, as a literal; None when it must not fold."""
    args = e.children()
    if not all(isinstance(a, Const) for a in args):
        return None
    if isinstance(e, Cast):
        return fold_cast(e.dtype, args[0])  # type: ignore[arg-type]
    row = find(e)
    if row is None or row.numpy is None:
        return None
    consts: list[Const] = list(args)  # type: ignore[arg-type]
    try:
        opk, res = check(row, e, [const_kind(c) for c in consts], raise_clash)
    except TypeClash:
        return None  # ill-typed: the verifier reports it
    assert opk is not None and res is not None
    if not row.fold_on(opk, *consts):
        return None
    in_f64 = row.operands == FLOAT and opk is not WEAK_FLOAT
    xs = [_array(c, opk) for c in consts]
    if any(x is None for x in xs):
        return None
    with np.errstate(all="ignore"):
        if in_f64:  # a float function: float64, rounded to the literal's dtype
            r = np.asarray(row.numpy(*(x.astype(np.float64) for x in xs)))
            if res != DType.I1:
                r = r.astype(xs[0].dtype)
        else:
            r = row.numpy(*xs)
    if res == DType.I1:
        return Const(bool(np.asarray(r).reshape(-1)[0]), DType.I1)
    weak = not isinstance(res, DType)
    return const_of(r[0] if weak else r, None if weak else res)  # type: ignore[arg-type]


def fold_cast(dtype: DType, a: Const) -> Const | None:
    """`dtype(a)` for a literal, converting like numpy's `astype` (the interpreter's rule)."""
    if dtype == DType.I1:
        return Const(bool(a.value), DType.I1)
    src = a.dtype or (DType.F64 if a.is_float else DType.I64)
    x = _array(a, src)
    if x is None:
        return None
    if dtype.is_int and src.is_float and not np.isfinite(x[0]):
        return None  # undefined in numpy and in C
    with np.errstate(all="ignore"):
        return const_of(x.astype(dtype.numpy), dtype)
