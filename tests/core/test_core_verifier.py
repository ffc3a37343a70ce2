"""The IR verifier (nfc.verifier): every class of error, and several at once."""

from __future__ import annotations

import pytest

from nfc.diagnostics import CompileError
from nfc.ir import (
    MAX_ELEMENTS,
    Axis,
    Binary,
    Block,
    Call,
    CallOp,
    Cast,
    ComputeOp,
    Const,
    DType,
    Expr,
    Func,
    Index,
    KernelOp,
    Load,
    Loc,
    Module,
    ReturnOp,
    Select,
    TensorType,
    Unary,
    Value,
    YieldOp,
    lift,
)
from nfc.verifier import expr_kind, infer_dtype, verify, verify_func

i, j, k = Index("i"), Index("j"), Index("k")
F32, F64, I32, I64 = DType.F32, DType.F64, DType.I32, DType.I64


def arg(name: str, shape: tuple[int, ...], dt: DType = F32) -> Value:
    return Value(TensorType(shape, dt), name)


def compute(body: Expr, dims: dict[str, int], raxes: dict[str, int] | None = None,
            dt: DType = F32, line: int = 1, shape: tuple[int, ...] | None = None,
            reduce: str | None = "sum") -> ComputeOp:
    d = tuple(Axis(a, e) for a, e in dims.items())
    ra = tuple(Axis(a, e) for a, e in (raxes or {}).items())
    t = TensorType(shape if shape is not None else tuple(dims.values()), dt)
    return ComputeOp(t, d, body, reduce=reduce if ra else None, raxes=ra,
                     loc=Loc("t.nf", line, 1), name=f"v{line}")


def module(*ops, args: list[Value], extra: list[Func] | None = None, ret=None) -> Module:
    ops = list(ops)
    values = ret if ret is not None else [ops[-1].results[0]]
    f = Func("f", args, Block(ops + [ReturnOp(values, loc=Loc("t.nf", 99, 1))]),
             loc=Loc("t.nf", 1, 1))
    return Module("m", [f] + (extra or []))


def errors(m: Module) -> list[str]:
    with pytest.raises(CompileError) as info:
        verify(m)
    return [d.message for d in info.value.diagnostics]


def one_error(m: Module, pattern: str) -> None:
    msgs = errors(m)
    assert len(msgs) == 1, msgs
    assert pattern in msgs[0], msgs


X = arg("x", (4, 8))


def test_valid_module_passes():
    y = arg("y", (8, 3))
    mm = compute(Load(X, (i, k)) * Load(y, (k, j)), {"i": 4, "j": 3}, {"k": 8})
    relu = compute(Call("max", (Load(mm.result, (i, j)), lift(0.0))), {"i": 4, "j": 3}, line=2)
    m = module(mm, relu, args=[X, y])
    verify(m)
    verify_func(m.funcs[0], m)


def test_result_shape_must_match_dims():
    one_error(module(compute(Load(X, (i, j)), {"i": 4, "j": 8}, shape=(8, 4)), args=[X]),
              "result type tensor<8x4xf32> does not match the dims [i: 4, j: 8]")


def test_load_arity_and_index_types_and_names():
    one_error(module(compute(Load(X, (i,)), {"i": 4}), args=[X]),
              "load of '%x' has 1 indices but the tensor has rank 2")
    one_error(module(compute(Load(X, (i, Cast(F32, j))), {"i": 4, "j": 8}), args=[X]),
              "index 1 of '%x' has type f32; indices must be integers")
    one_error(module(compute(Load(X, (i, Index("q"))), {"i": 4}), args=[X]),
              "unknown index variable 'q'")


def test_axes():
    one_error(module(compute(Load(X, (i, i)), {"i": 4}, {"i": 4}, shape=(4,)), args=[X]),
              "axis name 'i' is used twice")
    one_error(module(compute(Const(0.0), {"i": 0}), args=[X]),
              "axis 'i' has extent 0")
    big = compute(Const(0.0), {"i": 1 << 21, "j": 1 << 20})
    one_error(module(big, args=[X]), f"more than the limit {MAX_ELEMENTS}")
    one_error(module(compute(Load(X, (i, k)), {"i": 4}, {"k": 8}, reduce=None), args=[X]),
              "reduction axes without a reduction")
    one_error(module(compute(Load(X, (i, k)), {"i": 4}, {"k": 8}, reduce="mean"), args=[X]),
              "unknown reduction 'mean'")


