"""Typing rules of scalar expressions, building IR expressions (nfc.ir) as they check.

A value is a `ScalarExpr`: an IR expression with a scalar type `ScalarType`. Literals, index
variables and compile-time values are *weak*: they take the type of their context (`x[i] * 2` is
f32). The rules are those of the operator table's lattice (`nfc.ops`: two strong operands must
have the same dtype, a float literal never becomes an integer, weak integer and float make a
float), plus the surface language's own: booleans are not numbers, an index expression becomes a
float only through a cast, and a weak boolean is a compile-time constant. Operations on weak
constants fold at compile time with Python semantics (each row's `scalar`; `//` and `%` floor).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from nfc import ops
from nfc.diagnostics import error
from nfc.frontend.limits import MAX_CT_INT
from nfc.ir import Binary, Call, Cast, Const, DType, Expr, Index, Load, Loc, Select, Unary
from nfc.ops.lattice import FLOAT, FLOAT_OR_WEAK, REAL


@dataclass(frozen=True)
class ScalarType:
    """A scalar type: kind (`int`, `float`, `bool`) and dtype, None while weak."""

    kind: str
    dtype: DType | None = None

    def __str__(self) -> str:
        if self.dtype is not None:
            return str(self.dtype)
        return {"int": "integer", "float": "float", "bool": "boolean"}[self.kind]

    @property
    def lattice(self) -> ops.Kind:
        """This type on the operator table's lattice (a weak boolean is an i1 literal)."""
        if self.kind == "bool":
            return DType.I1
        if self.dtype is not None:
            return self.dtype
        return ops.WEAK_FLOAT if self.kind == "float" else ops.WEAK_INT

    @staticmethod
    def of(k: ops.Kind) -> ScalarType:
        """The scalar type of a lattice element (i1 is a strong boolean)."""
        if isinstance(k, DType):
            return ScalarType("bool" if k is DType.I1 else "float" if k.is_float else "int", k)
        return ScalarType(k.value)


WEAK_INT = ScalarType.of(ops.WEAK_INT)
WEAK_FLOAT = ScalarType.of(ops.WEAK_FLOAT)
BOOL = ScalarType.of(DType.I1)


def sty(dtype: DType) -> ScalarType:
    """The strong scalar type of a dtype."""
    return ScalarType.of(dtype)


def default_dtype(t: ScalarType) -> DType:
    """The dtype a weak type takes when nothing else decides it."""
    if t.dtype is not None:
        return t.dtype
    return {"int": DType.I32, "float": DType.F32, "bool": DType.I1}[t.kind]


@dataclass(frozen=True)
class ScalarExpr:
    """A typed scalar expression."""

    expr: Expr
    ty: ScalarType

    @property
    def const(self) -> int | float | bool | None:
        """The value of a weak literal, else None."""
        if isinstance(self.expr, Const) and self.ty.dtype is None:
            return self.expr.value
        return None


def const(value: int | float | bool) -> ScalarExpr:
    """A weak literal."""
    if isinstance(value, bool):
        return ScalarExpr(Const(value), ScalarType("bool"))
    if isinstance(value, int):
        if abs(value) > MAX_CT_INT:
            raise OverflowError
        return ScalarExpr(Const(value), WEAK_INT)
    return ScalarExpr(Const(float(value)), WEAK_FLOAT)


def _ct(value: int | float | bool, loc: Loc) -> ScalarExpr:
    try:
        return const(value)
    except OverflowError:
        raise error("compile-time integer is too large", loc) from None


def coerce(v: ScalarExpr, target: ScalarType, loc: Loc) -> ScalarExpr:
    """`v` converted to `target` when that loses nothing; else a diagnostic."""
    if v.ty == target:
        return v
    if v.ty.kind == "bool" or target.kind == "bool":
        if v.ty.kind == target.kind:
            return ScalarExpr(v.expr, target if target.dtype else v.ty)
        raise error(f"expected a {target} value, found a {v.ty} one", loc)
    if v.ty.dtype is not None:
        if target.dtype is None and v.ty.kind == target.kind:
            return v
        if target.dtype is None and target.kind == "float":
            raise error(f"{v.ty} value used where a float is expected; cast it with f32(...)",
                        loc)
        raise error(f"type mismatch: {v.ty} and {target}; convert with a cast such as "
                    f"{target.dtype or 'f32'}(...)", loc)
    # v is weak
    if v.ty.kind == target.kind:
        return ScalarExpr(v.expr, target)
    if v.ty.kind == "int" and target.kind == "float":
        if isinstance(v.expr, Const):
            return ScalarExpr(Const(float(v.expr.value)), target)
        raise error(f"integer index expression used as a {target} value; cast it with "
                    f"{target.dtype or 'f32'}(...)", loc)
    raise error(f"float value used where an integer is expected ({target})", loc)


