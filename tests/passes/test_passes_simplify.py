"""simplify: rule-by-rule unit tests and a hypothesis property test (same value before/after)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from nfc.interp import InterpError, run
from nfc.ir import (
    Axis,
    Binary,
    Block,
    Call,
    Cast,
    ComputeOp,
    Const,
    DType,
    Expr,
    Func,
    Index,
    Load,
    ReturnOp,
    Select,
    TensorType,
    Unary,
    Value,
)
from nfc.printer import format_expr
from nfc.simplify import same, simplify

i, j, k = Index("i"), Index("j"), Index("k")
X = Value(TensorType((8,), DType.F64), "x")
A = Value(TensorType((8,), DType.I64), "a")
A32 = Value(TensorType((8,), DType.I32), "a32")
RANGES = {"i": (0, 7), "j": (0, 3), "k": (-5, 5)}


def s(e: Expr, **kw: object) -> str:
    return format_expr(simplify(e, **kw))  # type: ignore[arg-type]


def x(idx: Expr = i) -> Expr:
    return Load(X, (idx,))


# ---------------------------------------------------------------------------------------------
# constant folding


@pytest.mark.parametrize(("e", "want"), [
    (Const(3) + Const(4) * Const(2), "11"),
    (Const(-7) // Const(2), "-4"),            # floor, not truncation
    (Const(-7) % Const(2), "1"),
    (Const(7) % Const(-2), "-1"),
    (Const(7) // Const(0), "7 // 0"),         # left for the verifier/runtime
    (Const(6) / Const(3), "6 / 3"),           # `/` on integers is left for the verifier
    (Const(7.0) / Const(2), "3.5"),
    (Const(1.5) + Const(1.5), "3.0"),         # two weak literals stay weak
    (Const(1, DType.I32) + Const(2147483647, DType.I32), "i32(-2147483648)"),
    (Const(0.1, DType.F32) + Const(0.2, DType.F32), "f32(0.30000001192092896)"),
    (Const(2, DType.I32) * Const(3), "i32(6)"),  # weak joins typed
    (Const(1, DType.I32) + Const(1, DType.I64), "i32(1) + i64(1)"),  # ill-typed: untouched
    (Binary("<", Const(1), Const(2)), "true"),
    (Binary("and", Const(True), Const(False)), "false"),
    (Unary("not", Const(False)), "true"),
    (Call("exp", (Const(0.0),)), "1.0"),
    (Call("max", (Const(2), Const(5))), "5"),
    (Call("pow", (Const(2), Const(10))), "1024"),
    (Call("pow", (Const(2), Const(-1))), "pow(2, -1)"),
    (Call("abs", (Const(-3, DType.I32),)), "i32(3)"),
    (Call("sqrt", (Const(-1.0),)), "nan"),
    (Cast(DType.F32, Const(3)), "f32(3.0)"),
    (Cast(DType.I32, Const(-3.7)), "i32(-3)"),
    (Cast(DType.I32, Const(math.inf)), "i32(inf)"),
    (Cast(DType.I1, Const(2)), "true"),
    (Select(Const(True), x(), Const(0.0)), "%x[i]"),
    (Select(Const(False), x(), Const(0.0)), "f64(0.0)"),
    (Select(Const(False), x(), i) + 1.0, "f64(i) + 1.0"),
])
def test_fold(e: Expr, want: str) -> None:
    assert s(e) == want


def test_fold_keeps_weak_and_typed_literals_apart() -> None:
    assert simplify(Const(1) + Const(2)) == Const(3)
    assert simplify(Const(1) + Const(2)).dtype is None
    assert simplify(Const(1.0, DType.F16) * Const(3)).dtype == DType.F16


# ---------------------------------------------------------------------------------------------
# identities


@pytest.mark.parametrize(("e", "want"), [
    (x() + Const(-0.0), "%x[i]"),
    (Const(-0.0) + x(), "%x[i]"),
    (x() - 0, "%x[i]"),
    (x() - 0.0, "%x[i]"),
    (Const(-0.0) - x(), "-%x[i]"),
    (x() + 0.0, "%x[i] + 0.0"),             # -0.0 + 0.0 is +0.0: the sign of zero is kept
    (x() + 0, "%x[i] + 0"),
    (x() - Const(-0.0), "%x[i] - -0.0"),
    (Binary("-", Const(0.0), x()), "0.0 - %x[i]"),
    (x() * 1, "%x[i]"),
    (x() * -1, "-%x[i]"),
    (x() / 1, "%x[i]"),
    (Unary("neg", Unary("neg", x())), "%x[i]"),
    (x() + -x(j), "%x[i] - %x[j]"),
    (x() - -x(j), "%x[i] + %x[j]"),
    (-x() * -x(j), "%x[i] * %x[j]"),
    (x() + Const(0.0, DType.F32), "%x[i] + f32(0.0)"),  # dropping it would change the type
    (Cast(DType.F64, x()), "%x[i]"),
    (Cast(DType.F32, x()), "f32(%x[i])"),
    (Select(Binary("<", x(), Const(1.0)), x(), x()), "%x[i]"),
    (Select(Unary("not", Binary("<", x(), Const(1.0))), x(), Const(0.0)),
     "select(%x[i] < 1.0, 0.0, %x[i])"),
    (Select(Binary("<", i, j), Const(True), Const(False)), "i < j"),
    (Select(Binary("<", i, j), Const(False), Const(True)), "i >= j"),
    (Binary("and", Binary("<", i, j), Const(True)), "i < j"),
    (Binary("or", Binary("<", i, j), Const(True)), "true"),
    (Binary("and", Binary("<", i, j), Binary("<", i, j)), "i < j"),
    (Unary("not", Unary("not", Binary("<", i, j))), "i < j"),
    (Unary("not", Binary("<", i, j)), "i >= j"),
    (Unary("not", Binary("==", x(), Const(1.0))), "%x[i] != 1.0"),
    (Call("max", (x(), x())), "%x[i]"),
    (Call("abs", (-x(),)), "abs(%x[i])"),
    (2.0 * x(), "%x[i] * 2.0"),             # literals go right in commutative operators
    (Call("max", (Const(0.0), x())), "max(0.0, %x[i])"),  # max(0.0, -0.0) is +0.0
    (Binary("==", Const(1.0), x()), "%x[i] == 1.0"),
    (Binary("==", i, i), "true"),
    (Binary("<", i, i), "false"),
])
def test_identity(e: Expr, want: str) -> None:
    assert s(e) == want


@pytest.mark.parametrize(("e", "want"), [
    (x() + 0.0, "%x[i]"),
    (Binary("-", Const(0.0), x()), "-%x[i]"),
    (x() * 0, "f64(0.0)"),                  # the expression's type is kept
    (x() * 0.0, "f64(0.0)"),
    (x() - x(), "f64(0.0)"),
    (x() / x(), "f64(1.0)"),
    (Binary("/", Const(0.0), x()), "f64(0.0)"),
    (Unary("not", Binary("<", x(), Const(1.0))), "%x[i] >= 1.0"),
    (Binary("==", x(), x()), "true"),
])
def test_float_rewrites_only_with_fast(e: Expr, want: str) -> None:
    assert s(e) == format_expr(e)  # inf * 0, nan - nan, not (nan < 1), -0.0 + 0.0 differ
    assert s(e, fast=True) == want


def test_integer_zero_product_is_always_folded() -> None:
    assert s(Load(A, (i,)) * 0) == "i64(0)"
    assert s(Load(A, (i,)) - Load(A, (i,))) == "i64(0)"


# ---------------------------------------------------------------------------------------------
# index algebra


@pytest.mark.parametrize(("e", "want"), [
    (i * 2 + 1 + i, "3 * i + 1"),
    (i * 2 + 1 + i - i * 3, "1"),
    (j + i, "i + j"),                       # canonical order: CSE matches `i + j` and `j + i`
    (2 * (i + 1), "2 * i + 2"),
    (0 - i + 3, "-i + 3"),
    (i - (j - 1), "i - j + 1"),
    (Load(A, (i,)) + 1 + Load(A, (i,)), "2 * %a[i] + 1"),
    (Load(A, (i,)) + Const(2, DType.I64) - 1, "%a[i] + i64(1)"),  # typed sums keep the type
    (i + Const(0, DType.I64), "i64(i)"),      # the type is kept
    (Load(A32, (i,)) + Const(2147483647, DType.I32) + 1, "%a32[i] + i32(-2147483648)"),
    (i * j + j * i, "i * j + j * i"),       # nonlinear terms are atoms, compared structurally
    (i // 1, "i"),
    (i % 1, "0"),
    (i * 4 // 4, "i"),
    ((i * 4 + 5) // 2, "2 * i + 2"),
    ((i * 4 + j + 5) // 2, "2 * i + (j + 1) // 2 + 2"),
    ((i * 4 + 6) % 4, "2"),
    ((i * 4 + j) % 4, "j % 4"),
    ((i // 2) // 4, "i // 8"),
    ((k // 12) * 12 + k % 12, "k"),          # a flatten followed by its unflatten
    (3 * (k // 5) * 5 + 3 * (k % 5) + 1, "3 * k + 1"),
    (Binary("//", i, Const(-2)), "i // -2"),  # negative divisors are left alone
])
def test_index_algebra(e: Expr, want: str) -> None:
    assert s(e) == want


@pytest.mark.parametrize(("e", "want"), [
    ((i * 4 + j) // 4, "i"),               # 0 <= j < 4
    ((i * 4 + j) % 4, "j"),
    ((i * 12 + j + 4) // 12, "i"),         # j + 4 in [4, 7]
    ((i * 12 + j + 4) % 12, "j + 4"),
    ((i * 3 + j) // 3, "i + j // 3"),      # j can reach 3
    ((j + 8) % 4, "j"),
    ((j + 4) % 4, "j"),
    (Binary("<", i, Const(8)), "true"),
    (Binary("<", i, Const(7)), "i < 7"),
    (Binary(">=", i - j, Const(-3)), "true"),
    (Binary("==", k, Const(6)), "false"),
    (Call("max", (i - 0, Const(0))), "i"),
    (Call("min", (j, Const(3))), "j"),
    (Call("min", (j, Const(2))), "min(j, 2)"),
    (Select(Binary("and", Binary("<=", Const(0), i), Binary("<", i, Const(8))), x(), Const(0.0)),
     "%x[i]"),
])
def test_ranges(e: Expr, want: str) -> None:
    assert s(e, ranges=RANGES) == want


def test_canonical_forms_match() -> None:
    a = simplify((i + 1) * 2 + j)
    b = simplify(j + 2 + i + i)
    assert same(a, b)


def test_deep_expression_does_not_overflow_the_stack() -> None:
    e: Expr = i
    for n in range(300):
        e = e + n if n % 2 else e * 1
    assert s(e) == f"i + {sum(n for n in range(300) if n % 2)}"


# ---------------------------------------------------------------------------------------------
# property: the value never changes

TABLE_F = np.array([0.5, -1.25, 3.0, 0.0, -0.0, 7.5, np.inf, np.nan])
TABLE_I = np.array([3, -2, 0, 7, 1, -9, 12, 5])
XF = Value(TensorType((8,), DType.F64), "xf")
XI = Value(TensorType((8,), DType.I64), "xi")


def evaluate(e: Expr, env: dict[str, int]) -> object:
    """A tiny reference evaluator: Python ints for integers, numpy float64 for floats.
    Loads read a table cyclically, so any index is fine."""
    if isinstance(e, Const):
        return np.float64(e.value) if e.is_float else e.value
    if isinstance(e, Index):
        return env[e.name]
    if isinstance(e, Load):
        idx = int(evaluate(e.indices[0], env)) % 8  # type: ignore[call-overload]
        return np.float64(TABLE_F[idx]) if e.tensor is XF else int(TABLE_I[idx])
    args = [evaluate(c, env) for c in e.children()]
    with np.errstate(all="ignore"):
        if isinstance(e, Unary):
            return -args[0] if e.op == "neg" else not args[0]  # type: ignore[operator]
        if isinstance(e, Cast):
            if e.dtype.is_int:
                return int(args[0])  # type: ignore[call-overload]
            return np.float64(args[0])  # type: ignore[arg-type]
        if isinstance(e, Select):
            return args[1] if args[0] else args[2]
        if isinstance(e, Call):
            fn = {"max": np.maximum, "min": np.minimum, "abs": np.abs, "exp": np.exp,
                  "tanh": np.tanh}[e.fn]
            r = fn(*args)
            ints = all(isinstance(a, int) for a in args) and e.fn in ("max", "min", "abs")
            return int(r) if ints else np.float64(r)
        assert isinstance(e, Binary)
        a, b = args
        if e.op in ("and", "or"):
            return (a and b) if e.op == "and" else (a or b)
        if isinstance(a, int) and isinstance(b, int) and e.op != "/":
            return {"+": a + b, "-": a - b, "*": a * b,
                    "//": a // b if b else None, "%": a % b if b else None,
                    "<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b, "==": a == b,
                    "!=": a != b}[e.op]
        fa, fb = np.float64(a), np.float64(b)  # type: ignore[arg-type]
        return {"+": fa + fb, "-": fa - fb, "*": fa * fb, "/": fa / fb,
                "<": fa < fb, "<=": fa <= fb, ">": fa > fb, ">=": fa >= fb, "==": fa == fb,
                "!=": fa != fb}[e.op]


def agree(a: object, b: object) -> bool:
    if isinstance(a, np.floating | float) or isinstance(b, np.floating | float):
        fa, fb = float(a), float(b)  # type: ignore[arg-type]
        if math.isnan(fa) or math.isnan(fb):
            return math.isnan(fa) and math.isnan(fb)
        return fa == fb or math.isclose(fa, fb, rel_tol=1e-9, abs_tol=1e-12)
    return bool(a == b)


small_ints = st.integers(-6, 6)
pos_ints = st.integers(1, 6)
int_leaves = st.one_of(st.sampled_from([i, j, k]), small_ints.map(Const),
                       st.sampled_from([0, 1, 3]).map(lambda v: Const(v, DType.I64)),
                       st.just(Load(XI, (i,))))


def int_exprs() -> st.SearchStrategy[Expr]:
    def extend(sub: st.SearchStrategy[Expr]) -> st.SearchStrategy[Expr]:
        return st.one_of(
            st.tuples(st.sampled_from(["+", "-", "*"]), sub, sub).map(lambda t: Binary(*t)),
            st.tuples(st.sampled_from(["//", "%"]), sub, pos_ints).map(
                lambda t: Binary(t[0], t[1], Const(t[2]))),
            sub.map(lambda a: Unary("neg", a)),
            st.tuples(st.sampled_from(["max", "min"]), sub, sub).map(
                lambda t: Call(t[0], (t[1], t[2]))),
            st.tuples(bool_of(sub), sub, sub).map(lambda t: Select(*t)),
            sub.map(lambda a: Load(XI, (a,))),
        )
    return st.recursive(int_leaves, extend, max_leaves=12)


def bool_of(ints: st.SearchStrategy[Expr]) -> st.SearchStrategy[Expr]:
    cmp = st.tuples(st.sampled_from(["<", "<=", ">", ">=", "==", "!="]), ints, ints).map(
        lambda t: Binary(*t))
    return st.one_of(cmp, cmp.map(lambda c: Unary("not", c)),
                     st.tuples(st.sampled_from(["and", "or"]), cmp, cmp).map(
                         lambda t: Binary(*t)),
                     st.booleans().map(lambda v: Const(v, DType.I1)))


float_leaves = st.one_of(
    st.sampled_from([0.0, 1.0, -1.0, 2.5, 0.5]).map(Const),
    st.sampled_from([0, 1, -1, 2]).map(Const),
    st.sampled_from([0.0, 1.0, -2.5]).map(lambda v: Const(v, DType.F64)),
    st.integers(0, 7).map(lambda n: Load(XF, (Const(n),))),
    st.just(Load(XF, (i,))), st.just(Load(XF, (j,))),
)


def float_exprs(ints: st.SearchStrategy[Expr]) -> st.SearchStrategy[Expr]:
    def extend(sub: st.SearchStrategy[Expr]) -> st.SearchStrategy[Expr]:
        fcmp = st.tuples(st.sampled_from(["<", "<=", "=="]), sub, sub).map(lambda t: Binary(*t))
        return st.one_of(
            st.tuples(st.sampled_from(["+", "-", "*", "/"]), sub, sub).map(lambda t: Binary(*t)),
            sub.map(lambda a: Unary("neg", a)),
            st.tuples(st.sampled_from(["max", "min"]), sub, sub).map(
                lambda t: Call(t[0], (t[1], t[2]))),
            st.tuples(st.sampled_from(["abs", "exp", "tanh"]), sub).map(
                lambda t: Call(t[0], (t[1],))),
            st.tuples(st.one_of(fcmp, fcmp.map(lambda c: Unary("not", c))), sub, sub).map(
                lambda t: Select(*t)),
            ints.map(lambda a: Load(XF, (a,))),
            ints.map(lambda a: Cast(DType.F64, a)),
        )
    return st.recursive(float_leaves, extend, max_leaves=10)


envs = st.fixed_dictionaries({"i": st.integers(0, 7), "j": st.integers(0, 3),
                              "k": st.integers(-5, 5)})
PROPS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPS
@given(int_exprs(), envs, st.booleans())
def test_property_integers(e: Expr, env: dict[str, int], use_ranges: bool) -> None:
    before = evaluate(e, env)
    out = simplify(e, RANGES if use_ranges else None)
    assert agree(before, evaluate(out, env)), (format_expr(e), format_expr(out))
    assert same(simplify(out, RANGES if use_ranges else None), out)  # a fixpoint


@PROPS
@given(float_exprs(int_exprs()), envs, st.booleans())
def test_property_floats(e: Expr, env: dict[str, int], use_ranges: bool) -> None:
    before = evaluate(e, env)
    if isinstance(before, int):  # all-integer-literal expressions: the context decides
        return
    out = simplify(e, RANGES if use_ranges else None)
    assert agree(before, evaluate(out, env)), (format_expr(e), format_expr(out))
    assert same(simplify(out, RANGES if use_ranges else None), out)


# ---------------------------------------------------------------------------------------------
# property: the interpreter (the project's oracle) agrees before and after

DIMS = (Axis("i", 8), Axis("j", 4), Axis("k", 11))
IRANGES = {a.name: (0, a.extent - 1) for a in DIMS}


def in_bounds(e: Expr) -> Expr:
    """Every load index taken modulo 8, so any generated expression reads in bounds."""
    def fn(n: Expr) -> Expr | None:
        if isinstance(n, Load):
            return Load(n.tensor, (Binary("%", n.indices[0], Const(8)),))
        return None
    return e.map(fn)


def interpret(body: Expr, dtype: DType) -> np.ndarray | None:
    out = ComputeOp(TensorType(tuple(a.extent for a in DIMS), dtype), DIMS, body)
    f = Func("f", [XF, XI], Block([out, ReturnOp([out.result])]))
    try:
        with np.errstate(all="ignore"):
            return run(f, [TABLE_F, TABLE_I])[0]
    except (InterpError, ValueError, TypeError):
        return None  # an ill-typed generated expression (e.g. `/` on integers)


@PROPS
@given(st.one_of(int_exprs().map(lambda e: (e, DType.I64)),
                 float_exprs(int_exprs()).map(lambda e: (e, DType.F64))))
def test_property_interpreter(case: tuple[Expr, DType]) -> None:
    e, dtype = in_bounds(case[0]), case[1]
    before = interpret(e, dtype)
    assume(before is not None)
    out = simplify(e, IRANGES)
    after = interpret(out, dtype)
    assert after is not None, (format_expr(e), format_expr(out))
    np.testing.assert_allclose(after, before, rtol=1e-12, atol=0,
                               err_msg=f"{format_expr(e)}  ==>  {format_expr(out)}")
