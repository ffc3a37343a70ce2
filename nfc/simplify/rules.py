"""Identities and integer index algebra, as (pattern, function) tables.

`IDENTITY_RULES` hold the exact algebraic identities (float rewrites that could change an
inf/NaN result only with `fast`); `INDEX_RULES` collect integer sums into a canonical linear
form and decide `//`, `%`, comparisons, `min` and `max` from the index ranges.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from nfc.ir import COMPARISONS, Binary, Call, Const, DType, Expr, Index, Select, Unary
from nfc.simplify.pattern import B, C, F, K, Rule, S, U, V, structural_key

_INVERSE = {"<": ">=", "<=": ">", ">": "<=", ">=": "<", "==": "!=", "!=": "=="}


def _absorbs(m: Any, c: Const) -> bool:
    """Whether dropping literal `c` next to `m.x` keeps the type: weak, or of x's own type."""
    return c.dtype is None or m.cx.type(m.x) == c.dtype


def _not_int(fn: Callable[[Any], Expr | None]) -> Callable[[Any], Expr | None]:
    """Integer `+ - * neg` are normalised as a whole by the index algebra instead."""
    return lambda m: None if m.cx.is_int(m.e) else fn(m)


def _invert(m: Any) -> Expr | None:
    op = m.e.x.op
    if op not in _INVERSE:
        return None
    # NaN makes every ordered comparison false, so `not (a < b)` is not `a >= b` for floats
    if op in ("==", "!=") or (m.cx.is_int(m.a) and m.cx.is_int(m.b)) or m.cx.fast:
        return Binary(_INVERSE[op], m.a, m.b)
    return None


def _self_compare(m: Any) -> Expr | None:
    op = m.e.op
    if not (m.cx.is_int(m.x) or m.cx.fast):
        return None  # NaN == NaN is false
    return Const(op in ("==", "<=", ">="), DType.I1)


def _literal_right(m: Any) -> Expr | None:
    a, b = m.e.children()
    if isinstance(a, Const) and not isinstance(b, Const):
        return m.e.rebuild((b, a))
    return None


def _minus_zero(c: Const) -> bool:
    return math.copysign(1.0, float(c.value)) < 0


def _drop_zero(minus: bool) -> Callable[[Any], Expr | None]:
    """`x + c` (minus=True) or `x - c` with a zero literal c: exact when the result cannot be a
    zero of the other sign, that is `x + -0.0` and `x - 0.0` (`-0.0 + 0.0` is `+0.0`)."""
    def fn(m: Any) -> Expr | None:
        if not _absorbs(m, m.c):
            return None
        return m.x if m.cx.fast or _minus_zero(m.c) == minus else None
    return fn


def _zero_minus(m: Any) -> Expr | None:
    # `-0.0 - x` is `-x` for every x; `0.0 - 0.0` is `+0.0` but `-(0.0)` is `-0.0`
    if _absorbs(m, m.c) and (m.cx.fast or _minus_zero(m.c)):
        return Unary("neg", m.x)
    return None


def _fast_const(value: float) -> Callable[[Any], Expr | None]:
    return lambda m: Const(value) if m.cx.fast else None


