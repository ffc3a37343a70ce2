"""Quasi-affine integer expressions with range-aware simplification.

The index solver builds expressions such as `z - 2 * (z // 2)` or `((w // 4) * 4 + w % 4) // 2`
while inverting strided and reshaped accesses. `QA` keeps them in a normal form, a sum of
integer multiples of atoms (index variables, `e // c`, `e % c`) plus a constant, and applies
exact rules so that the printed gradients read like hand-written ones:

- `(c*a + b) // c = a + b // c`, `(c*a + b) % c = b % c`;
- `(e // a + d) // b = (e + a*d) // (a*b)` and `(e % (k*c)) % c = e % c`;
- `b // c` and `b % c` are decided when the ranges put `b` inside one period of `c`;
- `e - c * (e // c)` becomes `e % c` and `c * (e // c) + e % c` becomes `e`.

All divisions are floor divisions by positive constants, as in the IR.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from nfc.ir import Binary, Cast, Const, Expr, Index, Unary

Interval = tuple[int, int]


@dataclass(frozen=True)
class Var:
    """An index variable."""

    name: str


@dataclass(frozen=True)
class Div:
    """`x // c` with `c > 1` and `x` not simplifiable further."""

    x: QA
    c: int


@dataclass(frozen=True)
class Mod:
    """`x % c` with `c > 1`."""

    x: QA
    c: int


Atom = Var | Div | Mod


def _key(a: Atom) -> tuple:
    if isinstance(a, Var):
        return (0, a.name)
    return (1 if isinstance(a, Div) else 2, _qa_key(a.x), a.c)


def _qa_key(q: QA) -> tuple:
    return tuple((0, _key(a), c) for a, c in q.terms) + ((1, q.const),)


@dataclass(frozen=True)
class QA:
    """`sum(c * atom) + const`, terms in canonical order, no zero coefficients."""

    terms: tuple[tuple[Atom, int], ...] = ()
    const: int = 0

    @staticmethod
    def make(terms: dict[Atom, int], const: int = 0) -> QA:
        """The normal form of a term map (zeros dropped, canonical order)."""
        items = sorted(((a, c) for a, c in terms.items() if c != 0), key=lambda t: _key(t[0]))
        return QA(tuple(items), const)

    @property
    def is_const(self) -> bool:
        """True when no atom occurs."""
        return not self.terms

    def coeff_map(self) -> dict[Atom, int]:
        """The terms as a dict."""
        return dict(self.terms)

    def names(self) -> set[str]:
        """Every variable name occurring, inside atoms included."""
        out: set[str] = set()
        for a, _ in self.terms:
            if isinstance(a, Var):
                out.add(a.name)
            else:
                out |= a.x.names()
        return out


def var(name: str) -> QA:
    """The variable `name`."""
    return QA(((Var(name), 1),), 0)


def const(k: int) -> QA:
    """The constant `k`."""
    return QA((), k)


class QACtx:
    """Builds normalised quasi-affine expressions under known variable ranges."""

    def __init__(self, ranges: Mapping[str, Interval]) -> None:
        self.ranges = dict(ranges)

    # -- arithmetic ---------------------------------------------------------------------------

    def add(self, *xs: QA) -> QA:
        """The sum of the arguments."""
        acc: dict[Atom, int] = {}
        k = 0
        for x in xs:
            for a, c in x.terms:
                acc[a] = acc.get(a, 0) + c
            k += x.const
        return self._recognise(acc, k)

    def scale(self, x: QA, k: int) -> QA:
        """`k * x`."""
        if k == 0:
            return const(0)
        return QA(tuple((a, c * k) for a, c in x.terms), x.const * k)

    def sub(self, a: QA, b: QA) -> QA:
        """`a - b`."""
        return self.add(a, self.scale(b, -1))

    def floordiv(self, x: QA, c: int) -> QA:
        """`x // c` for a positive constant `c`."""
        assert c > 0
        if c == 1:
            return x
        # coefficients reduced into [0, c): (c*a + b) // c = a + b // c
        q = QA.make({a: k // c for a, k in x.terms}, x.const // c)
        b = QA.make({a: k % c for a, k in x.terms}, x.const % c)
        if b.is_const:
            return self.add(q, const(b.const // c))
        if len(b.terms) == 1 and isinstance(b.terms[0][0], Div) and b.terms[0][1] == 1:
            inner = b.terms[0][0]
            return self.add(q, self.floordiv(self.add(inner.x, const(inner.c * b.const)),
                                             inner.c * c))
        r = self.interval(b)
        if r is not None and r[0] // c == r[1] // c:
            return self.add(q, const(r[0] // c))
        return self.add(q, QA(((Div(b, c), 1),), 0))

    def mod(self, x: QA, c: int) -> QA:
        """`x % c` for a positive constant `c`."""
        assert c > 0
        if c == 1:
            return const(0)
        b = QA.make({a: k % c for a, k in x.terms}, x.const % c)
        if b.is_const:
            return const(b.const % c)
        if (len(b.terms) == 1 and isinstance(b.terms[0][0], Mod) and b.terms[0][1] == 1
                and b.terms[0][0].c % c == 0):
            return self.mod(self.add(b.terms[0][0].x, const(b.const)), c)
        r = self.interval(b)
        if r is not None and r[0] // c == r[1] // c:
            return self.add(b, const(-(r[0] // c) * c))
        return QA(((Mod(b, c), 1),), 0)

    def _recognise(self, acc: dict[Atom, int], k: int) -> QA:
        """Fold `e - c*(e//c)` into `e % c` and `c*(e//c) + e%c` into `e`."""
        changed = True
        while changed:
            changed = False
            for a, alpha in list(acc.items()):
                if alpha == 0 or acc.get(a, 0) != alpha:
                    continue
                if isinstance(a, Div):
                    # acc = R + alpha*(e//c) = (R - m*e) + m*(e % c) + (alpha + m*c)*(e//c)
                    t0, c0 = a.x.terms[0]
                    m = acc.get(t0, 0) // c0 if acc.get(t0, 0) % c0 == 0 else 0
                    if (m != 0 and abs(alpha + m * a.c) < abs(alpha)
                            and all(acc.get(t, 0) == m * ct for t, ct in a.x.terms)):
                        for t, ct in a.x.terms:
                            acc[t] -= m * ct
                        k -= m * a.x.const
                        acc[a] = alpha + m * a.c
                        md = Mod(a.x, a.c)
                        acc[md] = acc.get(md, 0) + m
                        changed = True
                        break
                    # (e//a) - c*(e//(a*c)) = (e//a) % c
                    for b2, beta in list(acc.items()):
                        if (isinstance(b2, Div) and b2.x == a.x and b2.c > a.c
                                and b2.c % a.c == 0 and beta == -alpha * (b2.c // a.c)):
                            inner = QA(((a, 1),), 0)
                            acc[a] = 0
                            acc[b2] = 0
                            md = Mod(inner, b2.c // a.c)
                            acc[md] = acc.get(md, 0) + alpha
                            changed = True
                            break
                    if changed:
                        break
                if isinstance(a, Mod):
                    dv = Div(a.x, a.c)
                    if acc.get(dv, 0) == alpha * a.c:
                        acc[a] = 0
                        acc[dv] = 0
                        for t, ct in a.x.terms:
                            acc[t] = acc.get(t, 0) + alpha * ct
                        k += alpha * a.x.const
                        changed = True
                        break
        return QA.make(acc, k)

    # -- analysis -----------------------------------------------------------------------------

    def interval(self, x: QA) -> Interval | None:
        """Inclusive bounds of `x` over the ranges (None if a variable has no range)."""
        lo = hi = x.const
        for a, c in x.terms:
            r = self._atom_interval(a)
            if r is None:
                return None
            if c > 0:
                lo, hi = lo + c * r[0], hi + c * r[1]
            else:
                lo, hi = lo + c * r[1], hi + c * r[0]
        return lo, hi

    def _atom_interval(self, a: Atom) -> Interval | None:
        if isinstance(a, Var):
            return self.ranges.get(a.name)
        r = self.interval(a.x)
        if r is None:
            return (0, a.c - 1) if isinstance(a, Mod) else None
        if isinstance(a, Div):
            return r[0] // a.c, r[1] // a.c
        if r[0] // a.c == r[1] // a.c:
            return r[0] % a.c, r[1] % a.c
        return 0, a.c - 1

    def substitute(self, x: QA, mapping: Mapping[str, QA]) -> QA:
        """Replace variables by expressions, renormalising."""
        parts = [const(x.const)]
        for a, c in x.terms:
            if isinstance(a, Var):
                parts.append(self.scale(mapping.get(a.name, var(a.name)), c))
            elif isinstance(a, Div):
                parts.append(self.scale(self.floordiv(self.substitute(a.x, mapping), a.c), c))
            else:
                parts.append(self.scale(self.mod(self.substitute(a.x, mapping), a.c), c))
        return self.add(*parts)

    # -- conversion ---------------------------------------------------------------------------

    def from_expr(self, e: Expr) -> QA | None:
        """The normal form of an integer index expression, or None if not quasi-affine."""
        if isinstance(e, Const) and not e.is_float and (e.dtype is None or e.dtype.is_int):
            return const(int(e.value))
        if isinstance(e, Index):
            return var(e.name)
        if isinstance(e, Unary) and e.op == "neg":
            x = self.from_expr(e.x)
            return None if x is None else self.scale(x, -1)
        if isinstance(e, Cast) and e.dtype.is_int and e.dtype.value != "i1":
            return self.from_expr(e.x)
        if isinstance(e, Binary) and e.op in ("+", "-", "*", "//", "%"):
            a = self.from_expr(e.a)
            b = self.from_expr(e.b)
            if a is None or b is None:
                return None
            if e.op == "+":
                return self.add(a, b)
            if e.op == "-":
                return self.sub(a, b)
            if e.op == "*":
                if a.is_const:
                    return self.scale(b, a.const)
                return self.scale(a, b.const) if b.is_const else None
            if not b.is_const or b.const <= 0:
                return None
            return self.floordiv(a, b.const) if e.op == "//" else self.mod(a, b.const)
        return None


def to_expr(x: QA) -> Expr:
    """The expression of a normal form: `2 * h + w // 2 - 1` (weak literals)."""
    def atom(a: Atom) -> Expr:
        if isinstance(a, Var):
            return Index(a.name)
        op = "//" if isinstance(a, Div) else "%"
        return Binary(op, to_expr(a.x), Const(a.c))

    def term(a: Atom, c: int) -> Expr:
        if c == 1:
            return atom(a)
        if c == -1:
            return Unary("neg", atom(a))
        return Binary("*", Const(c), atom(a))

    if not x.terms:
        return Const(x.const)
    (a0, c0), *rest = x.terms
    out = term(a0, c0)
    for a, c in rest:
        out = Binary("-", out, term(a, -c)) if c < 0 else Binary("+", out, term(a, c))
    if x.const > 0:
        out = Binary("+", out, Const(x.const))
    elif x.const < 0:
        out = Binary("-", out, Const(-x.const))
    return out
