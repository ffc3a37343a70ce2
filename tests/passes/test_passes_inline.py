"""inline: calls replaced by copies of the callee, callees dropped, numerics unchanged."""

from __future__ import annotations

import pytest
from passes_testlib import apply, check_pass, computes, ops_named, text

from nfc.diagnostics import CompileError
from nfc.ir import (
    Axis,
    Block,
    CallOp,
    ComputeOp,
    DType,
    Func,
    Index,
    KernelOp,
    Load,
    Loc,
    Module,
    ReturnOp,
    TensorType,
    Value,
    YieldOp,
)
from nfc.irparser import parse_module
from nfc.passes.inline import Inline, is_public
from nfc.passmanager import Context
from nfc.verifier import verify

T48 = "tensor<4x8xf32>"
T82 = "tensor<8x2xf32>"
T42 = "tensor<4x2xf32>"

DENSE = f"""
nf.module @m {{
  nf.func @dense(%x: {T48}, %w: {T82}) -> ({T42}) {{
    %y = nf.compute [i: 4, j: 2] sum [k: 8] (%x[i, k] * %w[k, j]) : {T42} loc("m.nf":3:5)
    nf.return %y : {T42}
  }}
  nf.func @relu(%x: {T42}) -> ({T42}) {{
    %r = nf.compute [i: 4, j: 2] (max(%x[i, j], 0.0)) : {T42} loc("m.nf":7:5)
    nf.return %r : {T42}
  }}
  nf.func @layer(%x: {T48}, %w: {T82}) -> ({T42}) {{
    %h = nf.call @dense(%x, %w) : ({T48}, {T82}) -> ({T42})
    %r = nf.call @relu(%h) : ({T42}) -> ({T42})
    nf.return %r : {T42}
  }}
  nf.func @forward(%x: {T48}, %w: {T82}) -> ({T42}, {T42}) {{
    %a = nf.call @layer(%x, %w) : ({T48}, {T82}) -> ({T42}) loc("m.nf":20:3)
    %b = nf.call @dense(%x, %w) : ({T48}, {T82}) -> ({T42})
    %c = nf.compute [i: 4, j: 2] (%a[i, j] - %b[i, j]) : {T42}
    nf.return %c, %b : {T42}, {T42}
  }}
}}
"""


def test_nested_calls_are_inlined_and_callees_dropped() -> None:
    m = check_pass(DENSE, Inline())
    assert [f.name for f in m.funcs] == ["forward"]
    assert not ops_named(m, "nf.call")
    bodies = [c.body for c in computes(m)]
    assert len(bodies) == 4  # dense, relu (via layer), dense again, the subtraction
    x, w = m.func("forward").args
    assert computes(m)[0].body.a.tensor is x  # the copy reads the caller's argument
    assert computes(m)[0].body.b.tensor is w


def test_copies_are_fresh_values() -> None:
    m = apply(parse_module(DENSE), Inline())
    cs = computes(m)
    results = [c.result for c in cs]
    assert len({id(r) for r in results}) == len(results)
    assert all(r.owner is c for r, c in zip(results, cs, strict=True))
    # the two copies of @dense are distinct ops, and printing keeps names apart
    assert cs[0] is not cs[2]
    assert text(m).count("%y = ") == 1 and "%y_1 = " in text(m)


def test_locations_are_kept() -> None:
    m = apply(parse_module(DENSE), Inline())
    locs = [c.loc for c in computes(m)]
    assert locs[0] == Loc("m.nf", 3, 5)
    assert locs[1] == Loc("m.nf", 7, 5)


def test_callee_without_location_takes_the_call_location() -> None:
    src = f"""
    nf.func @f(%x: {T42}) -> ({T42}) {{
      %y = nf.compute [i: 4, j: 2] (%x[i, j] * 2.0) : {T42}
      nf.return %y : {T42}
    }}
    nf.func @forward(%x: {T42}) -> ({T42}) {{
      %y = nf.call @f(%x) : ({T42}) -> ({T42}) loc("m.nf":9:4)
      nf.return %y : {T42}
    }}
    """
    m = check_pass(src, Inline())
    assert computes(m)[0].loc == Loc("m.nf", 9, 4)


def test_public_functions_and_keep_funcs() -> None:
    src = f"""
    nf.func @helper(%x: {T42}) -> ({T42}) {{
      %y = nf.compute [i: 4, j: 2] (%x[i, j] + 1.0) : {T42}
      nf.return %y : {T42}
    }}
    nf.func @api(%x: {T42}) -> ({T42}) attributes {{nf.public = true}} {{
      %y = nf.compute [i: 4, j: 2] (%x[i, j] * 3.0) : {T42}
      nf.return %y : {T42}
    }}
    nf.func @eval(%x: {T42}) -> ({T42}) {{
      %y = nf.call @helper(%x) : ({T42}) -> ({T42})
      nf.return %y : {T42}
    }}
    nf.func @unused(%x: {T42}) -> ({T42}) {{
      nf.return %x : {T42}
    }}
    nf.func @forward(%x: {T42}) -> ({T42}) {{
      %a = nf.call @api(%x) : ({T42}) -> ({T42})
      %b = nf.call @eval(%a) : ({T42}) -> ({T42})
      nf.return %b : {T42}
    }}
    """
    m = check_pass(src, Inline())
    # @helper was inlined everywhere; @api and @eval are public; @unused was never called
    assert [f.name for f in m.funcs] == ["api", "eval", "unused", "forward"]
    assert is_public(m.func("api")) and is_public(m.func("eval"))
    kept = apply(parse_module(src), Inline(keep_funcs=True))
    assert [f.name for f in kept.funcs] == ["helper", "api", "eval", "unused", "forward"]
    assert not ops_named(kept, "nf.call", "eval")  # kept functions are inlined into as well


