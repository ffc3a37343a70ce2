"""The operator table (nfc.ops): one row per operator, and every layer reading it.

- the table is complete: every intrinsic of the parser, the frontend and the LLVM renderer is
  a row, and every row has a typing rule, numpy semantics and a derivative rule;
- the lattice: `join`, `promote`, `resolve`;
- one typing rule: on random expressions the verifier, the lenient typing of the simplifier
  and cost model, the interpreter and the LLVM emitter's typing agree;
- the intrinsics added as rows (`softplus`, `log1p`, `expm1`, `atan2`, `isfinite`): the
  interpreter against numpy, folding, and `.nf` source;
- a row registered at run time works in every layer (a plugin's intrinsic).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nfc import ops
from nfc.diagnostics import CompileError
from nfc.frontend import compile_source
from nfc.frontend.scalars import INTRINSIC_ARITY
from nfc.interp import InterpError, run
from nfc.ir import (
    INTRINSICS,
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
from nfc.irparser import parse_module
from nfc.printer import format_expr
from nfc.simplify import simplify
from nfc.verifier import expr_kind, verify, verify_func

F32, F64, I1, I32, I64 = DType.F32, DType.F64, DType.I1, DType.I32, DType.I64
WI, WF = ops.WEAK_INT, ops.WEAK_FLOAT
i = Index("i")
NEW = ("softplus", "log1p", "expm1", "atan2", "isfinite")


def func_of(body: Expr, dtype: DType, args: list[Value], n: int = 8) -> Func:
    op = ComputeOp(TensorType((n,), dtype), (Axis("i", n),), body, name="y")
    return Func("f", args, Block([op, ReturnOp([op.result])]))


# ---------------------------------------------------------------------------------------------
# the table is complete


def test_every_intrinsic_everywhere_is_a_row():
    calls = [r.name for r in ops.ROWS if r.node is Call]
    assert list(INTRINSICS) == calls  # the parser's list, in the table's order
    assert list(INTRINSICS)[:12] == ["exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "erf",
                                     "abs", "max", "min", "pow", "philox"]
    assert set(INTRINSIC_ARITY) == {r.name for r in ops.ROWS if r.node is Call and r.surface}
    assert "philox" not in INTRINSIC_ARITY and all(INTRINSIC_ARITY[n] == INTRINSICS[n]
                                                    for n in INTRINSIC_ARITY)
    from nfc.codegen.llvm.render import RULES

    assert set(RULES) == {r.name for r in ops.ROWS}  # the LLVM renderer covers every row
    for r in ops.ROWS:
        assert r.operands in ops.lattice.CLASSES, r.name
        assert r.grad is not None, f"'{r.name}' has no derivative rule"
        assert r.numpy is not None or r.name == "cast", r.name


def test_rows_are_found_by_node():
    x = Value(TensorType((4,), F32), "x")
    assert ops.find(Binary("+", i, i)).name == "+"
    assert ops.find(Unary("neg", i)).name == "neg"
    assert ops.find(Call("atan2", (i, i))).name == "atan2"
    assert ops.find(Select(Const(True), i, i)).name == "select"
    assert ops.find(Cast(F32, i)).name == "cast"
    assert ops.find(Load(x, (i,))) is None and ops.find(i) is None
    assert ops.find(Call("neg", (i,))) is None  # a unary operator is not an intrinsic
    assert ops.find(Call("no_such_fn", (i,))) is None


# ---------------------------------------------------------------------------------------------
# the lattice


@pytest.mark.parametrize(("a", "b", "want"), [
    (F32, F32, F32), (F32, WI, F32), (WI, I32, I32), (I1, WI, I1), (WF, F64, F64),
    (WI, WF, WF), (WI, WI, WI), (WF, WF, WF),
    (F32, F64, None), (WF, I32, None), (I64, WF, None), (I32, I64, None),
])
def test_join(a, b, want):
    assert ops.join("+", a, b) == want
    assert ops.join("+", b, a) == want


def test_join_reports_why():
    msgs: list[str] = []
    ops.join("max", F32, F64, msgs.append)
    ops.join("*", I32, WF, msgs.append)
    assert msgs == ["operands of 'max' have different types f32 and f64",
                    "a float operand of '*' meets an integer operand of type i32"]


def test_machine_join_and_resolution():
    assert ops.promote("+", I32, I64) == I64 and ops.promote("+", I64, F32) == F32
    assert ops.promote("+", F32, F64) == F64 and ops.promote("+", WF, I64) == I64
    assert ops.resolve(WI, F32) == F32 and ops.resolve(WF, I32) == F32  # never a float in an int
    assert ops.resolve(WI, None) == I64 and ops.resolve(WF, None) == F32
    assert ops.resolve(F64, F32) == F64


def test_weak_kinds_print_and_compare_as_before():
    assert str(WI) == "int" and WF == "float"
    assert expr_kind(Call("exp", (Const(1),))) == "float"


# ---------------------------------------------------------------------------------------------
# one typing rule, every consumer

XF = Value(TensorType((8,), F32), "xf")
XD = Value(TensorType((8,), F64), "xd")
XI = Value(TensorType((8,), I32), "xi")
XB = Value(TensorType((8,), I1), "xb")
LEAVES = st.sampled_from([
    Load(XF, (i,)), Load(XD, (i,)), Load(XI, (i,)), Load(XB, (i,)), i, Const(2), Const(0.5),
    Const(3, I32), Const(1.5, F32), Const(True, I1)])
UNARY = [r.name for r in ops.ROWS if r.node is Unary]
BINARY = [r.name for r in ops.ROWS if r.node is Binary]
CALLS = [r for r in ops.ROWS if r.node is Call and r.name != "philox"]


def _exprs() -> st.SearchStrategy[Expr]:
    def extend(sub: st.SearchStrategy[Expr]) -> st.SearchStrategy[Expr]:
        return st.one_of(
            st.tuples(st.sampled_from(BINARY), sub, sub).map(lambda t: Binary(*t)),
            st.tuples(st.sampled_from(UNARY), sub).map(lambda t: Unary(*t)),
            st.tuples(st.sampled_from(CALLS), st.lists(sub, min_size=2, max_size=2)).map(
                lambda t: Call(t[0].name, tuple(t[1][:t[0].arity]))),
            st.tuples(sub, sub, sub).map(lambda t: Select(*t)),
            st.tuples(st.sampled_from([F32, I32, I1]), sub).map(lambda t: Cast(*t)),
        )
    return st.recursive(LEAVES, extend, max_leaves=6)


def _safe(e: Expr) -> Expr:
    """Loads read in bounds, and integer divisors are never zero."""
    def fn(x: Expr) -> Expr | None:
        if isinstance(x, Binary) and x.op in ("//", "%"):
            return Binary(x.op, x.a, Select(Binary("==", x.b, Const(0)), Const(3), x.b))
        return None
    return e.map(fn)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_exprs())
def test_every_consumer_types_alike(e: Expr) -> None:
    from nfc.codegen.llvm.exprs import infer

    e = _safe(e)
    try:
        k = expr_kind(e)
    except ValueError:
        k = None
    if k is None:  # ill-typed: the interpreter refuses it as well
        with pytest.raises((InterpError, TypeError, ValueError)):
            run(func_of(e, F32, [XF, XD, XI, XB]), _inputs())
        return
    assert ops.Typer().kind(e) == k  # the simplifier's and the cost model's typing
    dtype = ops.resolve(k, F32 if ops.is_float(k) else I64)
    with np.errstate(all="ignore"):
        (y,) = run(func_of(e, dtype, [XF, XD, XI, XB]), _inputs())
    assert y.dtype == dtype.numpy
    if isinstance(k, DType) and k.is_float:
        assert infer(e, None) == k  # the LLVM emitter's typing (loop variables are i64)
    out = simplify(e, {"i": (0, 7)})
    if not isinstance(out, Const):
        assert ops.Typer().kind(out) in (k, WI if k is WF else k), format_expr(out)


def _inputs() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.standard_normal(8).astype(np.float32), rng.standard_normal(8),
            rng.integers(-5, 5, 8).astype(np.int32), rng.random(8) < 0.5]


# ---------------------------------------------------------------------------------------------
# the added intrinsics: interpreter against numpy

SPECIAL = [0.0, -0.0, 1e-30, -1e-30, 1e-7, -1e-7, 0.5, -0.5, 1.0, -1.0, 20.0, -20.0, 88.0,
           -88.0, 100.0, -100.0, 700.0, -750.0, np.inf, -np.inf, np.nan]


def reference(fn: str, x: np.ndarray, y: np.ndarray | None = None) -> np.ndarray:
    """float64 numpy formulations, independent of the table's."""
    with np.errstate(all="ignore"):
        return {
            "softplus": lambda: np.where(x > 30, x, np.log1p(np.exp(np.minimum(x, 30)))),
            "log1p": lambda: np.log1p(x),
            "expm1": lambda: np.expm1(x),
            "atan2": lambda: np.arctan2(x, y),
            "isfinite": lambda: ~np.isnan(x) & ~np.isinf(x),
        }[fn]()