def unify(a: ScalarExpr, b: ScalarExpr, loc: Loc) -> tuple[ScalarExpr, ScalarExpr]:
    """Bring two operands to one type: their join on the lattice, under the surface rules of
    `coerce`."""
    if a.ty.dtype is None and b.ty.dtype is None:
        if a.ty.kind == b.ty.kind:
            return a, b
        if "bool" in (a.ty.kind, b.ty.kind):
            raise error(f"type mismatch: {a.ty} and {b.ty}", loc)
    k = ops.join("", a.ty.lattice, b.ty.lattice)
    if k is None:
        if a.ty.dtype is not None and b.ty.dtype is not None:
            raise error(f"type mismatch: {a.ty} and {b.ty}; convert one with a cast such as "
                        f"{a.ty.dtype}(...)", loc)
        strong, weak = (a, b) if a.ty.dtype is not None else (b, a)
        coerce(weak, strong.ty, loc)  # raises the diagnostic of this pair
        raise AssertionError(f"{weak.ty} joins {strong.ty} but does not coerce to it")
    target = ScalarType.of(k)
    return coerce(a, target, loc), coerce(b, target, loc)


def _check(row: ops.Op, node: Expr, args: list[ScalarExpr], loc: Loc) -> ScalarType:
    """The type of `node`, an application of `row` to `args`, by the table's typing rule."""
    def report(msg: str) -> None:
        raise error(msg, loc)

    return ScalarType.of(ops.check(row, node, [a.ty.lattice for a in args], report)[1])  # type: ignore[arg-type]


def _fold(row: ops.Op, values: list[int | float | bool], loc: Loc) -> ScalarExpr:
    """A row on compile-time constants, with Python semantics."""
    try:
        r = row.scalar_fn()(*values)
    except ZeroDivisionError:
        raise error("division by zero in a compile-time expression", loc) from None
    except OverflowError:
        raise error("compile-time value is too large", loc) from None
    # inf and nan given as such (`-inf`, `inf * 2`) are values; an overflow of finite ones is
    # refused
    if isinstance(r, float) and not math.isfinite(r) and all(
            math.isfinite(v) for v in values if not isinstance(v, bool)):
        raise error("compile-time value is not finite", loc)
    return _ct(r, loc)


def binop(op: str, a: ScalarExpr, b: ScalarExpr, loc: Loc) -> ScalarExpr:
    """An arithmetic operator `+ - * / // %`."""
    for v in (a, b):
        if v.ty.kind == "bool":
            raise error(f"operator '{op}' needs numbers, found a boolean", loc)
    row = ops.get(op)
    assert row is not None
    x, y = a.const, b.const
    if x is not None and y is not None:
        return _fold(row, [x, y], loc)
    a, b = unify(a, b, loc)
    if row.operands == REAL and a.ty.kind == "int":
        raise error(f"'{op}' divides floats; use '//' for integer (floor) division", loc)
    node = Binary(op, a.expr, b.expr)
    return ScalarExpr(node, _check(row, node, [a, b], loc))


def compare(op: str, a: ScalarExpr, b: ScalarExpr, loc: Loc) -> ScalarExpr:
    """A comparison; the result is a boolean."""
    x, y = a.const, b.const
    if x is not None and y is not None:
        row = ops.get(op)
        assert row is not None
        return const(bool(row.scalar_fn()(x, y)))
    a, b = unify(a, b, loc)
    if a.ty.kind == "bool" and op not in ("==", "!="):
        raise error(f"operator '{op}' needs numbers, found booleans", loc)
    return ScalarExpr(Binary(op, a.expr, b.expr), BOOL)


def logic(op: str, a: ScalarExpr, b: ScalarExpr, loc: Loc) -> ScalarExpr:
    """`and` / `or` on booleans."""
    for v in (a, b):
        if v.ty.kind != "bool":
            raise error(f"operand of '{op}' must be a boolean, found {v.ty}", loc)
    x, y = a.const, b.const
    if x is not None and y is not None:
        return const(bool(x and y) if op == "and" else bool(x or y))
    if x is not None:  # constant operand: simplify
        if op == "and":
            return b if x else const(False)
        return const(True) if x else b
    return ScalarExpr(Binary(op, a.expr, b.expr), BOOL)


