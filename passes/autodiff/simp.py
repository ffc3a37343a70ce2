"""Small expression builders and a range-aware tidy-up for generated gradient bodies.

The builders fold the trivial cases derivative rules create (`x * 1.0`, `0 + x`, a missing
term); `None` stands for an exact structural zero, so no `x * 0.0` (which is NaN for inf) is
ever written. `tidy` normalises integer index expressions with `qa`, decides comparisons that
the index ranges settle, and folds selects and logic with constant conditions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from nfc.ir import COMPARISONS, Binary, Call, Cast, Const, Expr, Index, Load, Select, Unary
from nfc.passes.autodiff.qa import QACtx, to_expr

Interval = tuple[int, int]
TRUE = Const(True)
FALSE = Const(False)


def is_num(e: Expr | None, v: float) -> bool:
    """True when `e` is a (non-boolean) literal equal to `v`."""
    return isinstance(e, Const) and not isinstance(e.value, bool) and e.value == v


def is_bool_const(e: Expr, v: bool) -> bool:
    """True when `e` is the boolean literal `v`."""
    return isinstance(e, Const) and isinstance(e.value, bool) and e.value is v


def add(a: Expr | None, b: Expr | None) -> Expr | None:
    """`a + b`, with None as zero."""
    if a is None:
        return b
    if b is None:
        return a
    if isinstance(b, Unary) and b.op == "neg":
        return Binary("-", a, b.x)
    return Binary("+", a, b)


def sub(a: Expr | None, b: Expr | None) -> Expr | None:
    """`a - b`, with None as zero."""
    if b is None:
        return a
    if a is None:
        return neg(b)
    return Binary("-", a, b)


def neg(a: Expr | None) -> Expr | None:
    """`-a`."""
    if a is None:
        return None
    if isinstance(a, Unary) and a.op == "neg":
        return a.x
    if isinstance(a, Const) and not isinstance(a.value, bool):
        return Const(-a.value, a.dtype)
    return Unary("neg", a)


def mul(a: Expr | None, b: Expr | None) -> Expr | None:
    """`a * b`, with None as zero and literal ones dropped; a factor `select(c, x, 0.0)`
    moves the product into the select (`select(c, x * b, 0.0)`), keeping guards outermost."""
    if a is None or b is None:
        return None
    for s, o, left in ((a, b, True), (b, a, False)):
        if isinstance(s, Select) and (is_num(s.b, 0) or is_num(s.a, 0)):
            inner = s.a if is_num(s.b, 0) else s.b
            prod = mul(inner, o) if left else mul(o, inner)
            return select(s.cond, prod, None) if is_num(s.b, 0) else select(s.cond, None, prod)
    if is_num(a, 1):
        return b
    if is_num(b, 1):
        return a
    if is_num(a, -1):
        return neg(b)
    if is_num(b, -1):
        return neg(a)
    return Binary("*", a, b)


def div(a: Expr | None, b: Expr) -> Expr | None:
    """`a / b`, with None as zero."""
    if a is None:
        return None
    if is_num(b, 1):
        return a
    return Binary("/", a, b)


def select(c: Expr, a: Expr | None, b: Expr | None) -> Expr | None:
    """`select(c, a, b)` with None as zero (a float zero literal where one side remains)."""
    if a is None and b is None:
        return None
    if is_bool_const(c, True):
        return a
    if is_bool_const(c, False):
        return b
    return Select(c, Const(0.0) if a is None else a, Const(0.0) if b is None else b)


def conj(conds: Sequence[Expr]) -> Expr:
    """`c1 and c2 and ...` (true when empty)."""
    out: Expr | None = None
    for c in conds:
        if is_bool_const(c, True):
            continue
        out = c if out is None else Binary("and", out, c)
    return TRUE if out is None else out


def guard(conds: Sequence[Expr], body: Expr | None) -> Expr | None:
    """`select(all conds, body, 0.0)`, or `body` when there is no condition."""
    c = conj(conds)
    return body if is_bool_const(c, True) else select(c, body, None)


def tidy(e: Expr, ranges: Mapping[str, Interval]) -> Expr:
    """Normalise index arithmetic and fold conditions the index ranges decide."""
    cx = QACtx(ranges)
    return _tidy(e, cx)


def _is_index_expr(e: Expr) -> bool:
    return any(isinstance(n, Index) for n in e.walk()) and not any(
        isinstance(n, Load) for n in e.walk())


def _tidy(e: Expr, cx: QACtx) -> Expr:
    if isinstance(e, Load):
        return Load(e.tensor, tuple(_index(i, cx) for i in e.indices))
    if isinstance(e, Binary) and e.op in COMPARISONS:
        a, b = _tidy(e.a, cx), _tidy(e.b, cx)
        qa, qb = cx.from_expr(a), cx.from_expr(b)
        if qa is not None and qb is not None:
            r = cx.interval(cx.sub(qa, qb))
            if r is not None:
                decided = _decide(e.op, r)
                if decided is not None:
                    return Const(decided)
        return Binary(e.op, a, b)
    if isinstance(e, Binary) and e.op in ("and", "or"):
        a, b = _tidy(e.a, cx), _tidy(e.b, cx)
        absorbing = e.op == "or"
        for x, y in ((a, b), (b, a)):
            if is_bool_const(x, absorbing):
                return Const(absorbing)
            if is_bool_const(x, not absorbing):
                return y
        return Binary(e.op, a, b)
    if isinstance(e, Unary) and e.op == "not":
        x = _tidy(e.x, cx)
        if isinstance(x, Const) and isinstance(x.value, bool):
            return Const(not x.value)
        return Unary("not", x)
    if isinstance(e, Select):
        c = _tidy(e.cond, cx)
        if is_bool_const(c, True):
            return _tidy(e.a, cx)
        if is_bool_const(c, False):
            return _tidy(e.b, cx)
        a, b = _tidy(e.a, cx), _tidy(e.b, cx)
        return Select(c, a, b)
    if isinstance(e, Binary | Unary | Call | Cast):
        q = cx.from_expr(e) if _is_index_expr(e) else None
        if q is not None:
            return to_expr(q)
        kids = tuple(_tidy(k, cx) for k in e.children())
        if isinstance(e, Binary) and e.op == "*":
            return mul(*kids) or e.rebuild(kids)
        if isinstance(e, Binary) and e.op in ("+", "-") and is_num(kids[1], 0):
            return kids[0]
        if isinstance(e, Binary) and e.op == "+" and is_num(kids[0], 0):
            return kids[1]
        return e.rebuild(kids)
    return e


def _index(e: Expr, cx: QACtx) -> Expr:
    q = cx.from_expr(e)
    return to_expr(q) if q is not None else _tidy(e, cx)


def _decide(op: str, r: Interval) -> bool | None:
    """The truth of `d op 0` for every d in r, or None when it depends."""
    lo, hi = r
    table = {
        "<": (hi < 0, lo >= 0), "<=": (hi <= 0, lo > 0), ">": (lo > 0, hi <= 0),
        ">=": (lo >= 0, hi < 0), "==": (lo == hi == 0, lo > 0 or hi < 0),
        "!=": (lo > 0 or hi < 0, lo == hi == 0),
    }
    always, never = table[op]
    if always:
        return True
    if never:
        return False
    return None
