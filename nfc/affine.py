"""Affine index expressions and interval arithmetic.

Index expressions of the nf IR are mostly affine in the compute's index variables
(`p*2 + r - 1`), plus `//` and `%` by constants (reshape, strides), `min`/`max` (clamps) and
`select` (guards). This module gives them two exact-enough views:

- `to_affine(e)`: the normal form `c1*x1 + ... + cn*xn + c0` (names sorted, no zero
  coefficients), or None when `e` is not affine. Two expressions with the same normal form
  always have the same value, which is what bounds proofs and autodiff need.
- `interval(e, ranges)`: inclusive integer bounds of `e` when every index variable `x` lies in
  `ranges[x]`. Affine expressions get their exact range (each variable counted once), other
  nodes are bounded by interval arithmetic with floor semantics for `//` and `%`.

`affine_to_expr` turns a normal form back into an expression in a canonical shape: terms by
name (`2 * h`, `-w`), the constant last (`h - 1`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from nfc.ir import COMPARISONS, Binary, Call, Cast, Const, Expr, Index, Load, Select, Unary

#: An inclusive integer range.
Interval = tuple[int, int]


@dataclass(frozen=True)
class Affine:
    """`sum(c * x for x, c in coeffs) + const`; names sorted, coefficients never zero."""

    coeffs: tuple[tuple[str, int], ...] = ()
    const: int = 0

    @staticmethod
    def make(terms: Iterable[tuple[str, int]], const: int = 0) -> Affine:
        """The normal form of a sum of terms (repeated names are added up)."""
        acc: dict[str, int] = {}
        for name, c in terms:
            acc[name] = acc.get(name, 0) + c
        return Affine(tuple(sorted((n, c) for n, c in acc.items() if c != 0)), const)

    @staticmethod
    def constant(value: int) -> Affine:
        """The constant `value`."""
        return Affine((), value)

    @staticmethod
    def var(name: str) -> Affine:
        """The variable `name`."""
        return Affine(((name, 1),), 0)

    @property
    def is_const(self) -> bool:
        """True when no variable occurs."""
        return not self.coeffs

    @property
    def names(self) -> tuple[str, ...]:
        """The variables, sorted."""
        return tuple(n for n, _ in self.coeffs)

    def coeff(self, name: str) -> int:
        """The coefficient of `name` (0 when absent)."""
        return dict(self.coeffs).get(name, 0)

    def linear(self) -> Affine:
        """The same terms without the constant."""
        return Affine(self.coeffs, 0)

    def __add__(self, other: Affine | int) -> Affine:
        if isinstance(other, int):
            return Affine(self.coeffs, self.const + other)
        return Affine.make(self.coeffs + other.coeffs, self.const + other.const)

    __radd__ = __add__

    def __sub__(self, other: Affine | int) -> Affine:
        return self + (-other)

    def __rsub__(self, other: Affine | int) -> Affine:
        return (-self) + other

    def __neg__(self) -> Affine:
        return self.scale(-1)

    def scale(self, k: int) -> Affine:
        """`k` times this expression."""
        if k == 0:
            return Affine()
        return Affine(tuple((n, c * k) for n, c in self.coeffs), self.const * k)

    def evaluate(self, env: Mapping[str, int]) -> int:
        """The value for the given variable values."""
        return self.const + sum(c * env[n] for n, c in self.coeffs)

    def __str__(self) -> str:
        return _format_expr(affine_to_expr(self))


def _format_expr(e: Expr) -> str:
    from nfc.printer import format_expr  # the printer imports nothing of ours; keep it lazy

    return format_expr(e)


def _int_const(e: Expr) -> int | None:
    """The value of an integer literal (bools count as 0/1), else None."""
    if isinstance(e, Const) and not e.is_float:
        if e.dtype is not None and e.dtype.is_float:
            return None
        return int(e.value)
    return None


def to_affine(e: Expr, atom: Callable[[Expr], str | None] | None = None) -> Affine | None:
    """The affine normal form of the integer expression `e`, or None if it is not affine.

    Handles integer literals, index variables, `+`, `-`, negation, `*` with one constant side,
    integer casts of integer expressions, and `//`/`%` by a positive constant when every
    coefficient is a multiple of it (`(4*i + 1) // 2` is `2*i`). `atom`, when given, names
    sub-expressions that are not affine (e.g. `x // 2` or a load) so they become variables of
    the result: this is how a guard on `(h - r) // 2` can bound an index `(h - r) // 2`.
    """
    c = _int_const(e)
    if c is not None:
        return Affine.constant(c)
    if isinstance(e, Index):
        return Affine.var(e.name)
    out: Affine | None = None
    if isinstance(e, Unary) and e.op == "neg":
        x = to_affine(e.x, atom)
        out = None if x is None else -x
    elif isinstance(e, Cast) and e.dtype.is_int and e.dtype.value != "i1":
        # an int -> int cast keeps the value (overflow aside); a float inner is never affine
        out = to_affine(e.x, atom)
    elif isinstance(e, Binary) and e.op in ("+", "-", "*", "//", "%"):
        a = to_affine(e.a, atom)
        b = to_affine(e.b, atom)
        if a is not None and b is not None:
            out = _combine(e.op, a, b)
    if out is None and atom is not None:
        name = atom(e)
        if name is not None:
            return Affine.var(name)
    return out


def _combine(op: str, a: Affine, b: Affine) -> Affine | None:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        if a.is_const:
            return b.scale(a.const)
        if b.is_const:
            return a.scale(b.const)
        return None
    # // and %: exact only when the divisor is a positive constant dividing every coefficient
    if not b.is_const or b.const <= 0:
        return None
    d = b.const
    if any(c % d for _, c in a.coeffs):
        return None
    if op == "//":
        return Affine(tuple((n, c // d) for n, c in a.coeffs), a.const // d)
    return Affine.constant(a.const % d)


def is_int_valued(e: Expr) -> bool:
    """True when `e` certainly has an integer (or boolean) value: a structural check, with
    weak integer literals and index variables counting as integers."""
    if isinstance(e, Const):
        return not e.is_float and (e.dtype is None or e.dtype.is_int)
    if isinstance(e, Index):
        return True
    if isinstance(e, Load):
        return e.tensor.dtype.is_int
    if isinstance(e, Cast):
        return e.dtype.is_int
    if isinstance(e, Unary):
        return e.op == "not" or is_int_valued(e.x)
    if isinstance(e, Binary):
        if e.op in COMPARISONS or e.op in ("and", "or"):
            return True
        return e.op != "/" and is_int_valued(e.a) and is_int_valued(e.b)
    if isinstance(e, Call):
        return e.fn in ("min", "max", "abs") and all(is_int_valued(a) for a in e.args)
    if isinstance(e, Select):
        return is_int_valued(e.a) and is_int_valued(e.b)
    return False


def is_affine(e: Expr) -> bool:
    """True when `e` has an affine normal form (see `to_affine`)."""
    return to_affine(e) is not None


def affine_to_expr(aff: Affine) -> Expr:
    """The canonical expression of a normal form: `2 * h + w - 1`, `-w + 3`, `0`.

    Terms come sorted by name with coefficient first (`2 * h`, `h`, `-h`, `-2 * h`), later
    negative terms are subtracted, and a nonzero constant comes last. Literals are weak.
    """
    def term(name: str, c: int) -> Expr:
        if c == 1:
            return Index(name)
        if c == -1:
            return Unary("neg", Index(name))
        return Binary("*", Const(c), Index(name))

    if not aff.coeffs:
        return Const(aff.const)
    (n0, c0), *rest = aff.coeffs
    out = term(n0, c0)
    for name, c in rest:
        out = Binary("-", out, term(name, -c)) if c < 0 else Binary("+", out, term(name, c))
    if aff.const > 0:
        out = Binary("+", out, Const(aff.const))
    elif aff.const < 0:
        out = Binary("-", out, Const(-aff.const))
    return out


# ---------------------------------------------------------------------------------------------
# intervals


def affine_interval(aff: Affine, ranges: Mapping[str, Interval]) -> Interval | None:
    """The exact range of an affine expression over a box (None if a variable is unknown)."""
    lo = hi = aff.const
    for name, c in aff.coeffs:
        r = ranges.get(name)
        if r is None:
            return None
        if c > 0:
            lo += c * r[0]
            hi += c * r[1]
        else:
            lo += c * r[1]
            hi += c * r[0]
    return lo, hi


def hull(a: Interval, b: Interval) -> Interval:
    """The smallest interval containing both."""
    return min(a[0], b[0]), max(a[1], b[1])


def intersect(a: Interval | None, b: Interval | None) -> Interval | None:
    """The common part (may be empty, lo > hi); None stands for 'unknown', i.e. everything."""
    if a is None:
        return b
    if b is None:
        return a
    return max(a[0], b[0]), min(a[1], b[1])


def _mul(a: Interval, b: Interval) -> Interval:
    ps = [a[0] * b[0], a[0] * b[1], a[1] * b[0], a[1] * b[1]]
    return min(ps), max(ps)


def _floordiv(a: Interval, b: Interval) -> Interval | None:
    if b[0] > 0 or b[1] < 0:
        # e // d is monotone in e, and in d for a fixed sign of e: the corners bound it
        qs = [a[0] // b[0], a[0] // b[1], a[1] // b[0], a[1] // b[1]]
        return min(qs), max(qs)
    return None


def _mod(a: Interval, b: Interval) -> Interval | None:
    if b[0] == b[1] and b[0] > 0:
        d = b[0]
        if a[0] // d == a[1] // d:  # one period: the remainder grows with e
            return a[0] % d, a[1] % d
        return 0, d - 1
    if b[0] > 0:
        return 0, b[1] - 1
    if b[1] < 0:
        return b[0] + 1, 0
    return None


def interval(e: Expr, ranges: Mapping[str, Interval], *,
             refine: Callable[[Expr], Interval | None] | None = None) -> Interval | None:
    """Inclusive bounds of the integer expression `e` when each index `x` is in `ranges[x]`.

    None when unknown (loads, floats, a variable missing from `ranges`, division by a range
    containing 0). `//` and `%` use floor semantics: `e % c` is in [0, c-1], or tighter when
    `e`'s range lies in one period of `c`. `refine(node)`, when given, may return bounds known
    for a sub-expression by other means (e.g. guards); they are intersected with the computed
    ones. An empty result (lo > hi) means the ranges are contradictory.
    """
    return _interval(e, ranges, refine)


def _interval(e: Expr, ranges: Mapping[str, Interval],
              refine: Callable[[Expr], Interval | None] | None) -> Interval | None:
    base = _base_interval(e, ranges, refine)
    if refine is not None:
        base = intersect(base, refine(e))
    return base


def _base_interval(e: Expr, ranges: Mapping[str, Interval],
                   refine: Callable[[Expr], Interval | None] | None) -> Interval | None:
    if isinstance(e, Const):
        c = _int_const(e)
        return None if c is None else (c, c)
    if isinstance(e, Index):
        return ranges.get(e.name)
    aff = to_affine(e)
    if aff is not None and not aff.is_const and refine is None:
        # exact: each variable counted once (interval arithmetic would widen `h - h`)
        return affine_interval(aff, ranges)
    if aff is not None and aff.is_const:
        return aff.const, aff.const
    if isinstance(e, Unary):
        if e.op == "neg":
            x = _interval(e.x, ranges, refine)
            return None if x is None else (-x[1], -x[0])
        return (0, 1) if e.op == "not" else None
    if isinstance(e, Cast):
        if e.dtype.is_float:
            return None
        if e.dtype.value == "i1":
            return 0, 1
        return _interval(e.x, ranges, refine)
    if isinstance(e, Binary):
        if e.op in COMPARISONS or e.op in ("and", "or"):
            return 0, 1
        a = _interval(e.a, ranges, refine)
        b = _interval(e.b, ranges, refine)
        if aff is not None and a is not None and b is not None:
            # the exact affine range may beat the structural one; both are sound
            exact = affine_interval(aff, ranges)
            if exact is not None:
                return intersect(exact, _structural(e.op, a, b))
        if a is None or b is None:
            return None
        return _structural(e.op, a, b)
    if isinstance(e, Call) and e.fn in ("min", "max") and len(e.args) == 2:
        a = _interval(e.args[0], ranges, refine)
        b = _interval(e.args[1], ranges, refine)
        if a is None or b is None:
            return None
        f = min if e.fn == "min" else max
        return f(a[0], b[0]), f(a[1], b[1])
    if isinstance(e, Call) and e.fn == "abs":
        x = _interval(e.args[0], ranges, refine)
        if x is None:
            return None
        if x[0] >= 0:
            return x
        if x[1] <= 0:
            return -x[1], -x[0]
        return 0, max(-x[0], x[1])
    if isinstance(e, Select):
        a = _interval(e.a, ranges, refine)
        b = _interval(e.b, ranges, refine)
        if a is None or b is None:
            return None
        return hull(a, b)
    return None


def _structural(op: str, a: Interval, b: Interval) -> Interval | None:
    if op == "+":
        return a[0] + b[0], a[1] + b[1]
    if op == "-":
        return a[0] - b[1], a[1] - b[0]
    if op == "*":
        return _mul(a, b)
    if op == "//":
        return _floordiv(a, b)
    if op == "%":
        return _mod(a, b)
    return None
