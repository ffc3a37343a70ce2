"""cse: identical computes and calls merged (up to axis renaming); numerics unchanged."""

from __future__ import annotations

from passes_testlib import apply, check_pass, computes, ops_named

from nfc.irparser import parse_module
from nfc.passes.cse import CSE, compute_key

T = "tensor<4x8xf32>"


def test_renamed_axes_are_merged_and_uses_redirected() -> None:
    src = f"""
    nf.func @forward(%x: {T}) -> ({T}, {T}) {{
      %a = nf.compute [i: 4, j: 8] (exp(%x[i, j]) + 1.0) : {T}
      %b = nf.compute [p: 4, q: 8] (exp(%x[p, q]) + 1.0) : {T}
      %c = nf.compute [i: 4, j: 8] (%a[i, j] * %b[i, j]) : {T}
      nf.return %c, %b : {T}, {T}
    }}
    """
    m = check_pass(src, CSE())
    a, c = computes(m)
    assert c.body.a.tensor is a.result and c.body.b.tensor is a.result  # type: ignore[attr-defined]
    assert m.func("forward").ret.values[1] is a.result


def test_cascade() -> None:
    # once %b is %a, %d reads the same as %c and is merged too
    src = f"""
    nf.func @forward(%x: {T}) -> ({T}) {{
      %a = nf.compute [i: 4, j: 8] (%x[i, j] * 2.0) : {T}
      %b = nf.compute [i: 4, j: 8] (%x[i, j] * 2.0) : {T}
      %c = nf.compute [i: 4, j: 8] (%a[i, j] + 1.0) : {T}
      %d = nf.compute [i: 4, j: 8] (%b[i, j] + 1.0) : {T}
      %e = nf.compute [i: 4, j: 8] (%c[i, j] - %d[i, j]) : {T}
      nf.return %e : {T}
    }}
    """
    m = check_pass(src, CSE())
    assert len(computes(m)) == 3


def test_canonical_index_order_and_reduction_axes() -> None:
    src = """
    nf.func @forward(%x: tensor<4x8xf32>, %v: tensor<16xf32>) -> (tensor<4xf32>, tensor<4xf32>,
        tensor<4x8xf32>, tensor<4x8xf32>) {
      %s = nf.compute [i: 4] sum [k: 8] (%x[i, k] * 2.0) : tensor<4xf32>
      %t = nf.compute [n: 4] sum [r: 8] (%x[n, r] * 2.0) : tensor<4xf32>
      %u = nf.compute [i: 4, j: 8] (%v[j + i]) : tensor<4x8xf32>
      %w = nf.compute [a: 4, b: 8] (%v[a + b]) : tensor<4x8xf32>
      nf.return %s, %t, %u, %w : tensor<4xf32>, tensor<4xf32>, tensor<4x8xf32>, tensor<4x8xf32>
    }
    """
    m = check_pass(src, CSE())
    assert len(computes(m)) == 2


def test_different_things_are_not_merged() -> None:
    src = """
    nf.func @forward(%x: tensor<4x4xf32>) -> (tensor<4x4xf32>, tensor<4x4xf32>, tensor<4x4xf32>,
        tensor<4x4xf64>, tensor<4xf32>, tensor<4xf32>, tensor<4x4xf32>) {
      %a = nf.compute [i: 4, j: 4] (%x[i, j] * 2.0) : tensor<4x4xf32>
      %t = nf.compute [i: 4, j: 4] (%x[j, i] * 2.0) : tensor<4x4xf32>
      %at = nf.compute [i: 4, j: 4] (%x[i, j] * 2.0) {nf.tag = 1} : tensor<4x4xf32>
      %d = nf.compute [i: 4, j: 4] (f64(%x[i, j]) * 2.0) : tensor<4x4xf64>
      %s = nf.compute [i: 4] sum [j: 4] (%x[i, j]) : tensor<4xf32>
      %m = nf.compute [i: 4] max [j: 4] (%x[i, j]) : tensor<4xf32>
      %c = nf.compute [i: 4, j: 4] (%x[i, j] * 3.0) : tensor<4x4xf32>
      nf.return %a, %t, %at, %d, %s, %m, %c : tensor<4x4xf32>, tensor<4x4xf32>, tensor<4x4xf32>,
          tensor<4x4xf64>, tensor<4xf32>, tensor<4xf32>, tensor<4x4xf32>
    }
    """
    m = check_pass(src, CSE())
    assert len(computes(m)) == 7


def test_calls_are_merged() -> None:
    src = f"""
    nf.func @f(%x: {T}) -> ({T}) {{
      %y = nf.compute [i: 4, j: 8] (tanh(%x[i, j])) : {T}
      nf.return %y : {T}
    }}
    nf.func @forward(%x: {T}, %z: {T}) -> ({T}) {{
      %a = nf.call @f(%x) : ({T}) -> ({T})
      %b = nf.call @f(%x) : ({T}) -> ({T})
      %c = nf.call @f(%z) : ({T}) -> ({T})
      %d = nf.compute [i: 4, j: 8] (%a[i, j] + %b[i, j] + %c[i, j]) : {T}
      nf.return %d : {T}
    }}
    """
    m = check_pass(src, CSE())
    assert len(ops_named(m, "nf.call")) == 2


def test_kernels_are_separate_scopes() -> None:
    src = f"""
    nf.func @forward(%x: {T}) -> ({T}, {T}, {T}) {{
      %a = nf.compute [i: 4, j: 8] (%x[i, j] * 2.0) : {T}
      %k = nf.kernel {{nf.group = 0}} {{
        %b = nf.compute [i: 4, j: 8] (%x[i, j] * 2.0) : {T}
        %c = nf.compute [i: 4, j: 8] (%x[i, j] * 2.0) : {T}
        %d = nf.compute [i: 4, j: 8] (%b[i, j] + %c[i, j]) : {T}
        nf.yield %d : {T}
      }} : {T}
      %e = nf.compute [i: 4, j: 8] (%x[i, j] * 2.0) : {T}
      nf.return %a, %k, %e : {T}, {T}, {T}
    }}
    """
    m = check_pass(src, CSE())
    # %c merges into %b inside the kernel, %e into %a outside; %b stays (not replaced by %a)
    assert len(computes(m)) == 3


def test_compute_key_ignores_locations_names_and_callsites() -> None:
    m = parse_module(f"""
    nf.func @forward(%x: {T}) -> ({T}, {T}) {{
      %a = nf.compute [i: 4, j: 8] (%x[i, j] + 1.0) {{nf.callsite = "m.nf:3:4"}} : {T}
          loc("a.nf":1:1)
      %b = nf.compute [u: 4, v: 8] (1.0 + %x[u, v]) {{nf.callsite = "m.nf:5:4"}} : {T}
          loc("a.nf":2:1)
      nf.return %a, %b : {T}, {T}
    }}
    """)
    a, b = computes(m)
    assert compute_key(a) == compute_key(b)
    apply(m, CSE())
    assert len(computes(m)) == 1
    assert computes(m)[0].attrs == {"nf.callsite": "m.nf:3:4"}
