"""Where an index can take values when conditional expressions guard its uses.

`xh[n, k] = x[n, k] if k < I else h[n, k - I]` reads `x` in bounds for k in 0..I and `h` for
k in I..I + H: the index ranges over the union of what its branches allow. `domain` computes
that set for one index of a comprehension (or of a reduction) as a union of integer intervals:

- an access `t[..., f(k), ...]` allows the k with `0 <= f(k) < size` (f affine in k, also
  through `//` and `*` by constants); accesses whose subscript involves other indices or data
  constrain nothing (the bounds proof checks them later);
- `a if c else b` allows `(T(c) & dom(a)) | (F(c) & dom(b))`, where T and F are the values of
  k for which `c` *may* be true and false: a comparison affine in k gives an interval and its
  complement, anything else (data, other indices, floats) may go either way;
- every other expression allows the intersection of what its parts allow.

Intervals are inclusive; NEG and POS stand for minus and plus infinity and keep integer
arithmetic exact.
"""

from __future__ import annotations

from collections.abc import Callable

from nfc.frontend import ast
from nfc.frontend.limits import MAX_NESTING

NEG = -(1 << 200)
POS = 1 << 200
ISet = tuple[tuple[int, int], ...]
ALL: ISet = ((NEG, POS),)
NONE: ISet = ()

#: Binding nodes of the index variables visible at a point: (id of binder, names), innermost
#: last. The comprehension statement binds its output indices, a Reduce its own.
Scopes = list[tuple[int, frozenset[str]]]


def _norm(parts: list[tuple[int, int]]) -> ISet:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted((max(lo, NEG), min(hi, POS)) for lo, hi in parts):
        if lo > hi:
            continue
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return tuple(out)


def inter(a: ISet, b: ISet) -> ISet:
    """Intersection."""
    return _norm([(max(x[0], y[0]), min(x[1], y[1])) for x in a for y in b])


def union(a: ISet, b: ISet) -> ISet:
    """Union."""
    return _norm([*a, *b])


def complement(a: ISet) -> ISet:
    """Every integer (within NEG..POS) not in `a`."""
    out, lo = [], NEG
    for x, y in a:
        out.append((lo, x - 1))
        lo = y + 1
    out.append((lo, POS))
    return _norm(out)