IDENTITY_RULES: list[Rule] = [
    (B("+", V("x"), K("c", 0)), _not_int(_drop_zero(minus=True))),
    (B("-", V("x"), K("c", 0)), _not_int(_drop_zero(minus=False))),
    (B("-", K("c", 0), V("x")), _not_int(_zero_minus)),
    (B("*", V("x"), K("c", 1)), _not_int(lambda m: m.x if _absorbs(m, m.c) else None)),
    (B("*", V("x"), K("c", -1)),
     _not_int(lambda m: Unary("neg", m.x) if _absorbs(m, m.c) else None)),
    (B("/", V("x"), K("c", 1)), lambda m: m.x if _absorbs(m, m.c) else None),
    # only with fast: inf * 0, NaN * 0, inf - inf, 0 / 0 are NaN
    (B("*", V("x"), K("c", 0)), _not_int(lambda m: m.c if m.cx.fast else None)),
    (B("/", K("c", 0), V("x")), lambda m: m.c if m.cx.fast and not m.cx.is_int(m.x) else None),
    (B("-", V("x"), V("x")), _not_int(_fast_const(0.0))),
    (B("/", V("x"), V("x")), lambda m: None if m.cx.is_int(m.x) else _fast_const(1.0)(m)),
    (U("neg", U("neg", V("x"))), _not_int(lambda m: m.x)),
    (B("+", V("x"), U("neg", V("y"))), _not_int(lambda m: Binary("-", m.x, m.y))),
    (B("-", V("x"), U("neg", V("y"))), _not_int(lambda m: Binary("+", m.x, m.y))),
    (B("*", U("neg", V("x")), U("neg", V("y"))), _not_int(lambda m: Binary("*", m.x, m.y))),
    (B("/", U("neg", V("x")), U("neg", V("y"))), lambda m: Binary("/", m.x, m.y)),
    (U("not", U("not", V("x"))), lambda m: m.x),
    (U("not", B(None, V("a"), V("b"))), _invert),
    (B(None, V("x"), V("x")), lambda m: _self_compare(m) if m.e.op in COMPARISONS else None),
    (S(V("c"), V("a"), V("a")), lambda m: m.a),
    (S(U("not", V("c")), V("a"), V("b")), lambda m: Select(m.c, m.b, m.a)),
    (S(V("c"), K("t", True), K("f", False)), lambda m: m.c),
    (S(V("c"), K("t", False), K("f", True)), lambda m: Unary("not", m.c)),
    (B("and", V("x"), K("c", True)), lambda m: m.x),
    (B("and", V("x"), K("c", False)), lambda m: m.c),
    (B("or", V("x"), K("c", False)), lambda m: m.x),
    (B("or", V("x"), K("c", True)), lambda m: m.c),
    (B("and", V("x"), V("x")), lambda m: m.x),
    (B("or", V("x"), V("x")), lambda m: m.x),
    (F("max", V("x"), V("x")), lambda m: m.x),
    (F("min", V("x"), V("x")), lambda m: m.x),
    (F("abs", F("abs", V("x"))), lambda m: m.e.args[0]),
    (F("abs", U("neg", V("x"))), lambda m: Call("abs", (m.x,))),
    (C(V("x")), lambda m: m.x if m.cx.type(m.x) == m.e.dtype else None),
    # literals go right in commutative operators (`2.0 * x` is `x * 2.0`), as in MLIR
    (B("+", K(), V("x")), _not_int(_literal_right)),
    (B("*", K(), V("x")), _not_int(_literal_right)),
    (B("==", K(), V("x")), _literal_right),
    (B("!=", K(), V("x")), _literal_right),
]

# ---------------------------------------------------------------------------------------------
# integer index algebra

#: A linear form: atom key -> [atom, coefficient], plus a constant.
Linear = tuple[dict[Any, list[Any]], int]


def _weak_int(e: Expr) -> int | None:
    if isinstance(e, Const) and e.dtype is None and type(e.value) is int:
        return e.value
    return None


def _linear(e: Expr, dtype: DType | None = None) -> Linear:
    """`e` (an integer expression) as a sum of coefficient * atom plus a constant; literals
    typed `dtype` count as constants too."""
    terms: dict[Any, list[Any]] = {}
    const = 0

    def add(x: Expr, k: int) -> None:
        nonlocal const
        v = _weak_int(x)
        if v is None and dtype is not None and isinstance(x, Const) and x.dtype == dtype:
            v = int(x.value)
        if v is not None:
            const += k * v
        elif isinstance(x, Binary) and x.op in ("+", "-"):
            add(x.a, k)
            add(x.b, k if x.op == "+" else -k)
        elif isinstance(x, Unary) and x.op == "neg":
            add(x.x, -k)
        elif isinstance(x, Binary) and x.op == "*" and _weak_int(x.b) is not None:
            add(x.a, k * x.b.value)  # type: ignore[attr-defined]
        elif isinstance(x, Binary) and x.op == "*" and _weak_int(x.a) is not None:
            add(x.b, k * x.a.value)  # type: ignore[attr-defined]
        else:
            slot = terms.setdefault(structural_key(x), [x, 0])
            slot[1] += k

    add(e, 1)
    const += _merge_divmod(terms)
    return {key: s for key, s in terms.items() if s[1] != 0}, const