@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("fn", NEW)
def test_interpreter_against_numpy(fn: str, dtype: DType) -> None:
    rng = np.random.default_rng(7)
    xs = np.concatenate([SPECIAL, rng.standard_normal(40) * 4, rng.uniform(-1, 3, 40)])
    x = xs.astype(dtype.numpy)
    n = len(x)
    a, b = Value(TensorType((n,), dtype), "a"), Value(TensorType((n,), dtype), "b")
    args: tuple[Expr, ...] = (Load(a, (i,)),)
    y = np.roll(x, 5)
    if fn == "atan2":
        args += (Load(b, (i,)),)
    out_dt = I1 if fn == "isfinite" else dtype
    (got,) = run(func_of(Call(fn, args), out_dt, [a, b], n), [x, y])
    want = reference(fn, x.astype(np.float64), y.astype(np.float64))
    assert got.dtype == out_dt.numpy
    if fn == "isfinite":
        np.testing.assert_array_equal(got, want)
        return
    if fn == "log1p":
        want = np.where(x < -1, np.nan, want)
    with np.errstate(over="ignore"):
        want = want.astype(dtype.numpy)
    np.testing.assert_allclose(got, want, rtol=3e-7 if dtype is F32 else 1e-15, atol=0)


def test_isfinite_guards_a_select() -> None:
    a = Value(TensorType((4,), F32), "a")
    body = Select(Call("isfinite", (Call("log", (Load(a, (i,)),)),)),
                  Call("log", (Load(a, (i,)),)), Const(-1.0))
    x = np.array([1.0, 0.0, -2.0, np.e], np.float32)
    with np.errstate(all="ignore"):
        (got,) = run(func_of(body, F32, [a], 4), [x])
    np.testing.assert_allclose(got, [0.0, -1.0, -1.0, 1.0], rtol=1e-6)


