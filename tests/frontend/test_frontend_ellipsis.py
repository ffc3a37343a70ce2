"""Rank-polymorphic ops: `...` for the leading dimensions in signatures, index lists and
subscripts; unification at ranks 1 to 4 and its diagnostics."""

from __future__ import annotations

import numpy as np
import pytest

from nfc.diagnostics import CompileError
from nfc.frontend import compile_op, compile_source
from nfc.interp import run
from nfc.ir import DType, TensorType
from nfc.printer import print_module
from nfc.verifier import verify

OPS = """
op norm<eps: float = 1e-5>(x: T[..., D], g: T[D], b: T[D]) -> T[..., D] {
  mu[...] = (sum(d) x[..., d]) / D
  xc[..., d] = x[..., d] - mu[...]
  var[...] = (sum(d) xc[..., d] * xc[..., d]) / D
  y[..., d] = xc[..., d] * rsqrt(var[...] + eps) * g[d] + b[d]
}
op add(x: T[..., D], y: T[..., D]) -> T[..., D] {
  z[..., d] = x[..., d] + y[..., d]
}
op rowsum(x: T[..., D]) -> T[...] {
  s[...] = sum(d) x[..., d]
}
op pair(x: T[..., D]) -> (a: T[..., D], s: T[...]) {
  a = add(x, x)
  s = rowsum(x)
}
op whole(x: T[...]) -> T[...] {
  y[...] = 2.0 * x[...]
}
"""


def t(*shape: int) -> TensorType:
    return TensorType(shape, DType.F64)


def errors(src: str) -> list[str]:
    with pytest.raises(CompileError) as ei:
        compile_source(src, "e.nf")
    return [f"{d.loc.line}:{d.loc.col}: {d.message}" for d in ei.value.diagnostics]


@pytest.mark.parametrize("shape", [(4,), (3, 4), (2, 3, 4), (2, 1, 3, 4)],
                         ids=lambda s: f"rank{len(s)}")
def test_leading_dims_unify_at_every_rank(shape: tuple[int, ...]) -> None:
    module = compile_op(OPS, "norm", [t(*shape), t(4), t(4)])
    verify(module)
    f = module.funcs[0]
    assert f.ret.values[0].shape == shape
    rng = np.random.default_rng(1)
    x, g, b = rng.standard_normal(shape), rng.standard_normal(4), rng.standard_normal(4)
    (y,) = run(f, [x, g, b])
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    np.testing.assert_allclose(y, (x - mu) / np.sqrt(var + 1e-5) * g + b, rtol=1e-12)


@pytest.mark.parametrize("shape", [(), (3,), (2, 3), (2, 2, 3)], ids=lambda s: f"rank{len(s)}")
def test_an_ellipsis_alone_is_every_dimension(shape: tuple[int, ...]) -> None:
    module = compile_op(OPS, "whole", [t(*shape)])
    x = np.random.default_rng(2).standard_normal(shape)
    (y,) = run(module.funcs[0], [x])
    np.testing.assert_array_equal(y, 2 * x)


def test_results_several_outputs_and_nested_polymorphic_calls() -> None:
    module = compile_op(OPS, "pair", [t(2, 3, 4)])
    verify(module)
    assert [v.shape for v in module.funcs[0].ret.values] == [(2, 3, 4), (2, 3)]
    x = np.random.default_rng(3).standard_normal((2, 3, 4))
    a, s = run(module.funcs[0], [x])
    np.testing.assert_allclose(a, 2 * x)
    np.testing.assert_allclose(s, x.sum(-1))


def test_ir_names_of_the_leading_indices() -> None:
    # one leading index is `n` (rank-2 calls print as before); several are n0, n1, ...
    two = print_module(compile_op(OPS, "add", [t(3, 4), t(3, 4)]))
    assert "nf.compute [n: 3, d: 4] (%x[n, d] + %y[n, d])" in two
    four = print_module(compile_op(OPS, "add", [t(2, 5, 3, 4), t(2, 5, 3, 4)]))
    assert "nf.compute [n0: 2, n1: 5, n2: 3, d: 4] (%x[n0, n1, n2, d] + %y[n0, n1, n2, d])" \
        in four