def _merge_divmod(terms: dict[Any, list[Any]]) -> int:
    """`m*c * (x // c) + m * (x % c)` is `m * x` (a reshape followed by its inverse); returns
    the constant this adds."""
    const = 0
    for key, (atom, coeff) in list(terms.items()):
        if not (isinstance(atom, Binary) and atom.op == "%" and coeff != 0 and key in terms):
            continue
        c = _weak_int(atom.b)
        div = structural_key(Binary("//", atom.a, atom.b))
        if c is None or div not in terms or terms[div][1] != coeff * c:
            continue
        del terms[key], terms[div]
        sub, k = _linear(atom.a)
        const += coeff * k
        for skey, (sub_atom, sub_coeff) in sub.items():
            terms.setdefault(skey, [sub_atom, 0])[1] += coeff * sub_coeff
    return const


def _atom_order(atom: Expr) -> tuple[int, str]:
    from nfc.printer import format_expr  # the printer is core too; only needed for sorting

    if isinstance(atom, Index):
        return 0, atom.name
    return 1, format_expr(atom)


def _from_linear(form: Linear, dtype: DType | None = None, *,
                 typed_literal: bool = True) -> Expr:
    """The canonical expression of a linear form: the shape of `nfc.affine.affine_to_expr`
    (terms sorted, index variables first, `2 * h`, later negative terms subtracted, constant
    last), with loads and other non-affine atoms as further terms. With `dtype`, the constant
    wraps around into its range, and is a literal of that type if `typed_literal`."""
    terms, const = form
    items = sorted(((a, c) for a, c in terms.values() if c != 0),
                   key=lambda t: _atom_order(t[0]))
    def term(a: Expr, c: int) -> Expr:
        if c == 1:
            return a
        if c == -1:
            return Unary("neg", a)
        return Binary("*", Const(c), a)

    if dtype is not None:
        half = 1 << (8 * dtype.itemsize - 1)
        const = (const + half) % (2 * half) - half
        if not typed_literal:
            dtype = None
    if not items:
        return Const(const, dtype)
    out = term(*items[0])
    for a, c in items[1:]:
        out = Binary("-", out, term(a, -c)) if c < 0 else Binary("+", out, term(a, c))
    if dtype is not None:
        return Binary("+", out, Const(const, dtype)) if const else out
    if const > 0:
        out = Binary("+", out, Const(const))
    elif const < 0:
        out = Binary("-", out, Const(-const))
    return out


def _normalise(m: Any) -> Expr | None:
    if m.cx.is_index(m.e):
        return _from_linear(_linear(m.e))
    if not m.cx.is_int(m.e):
        return None
    # a typed sum (i32 data): collecting terms is exact in wrap-around arithmetic too
    t = m.cx.type(m.e)
    typed = any(isinstance(n, Const) and n.dtype == t for n in m.e.walk())
    return _from_linear(_linear(m.e, t), t, typed_literal=typed)


