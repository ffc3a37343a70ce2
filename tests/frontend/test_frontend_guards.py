"""Range inference through guards: a bare use under a condition on the same index does not
fix the range alone; the range is the union of what the branches read in bounds."""

from __future__ import annotations

import numpy as np
import pytest

from nfc.diagnostics import CompileError
from nfc.frontend import compile_source
from nfc.interp import run
from nfc.ir import ComputeOp, Module
from nfc.verifier import verify


def compile_model(body: str, decls: str = "input x: f32[2, 3]\n  input h: f32[2, 4]") -> Module:
    src = f"model m {{\n  {decls}\n  {body}\n}}\n"
    module = compile_source(src, "g.nf")
    verify(module)
    return module


def errors(body: str, decls: str = "input x: f32[2, 3]\n  input h: f32[2, 4]") -> list[str]:
    with pytest.raises(CompileError) as ei:
        compile_model(body, decls)
    return [f"{d.loc.line}:{d.loc.col}: {d.message}" for d in ei.value.diagnostics]


def computes(module: Module) -> dict[str, ComputeOp]:
    return {op.result.name: op for op in module.funcs[0].body.ops if isinstance(op, ComputeOp)}


def test_concat_in_a_local_tensor_needs_no_explicit_range() -> None:
    # the gap of docs/models.md: `xh[n, k]` used to be inferred 0..I from the bare `x[n, k]`
    src = """
op cat(x: T[N, I], h: T[N, H]) -> T[N, I + H] {
  xh[n, k] = x[n, k] if k < I else h[n, k - I]
  y[n, k] = xh[n, k]
}
model m {
  input x: f32[2, 3]
  input h: f32[2, 4]
  y = cat(x, h)
  output y
}
"""
    module = compile_source(src, "cat.nf")
    verify(module)
    assert computes(module)["xh"].result.shape == (2, 7)
    rng = np.random.default_rng(0)
    x, h = rng.standard_normal((2, 3), np.float32), rng.standard_normal((2, 4), np.float32)
    (y,) = run(module.funcs[0], {"x": x, "h": h})
    np.testing.assert_array_equal(y, np.concatenate([x, h], axis=1))


def test_union_of_branches_of_different_sizes() -> None:
    # then: k < 3 and x in bounds -> 0..2; else: h in bounds -> 3..3 ∪ ... = 0..3 (size 4)
    m = compile_model("y[n, k] = x[n, k] if k < 3 else h[n, k]\n  output y")
    assert computes(m)["y"].result.shape == (2, 4)


def test_union_for_a_reduction_index() -> None:
    m = compile_model("y[n] = sum(k) (x[n, k] if k < 3 else h[n, k - 3])\n  output y")
    op = next(o for o in computes(m).values() if o.reduce == "sum")
    assert [a.extent for a in op.raxes] == [7]
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    h = np.ones((2, 4), np.float32)
    (y,) = run(m.funcs[0], {"x": x, "h": h})
    np.testing.assert_array_equal(y, x.sum(1) + 4)


@pytest.mark.parametrize("body,extent", [
    # the branch bound may be a conjunction, and floor division is understood
    ("y[n, k] = x[n, k // 2] if k < 6 else h[n, k - 6]", 10),
    ("y[n, k] = h[n, k - 3] if k >= 3 else x[n, k]", 7),
    ("y[n, k] = h[n, k - 3] if not (k < 3) else x[n, k]", 7),
    ("y[n, k] = x[n, k] if k < 3 else (h[n, k - 3] if k < 5 else h[n, k - 5])", 9),
])
def test_guards_of_several_shapes(body: str, extent: int) -> None:
    m = compile_model(body + "\n  output y")
    assert computes(m)["y"].result.shape == (2, extent)


def test_an_unbounded_branch_keeps_the_bare_use() -> None:
    # `else 0.0` allows every k: the bare use decides, as before
    m = compile_model("y[n, k] = x[n, k] if k < 2 else 0.0\n  output y")
    assert computes(m)["y"].result.shape == (2, 3)


def test_a_data_dependent_guard_keeps_the_bare_use() -> None:
    m = compile_model("y[n, k] = x[n, k] if x[n, k] > 0.0 else 2.0 * x[n, k]\n  output y")
    assert computes(m)["y"].result.shape == (2, 3)


def test_an_unguarded_use_decides_over_guarded_ones() -> None:
    # `h[n, k]` outside the conditional fixes k to 0..4; the guarded `x[n, k]` does not
    # conflict with it (the guard keeps it in bounds)
    m = compile_model("y[n, k] = h[n, k] + (x[n, k] if k < 3 else 0.0)\n  output y")
    assert computes(m)["y"].result.shape == (2, 4)


def test_branches_with_a_gap_are_an_error() -> None:
    assert errors("y[n, k] = x[n, k] if k < 2 else h[n, k - 5]\n  output y") == [
        "4:8: cannot infer the range of index 'k': the branches read in bounds for 0..2 and "
        "5..9, which is not one range; give its range explicitly, e.g. `t[k in 0..N] = ...`"]


def test_conflicting_unguarded_uses_are_still_an_error() -> None:
    assert errors("y[n, k] = x[n, k] + h[n, k]\n  output y") == [
        "4:28: conflicting ranges for index 'k': 'x' dimension 1 has size 3 but 'h' dimension "
        "1 has size 4"]


def test_a_guard_on_another_index_does_not_count() -> None:
    # the condition mentions n, not k: both bare uses of k decide and conflict
    assert errors("y[n, k] = x[n, k] if n < 1 else h[n, k]\n  output y")[0].startswith(
        "4:40: conflicting ranges for index 'k'")


def test_shadowed_index_in_a_reduction_is_another_index() -> None:
    # the inner `k` of sum(k) is not the outer output index
    m = compile_model("y[n, k] = (x[n, k] if k < 3 else h[n, k - 3]) + (sum(k) h[n, k])"
                      "\n  output y")
    assert computes(m)["y"].result.shape == (2, 7)
