"""dce: dead ops removed, kernels trimmed; returns, arguments and live ops kept."""

from __future__ import annotations

from passes_testlib import apply, check_pass, computes, ops_named, text

from nfc.ir import KernelOp
from nfc.irparser import parse_module
from nfc.passes.dce import DCE

T = "tensor<4x8xf32>"


def test_dead_chains_are_removed() -> None:
    src = f"""
    nf.func @forward(%x: {T}, %unused: {T}) -> ({T}) {{
      %a = nf.compute [i: 4, j: 8] (exp(%x[i, j])) : {T}
      %b = nf.compute [i: 4, j: 8] (%a[i, j] * 2.0) : {T}
      %c = nf.compute [i: 4, j: 8] (%x[i, j] + 1.0) : {T}
      %d = nf.compute [i: 4, j: 8] (%c[i, j] * 2.0) : {T}
      nf.return %d : {T}
    }}
    """
    m = check_pass(src, DCE())
    assert [c.result.name for c in computes(m)] == ["c", "d"]
    assert len(m.func("forward").args) == 2


def test_returning_an_argument_keeps_nothing() -> None:
    src = f"""
    nf.func @forward(%x: {T}) -> ({T}) {{
      %a = nf.compute [i: 4, j: 8] (exp(%x[i, j])) : {T}
      nf.return %x : {T}
    }}
    """
    m = check_pass(src, DCE())
    assert not computes(m)


def test_unused_calls_are_removed() -> None:
    src = f"""
    nf.func @f(%x: {T}) -> ({T}, {T}) {{
      %y = nf.compute [i: 4, j: 8] (tanh(%x[i, j])) : {T}
      nf.return %y, %x : {T}, {T}
    }}
    nf.func @forward(%x: {T}) -> ({T}) {{
      %a, %b = nf.call @f(%x) : ({T}) -> ({T}, {T})
      %c, %d = nf.call @f(%x) : ({T}) -> ({T}, {T})
      nf.return %d : {T}
    }}
    """
    m = check_pass(src, DCE())
    assert len(ops_named(m, "nf.call")) == 1
    assert len(computes(m, "f")) == 1  # a callee's body is not trimmed by its callers


KERNEL = f"""
nf.func @forward(%x: {T}) -> ({T}) {{
  %k1, %k2, %k3 = nf.kernel {{nf.group = 1}} {{
    %a = nf.compute [i: 4, j: 8] (%x[i, j] * 2.0) : {T}
    %b = nf.compute [i: 4, j: 8] (%a[i, j] + 1.0) : {T}
    %dead = nf.compute [i: 4, j: 8] (%x[i, j] - 1.0) : {T}
    %c = nf.compute [i: 4, j: 8] (exp(%x[i, j])) : {T}
    nf.yield %a, %b, %c : {T}, {T}, {T}
  }} : {T}, {T}, {T}
  %gone = nf.kernel {{nf.group = 2}} {{
    %e = nf.compute [i: 4, j: 8] (%x[i, j] * 3.0) : {T}
    nf.yield %e : {T}
  }} : {T}
  %r = nf.compute [i: 4, j: 8] (%k2[i, j] * %k3[i, j]) : {T}
  nf.return %r : {T}
}}
"""


def test_kernels_are_trimmed_or_removed() -> None:
    m = check_pass(KERNEL, DCE())
    kernels = [op for op in m.func("forward").body.ops if isinstance(op, KernelOp)]
    assert len(kernels) == 1
    k = kernels[0]
    assert [r.name for r in k.results] == ["k2", "k3"]
    assert [r.index for r in k.results] == [0, 1]
    # %a stays: the yielded %b still reads it
    assert [c.result.name for c in computes(m)] == ["a", "b", "c", "r"]
    assert "%dead" not in text(m) and "nf.group = 2" not in text(m)


def test_printed_result_round_trips() -> None:
    m = apply(parse_module(KERNEL), DCE())
    printed = text(m)
    assert text(parse_module(printed)) == printed
