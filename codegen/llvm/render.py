"""The LLVM renderer of the operator table: one entry per row of `nfc.ops`, by name.

`emit_op(em, e, dt)` emits the operator node `e` computed in type `dt` (what its context
expects, see `nfc.codegen.llvm.exprs.infer`). An entry (`Rule`) is a function of the emitter,
the node and `dt`, and a rough instruction count for unrolling decisions; most get their
operands from `operands`, already converted to the type the row computes in. A row with no
entry here is emitted by its `lower["llvm"]` hook (a function of the builder and the operand
values, like the ones in `nfc.codegen.llvm.intrinsics`), or else through its `expand`.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from llvmlite import ir

from nfc import ops
from nfc.codegen.llvm import intrinsics
from nfc.codegen.llvm.fold import const_ints, fold_int, int_constant
from nfc.ir import Const, DType, Expr

if TYPE_CHECKING:
    from nfc.codegen.llvm.exprs import ExprEmitter

Render = Callable[["ExprEmitter", Expr, DType], ir.Value]


@dataclass(frozen=True)
class Rule:
    """How one row is emitted."""

    render: Render
    size: int = 1
    """About how many instructions it becomes (a polynomial counts ~20)."""


def operands(em: ExprEmitter, e: Expr, dt: DType) -> tuple[list[ir.Value], DType]:
    """The operands of `e` and the type they are computed in: `dt` for a row whose result
    is its operands' type, else their common type (a comparison's, `philox`'s i64); both
    scalars or both vectors."""
    row = ops.find(e)
    assert row is not None
    odt = dt if row.result is None else ops.resolve(em.typer().kinds(e)[0], None)
    args = [em.value(a, odt) for a in e.children()]
    if len(args) > 1 and len({intrinsics.lanes(a.type) is None for a in args}) > 1:
        args = [em.vec(a) for a in args]
    return args, odt


def _arith(fop: str, iop: str) -> Rule:
    def render(em: ExprEmitter, e: Expr, dt: DType) -> ir.Value:
        (x, y), _ = operands(em, e, dt)
        if dt.is_float:
            return getattr(em.b, fop)(x, y)
        folded = fold_int(e.op, x, y, x.type)  # type: ignore[attr-defined]
        return folded if folded is not None else getattr(em.b, iop)(x, y)
    return Rule(render)


def _floor_div(em: ExprEmitter, e: Expr, dt: DType) -> ir.Value:
    """`//` and `%` with floor semantics (Python's), for floats and integers."""
    (x, y), _ = operands(em, e, dt)
    b, op = em.b, e.op  # type: ignore[attr-defined]
    if dt.is_float:
        q = intrinsics.intrinsic(b, "floor", [b.fdiv(x, y)])
        return q if op == "//" else b.fsub(x, b.fmul(q, y))
    folded = fold_int(op, x, y, x.type)
    if folded is not None:
        return folded
    if em.nonneg(e.a) and em.nonneg(e.b):  # type: ignore[attr-defined]
        return b.sdiv(x, y) if op == "//" else b.srem(x, y)
    # floor semantics for negative operands
    q, r = b.sdiv(x, y), b.srem(x, y)
    zero = intrinsics.const(x.type, 0)
    fix = b.and_(b.icmp_signed("!=", r, zero),
                 b.icmp_signed("!=", b.icmp_signed("<", r, zero), b.icmp_signed("<", y, zero)))
    if op == "//":
        return b.sub(q, b.zext(fix, x.type))
    return b.add(r, b.select(fix, y, zero))


def _compare(em: ExprEmitter, e: Expr, dt: DType) -> ir.Value:
    (x, y), t = operands(em, e, dt)
    b, op = em.b, e.op  # type: ignore[attr-defined]
    if not t.is_float:
        folded = fold_int(op, x, y, intrinsics.like(x.type, intrinsics.I1))
        return folded if folded is not None else b.icmp_signed(op, x, y)
    # `!=` is true for NaN operands (unordered), the others false (ordered)
    return b.fcmp_unordered(op, x, y) if op == "!=" else b.fcmp_ordered(op, x, y)


def _logic(em: ExprEmitter, e: Expr, dt: DType) -> ir.Value:
    (x, y), _ = operands(em, e, dt)
    op = e.op  # type: ignore[attr-defined]
    folded = fold_int(op, x, y, x.type)
    if folded is not None:
        return folded
    return em.b.and_(x, y) if op == "and" else em.b.or_(x, y)


def _not(em: ExprEmitter, e: Expr, dt: DType) -> ir.Value:
    (v,), _ = operands(em, e, dt)
    ints = const_ints(v)
    if ints is not None:
        return int_constant(v.type, [1 - (x & 1) for x in ints]) or v
    return em.b.xor(v, intrinsics.const(v.type, 1))


def _neg(em: ExprEmitter, e: Expr, dt: DType) -> ir.Value:
    (v,), _ = operands(em, e, dt)
    return em.b.fneg(v) if dt.is_float else em.b.sub(intrinsics.const(v.type, 0), v)


def _extremum(cmp: str) -> Rule:
    # NaN does not propagate: an ordered compare picks the second operand (docs/codegen.md)
    def render(em: ExprEmitter, e: Expr, dt: DType) -> ir.Value:
        (x, y), _ = operands(em, e, dt)
        b = em.b
        c = b.fcmp_ordered(cmp, x, y) if dt.is_float else b.icmp_signed(cmp, x, y)
        return b.select(c, x, y)
    return Rule(render)


def _abs(em: ExprEmitter, e: Expr, dt: DType) -> ir.Value:
    (x,), _ = operands(em, e, dt)
    b = em.b
    if dt.is_float:
        return intrinsics.intrinsic(b, "fabs", [x])
    zero = intrinsics.const(x.type, 0)
    return b.select(b.icmp_signed("<", x, zero), b.sub(zero, x), x)


def _math(fn: Callable[..., ir.Value], size: int = 20) -> Rule:
    """A float function of `nfc.codegen.llvm.intrinsics` (builder and operand values)."""
    def render(em: ExprEmitter, e: Expr, dt: DType) -> ir.Value:
        args, t = operands(em, e, dt)
        if not t.is_float:
            raise NotImplementedError(f"{e.fn} of {t}")  # type: ignore[attr-defined]
        return fn(em.b, *args)
    return Rule(render, size)


def _pow(em: ExprEmitter, e: Expr, dt: DType) -> ir.Value:
    (x, y), _ = operands(em, e, dt)
    if not dt.is_float:
        raise NotImplementedError(f"pow of {dt}")
    yc = e.args[1]  # type: ignore[attr-defined]
    c = float(yc.value) if isinstance(yc, Const) and not isinstance(yc.value, bool) else None
    return intrinsics.pow_(em.b, x, y, c)


def _philox(em: ExprEmitter, e: Expr, dt: DType) -> ir.Value:
    (key, ctr), _ = operands(em, e, dt)
    b = em.b
    words = intrinsics.philox4x32(b, key, ctr)
    f64 = intrinsics.like(key.type, intrinsics.F64)
    u = b.fmul(b.uitofp(words[0], f64), intrinsics.const(f64, 2.0 ** -32))
    return em.convert(u, DType.F64, dt)


def _bit(em: ExprEmitter, e: Expr, dt: DType) -> ir.Value:
    """`bit(w, j)`: `(w >> j) & 1 != 0` (a logical shift: j < the width of w)."""
    (w, j), _ = operands(em, e, dt)
    b = em.b
    low = b.and_(b.lshr(w, j), intrinsics.const(w.type, 1))
    return b.icmp_signed("!=", low, intrinsics.const(w.type, 0))


RULES: dict[str, Rule] = {
    "+": _arith("fadd", "add"), "-": _arith("fsub", "sub"), "*": _arith("fmul", "mul"),
    "/": _arith("fdiv", "sdiv"), "//": Rule(_floor_div), "%": Rule(_floor_div),
    **{op: Rule(_compare) for op in ("<", "<=", ">", ">=", "==", "!=")},
    "and": Rule(_logic), "or": Rule(_logic), "not": Rule(_not), "neg": Rule(_neg),
    "select": Rule(lambda em, e, dt: em.select(e, dt)),  # type: ignore[arg-type]
    "cast": Rule(lambda em, e, dt: em.value(e.x, e.dtype)),  # type: ignore[attr-defined]
    "exp": _math(intrinsics.exp), "log": _math(intrinsics.log), "sqrt": _math(intrinsics.sqrt),
    "rsqrt": _math(intrinsics.rsqrt), "tanh": _math(intrinsics.tanh),
    "sigmoid": _math(intrinsics.sigmoid), "erf": _math(intrinsics.erf),
    "abs": Rule(_abs), "max": _extremum(">"), "min": _extremum("<"), "pow": Rule(_pow, 20),
    "philox": Rule(_philox, 20),
    "softplus": _math(intrinsics.softplus), "log1p": _math(intrinsics.log1p),
    "expm1": _math(intrinsics.expm1),
    "atan2": _math(intrinsics.atan2), "isfinite": _math(intrinsics.isfinite, 1),
    "bit": Rule(_bit, 3),
}


def _hook(hook: Any) -> Callable[..., ir.Value]:
    if isinstance(hook, str):
        mod, _, attr = hook.partition(":")
        return getattr(importlib.import_module(mod), attr)  # type: ignore[no-any-return]
    return hook  # type: ignore[no-any-return]


@functools.cache
def rule(row: ops.Op) -> Rule:
    """The entry of `row`: its own, its `lower["llvm"]` hook, or its expansion."""
    found = RULES.get(row.name)
    if found is not None and ops.BUILTIN.get(row.name) is row:
        return found
    if "llvm" in row.lower:
        found = _math(_hook(row.lower["llvm"]))
    elif row.expand is not None:
        expand = row.expand
        found = Rule(lambda em, e, dt: em.value(expand(*e.children()), dt), 20)
    else:
        raise NotImplementedError(f"the CPU backend cannot emit '{row.name}': its row has no "
                                  "lower['llvm'] hook and no expand")
    return found


def emit_op(em: ExprEmitter, e: Expr, dt: DType) -> ir.Value:
    """Emit the operator node `e` in type `dt`."""
    row = ops.find(e)
    if row is None:
        raise TypeError(f"cannot emit {e!r}")
    return rule(row).render(em, e, dt)


def size(e: Expr) -> int:
    """About how many instructions the operator node `e` itself becomes (1 for leaves)."""
    row = ops.find(e)
    return 1 if row is None else rule(row).size