def test_bounds_violations_are_reported():
    one_error(module(compute(Load(X, (i, j + 1)), {"i": 4, "j": 8}), args=[X]),
              "access '%x' dimension 1 can reach 8 but the tensor has size 8")
    guard = Binary("<", j + 1, lift(8))
    verify(module(compute(Select(guard, Load(X, (i, j + 1)), lift(0.0)), {"i": 4, "j": 8}),
                  args=[X]))


@pytest.mark.parametrize(("body", "dt", "pattern"), [
    (Load(X, (i, j)) + Cast(F64, Load(X, (i, j))), F32, "different types f32 and f64"),
    (Cast(I32, Load(X, (i, j))) / 2, I32, "'/' on integers (i32)"),
    (Cast(I32, Load(X, (i, j))) + 0.5, I32, "a float operand of '+' meets an integer"),
    (Load(X, (i, j)), F64, "the body has type f32 but the result type is tensor<4x8xf64>"),
    (lift(0.5) * i, I32, "the body is a float but the result type is tensor<4x8xi32>"),
    (Unary("not", Load(X, (i, j))), DType.I1, "'not' needs an i1 operand"),
    (Call("exp", (Cast(I32, Load(X, (i, j))),)), I32, "'exp' needs a float operand, not i32"),
    (Call("philox", (Load(X, (i, j)), lift(1))), F32, "philox takes integer arguments"),
    (Select(Load(X, (i, j)), lift(1.0), lift(0.0)), F32, "select condition has type f32"),
    (Binary("and", Load(X, (i, j)), lift(True)), DType.I1, "'and' needs i1 operands"),
    (Call("exp", (lift(1.0), lift(2.0))), F32, "'exp' takes 1 arguments, 2 given"),
    (Call("gelu", (lift(1.0),)), F32, "unknown intrinsic 'gelu'"),
    (Cast(DType.I1, i) + 1, DType.I1, "arithmetic '+' on i1 values"),
])
def test_type_errors(body, dt, pattern):
    one_error(module(compute(body, {"i": 4, "j": 8}, dt=dt), args=[X]), pattern)


def test_ssa_dominance():
    a = compute(Load(X, (i, j)), {"i": 4, "j": 8}, line=1)
    b = compute(Load(a.result, (i, j)), {"i": 4, "j": 8}, line=2)
    one_error(module(b, a, args=[X], ret=[b.result]), "'%v1' is used before its definition")
    stranger = arg("other", (4, 8))
    one_error(module(compute(Load(stranger, (i, j)), {"i": 4, "j": 8}), args=[X]),
              "'%other' is not defined in @f")
    one_error(module(a, a, args=[X]), "'%v1' is defined twice")


def test_return_structure():
    a = compute(Load(X, (i, j)), {"i": 4, "j": 8})
    f = Func("f", [X], Block([a]), loc=Loc("t.nf", 1, 1))
    one_error(Module("m", [f]), "@f does not end with nf.return")
    m = module(a, args=[X])
    m.funcs[0].attrs["nf.results"] = ["loss", "logits"]
    one_error(m, "nf.results of @f must name its 1 results")
    m2 = module(a, args=[X])
    m2.funcs[0].body.ops.insert(0, ReturnOp([X]))
    assert "nf.return before the end of the function" in errors(m2)[0]


def callee(name: str = "g", dt: DType = F32) -> Func:
    p = arg("p", (4, 8), dt)
    op = compute(Load(p, (i, j)) * 2, {"i": 4, "j": 8}, dt=dt)
    return Func(name, [p], Block([op, ReturnOp([op.result])]))


def test_calls():
    call = CallOp("g", [X], [TensorType((4, 8), F32)], loc=Loc("t.nf", 5, 1))
    verify(module(call, args=[X], extra=[callee()]))
    one_error(module(call, args=[X]), "call of unknown function '@g'")
    assert errors(module(call, args=[X], extra=[callee(dt=F64)])) == [
        "argument 0 of the call of '@g' has type tensor<4x8xf32>, expected tensor<4x8xf64>",
        "call of '@g' has result types (tensor<4x8xf32>) but the callee returns "
        "(tensor<4x8xf64>)"]
    bad = CallOp("g", [X], [TensorType((4, 8), F64)])
    one_error(module(bad, args=[X], extra=[callee()]), "but the callee returns")
    two = CallOp("g", [X, X], [TensorType((4, 8), F32)])
    one_error(module(two, args=[X], extra=[callee()]), "passes 2 arguments, it takes 1")


def test_recursion_and_duplicate_functions():
    p = arg("p", (4, 8))
    rec = CallOp("g", [p], [TensorType((4, 8), F32)])
    g = Func("g", [p], Block([rec, ReturnOp([rec.results[0]])]))
    call = CallOp("g", [X], [TensorType((4, 8), F32)])
    one_error(module(call, args=[X], extra=[g]), "recursive nf.call: @g -> @g")
    one_error(module(call, args=[X], extra=[callee(), callee()]), "function '@g' is defined twice")


