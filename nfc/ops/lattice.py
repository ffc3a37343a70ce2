"""The dtype lattice of scalar expressions and the typing rule of every operand class.

A scalar expression has a *kind*: a `DType`, or one of two weak kinds. Literals without a
dtype and index variables are weak (`WEAK_INT`, `WEAK_FLOAT`): they take the type of what they
meet. `join` is the one rule for two operands:

    join(t, t) = t                      two typed operands must agree
    join(t, weak int) = t               a weak integer becomes anything (i1 included)
    join(t, weak float) = t             if t is a float; a weak float never becomes an integer
    join(weak int, weak float) = weak float

Each operator row (`nfc.ops.table`) names an *operand class* that says what its operands may
be and what it gives; `check` applies it. Every consumer runs the same `check`, differing only
in what it does with a violation and in the join it passes:

- the verifier and the interpreter report violations (the node gets no kind);
- the simplifier and the cost model ignore them and keep the kind the node would have (a
  failed join still gives no kind);
- a backend types loop IR, where index variables are machine integers (`i64`), with
  `promote` (floats beat integers, wider beats narrower) and resolves weak kinds by the
  type the context expects (`resolve`).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from nfc.ir import Binary, Const, DType, Expr, Unary

if TYPE_CHECKING:
    from nfc.ops.table import Op


class Weak(enum.StrEnum):
    """The weak kinds: an expression made only of untyped literals and index variables."""

    INT = "int"
    FLOAT = "float"


WEAK_INT = Weak.INT
WEAK_FLOAT = Weak.FLOAT
#: An element of the lattice: a dtype, or a weak kind.
Kind = DType | Weak
#: Where a violation goes: a message sink (the verifier collects, the interpreter raises).
Report = Callable[[str], None]


class TypeClash(Exception):
    """A typing rule is violated; the message says which (raised by `raise_clash`)."""


def raise_clash(message: str) -> None:
    """A `Report` that raises TypeClash."""
    raise TypeClash(message)


def ignore(message: str) -> None:
    """A `Report` that drops the violation (lenient typing)."""


def is_float(k: Kind | None) -> bool:
    """Whether `k` is a float kind (weak floats included)."""
    return k is WEAK_FLOAT or (isinstance(k, DType) and k.is_float)


def is_weak(k: Kind | None) -> bool:
    """Whether `k` is a weak kind."""
    return isinstance(k, Weak)


def const_kind(c: Const) -> Kind:
    """The kind of a literal: its dtype, i1 for booleans, else weak."""
    if isinstance(c.value, bool):
        return DType.I1
    if c.dtype is not None:
        return c.dtype
    return WEAK_FLOAT if c.is_float else WEAK_INT


def join(what: str, a: Kind | None, b: Kind | None, report: Report = ignore) -> Kind | None:
    """The common kind of two operands of `what` (None when one is unknown or they clash;
    a clash is reported)."""
    if a is None or b is None:
        return None
    if isinstance(a, DType) and isinstance(b, DType):
        if a != b:
            report(f"operands of '{what}' have different types {a} and {b}")
            return None
        return a
    if isinstance(a, DType) or isinstance(b, DType):
        strong, weak = (a, b) if isinstance(a, DType) else (b, a)
        assert isinstance(strong, DType)
        if weak is WEAK_FLOAT and not strong.is_float:
            report(f"a float operand of '{what}' meets an integer operand of type {strong}")
            return None
        return strong
    return WEAK_FLOAT if WEAK_FLOAT in (a, b) else WEAK_INT


def promote(what: str, a: Kind | None, b: Kind | None, report: Report = ignore) -> Kind | None:
    """The machine join of a backend: a typed operand beats a weak one, floats beat integers,
    wider beats narrower (index variables are `i64` there and meet `i32` data)."""
    if a is None or b is None:
        return None
    if isinstance(a, DType) and isinstance(b, DType):
        if a == b:
            return a
        if a.is_float != b.is_float:
            return a if a.is_float else b
        return a if a.itemsize >= b.itemsize else b
    if isinstance(a, DType) or isinstance(b, DType):
        return a if isinstance(a, DType) else b
    return WEAK_FLOAT if WEAK_FLOAT in (a, b) else WEAK_INT


def resolve(k: Kind, ctx: DType | None) -> DType:
    """The dtype a backend computes kind `k` in, given the type its context expects: a weak
    kind takes the context's type (a weak float only a float one), else f32 or i64."""
    if isinstance(k, DType):
        return k
    if ctx is not None and (k is WEAK_INT or ctx.is_float):
        return ctx
    return DType.F32 if k is WEAK_FLOAT else DType.I64