def _split(form: Linear, c: int) -> tuple[Linear, Linear]:
    """(multiples of c divided by c, the rest) with the rest's constant in [0, c)."""
    terms, k = form
    q = {key: [a, n // c] for key, (a, n) in terms.items() if n % c == 0}
    r = {key: [a, n] for key, (a, n) in terms.items() if n % c != 0}
    return (q, k // c), (r, k % c)


def _divisor(m: Any) -> int | None:
    """The positive literal divisor of an index expression (weak integers: int64, where the
    identities below hold as long as nothing overflows), or None."""
    c = _weak_int(m.e.b)
    return c if c is not None and c > 0 and m.cx.is_index(m.e) else None


def _division(m: Any) -> tuple[int, Linear, Linear, Expr, int | None] | None:
    """The parts of `a // c` or `a % c` for an index expression `a` and a positive literal
    `c`: (c, the multiples of c in `a` divided by c, the rest with its constant in [0, c), the
    rest as an expression, `rest // c` when the ranges decide it, else None). This is the one
    place of `(c*q + r) // c = q + r // c` and `(c*q + r) % c = r % c`; None when the rule
    does not apply, or (with `divisions_only`) when nothing leaves the division and nothing
    is decided, so the division keeps the shape it was written in."""
    c = _divisor(m)
    if c is None:
        return None
    quot, rest = _split(_linear(m.e.a), c)
    rest_e = _from_linear(rest)
    lo_hi = m.cx.interval(rest_e) if rest[0] else (rest[1], rest[1])
    decided = lo_hi[0] // c if lo_hi is not None and lo_hi[0] // c == lo_hi[1] // c else None
    if decided is None and not quot[0] and m.cx.divisions_only:
        return None
    return c, quot, rest, rest_e, decided


def _floordiv(m: Any) -> Expr | None:
    if _weak_int(m.e.b) == 1 and m.cx.is_int(m.e):
        return m.e.a
    parts = _division(m)
    if parts is None:
        return None
    c, (q, k), _, rest_e, decided = parts
    if decided is not None:
        k += decided  # the rest stays within one period of c
    else:
        q[structural_key(Binary("//", rest_e, Const(c)))] = [Binary("//", rest_e, Const(c)), 1]
    return _from_linear((q, k))


def _mod(m: Any) -> Expr | None:
    if _weak_int(m.e.b) == 1 and m.cx.is_int(m.e):
        return Const(0)
    parts = _division(m)
    if parts is None:
        return None
    c, _, rest, rest_e, decided = parts
    if decided is not None:
        return _from_linear((rest[0], rest[1] - decided * c))
    return Binary("%", rest_e, Const(c))


def _nested_div(m: Any) -> Expr | None:
    a, b = _weak_int(m.e.a.b), _weak_int(m.e.b)
    if a is None or b is None or a <= 0 or b <= 0 or not m.cx.is_int(m.e):
        return None
    return Binary("//", m.x, Const(a * b))  # floor(floor(x / a) / b) == floor(x / (a*b))


def _difference(m: Any, a: Expr, b: Expr) -> tuple[int, int] | None:
    """Bounds of `a - b` for index expressions, None when unknown or not indices (typed
    integers may wrap around: `x + i32(1) > x` is false for the largest x)."""
    if not (m.cx.is_index(a) and m.cx.is_index(b)):
        return None
    return m.cx.interval(_from_linear(_linear(Binary("-", a, b))))


def _decide_compare(m: Any) -> Expr | None:
    op = m.e.op
    if op not in COMPARISONS:
        return None
    d = _difference(m, m.e.a, m.e.b)
    if d is None:
        return None
    lo, hi = d
    verdict = {"<": (hi < 0, lo >= 0), "<=": (hi <= 0, lo > 0), ">": (lo > 0, hi <= 0),
               ">=": (lo >= 0, hi < 0), "==": (lo == hi == 0, lo > 0 or hi < 0),
               "!=": (lo > 0 or hi < 0, lo == hi == 0)}[op]
    if verdict[0]:
        return Const(True, DType.I1)
    return Const(False, DType.I1) if verdict[1] else None


def _decide_minmax(m: Any) -> Expr | None:
    a, b = m.e.args
    d = _difference(m, a, b)
    if d is None:
        return None
    if d[1] <= 0:  # a <= b
        return b if m.e.fn == "max" else a
    if d[0] >= 0:
        return a if m.e.fn == "max" else b
    return None


#: `//` and `%` of index expressions by positive literals (`nfc.simplify.simplify_divisions`).
DIVISION_RULES: list[Rule] = [
    (B("//", V("a"), K()), _floordiv),
    (B("%", V("a"), K()), _mod),
]

INDEX_RULES: list[Rule] = [
    (B("+", V("a"), V("b")), _normalise),
    (B("-", V("a"), V("b")), _normalise),
    (B("*", V("a"), V("b")), _normalise),
    (U("neg", V("x")), _normalise),
    (B("//", B("//", V("x"), K()), K()), _nested_div),
    *DIVISION_RULES,
    (B(None, V("a"), V("b")), _decide_compare),
    (F("max", V("a"), V("b")), _decide_minmax),
    (F("min", V("a"), V("b")), _decide_minmax),
]

