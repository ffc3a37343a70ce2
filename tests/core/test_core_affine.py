"""Affine normal forms and interval arithmetic (nfc.affine)."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from nfc.affine import Affine, affine_to_expr, interval, is_affine, is_int_valued, to_affine
from nfc.ir import (
    Binary,
    Call,
    Cast,
    Const,
    DType,
    Expr,
    Index,
    Load,
    Select,
    TensorType,
    Unary,
    Value,
)
from nfc.printer import format_expr

h, w, r, s = (Index(n) for n in "hwrs")


def evaluate(e: Expr, env: dict[str, int]) -> int:
    """Direct integer evaluation with floor semantics (the reference for the property)."""
    if isinstance(e, Const):
        return int(e.value)
    if isinstance(e, Index):
        return env[e.name]
    if isinstance(e, Binary):
        a, b = evaluate(e.a, env), evaluate(e.b, env)
        return {"+": a + b, "-": a - b, "*": a * b,
                "//": a // b if b else 0, "%": a % b if b else 0}[e.op]
    if isinstance(e, Call):
        a, b = (evaluate(x, env) for x in e.args)
        return max(a, b) if e.fn == "max" else min(a, b)
    if isinstance(e, Select):
        c = e.cond
        assert isinstance(c, Binary)
        return evaluate(e.a, env) if evaluate(c.a, env) < evaluate(c.b, env) else evaluate(
            e.b, env)
    if isinstance(e, Cast):
        return evaluate(e.x, env)
    if isinstance(e, Unary) and e.op == "neg":
        return -evaluate(e.x, env)
    raise AssertionError(e)


def test_normal_form_sorts_merges_and_drops_zero_terms():
    a = to_affine(2 * h + r - 1 - h + (w - w))
    assert a == Affine((("h", 1), ("r", 1)), -1)
    assert to_affine(-(3 * (h - 2))) == Affine((("h", -3),), 6)
    assert to_affine(Cast(DType.I32, h + 1)) == Affine((("h", 1),), 1)
    assert to_affine(Const(7)) == Affine.constant(7)


def test_non_affine_expressions():
    x = Value(TensorType((4,), DType.I32), "x")
    assert to_affine(h * w) is None
    assert to_affine(h // 2) is None
    assert to_affine(Load(x, (h,))) is None
    assert to_affine(Const(1.5)) is None
    assert to_affine(Cast(DType.I32, Const(1.5))) is None
    assert not is_affine(h % 3)
    assert is_affine(h * 4 - r)


def test_exact_division_of_multiples_stays_affine():
    assert to_affine((4 * h + 6 * w + 1) // 2) == Affine((("h", 2), ("w", 3)), 0)
    assert to_affine((4 * h + 7) % 2) == Affine.constant(1)
    assert to_affine((4 * h + 1) // 3) is None


def test_atoms_name_non_affine_parts():
    names: dict[Expr, str] = {}

    def atom(e: Expr) -> str:
        return names.setdefault(e, f"${len(names)}")

    a = to_affine((h - r) // 2 + 1 - h, atom)
    assert a == Affine((("$0", 1), ("h", -1)), 1)
    assert names == {(h - r) // 2: "$0"}


def test_affine_arithmetic():
    a = Affine.var("h") + 2
    b = Affine.var("w").scale(3)
    assert a - b == Affine((("h", 1), ("w", -3)), 2)
    assert (a - a) == Affine()
    assert (-a).evaluate({"h": 5}) == -7
    assert a.coeff("h") == 1 and a.coeff("z") == 0


def test_affine_to_expr_is_canonical():
    assert format_expr(affine_to_expr(Affine.make([("w", 1), ("h", 2)], -1))) == "2 * h + w - 1"
    assert format_expr(affine_to_expr(Affine.make([("h", -1), ("w", -2)], 3))) == (
        "-h - 2 * w + 3")
    assert format_expr(affine_to_expr(Affine.make([("h", -2)]))) == "-2 * h"
    assert affine_to_expr(Affine.constant(0)) == Const(0)
    for aff in [Affine.make([("a", 3), ("b", -1)], 5), Affine.make([("q", -4)], -2)]:
        assert to_affine(affine_to_expr(aff)) == aff


def test_interval_basics():
    rg = {"h": (0, 7), "r": (0, 2), "w": (3, 5)}
    assert interval(h + r - 1, rg) == (-1, 8)
    assert interval(h - h, rg) == (0, 0)  # affine: h counted once
    assert interval(h * 2 - w, rg) == (-5, 11)
    assert interval((h * 4 + r) // 3, rg) == (0, 10)
    assert interval(h % 3, rg) == (0, 2)
    assert interval(w % 8, rg) == (3, 5)  # one period: tighter than [0, 7]
    assert interval((h - 9) // 4, rg) == (-3, -1)  # floor semantics below zero
    assert interval((h - 9) % 4, rg) == (0, 3)
    assert interval(Call("max", (h - 2, Const(0))), rg) == (0, 5)
    assert interval(Call("min", (h, Const(3))), rg) == (0, 3)
    assert interval(Select(Binary("<", h, Const(3)), r, w), rg) == (0, 5)
    assert interval(Cast(DType.I64, h + 1), rg) == (1, 8)
    assert interval(Binary("<", h, w), rg) == (0, 1)


def test_interval_unknown():
    x = Value(TensorType((4,), DType.I32), "x")
    assert interval(Load(x, (h,)), {"h": (0, 3)}) is None
    assert interval(h + Index("zz"), {"h": (0, 3)}) is None
    assert interval(h // r, {"h": (0, 3), "r": (0, 2)}) is None  # divisor range holds 0
    assert interval(Cast(DType.I32, Const(2.5)), {}) is None


def test_interval_refine_hook_intersects():
    def refine(e: Expr):
        return (0, 4) if e == h - 1 else None

    assert interval((h - 1) // 2, {"h": (0, 9)}, refine=refine) == (0, 2)


def test_is_int_valued():
    f = Value(TensorType((4,), DType.F32), "f")
    assert is_int_valued(h // 2 + Const(1))
    assert not is_int_valued(Load(f, (h,)))
    assert is_int_valued(Cast(DType.I32, Load(f, (h,))))
    assert not is_int_valued(h + Const(0.5))


# ---------------------------------------------------------------------------------------------
# property: interval() contains every concrete value

NAMES = ["a", "b", "c"]


def exprs() -> st.SearchStrategy[Expr]:
    leaves = st.one_of(st.sampled_from([Index(n) for n in NAMES]),
                       st.integers(-6, 6).map(Const))

    def extend(children: st.SearchStrategy[Expr]) -> st.SearchStrategy[Expr]:
        pos = st.integers(1, 7).map(Const)
        return st.one_of(
            st.tuples(st.sampled_from(["+", "-"]), children, children).map(
                lambda t: Binary(t[0], t[1], t[2])),
            st.tuples(children, st.integers(-4, 4)).map(lambda t: Binary("*", t[0], Const(t[1]))),
            st.tuples(st.sampled_from(["//", "%"]), children, pos).map(
                lambda t: Binary(t[0], t[1], t[2])),
            children.map(lambda c: Unary("neg", c)),
            st.tuples(st.sampled_from(["max", "min"]), children, children).map(
                lambda t: Call(t[0], (t[1], t[2]))),
            st.tuples(children, children, children, children).map(
                lambda t: Select(Binary("<", t[0], t[1]), t[2], t[3])),
        )

    return st.recursive(leaves, extend, max_leaves=8)


ranges_st = st.fixed_dictionaries(
    {n: st.tuples(st.integers(-5, 5), st.integers(0, 4)).map(lambda t: (t[0], t[0] + t[1]))
     for n in NAMES})


@settings(max_examples=300, deadline=None)
@given(exprs(), ranges_st)
def test_interval_contains_every_value(e, ranges):
    iv = interval(e, ranges)
    assert iv is not None
    lo, hi = iv
    for vals in itertools.product(*(range(ranges[n][0], ranges[n][1] + 1) for n in NAMES)):
        v = evaluate(e, dict(zip(NAMES, vals, strict=True)))
        assert lo <= v <= hi, (format_expr(e), ranges, vals, v, iv)


@settings(max_examples=200, deadline=None)
@given(exprs())
def test_affine_normal_form_agrees_with_evaluation(e):
    aff = to_affine(e)
    if aff is None:
        return
    for vals in itertools.product(range(-3, 4), repeat=3):
        env = dict(zip(NAMES, vals, strict=True))
        assert aff.evaluate(env) == evaluate(e, env)
        assert evaluate(affine_to_expr(aff), env) == evaluate(e, env)