# ---------------------------------------------------------------------------------------------
# typing and folding of the added intrinsics


@pytest.mark.parametrize(("e", "kind"), [
    (Call("softplus", (Load(XF, (i,)),)), F32),
    (Call("log1p", (i,)), WF),  # a weak integer becomes a weak float
    (Call("atan2", (Load(XD, (i,)), Const(1))), F64),
    (Call("isfinite", (Load(XD, (i,)),)), I1),
    (Select(Call("isfinite", (Load(XF, (i,)),)), Load(XF, (i,)), Const(0.0)), F32),
])
def test_added_intrinsics_type(e: Expr, kind: ops.Kind) -> None:
    assert expr_kind(e) == kind


@pytest.mark.parametrize(("e", "msg"), [
    (Call("expm1", (Load(XI, (i,)),)), "'expm1' needs a float operand, not i32"),
    (Call("atan2", (Load(XF, (i,)), Load(XD, (i,)))),
     "operands of 'atan2' have different types f32 and f64"),
    (Call("isfinite", (Load(XB, (i,)),)), "'isfinite' of i1 values"),
    (Call("softplus", (Load(XF, (i,)), Load(XF, (i,)))), "'softplus' takes 1 arguments, 2 given"),
])
def test_added_intrinsics_refuse(e: Expr, msg: str) -> None:
    with pytest.raises(ValueError, match=msg):
        expr_kind(e)


