"""Local rewrites of scalar expressions: constant folding, algebraic identities, index algebra.

`simplify(e, ranges)` applies tables of (pattern, function) rules bottom-up until nothing
changes. Every rule is local and exact:

- **Constant folding** of every operator, intrinsic and cast, in the literal's dtype, by the
  rows of the operator table (`nfc.ops.fold`: typed literals compute in numpy with that
  dtype's wrap-around and rounding; two weak literals give a weak literal; integer `//` and
  `%` floor; division by an integer zero is left alone). Types are the table's too
  (`nfc.ops.Typer`).
- **Identities** `x - 0`, `x * 1`, `x / 1`, `-(-x)`, `x + -y`, `not not x`,
  `select(true, a, b)`, `select(c, a, a)`, `select(not c, a, b)`, `and`/`or` with constants,
  `max(x, x)`, casts to the operand's own type, literals to the right of `+ * == !=`,
  `not (a < b)` to `a >= b` (integers only: with a NaN both are false).
- **Integer index algebra**: sums of integer terms are collected into one canonical linear form
  (terms sorted, coefficient first, constant last: `i*2 + 1 + i` becomes `3 * i + 1`, the
  shape of `nfc.affine.affine_to_expr`), so equal index expressions print equally and CSE can
  match them; `(k // c) * c + k % c` becomes `k`. For index expressions (weak integers, int64;
  assumed not to overflow) `(a*c + b) // c` becomes `a + b // c` and `(a*c + b) % c` becomes
  `b % c`; then `b // c` and `b % c` are decided when `ranges` prove `b` within one period of
  `c` (reshape round trips vanish); comparisons, `min` and `max` are decided when the ranges
  order their operands. Typed integer sums (i32 data) are collected too (exact in wrap-around
  arithmetic), but nothing is decided about them.

What is never done: a float rewrite that could change any result bit, inf, NaN and the sign
of zero included. `x * 0.0` is not `0.0` (inf * 0 and NaN * 0 are NaN), `x - x` is not `0.0`,
`x + 0.0` is not `x` (`-0.0 + 0.0` is `+0.0`, and `1 / x` tells them apart; `x - 0.0` and
`x + -0.0` do fold), float sums are not reassociated and `max(0.0, x)` keeps its argument
order. `fast=True` allows `x * 0 -> 0`, `x + 0.0 -> x`, `0.0 - x -> -x`, `0 / x -> 0`,
`x - x -> 0`, `x / x -> 1` and `not (a < b) -> a >= b` for floats too, assuming finite,
non-NaN values whose zeros' sign does not matter. Weak float literals fold in float64, as the
interpreter computes weak-only sub-expressions.

`simplify_divisions(e, ranges)` applies only the `//` and `%` rules of the index algebra and
leaves everything else as written: code generation uses it on the loop IR, so the division rule
exists once.

The rules live in tables, one module per kind: `nfc.simplify.fold` (constant folding),
`nfc.simplify.rules` (identities and the index algebra), written with the small pattern
language of `nfc.simplify.pattern` (`B("+", V("x"), K("c", 0))` is `x + 0`).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import SimpleNamespace

from nfc.affine import interval
from nfc.ir import Binary, Cast, Const, DType, Expr
from nfc.ops import WEAK_FLOAT, WEAK_INT, Kind, Typer
from nfc.simplify.fold import FOLD_RULES, fold_binary, fold_cast, fold_unary
from nfc.simplify.pattern import Pat, Rule, match, op_of, same, structural_key
from nfc.simplify.rules import DIVISION_RULES, IDENTITY_RULES, INDEX_RULES

__all__ = ["DIVISION_RULES", "FOLD_RULES", "IDENTITY_RULES", "INDEX_RULES", "WEAK_FLOAT",
           "WEAK_INT", "Pat", "Range", "Rule", "fold_binary", "fold_cast", "fold_unary", "match",
           "same", "simplify", "simplify_divisions", "structural_key"]

#: An inclusive integer range of an index variable.
Range = tuple[int, int]


def simplify(e: Expr, ranges: Mapping[str, Range] | None = None, *, fast: bool = False) -> Expr:
    """`e` rewritten to a simpler expression with the same value.

    `ranges` maps index variables to inclusive bounds (a compute's axis `i: 8` is `(0, 7)`);
    they let `//`, `%`, comparisons, `min` and `max` of indices be decided. `fast` allows the
    float rewrites that assume finite, non-NaN values (see the module docstring).
    """
    return _Simplifier(dict(ranges or {}), fast).run(e)


def simplify_divisions(e: Expr, ranges: Mapping[str, Range] | None = None) -> Expr:
    """`e` with only the division rules of the index algebra applied: in `a // c` and `a % c`
    of an index expression by a positive literal, the multiples of `c` leave the division
    (`(2*(8*q + l) + p + 1) // 2` is `8 * q + l + (p + 1) // 2`) and a remainder that `ranges`
    keep within one period of `c` is decided (`(8*j.0 + j.1) // 8` is `j.0` for j.1 in 0..7).
    Everything else keeps its shape, and so does a division from which nothing leaves.

    Code generation calls this on the loop IR once split loop variables replace the axes:
    the block structure of splits and packs resolves, while the emitter folds the affine
    arithmetic itself."""
    if not any(isinstance(n, Binary) and n.op in ("//", "%") for n in e.walk()):
        return e  # the common case (no division) without the simplifier's type inference
    return _Simplifier(dict(ranges or {}), False, _DIVISION_TABLE, divisions_only=True).run(e)


# ---------------------------------------------------------------------------------------------
# the driver

#: Rules by (node class, operator); operator None holds the rules for any operator.
_TABLE: dict[tuple[type[Expr], str | None], list[Rule]] = {}
for _rule in FOLD_RULES + INDEX_RULES + IDENTITY_RULES:
    _TABLE.setdefault((_rule[0].cls, _rule[0].op), []).append(_rule)  # type: ignore[arg-type]
_DIVISION_TABLE: dict[tuple[type[Expr], str | None], list[Rule]] = {}
for _rule in DIVISION_RULES:
    _DIVISION_TABLE.setdefault((_rule[0].cls, _rule[0].op), []).append(_rule)  # type: ignore[arg-type]

#: Rewrites of one node before simplify gives up with an internal error (a rule cycle).
_MAX_STEPS = 10_000

class _Simplifier:
    def __init__(self, ranges: dict[str, Range], fast: bool,
                 table: dict[tuple[type[Expr], str | None], list[Rule]] = _TABLE, *,
                 divisions_only: bool = False) -> None:
        self.ranges = ranges
        self.fast = fast
        self.table = table
        self.divisions_only = divisions_only
        """Leave a division alone unless something leaves it or it is decided."""
        self.done: set[int] = set()
        self.typer = Typer()  # the operator table's typing, memoised per node
        self.keep: list[Expr] = []  # keeps memoised nodes alive so their ids stay unique

    def run(self, e: Expr) -> Expr:
        return self.simp(e)

    def simp(self, e: Expr) -> Expr:
        for _ in range(_MAX_STEPS):
            if id(e) in self.done:
                return e
            kids = e.children()
            if kids:
                new = tuple(self.simp(k) for k in kids)
                if any(a is not b for a, b in zip(new, kids, strict=True)):
                    e = e.rebuild(new)
            out = self.rewrite(e)
            if out is None:
                self.done.add(id(e))
                self.keep.append(e)
                return e
            e = out
        raise AssertionError(f"simplify: rules cycle on {e!r}")

    def retype(self, new: Expr, want: Kind | None) -> Expr | None:
        """`new`, converted to type `want` if a rewrite made a typed expression weak, or a weak
        float a weak integer; None when that cannot be done. `1.0 / select(false, %x[i], 0)`
        must stay a float division (`0` alone would make it an integer one, an error), and a
        weak float would compute in float64 instead of `want`."""
        have = self.type(new)
        if have == want or want is None or want == WEAK_INT:
            return new
        if isinstance(want, DType):
            return (fold_cast(want, new) if isinstance(new, Const) else None) or Cast(want, new)
        if have == WEAK_INT and isinstance(new, Const):  # a weak int where a weak float was
            return Const(float(new.value))
        return None

    def rewrite(self, e: Expr) -> Expr | None:
        op = op_of(e)
        for rules in (self.table.get((type(e), op), ()), self.table.get((type(e), None), ())):
            for pat, fn in rules:
                env: dict[str, Expr] = {}
                if not match(pat, e, env):
                    continue
                out = fn(SimpleNamespace(e=e, cx=self, **env))
                if out is not None:
                    out = self.retype(out, self.type(e))
                if out is not None and out != e:  # a declined rewrite; strict `same` is slower
                    return out
        return None

    def interval(self, e: Expr) -> tuple[int, int] | None:
        return interval(e, self.ranges)

    def is_index(self, e: Expr) -> bool:
        """Whether `e` is a weak integer: index arithmetic, computed in int64."""
        return self.type(e) == WEAK_INT

    def is_int(self, e: Expr) -> bool:
        t = self.type(e)
        return t == WEAK_INT or (isinstance(t, DType) and t.is_int and t != DType.I1)

    def type(self, e: Expr) -> Kind | None:
        """The kind of `e` by the operator table (nfc.ops); None where it is ill-typed."""
        return self.typer.kind(e)