Join = Callable[[str, Kind | None, Kind | None, Report], Kind | None]

# ---------------------------------------------------------------------------------------------
# operand classes

#: i1 operands, i1 result (`and`, `or`, `not`).
BOOL = "bool"
#: operands of any one type, i1 result (comparisons).
ANY = "any"
#: numbers of one type, not i1 (`+ - * // %`, `neg`, `abs`, `max`, `min`).
NUM = "num"
#: floats of one type (`/`): an integer operand, weak or not, is an error.
REAL = "real"
#: floats of one type; weak integers become weak floats (`exp`, `atan2`, `isfinite`, ...).
FLOAT = "float"
#: floats of one type, or weak integers, which stay integers (`pow(2, 10)` is `1024`).
FLOAT_OR_WEAK = "float-or-weak"
#: integers of any types, computed in i64 (`philox`).
INT = "int"
#: `select(c, a, b)`: an i1 condition and two operands of one type.
SELECT = "select"
#: `f32(x)`: any operand, the cast's dtype.
CAST = "cast"

CLASSES = (BOOL, ANY, NUM, REAL, FLOAT, FLOAT_OR_WEAK, INT, SELECT, CAST)


def _i1_message(row: Op) -> str:
    if row.node is Binary:
        return f"arithmetic '{row.name}' on i1 values"
    if row.node is Unary:
        return "negation of an i1 value"
    return f"'{row.name}' of i1 values"


def check(row: Op, e: Expr, kinds: Sequence[Kind | None], report: Report = ignore,
          join_fn: Join = join) -> tuple[Kind | None, Kind | None]:
    """(operand kind, result kind) of `e`, an application of `row` to operands of `kinds`.

    Violations go to `report`; the kinds returned are those the node has when its operands
    are taken as they are (what lenient consumers use). The operand kind is the type the
    operands are converted to before the operator applies; None where it is unknown.
    """
    cls = row.operands
    name = row.name
    if cls == CAST:
        return kinds[0], e.dtype  # type: ignore[attr-defined]
    if cls == SELECT:
        c, a, b = kinds
        if c is not None and c != DType.I1:
            report(f"select condition has type {c}, expected i1")
        k = join_fn("select", a, b, report)
        return k, k
    if cls == BOOL:
        for k in kinds:
            if k is not None and k != DType.I1:
                report(f"'{name}' needs i1 operands, not {k}" if row.node is Binary
                       else f"'{name}' needs an i1 operand, not {k}")
                break
        return DType.I1, DType.I1
    if cls == INT:
        if all(k is not None for k in kinds) and any(is_float(k) for k in kinds):
            report(f"{name} takes integer arguments")
        return DType.I64, row.result
    k: Kind | None = kinds[0]
    for other in kinds[1:]:
        k = join_fn(name, k, other, report)
    if cls == ANY:
        return k, DType.I1
    if k is None:
        return None, row.result
    if k == DType.I1:
        report(_i1_message(row))
    elif cls == REAL and not is_float(k):
        report(f"'{name}' on integers ({k}); use '//' for floor division")
    elif cls in (FLOAT, FLOAT_OR_WEAK) and isinstance(k, DType) and not k.is_float:
        report(f"'{name}' needs a float operand, not {k}")
    elif cls == FLOAT and k is WEAK_INT:
        k = WEAK_FLOAT
    return k, row.result if row.result is not None else k


def check_strict(row: Op, e: Expr, kinds: Sequence[Kind | None], report: Report
                 ) -> tuple[Kind | None, Kind | None]:
    """`check` for consumers that report violations: no kind for a node that has one, or
    whose operands have none (so one mistake is reported once, not at every parent)."""
    errors: list[str] = []

    def collect(msg: str) -> None:
        errors.append(msg)
        report(msg)

    opk, res = check(row, e, kinds, collect)
    if errors or any(k is None for k in kinds):
        return None, None
    return opk, res


__all__ = [
    "ANY", "BOOL", "CAST", "CLASSES", "FLOAT", "FLOAT_OR_WEAK", "INT", "NUM", "REAL", "SELECT",
    "WEAK_FLOAT", "WEAK_INT", "Kind", "Report", "TypeClash", "Weak", "check", "check_strict",
    "const_kind", "ignore", "is_float", "is_weak", "join", "promote", "raise_clash", "resolve",
]