def test_kernels():
    a = compute(Load(X, (i, j)), {"i": 4, "j": 8}, line=1)
    b = compute(Load(a.result, (i, j)) + Load(X, (i, j)), {"i": 4, "j": 8}, line=2)
    kern = KernelOp(Block([a, b, YieldOp([b.result])]), loc=Loc("t.nf", 3, 1))
    verify(module(kern, args=[X]))
    # values of a kernel body are private to it
    leak = compute(Load(a.result, (i, j)), {"i": 4, "j": 8}, line=4)
    one_error(module(kern, leak, args=[X]), "'%v1' is defined inside an nf.kernel body")
    # yield types must stay the kernel's result types
    c = compute(Load(X, (i, j)), {"i": 4, "j": 8}, dt=F32, line=5)
    d = compute(Cast(F64, Load(X, (i, j))), {"i": 4, "j": 8}, dt=F64, line=6)
    kern2 = KernelOp(Block([c, d, YieldOp([c.result])]))
    kern2.body.ops[-1] = YieldOp([d.result])
    one_error(module(kern2, args=[X]), "nf.kernel yields (tensor<4x8xf64>) but its results "
                                        "are (tensor<4x8xf32>)")
    e = compute(Load(X, (i, j)), {"i": 4, "j": 8}, line=7)
    inner = KernelOp(Block([e, YieldOp([e.result])]))
    outer = KernelOp(Block([inner, YieldOp([inner.results[0]])]))
    one_error(module(outer, args=[X]), "nf.kernel inside another kernel")
    f = compute(Load(X, (i, j)), {"i": 4, "j": 8}, line=8)
    nok = KernelOp(Block([f, YieldOp([f.result])]))
    nok.body.ops.pop()
    assert "does not end with nf.yield" in errors(module(nok, args=[X]))[0]


def test_argument_attributes():
    a = compute(Load(X, (i, j)), {"i": 4, "j": 8})
    rng = arg("rng", (2,), I32)
    m = module(a, args=[X, rng])
    m.funcs[0].arg_attrs = [{"nf.role": "weight"}, {"nf.role": "rng"}]
    msgs = errors(m)
    assert any("nf.role 'weight'" in s for s in msgs)
    assert any("rng argument '%rng' has type tensor<2xi32>" in s for s in msgs)
    m.funcs[0].arg_attrs = [{"nf.role": "param", "nf.init": "normal(0.0, 0.1)",
                             "nf.trainable": True}, {"nf.role": "input"}]
    verify(m)
    m.funcs[0].arg_attrs[0]["nf.init"] = "gaussian(1)"
    one_error(m, "nf.init of '%x' is 'gaussian(1)'")
    m.funcs[0].arg_attrs = [{}]
    one_error(m, "has 2 arguments but 1 argument attribute dicts")


def test_several_errors_at_once_each_located():
    a = compute(Load(X, (i, j + 1)), {"i": 4, "j": 8}, line=3)          # bounds
    b = compute(Load(X, (i,)), {"i": 4}, line=4)                       # arity
    c = compute(Load(X, (i, j)) + Cast(F64, i), {"i": 4, "j": 8}, line=5)  # types
    d = compute(Load(X, (i, j)), {"i": 4, "j": 0}, line=6, shape=(4, 1))   # extent, shape
    with pytest.raises(CompileError) as info:
        verify(module(a, b, c, d, args=[X], ret=[a.result]))
    diags = info.value.diagnostics
    assert [dg.loc.line for dg in diags] == [3, 4, 5, 6, 6]
    assert all(dg.severity == "error" for dg in diags)
    text = info.value.render()
    assert "t.nf:3:1: error: access '%x' dimension 1 can reach 8" in text


def test_infer_dtype():
    assert infer_dtype(Load(X, (i, j)) * 2) == F32
    assert infer_dtype(lift(2) * i) is None
    assert infer_dtype(Binary("<", Load(X, (i, j)), lift(0.0))) == DType.I1
    assert infer_dtype(Call("philox", (lift(1), i))) is None
    assert infer_dtype(Cast(I64, Load(X, (i, j)))) == I64
    assert expr_kind(lift(2) * i) == "int"
    assert expr_kind(Call("exp", (lift(1),))) == "float"
    with pytest.raises(ValueError, match="different types"):
        infer_dtype(Load(X, (i, j)) + Cast(F64, i))