def test_model_calls_at_different_ranks() -> None:
    src = OPS + """
model m {
  input x: f32[2, 3, 4]
  input v: f32[4]
  input g: f32[4]
  a = norm<eps = 0.1>(x, g, g)
  b = norm(v, g, g)
  c = rowsum(add(x, x))
  output a, b, c
}
"""
    module = compile_source(src, "m.nf")
    verify(module)
    assert [v.shape for v in module.funcs[0].ret.values] == [(2, 3, 4), (4,), (2, 3)]


def test_mismatched_leading_dims_between_arguments() -> None:
    src = OPS + """
model m {
  input x: f32[2, 3, 4]
  input y: f32[3, 2, 4]
  z = add(x, y)
  output z
}
"""
    with pytest.raises(CompileError) as ei:
        compile_source(src, "e.nf")
    (d,) = ei.value.diagnostics
    assert (d.loc.line, d.loc.col) == (25, 14)
    assert d.message == ("leading dimensions of argument 2 of 'add' are [3, 2] ('...' of "
                         "f32[3, 2, 4]) but '...' = [2, 3] was bound by argument 1")
    assert d.notes[0].message == "parameter 'y' declared here as T[..., D]"


def test_rank_below_the_fixed_dimensions() -> None:
    src = OPS + "model m {\n  input s: f32[]\n  z = rowsum(s)\n  output s\n}\n"
    assert errors(src) == ["23:14: argument 1 of 'rowsum' has rank 0 (f32[]) but parameter 'x' "
                           "expects rank 1 or more"]


def test_two_ellipses_and_misplaced_ones() -> None:
    src = """op f(x: T[..., D, ...]) -> T[D] {
  y[d] = x[0, d, 0]
}
op g(x: T[D, ...]) -> T[D] {
  y[d] = x[d, 0]
}
op h(x: T[..., D]) -> T[..., D] {
  y[d, ...] = x[d, ...]
}
"""
    assert errors(src) == [
        "1:19: '...' appears twice in a type; one '...' stands for all the leading dimensions",
        "4:14: '...' may only be the first dimension of a type (it stands for the leading "
        "dimensions)",
        "8:8: '...' must come first in an index list",
        "8:20: '...' stands for leading dimensions: write it first in an op's parameter type "
        "`x: T[..., D]`, in an index list `y[..., d] = ...` and in a subscript `x[..., d]`",
    ]


def test_ellipsis_needs_a_polymorphic_signature_and_a_polymorphic_lhs() -> None:
    src = """op f(x: T[D]) -> T[..., D] {
  y[..., d] = x[d]
}
op g(x: T[..., D]) -> T[D] {
  y[d] = x[..., d]
}
model m {
  input a: f32[2, 3]
  b[...] = a[...]
  c = a[..., 0]
  output a
}
"""
    assert errors(src) == [
        "1:20: '...' in the result type of 'f' is not bound by any parameter",
        "2:5: '...' in an index list stands for the leading indices of an op whose signature "
        "has '...' (`x: T[..., D]`)",
        "5:12: '...' in a subscript stands for the '...' indices of the left-hand side, which "
        "has none: write `y[..., d] = x[..., d]`",
        "9:5: '...' in an index list stands for the leading indices of an op whose signature "
        "has '...' (`x: T[..., D]`)",
        "10:9: '...' stands for leading dimensions: write it first in an op's parameter type "
        "`x: T[..., D]`, in an index list `y[..., d] = ...` and in a subscript `x[..., d]`",
    ]


def test_bounds_note_shows_the_bound_dimensions() -> None:
    src = """op f(x: T[..., D]) -> T[..., D] {
  y[..., d] = x[..., d + 1]
}
model m {
  input a: f32[2, 3, 4]
  y = f(a)
  output y
}
"""
    with pytest.raises(CompileError) as ei:
        compile_source(src, "b.nf")
    text = ei.value.render()
    assert "b.nf:2:22: error: access 'x' dimension 2 can reach 4 but the tensor has size 4" in text
    assert "note: 'x' declared here as f32[..., D] with D = 4" in text


def test_declared_output_rank_is_checked() -> None:
    src = """op f(x: T[..., D]) -> T[D] {
  y[..., d] = x[..., d]
}
model m {
  input a: f32[2, 4]
  y = f(a)
  output y
}
"""
    assert errors(src) == ["2:3: 'y' is declared with rank 1 but assigned with 2 indices"]