def negate(a: ScalarExpr, loc: Loc) -> ScalarExpr:
    """Arithmetic negation."""
    if a.ty.kind == "bool":
        raise error("cannot negate a boolean; use 'not'", loc)
    if a.const is not None:
        return _ct(-a.const, loc)
    return ScalarExpr(Unary("neg", a.expr), a.ty)


def logical_not(a: ScalarExpr, loc: Loc) -> ScalarExpr:
    """`not a`."""
    if a.ty.kind != "bool":
        raise error(f"operand of 'not' must be a boolean, found {a.ty}", loc)
    if a.const is not None:
        return const(not a.const)
    return ScalarExpr(Unary("not", a.expr), BOOL)


def select(c: ScalarExpr, a: ScalarExpr, b: ScalarExpr, loc: Loc) -> ScalarExpr:
    """`a if c else b`."""
    if c.ty.kind != "bool":
        raise error(f"the condition of 'if' must be a boolean, found {c.ty}", loc)
    if c.const is not None:
        return a if c.const else b
    a, b = unify(a, b, loc)
    return ScalarExpr(Select(c.expr, a.expr, b.expr), a.ty if a.ty.dtype else b.ty)


#: Intrinsics `.nf` source may call, name -> number of arguments: the operator table's rows
#: with `surface` (plugins' included, loaded on lookup).
INTRINSIC_ARITY: Mapping[str, int] = ops.Intrinsics(surface=True)


def intrinsic(fn: str, args: list[ScalarExpr], loc: Loc) -> ScalarExpr:
    """An intrinsic call; the caller has checked the arity. The row's operand class decides:
    float operands take literals as floats and refuse index expressions without a cast."""
    row = ops.get(fn)
    assert row is not None, fn
    for v in args:
        if v.ty.kind == "bool":
            raise error(f"'{fn}' needs numbers, found a boolean", loc)
    if row.operands in (FLOAT, FLOAT_OR_WEAK, REAL):
        args = [_float_operand(fn, a, loc) for a in args]
    values = [a.const for a in args]
    if all(v is not None for v in values):
        try:
            return _ct(row.scalar_fn()(*values), loc)
        except (ValueError, OverflowError, ZeroDivisionError):
            raise error(f"'{fn}' is undefined for {', '.join(map(str, values))}",
                        loc) from None
    if len(args) == 2:
        args = list(unify(args[0], args[1], loc))
    node = Call(fn, tuple(a.expr for a in args))
    return ScalarExpr(node, _check(row, node, args, loc))


def _float_operand(fn: str, a: ScalarExpr, loc: Loc) -> ScalarExpr:
    """A float operand of `fn`: a weak integer literal becomes a float one."""
    if a.ty.kind == "float":
        return a
    if a.const is None:
        raise error(f"'{fn}' needs a float, found {a.ty}; cast it with f32(...)", loc)
    return coerce(a, WEAK_FLOAT, loc)


def cast(dtype: DType, a: ScalarExpr, loc: Loc) -> ScalarExpr:
    """`f32(x)` and friends."""
    value = a.const
    if value is not None:
        if dtype is DType.I1:
            return ScalarExpr(Const(bool(value), DType.I1), BOOL)
        if dtype.is_float:
            return ScalarExpr(Const(float(value), dtype), sty(dtype))
        if isinstance(value, float) and not math.isfinite(value):
            raise error(f"cannot convert {value} to {dtype}", loc)
        return ScalarExpr(Const(int(value), dtype), sty(dtype))
    if a.ty.dtype == dtype:
        return a
    return ScalarExpr(Cast(dtype, a.expr), sty(dtype))


def has_index(e: Expr) -> bool:
    """Whether `e` mentions an index variable outside the subscripts of loads."""
    stack = [e]
    while stack:
        x = stack.pop()
        if isinstance(x, Index):
            return True
        if not isinstance(x, Load):
            stack.extend(x.children())
    return False


def check_index_expr(e: Expr, loc: Loc) -> None:
    """Refuse index expressions that are not affine (or quasi-affine with constants)."""
    stack = [e]
    while stack:
        x = stack.pop()
        if isinstance(x, Load):
            continue
        if isinstance(x, Binary):
            if x.op == "*" and has_index(x.a) and has_index(x.b):
                raise error("index expression is not affine: one factor of '*' must be a "
                            "compile-time constant", loc)
            if x.op in ("//", "%") and has_index(x.b):
                raise error(f"index expression is not affine: the right operand of "
                            f"'{x.op}' must be a compile-time constant", loc)
            if x.op in ("//", "%") and isinstance(x.b, Const) and x.b.value <= 0:
                raise error(f"'{x.op}' in an index needs a positive constant, found "
                            f"{x.b.value}", loc)
        stack.extend(x.children())
