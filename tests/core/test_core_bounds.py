"""Static bounds checking with guards (nfc.bounds)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from nfc.bounds import BoundsViolation, check_bounds
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
    lift,
)
from nfc.printer import format_expr

n, c, h, w, r, s, i, j = (Index(x) for x in "nchwrsij")


def lt(a, b) -> Expr: return Binary("<", lift(a), lift(b))
def le(a, b) -> Expr: return Binary("<=", lift(a), lift(b))
def ge(a, b) -> Expr: return Binary(">=", lift(a), lift(b))
def both(a, b) -> Expr: return Binary("and", a, b)
def either(a, b) -> Expr: return Binary("or", a, b)


def compute(body: Expr, dims: dict[str, int], raxes: dict[str, int] | None = None,
            dtype: DType = DType.F32, **attrs) -> ComputeOp:
    d = tuple(Axis(k, v) for k, v in dims.items())
    ra = tuple(Axis(k, v) for k, v in (raxes or {}).items())
    return ComputeOp(TensorType(tuple(dims.values()), dtype), d, body,
                     reduce="sum" if ra else None, raxes=ra, attrs=attrs or None)


def summary(vs: list[BoundsViolation]) -> list[tuple[str | None, int, int | None, int | None,
                                                      int]]:
    return [(v.load.tensor.name, v.dim, v.lo, v.hi, v.size) for v in vs]


X = Value(TensorType((2, 3, 8, 8), DType.F32), "x")


def conv(guard: Expr | None, pad: int = 1, hsize: int = 8) -> ComputeOp:
    ld = Load(X, (n, c, h + r - pad, w + s - pad))
    body: Expr = ld if guard is None else Select(guard, ld, Const(0.0))
    return compute(body, {"n": 2, "h": hsize, "w": 8}, {"c": 3, "r": 3, "s": 3})


def test_guarded_padded_conv_is_in_bounds():
    g = both(both(le(0, h + r - 1), lt(h + r - 1, 8)), both(ge(w + s - 1, 0), lt(w + s, 9)))
    assert check_bounds(conv(g)) == []


def test_padded_conv_guard_as_negated_or_in_else_branch():
    bad = either(either(lt(h + r - 1, 0), ge(h + r - 1, 8)),
                 either(lt(w + s - 1, 0), le(8, w + s - 1)))
    op = compute(Select(bad, Const(0.0), Load(X, (n, c, h + r - 1, w + s - 1))),
                 {"n": 2, "h": 8, "w": 8}, {"c": 3, "r": 3, "s": 3})
    assert check_bounds(op) == []
    op = compute(Select(Unary("not", bad), Load(X, (n, c, h + r - 1, w + s - 1)), Const(0.0)),
                 {"n": 2, "h": 8, "w": 8}, {"c": 3, "r": 3, "s": 3})
    assert check_bounds(op) == []


def test_unguarded_padded_conv_is_rejected():
    assert summary(check_bounds(conv(None))) == [("x", 2, -1, 8, 8), ("x", 3, -1, 8, 8)]


def test_off_by_one_guard_is_rejected_with_the_reach():
    g = both(both(le(0, h + r - 1), le(h + r - 1, 8)), both(ge(w + s - 1, 0), lt(w + s, 9)))
    (v,) = check_bounds(conv(g))
    assert (v.dim, v.lo, v.hi, v.size) == (2, 0, 8, 8)
    assert v.message() == "access '%x' dimension 2 can reach 8 but the tensor has size 8"


def test_lower_bound_violation_message():
    op = compute(Load(X, (n, c, h - 1, w)), {"n": 2, "c": 3, "h": 8, "w": 8})
    (v,) = check_bounds(op)
    assert (v.dim, v.lo, v.hi) == (2, -1, 6)
    assert "can reach -1" in v.message()


def test_single_variable_guards_tighten_the_variable():
    # guards on h alone (h >= 1) then used in h - 1 and in 2*h - 2 // 2
    op = compute(Select(ge(h, 1), Load(X, (n, c, h - 1, (2 * h - 2) // 2)), Const(0.0)),
                 {"n": 2, "c": 3, "h": 8})
    assert check_bounds(op) == []


def test_or_guard_gives_no_facts():
    op = compute(Select(either(ge(h, 1), ge(w, 1)), Load(X, (n, c, h - 1, w)), Const(0.0)),
                 {"n": 2, "c": 3, "h": 8, "w": 8})
    assert summary(check_bounds(op)) == [("x", 2, -1, 6, 8)]


def test_guard_on_scaled_form_bounds_a_multiple():
    # 0 <= 2*(h+r) - 2 < 16  bounds  h + r - 1  (the same form up to a factor)
    g = both(le(0, 2 * (h + r) - 2), lt(2 * (h + r) - 2, 16))
    op = compute(Select(g, Load(X, (n, c, h + r - 1, w)), Const(0.0)),
                 {"n": 2, "c": 3, "h": 8, "w": 8}, {"r": 3})
    assert check_bounds(op) == []


def test_guard_on_non_affine_subexpression():
    # transposed conv: x[(h - r) // 2] guarded by (h - r) % 2 == 0 and 0 <= (h - r)//2 < 8
    q = (h - r) // 2
    g = both(Binary("==", (h - r) % 2, Const(0)), both(le(0, q), lt(q, 8)))
    op = compute(Select(g, Load(X, (n, c, q, w)), Const(0.0)),
                 {"n": 2, "c": 3, "h": 17, "w": 8}, {"r": 3})
    assert check_bounds(op) == []
    op = compute(Load(X, (n, c, q, w)), {"n": 2, "c": 3, "h": 17, "w": 8}, {"r": 3})
    assert summary(check_bounds(op)) == [("x", 2, -1, 8, 8)]


def test_reshape_with_floordiv_and_mod():
    y = Value(TensorType((6, 4), DType.F32), "y")
    op = compute(Load(y, ((i * 8 + j) // 4, (i * 8 + j) % 4)), {"i": 3, "j": 8})
    assert check_bounds(op) == []
    op = compute(Load(y, ((i * 8 + j) // 4, (i * 8 + j) % 4)), {"i": 4, "j": 8})
    assert summary(check_bounds(op)) == [("y", 0, 0, 7, 6)]


def test_clamped_index_with_min_max():
    op = compute(Load(X, (n, c, Call("min", (Call("max", (h - 1, Const(0))), Const(7))), w)),
                 {"n": 2, "c": 3, "h": 10, "w": 8})
    assert check_bounds(op) == []


def test_dead_branch_is_not_checked():
    op = compute(Select(lt(h, 0), Load(X, (n, c, h - 5, w)), Const(0.0)),
                 {"n": 2, "c": 3, "h": 8, "w": 8})
    assert check_bounds(op) == []
    op = compute(Select(Const(False, DType.I1), Load(X, (n, c, h + 50, w)), Const(0.0)),
                 {"n": 2, "c": 3, "h": 8, "w": 8})
    assert check_bounds(op) == []


def test_condition_loads_are_checked_without_short_circuit():
    m = Value(TensorType((8,), DType.F32), "m")
    cond = both(ge(h, 1), Binary(">", Load(m, (h - 1,)), Const(0.0)))
    op = compute(Select(cond, Const(1.0), Const(0.0)), {"h": 8})
    assert summary(check_bounds(op)) == [("m", 0, -1, 6, 8)]


EMB = Value(TensorType((100, 16), DType.F32), "E")
IDS = Value(TensorType((4,), DType.I32), "ids")


def test_embedding_gather_is_accepted():
    op = compute(Load(EMB, (Load(IDS, (n,)), j)), {"n": 4, "j": 16})
    assert check_bounds(op) == []
    op = compute(Load(EMB, (Cast(DType.I64, Load(IDS, (n,))), j)), {"n": 4, "j": 16})
    assert check_bounds(op) == []


def test_computed_data_dependent_index_needs_guard_or_attribute():
    idx = Load(IDS, (n,)) + 1
    op = compute(Load(EMB, (idx, j)), {"n": 4, "j": 16})
    (v,) = check_bounds(op)
    assert (v.dim, v.lo, v.hi, v.size) == (0, -(1 << 31) + 1, 1 << 31, 100)
    op = compute(Load(EMB, (idx, j)), {"n": 4, "j": 16}, **{"nf.assume_inbounds": True})
    assert check_bounds(op) == []
    g = both(ge(Load(IDS, (n,)), 0), lt(Load(IDS, (n,)), 99))
    op = compute(Select(g, Load(EMB, (idx, j)), Const(0.0)), {"n": 4, "j": 16})
    assert check_bounds(op) == []


def test_boolean_load_index_is_bounded_by_its_dtype():
    mask = Value(TensorType((4,), DType.I1), "mask")
    op = compute(Load(EMB, (Load(mask, (n,)) * 2 + 3, j)), {"n": 4, "j": 16})
    assert check_bounds(op) == []


def test_unbounded_index_is_reported():
    op = compute(Load(EMB, (n * j, j)), {"n": 4, "j": 16})
    assert summary(check_bounds(op)) == []  # n*j in [0, 45]: interval arithmetic
    op = compute(Load(EMB, (Binary("//", n, j), j)), {"n": 4, "j": 16})
    (v,) = check_bounds(op)  # divisor range contains 0
    assert (v.lo, v.hi) == (None, None)
    assert "cannot be bounded" in v.message()


# ---------------------------------------------------------------------------------------------
# property: whatever check_bounds accepts, the interpreter runs without an out-of-bounds read


def _index_exprs() -> st.SearchStrategy[Expr]:
    leaves = st.one_of(st.sampled_from([i, j]), st.integers(-3, 3).map(Const))
    return st.recursive(leaves, lambda ch: st.one_of(
        st.tuples(st.sampled_from(["+", "-"]), ch, ch).map(lambda t: Binary(t[0], t[1], t[2])),
        st.tuples(ch, st.integers(-2, 3)).map(lambda t: Binary("*", t[0], Const(t[1]))),
        st.tuples(st.sampled_from(["//", "%"]), ch, st.integers(1, 4)).map(
            lambda t: Binary(t[0], t[1], Const(t[2])))), max_leaves=4)


def _guards() -> st.SearchStrategy[Expr]:
    cmp = st.tuples(st.sampled_from(["<", "<=", ">", ">=", "==", "!="]), _index_exprs(),
                    _index_exprs()).map(lambda t: Binary(t[0], t[1], t[2]))
    return st.recursive(cmp, lambda ch: st.one_of(
        st.tuples(st.sampled_from(["and", "or"]), ch, ch).map(lambda t: Binary(t[0], t[1], t[2])),
        ch.map(lambda g: Unary("not", g))), max_leaves=3)


@settings(max_examples=300, deadline=None)
@given(_index_exprs(), _guards(), st.booleans(), st.integers(1, 5), st.integers(1, 5),
       st.integers(1, 6))
def test_accepted_loads_never_fail_in_the_interpreter(idx, guard, then, ni, nj, size):
    x = Value(TensorType((size,), DType.F32), "x")
    ld = Load(x, (idx,))
    body = Select(guard, ld, Const(0.0)) if then else Select(guard, Const(0.0), ld)
    op = compute(body, {"i": ni, "j": nj})
    f = Func("f", [x], Block([op, ReturnOp([op.result])]))
    accepted = check_bounds(op) == []
    try:
        run(f, [np.arange(size, dtype=np.float32)])
        failed = False
    except InterpError:
        failed = True
    assert not (accepted and failed), format_expr(body)