def _ceil_div(a: int, b: int) -> int:
    return -((-a) // b)


Lin = tuple[int, int]  # a * k + b


class Domain:
    """The values of index `name` bound by node `key` that some branch reads in bounds."""

    def __init__(self, key: int, name: str, shape_of: Callable[[str], tuple[int, ...] | None],
                 const_of: Callable[[str], object]) -> None:
        self.key = key
        self.name = name
        self.shape_of = shape_of
        self.const_of = const_of

    # ---- names --------------------------------------------------------------------------

    @staticmethod
    def binder(name: str, scopes: Scopes) -> int | None:
        """The binding node of index `name`, None if it is not an index here."""
        for key, names in reversed(scopes):
            if name in names:
                return key
        return None

    def mentions(self, e: ast.Expr, scopes: Scopes) -> bool:
        """Whether `e` uses the index outside the subscripts of loads (a guard on it)."""
        if isinstance(e, ast.Name):
            return e.id == self.name and self.binder(e.id, scopes) == self.key
        if isinstance(e, ast.Subscript):
            return False
        if isinstance(e, ast.Reduce):
            inner = [*scopes, (id(e), frozenset(r.name for r in e.indices))]
            return self.mentions(e.body, inner)
        return any(self.mentions(c, scopes) for c in e.children())

    # ---- affine forms -------------------------------------------------------------------

    def lin(self, e: ast.Expr, scopes: Scopes) -> Lin | None:
        """`e` as a * k + b with integer a, b; None when it is not affine in k alone."""
        if isinstance(e, ast.Num):
            return (0, e.value) if isinstance(e.value, int) else None
        if isinstance(e, ast.Name):
            key = self.binder(e.id, scopes)
            if key is not None:
                return (1, 0) if key == self.key and e.id == self.name else None
            v = self.const_of(e.id)
            return (0, v) if isinstance(v, int) and not isinstance(v, bool) else None
        if isinstance(e, ast.Unary) and e.op == "neg":
            x = self.lin(e.x, scopes)
            return None if x is None else (-x[0], -x[1])
        if isinstance(e, ast.BinOp):
            first, links = ast.chain(e)
            acc = self.lin(first, scopes)
            for link in links:  # a loop, not recursion: chains may be long
                if acc is None:
                    return None
                acc = _lin_op(link.op, acc, self.lin(link.b, scopes))
            return acc
        return None

    def const(self, e: ast.Expr, scopes: Scopes) -> int | None:
        """The value of `e` when it is a compile-time integer."""
        f = self.lin(e, scopes)
        return f[1] if f is not None and f[0] == 0 else None

    def pre(self, e: ast.Expr, lo: int, hi: int, scopes: Scopes) -> ISet | None:
        """The k for which `lo <= e <= hi`; None when `e` is not understood.

        Each rule narrows the question to one operand, so this is a loop (chains may be long);
        after a few hundred steps the expression counts as not understood.
        """
        for _ in range(4 * MAX_NESTING):
            f = self.lin(e, scopes)
            if f is not None:
                a, b = f
                if a == 0:
                    return ALL if lo <= b <= hi else NONE
                if a > 0:
                    return _norm([(_ceil_div(lo - b, a), (hi - b) // a)])
                return _norm([(_ceil_div(hi - b, a), (lo - b) // a)])
            if isinstance(e, ast.Unary) and e.op == "neg":
                e, lo, hi = e.x, -hi, -lo
                continue
            if not isinstance(e, ast.BinOp):
                return None
            ca, cb = self.const(e.a, scopes), self.const(e.b, scopes)
            if e.op == "//" and cb is not None and cb > 0:
                e, lo, hi = e.a, lo * cb, hi * cb + cb - 1
            elif e.op == "+" and cb is not None:
                e, lo, hi = e.a, lo - cb, hi - cb
            elif e.op == "+" and ca is not None:
                e, lo, hi = e.b, lo - ca, hi - ca
            elif e.op == "-" and cb is not None:
                e, lo, hi = e.a, lo + cb, hi + cb
            elif e.op == "-" and ca is not None:
                e, lo, hi = e.b, ca - hi, ca - lo
            elif e.op == "*" and (ca is not None or cb is not None):
                c, x = (ca, e.b) if ca is not None else (cb, e.a)
                assert c is not None
                if c == 0:
                    return ALL if lo <= 0 <= hi else NONE
                if c > 0:
                    e, lo, hi = x, _ceil_div(lo, c), hi // c
                else:
                    e, lo, hi = x, _ceil_div(hi, c), lo // c
            else:
                return None
        return None

    # ---- conditions and domains ---------------------------------------------------------

    _CMP = {"<": (NEG, -1), "<=": (NEG, 0), ">": (1, POS), ">=": (0, POS), "==": (0, 0)}

    def cond(self, e: ast.Expr, scopes: Scopes) -> tuple[ISet, ISet]:
        """(T, F): the k for which `e` may be true, and may be false."""
        if isinstance(e, ast.Bool):
            return (ALL, NONE) if e.value else (NONE, ALL)
        if isinstance(e, ast.Name) and self.binder(e.id, scopes) is None:
            v = self.const_of(e.id)
            if isinstance(v, bool):
                return (ALL, NONE) if v else (NONE, ALL)
        if isinstance(e, ast.Unary) and e.op == "not":
            t, f = self.cond(e.x, scopes)
            return f, t
        if isinstance(e, ast.BoolOp):
            first, links = ast.chain(e)
            t1, f1 = self.cond(first, scopes)
            for link in links:  # `a and b and c ...`: a loop, chains may be long
                t2, f2 = self.cond(link.b, scopes)
                if link.op == "and":
                    t1, f1 = inter(t1, t2), union(f1, f2)
                else:
                    t1, f1 = union(t1, t2), inter(f1, f2)
            return t1, f1
        if isinstance(e, ast.Compare):
            t, f = ALL, NONE
            for k, op in enumerate(e.ops):
                diff = ast.BinOp(e.loc, "-", e.operands[k], e.operands[k + 1])
                s = self.pre(diff, 0, 0, scopes) if op in ("==", "!=") \
                    else self.pre(diff, *self._CMP[op], scopes)
                if s is None:
                    ts, fs = ALL, ALL
                else:
                    ts, fs = (complement(s), s) if op == "!=" else (s, complement(s))
                t, f = inter(t, ts), union(f, fs)
            return t, f
        return ALL, ALL

    def dom(self, e: ast.Expr, scopes: Scopes) -> ISet:
        """The k for which evaluating `e` reads every tensor in bounds."""
        if isinstance(e, ast.Subscript):
            shape = self.shape_of(e.name) if self.binder(e.name, scopes) is None else None
            out = ALL
            for d, ix in enumerate(e.indices):
                out = inter(out, self.dom(ix, scopes))
                if shape is not None and d < len(shape):
                    s = self.pre(ix, 0, shape[d] - 1, scopes)
                    if s is not None:
                        out = inter(out, s)
            return out
        if isinstance(e, ast.IfExp):
            t, f = self.cond(e.cond, scopes)
            branches = union(inter(t, self.dom(e.a, scopes)), inter(f, self.dom(e.b, scopes)))
            return inter(self.dom(e.cond, scopes), branches)
        if isinstance(e, ast.Reduce):
            inner = [*scopes, (id(e), frozenset(r.name for r in e.indices))]
            return self.dom(e.body, inner)
        out = ALL
        for c in e.children():
            out = inter(out, self.dom(c, scopes))
        return out


def _lin_op(op: str, a: Lin, b: Lin | None) -> Lin | None:
    """`a op b` for affine forms; None when the result is not affine."""
    if b is None:
        return None
    if op == "+":
        return (a[0] + b[0], a[1] + b[1])
    if op == "-":
        return (a[0] - b[0], a[1] - b[1])
    if op == "*" and (a[0] == 0 or b[0] == 0):
        return (a[0] * b[1] + b[0] * a[1], a[1] * b[1])
    if op in ("//", "%") and a[0] == 0 and b[0] == 0 and b[1] != 0:
        return (0, a[1] // b[1] if op == "//" else a[1] % b[1])
    return None


def bounded(s: ISet) -> bool:
    """Whether a non-empty set has finite bounds."""
    return bool(s) and s[0][0] > NEG and s[-1][1] < POS
