"""canonicalize: simplified bodies, folded copies, trimmed reductions; numerics unchanged."""

from __future__ import annotations

from passes_testlib import apply, check_pass, computes, text

from nfc.ir import (
    Axis,
    Block,
    ComputeOp,
    Const,
    DType,
    Func,
    Index,
    Load,
    Module,
    ReturnOp,
    TensorType,
    Value,
)
from nfc.irparser import parse_module
from nfc.passes.canonicalize import Canonicalize, canonicalize_compute, copy_source
from nfc.printer import format_expr

T = "tensor<4x8xf32>"


def bodies(m: Module, func: str = "forward") -> list[str]:
    return [format_expr(c.body) for c in computes(m, func)]


def test_bodies_are_simplified() -> None:
    src = f"""
    nf.func @forward(%x: {T}, %y: {T}) -> ({T}) {{
      %a = nf.compute [i: 4, j: 8] (%x[i, j] * 1.0 - 0.0 * 2.0 - %y[i, 2 * j - j]) : {T}
      nf.return %a : {T}
    }}
    """
    m = check_pass(src, Canonicalize())
    assert bodies(m) == ["%x[i, j] - %y[i, j]"]


def test_copies_are_folded() -> None:
    src = f"""
    nf.func @forward(%x: {T}) -> ({T}, {T}) {{
      %a = nf.compute [i: 4, j: 8] (%x[i, j] * 1.0) : {T}
      %b = nf.compute [p: 4, q: 8] (%a[p, q]) : {T}
      %c = nf.compute [i: 4, j: 8] (exp(%b[i, j])) : {T}
      nf.return %c, %b : {T}, {T}
    }}
    """
    m = check_pass(src, Canonicalize())
    f = m.func("forward")
    assert bodies(m) == ["exp(%x[i, j])"]
    assert f.ret.values[1] is f.args[0]  # the returned copy is the argument itself


def test_not_copies() -> None:
    src = """
    nf.func @forward(%x: tensor<4x4xf32>, %y: tensor<4x8xf32>) -> (tensor<4x4xf32>,
        tensor<4x4xf32>, tensor<4x4xf64>, tensor<4xf32>) {
      %t = nf.compute [i: 4, j: 4] (%x[j, i]) : tensor<4x4xf32>
      %s = nf.compute [i: 4, j: 4] (%y[i, j]) : tensor<4x4xf32>
      %d = nf.compute [i: 4, j: 4] (f64(%x[i, j])) : tensor<4x4xf64>
      %r = nf.compute [i: 4] sum [j: 4] (%x[i, j]) : tensor<4xf32>
      nf.return %t, %s, %d, %r : tensor<4x4xf32>, tensor<4x4xf32>, tensor<4x4xf64>, tensor<4xf32>
    }
    """
    m = check_pass(src, Canonicalize())
    assert len(computes(m)) == 4


def test_reshape_round_trip_becomes_a_copy() -> None:
    src = """
    nf.func @forward(%x: tensor<4x12xf32>) -> (tensor<4x12xf32>) {
      %f = nf.compute [n: 48] (%x[n // 12, n % 12]) : tensor<48xf32>
      %g = nf.compute [i: 4, j: 12] (%f[i * 12 + j]) : tensor<4x12xf32>
      %h = nf.compute [i: 4, j: 12] (%f[(j + 12 * i + 24) % 48] + 1.0) : tensor<4x12xf32>
      nf.return %g : tensor<4x12xf32>
    }
    """
    m = check_pass(src, Canonicalize())
    f = m.func("forward")
    # %g reads %f[12 * i + j]; only inlining %f (fusion, later) would make it a copy of %x
    assert bodies(m)[1] == "%f[12 * i + j]"
    assert bodies(m)[2] == "%f[(12 * i + j + 24) % 48] + 1.0"
    assert f.ret.values[0] is computes(m)[1].result


def test_unflatten_of_flatten_folds_to_the_source() -> None:
    src = """
    nf.func @forward(%x: tensor<4x12xf32>) -> (tensor<4x12xf32>) {
      %g = nf.compute [i: 4, j: 12] (%x[(i * 12 + j) // 12, (i * 12 + j) % 12]) : tensor<4x12xf32>
      nf.return %g : tensor<4x12xf32>
    }
    """
    m = check_pass(src, Canonicalize())
    f = m.func("forward")
    assert not computes(m)
    assert f.ret.values[0] is f.args[0]