@pytest.mark.parametrize(("e", "want"), [
    (Call("softplus", (Const(0.0),)), math.log(2.0)),
    (Call("log1p", (Const(1e-10),)), math.log1p(1e-10)),
    (Call("expm1", (Const(1e-10),)), math.expm1(1e-10)),
    (Call("atan2", (Const(1), Const(-1))), math.atan2(1, -1)),
    (Call("isfinite", (Const(math.inf),)), False),
    (Call("isfinite", (Const(2.0, F32),)), True),
    (Call("pow", (Const(2), Const(10))), 1024),  # weak integers stay exact integers
])
def test_folding(e: Expr, want: object) -> None:
    c = ops.fold(e)
    assert c is not None and c.value == want and type(c.value) is type(want)
    assert simplify(e) == c


def test_folding_typed_literal_rounds_to_its_dtype() -> None:
    c = ops.fold(Call("expm1", (Const(1e-3, F32),)))
    assert c is not None and c.dtype is F32
    assert c.value == float(np.float32(math.expm1(np.float32(1e-3))))


@pytest.mark.parametrize("e", [
    Call("pow", (Const(2), Const(-1))),  # no integer result
    Binary("//", Const(3, I32), Const(0, I32)),  # the runtime reports it
    Call("philox", (Const(1), Const(2))),  # draws stay visible
    Call("log1p", (Const(1, I32),)),  # ill-typed: the verifier reports it
])
def test_not_folded(e: Expr) -> None:
    assert ops.fold(e) is None


def test_parsed_and_printed() -> None:
    text = """nf.func @f(%x: tensor<4xf32>, %y: tensor<4xf32>) -> (tensor<4xf32>) {
  %z = nf.compute [i: 4] (select(isfinite(%x[i]), atan2(%x[i], %y[i]) + expm1(%y[i]),
                                 softplus(log1p(%x[i])))) : tensor<4xf32>
  nf.return %z : tensor<4xf32>
}
"""
    m = parse_module(text, "t.nfir")
    verify(m)
    from nfc.printer import print_module

    assert "select(isfinite(%x[i]), atan2(%x[i], %y[i]) + expm1(%y[i]), softplus(log1p(" \
        in print_module(m)


# ---------------------------------------------------------------------------------------------
# from .nf source

SOURCE = """
op stable(x: T[N], y: T[N]) -> T[N] {
  z[n] = softplus(x[n]) + log1p(x[n] * x[n]) - expm1(-abs(y[n])) + atan2(y[n], 2) * 0.5
}

op guard(x: T[N]) -> T[N] {
  z[n] = log(x[n]) if isfinite(log(x[n])) else 0.0
}

model m(n = 16) {
  input x: f32[n]
  input y: f32[n]
  a = stable(x, y)
  b = guard(x)
  c = softplus(x) + atan2(x, y)
  output a
  output b
  output c
}
"""


def test_available_from_nf_source() -> None:
    module = compile_source(SOURCE, "m.nf")
    verify(module)
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(16) * 3).astype(np.float32)
    y = rng.standard_normal(16).astype(np.float32)
    with np.errstate(all="ignore"):
        a, b, c = run(module.func("forward"), {"x": x, "y": y})
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    sp = np.logaddexp(0.0, x64)
    want = sp + np.log1p(x64 * x64) - np.expm1(-np.abs(y64)) + np.arctan2(y64, 2.0) * 0.5
    np.testing.assert_allclose(a, want, rtol=2e-6, atol=2e-6)
    with np.errstate(all="ignore"):
        np.testing.assert_allclose(b, np.where(x64 > 0, np.log(np.abs(x64)), 0.0), rtol=2e-6)
    np.testing.assert_allclose(c, sp + np.arctan2(x64, y64), rtol=2e-6, atol=2e-6)


def test_constants_fold_in_the_frontend() -> None:
    src = """
model m(n = 4) {
  input x: f32[n]
  y = x * softplus(0.0) + log1p(1) + atan2(1, 1) + (1.0 if isfinite(1.0 / 3.0) else 2.0)
  output y
}
"""
    module = compile_source(src, "m.nf")
    text = "\n".join(format_expr(op.body) for op in module.func("forward").walk()
                     if isinstance(op, ComputeOp))
    assert "softplus" not in text and "isfinite" not in text and "atan2" not in text
    x = np.ones(4, np.float32)
    (y,) = run(module.func("forward"), {"x": x})
    want = math.log(2.0) + math.log1p(1) + math.atan2(1, 1) + 1.0
    np.testing.assert_allclose(y, np.float32(want), rtol=1e-6)