def test_callee_returning_its_argument_and_several_results() -> None:
    src = f"""
    nf.func @pair(%x: {T42}) -> ({T42}, {T42}) {{
      %y = nf.compute [i: 4, j: 2] (exp(%x[i, j])) : {T42}
      nf.return %x, %y : {T42}, {T42}
    }}
    nf.func @forward(%x: {T42}) -> ({T42}, {T42}, {T42}) {{
      %a, %b = nf.call @pair(%x) : ({T42}) -> ({T42}, {T42})
      %c, %d = nf.call @pair(%b) : ({T42}) -> ({T42}, {T42})
      nf.return %a, %c, %d : {T42}, {T42}, {T42}
    }}
    """
    m = check_pass(src, Inline())
    f = m.func("forward")
    ret = f.ret.values
    assert ret[0] is f.args[0]          # %a was the argument itself
    assert ret[1] is computes(m)[0].result  # %c is %b, the first copy's exp
    assert len(computes(m)) == 2


def test_call_inside_a_kernel_is_inlined() -> None:
    t = TensorType((4,), DType.F32)
    x = Value(t, "x")
    y = ComputeOp(t, (Axis("i", 4),), Load(x, (Index("i"),)) * 2.0, name="y")
    callee = Func("twice", [x], Block([y, ReturnOp([y.result])]))
    a = Value(t, "a")
    call = CallOp("twice", [a], [t], names=["c"])
    use = ComputeOp(t, (Axis("i", 4),), Load(call.result, (Index("i"),)) + 1.0, name="d")
    kernel = KernelOp(Block([call, use, YieldOp([use.result])]), names=["k"])
    fwd = Func("forward", [a], Block([kernel, ReturnOp([kernel.result])]))
    m = Module("m", [callee, fwd])
    verify(m)
    apply(m, Inline())
    inner = kernel.body.ops
    assert [op.opname for op in inner] == ["nf.compute", "nf.compute", "nf.yield"]
    assert inner[1].body.a.tensor is inner[0].result  # type: ignore[attr-defined]
    assert [f.name for f in m.funcs] == ["forward"]


def test_clone_op_copies_kernels_deeply() -> None:
    t = TensorType((4,), DType.F32)
    a = Value(t, "a")
    c = ComputeOp(t, (Axis("i", 4),), Load(a, (Index("i"),)) * 2.0, name="c")
    k = KernelOp(Block([c, YieldOp([c.result])]), attrs={"nf.s": 1}, names=["k"])
    b = Value(t, "b")
    vmap = {a: b}
    k2 = k.clone(vmap)
    assert isinstance(k2, KernelOp) and k2 is not k and k2.attrs == k.attrs
    c2 = k2.body.ops[0]
    assert isinstance(c2, ComputeOp) and c2 is not c
    assert c2.body.a.tensor is b  # type: ignore[attr-defined]
    assert k2.body.ops[1].values[0] is c2.result  # type: ignore[attr-defined]
    assert vmap[k.result] is k2.result
    assert c.body.a.tensor is a  # the original is untouched  # type: ignore[attr-defined]


def test_recursion_is_an_error() -> None:
    src = f"""
    nf.func @f(%x: {T42}) -> ({T42}) {{
      %y = nf.call @g(%x) : ({T42}) -> ({T42}) loc("r.nf":2:7)
      nf.return %y : {T42}
    }}
    nf.func @g(%x: {T42}) -> ({T42}) {{
      %y = nf.call @f(%x) : ({T42}) -> ({T42}) loc("r.nf":5:7)
      nf.return %y : {T42}
    }}
    """
    m = parse_module(src)
    with pytest.raises(CompileError, match="recursive call of '@f'"):
        Inline().apply(Context(), m)


def test_unknown_callee_is_an_error() -> None:
    t = TensorType((4,), DType.F32)
    a = Value(t, "a")
    call = CallOp("nowhere", [a], [t], loc=Loc("u.nf", 1, 2))
    m = Module("m", [Func("forward", [a], Block([call, ReturnOp([call.result])]))])
    with pytest.raises(CompileError, match="unknown function '@nowhere'") as err:
        Inline().apply(Context(), m)
    assert err.value.diagnostics[0].loc == Loc("u.nf", 1, 2)
