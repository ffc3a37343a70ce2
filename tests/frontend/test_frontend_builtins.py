"""The builtins `zeros<[...]>`, `full<[...], v>` and `zeros_like(x)`."""

from __future__ import annotations

import numpy as np
import pytest

from nfc.diagnostics import CompileError
from nfc.frontend import compile_source
from nfc.interp import run
from nfc.verifier import verify


def errors(src: str) -> list[str]:
    with pytest.raises(CompileError) as ei:
        compile_source(src, "z.nf")
    return [f"{d.loc.line}:{d.loc.col}: {d.message}" for d in ei.value.diagnostics]


def test_zero_initial_state_without_explicit_ranges() -> None:
    src = """
model rnn(batch = 2, hidden = 3, steps = 2) {
  input x: f32[batch, hidden]
  h = zeros<[batch, hidden]>
  c = zeros_like(x)
  k = full<[hidden], 0.5>()
  for t in 0..steps { h = tanh(h + x * k) + c }
  output h
}
"""
    module = compile_source(src, "rnn.nf")
    verify(module)
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    (h,) = run(module.funcs[0], {"x": x})
    expect = np.zeros((2, 3), np.float32)
    for _ in range(2):
        expect = np.tanh(expect + x * np.float32(0.5))
    np.testing.assert_allclose(h, expect, rtol=1e-6)


def test_types_of_the_constants() -> None:
    src = """
op f(x: T[N]) -> (a: T[N], b: T[N], c: i32[2, N], d: T[N]) {
  a = zeros_like(x)
  b = T(zeros<[N]>)
  c = full<shape = [2, N], value = 7>
  d = x + full<[N], 1.5>
}
model m {
  input x: f64[3]
  a, b, c, d = f(x)
  z = zeros<[2, 2]>
  output a, b, c, d, z
}
"""
    module = compile_source(src, "t.nf")
    verify(module)
    f = module.funcs[0]
    assert [str(v.dtype) for v in f.ret.values] == ["f64", "f64", "i32", "f64", "f32"]
    a, b, c, d, z = run(f, {"x": np.arange(3.0)})
    np.testing.assert_array_equal(c, np.full((2, 3), 7))
    np.testing.assert_array_equal(d, np.arange(3.0) + 1.5)
    assert not a.any() and not b.any() and not z.any()


def test_builtin_misuse() -> None:
    src = """model m {
  input x: f32[2]
  a = zeros<[2, 0]>
  b = full<[2]>
  c = zeros<[2], 1.0>
  d = full<[2], [1]>
  f = zeros_like(x, x)
  g[i] = x[i] + zeros<[2]>
  output x
}
"""
    assert errors(src) == [
        "3:7: 'zeros' has size 0 in dimension 1; sizes must be positive",
        "4:7: 'full' needs its value: `full<[d0, d1, ...], value>`",
        "5:18: 'zeros' takes 1 compile-time argument: `zeros<[d0, d1, ...]>`",
        "6:17: the value of 'full' must be a number or a boolean, found [1]",
        "7:7: 'zeros_like' takes 1 argument but 2 were given",
        "8:17: 'zeros' works on whole tensors and cannot be called inside an element "
        "expression; assign its result first (`t = zeros(...)`) and index that",
    ]


def test_builtin_names_are_reserved() -> None:
    assert errors("op zeros(x: T[N]) -> T[N] {\n  y[i] = x[i]\n}\n") == [
        "1:1: op 'zeros' would hide the builtin of the same name"]