@pytest.mark.parametrize(("body", "msg"), [
    ("isfinite(f32(n)) + 1.0", "operator '+' needs numbers, found a boolean"),
    ("log1p(n)", "'log1p' needs a float, found integer; cast it with f32(...)"),
    ("atan2(x[n], true)", "'atan2' needs numbers, found a boolean"),
    ("expm1(x[n], x[n])", "'expm1' takes 1 argument"),
])
def test_nf_diagnostics(body: str, msg: str) -> None:
    src = f"""
op f(x: T[N]) -> T[N] {{
  z[n] = {body}
}}
model m {{
  input x: f32[4]
  y = f(x)
  output y
}}
"""
    with pytest.raises(CompileError) as ei:
        compile_source(src, "m.nf")
    assert any(msg in d.message for d in ei.value.diagnostics), ei.value.diagnostics


# ---------------------------------------------------------------------------------------------
# a row added at run time (what a plugin's entry point adds)


def _softsign_grad(g: ops.Grad) -> Expr | None:
    (u,) = g.args
    den = Binary("+", Const(1.0), Call("abs", (u,)))
    return g.mul(g.d(0), Binary("/", Const(1.0), Binary("*", den, den)))


SOFTSIGN = ops.Op(
    "softsign", Call, 1, ops.lattice.FLOAT, numpy=lambda v: v / (1 + np.abs(v)),
    grad=_softsign_grad, flops=1.0, doc="x / (1 + |x|)",
    expand=lambda x: Binary("/", x, Binary("+", Const(1.0), Call("abs", (x,)))))


@pytest.fixture
def softsign():
    ops.register(SOFTSIGN, "tests")
    yield SOFTSIGN
    ops.unregister("softsign")


def test_registered_row_in_every_layer(softsign) -> None:
    from nfc.codegen.jit import compile_kernel
    from nfc.cost import compute_cost
    from nfc.passes.autodiff.exprgrad import derivative

    assert "softsign" in INTRINSICS and INTRINSIC_ARITY["softsign"] == 1
    text = """nf.func @f(%x: tensor<9xf32>) -> (tensor<9xf32>) {
  %y = nf.compute [i: 9] (softsign(%x[i]) * 2.0) : tensor<9xf32>
  nf.return %y : tensor<9xf32>
}
"""
    f = parse_module(text, "t.nfir").func("f")
    verify_func(f)
    x = np.linspace(-4, 4, 9).astype(np.float32)
    (y,) = run(f, [x])
    np.testing.assert_allclose(y, 2 * x / (1 + np.abs(x)), rtol=1e-6)
    op = f.body.ops[0]
    assert compute_cost(op).flops == 9 * 2
    assert simplify(Call("softsign", (Const(1.0),))) == Const(0.5)
    d = derivative(op.body, op.body.a.args[0], [])
    assert d is not None and "abs" in format_expr(d)
    kernel = compile_kernel(op)  # no LLVM hook: emitted through its expansion
    np.testing.assert_allclose(kernel(x), y, rtol=1e-6)
    # a kernel with a plugin's intrinsic is cached under the plugin's code too
    assert ops.plugin_fingerprint(["softsign", "exp"]) != "" == ops.plugin_fingerprint(["exp"])
    module = compile_source("model m { input x: f32[3]\n y = softsign(x)\n output y }", "m.nf")
    (z,) = run(module.func("forward"), {"x": np.array([-1, 0, 3], np.float32)})
    np.testing.assert_allclose(z, [-0.5, 0.0, 0.75])


def test_registration_is_checked(softsign) -> None:
    with pytest.raises(CompileError, match="registered twice: by tests and by other"):
        ops.register(ops.Op("softsign", Call, 1, ops.lattice.FLOAT, numpy=np.abs), "other")
    with pytest.raises(CompileError, match="registered twice: by nfc"):
        ops.register(ops.Op("exp", Call, 1, ops.lattice.FLOAT, numpy=np.exp))
    with pytest.raises(CompileError, match="cannot name an intrinsic"):
        ops.register(ops.Op("select", Call, 3, ops.lattice.SELECT, numpy=np.where))
    with pytest.raises(CompileError, match="no numpy semantics"):
        ops.register(ops.Op("nothing", Call, 1, ops.lattice.FLOAT))