def test_guards_decided_by_ranges() -> None:
    # a pad with p = 0: the guard always holds and the select disappears
    src = """
    nf.func @forward(%x: tensor<2x6xf32>) -> (tensor<2x6xf32>) {
      %p = nf.compute [n: 2, h: 6] (select(0 <= h - 0 and h - 0 < 6, %x[n, h - 0], 0.0) * 2.0)
          : tensor<2x6xf32>
      nf.return %p : tensor<2x6xf32>
    }
    """
    m = check_pass(src, Canonicalize())
    assert bodies(m) == ["%x[n, h] * 2.0"]


def test_unit_reduction_axes_are_dropped() -> None:
    src = """
    nf.func @forward(%x: tensor<4x1xf32>, %y: tensor<4x8xf32>) -> (tensor<4xf32>, tensor<4xf32>,
        tensor<4xf32>) {
      %a = nf.compute [i: 4] sum [k: 1] (%x[i, k] * 2.0) : tensor<4xf32>
      %b = nf.compute [i: 4] sum [k: 1, j: 8] (%x[i, k] * %y[i, j]) : tensor<4xf32>
      %c = nf.compute [i: 4] max [k: 8, j: 8] (%y[i, j]) : tensor<4xf32>
      nf.return %a, %b, %c : tensor<4xf32>, tensor<4xf32>, tensor<4xf32>
    }
    """
    m = check_pass(src, Canonicalize())
    a, b, c = computes(m)
    assert a.reduce is None and a.raxes == () and format_expr(a.body) == "%x[i, 0] * 2.0"
    assert b.reduce == "sum" and [x.name for x in b.raxes] == ["j"]
    assert c.reduce == "max" and [x.name for x in c.raxes] == ["j"]


def test_sum_over_an_unused_axis_is_kept() -> None:
    src = """
    nf.func @forward(%y: tensor<4x8xf32>) -> (tensor<4xf32>) {
      %c = nf.compute [i: 4] sum [k: 3, j: 8] (%y[i, j]) : tensor<4xf32>
      nf.return %c : tensor<4xf32>
    }
    """
    m = check_pass(src, Canonicalize())
    assert len(computes(m)[0].raxes) == 2  # the sum counts it three times


def test_fast_option() -> None:
    src = f"""
    nf.func @forward(%x: {T}, %y: {T}) -> ({T}) {{
      %a = nf.compute [i: 4, j: 8] (%x[i, j] * 0.0 + %y[i, j]) : {T}
      nf.return %a : {T}
    }}
    """
    assert bodies(check_pass(src, Canonicalize())) == ["%x[i, j] * 0.0 + %y[i, j]"]
    m = apply(parse_module(src), Canonicalize(fast=True))
    assert bodies(m) == []  # %y[i, j] alone is a copy of %y
    assert m.func("forward").ret.values[0] is m.func("forward").args[1]


def test_inside_kernels() -> None:
    src = f"""
    nf.func @forward(%x: {T}) -> ({T}) {{
      %k = nf.kernel {{nf.fused = true}} {{
        %a = nf.compute [i: 4, j: 8] (%x[i, j] - 0.0) : {T}
        %b = nf.compute [i: 4, j: 8] (%a[i, j] * (1.0 + 1.0)) : {T}
        nf.yield %b : {T}
      }} : {T}
      nf.return %k : {T}
    }}
    """
    m = check_pass(src, Canonicalize())
    assert bodies(m) == ["%x[i, j] * 2.0"]
    assert "nf.kernel" in text(m)


def test_canonicalize_compute_and_copy_source_directly() -> None:
    t = TensorType((3,), DType.I32)
    x = Value(t, "x")
    op = ComputeOp(t, (Axis("i", 3),), Load(x, (Index("i") + 0,)) * Const(1), name="y")
    assert copy_source(op) is None
    canonicalize_compute(op)
    assert copy_source(op) is x
    f = Func("forward", [x], Block([op, ReturnOp([op.result])]))
    apply(Module("m", [f]), Canonicalize())
    assert f.body.ops[0].values == [x]  # type: ignore[attr-defined]
