"""One mistake, one message: a failed value silences the checks that depend on it; shapes
that are not multiples say so."""

from __future__ import annotations

import pytest

from nfc.diagnostics import CompileError
from nfc.frontend import compile_source

LN = """op ln(x: T[N, D], g: T[D]) -> T[N, D] {
  y[n, d] = x[n, d] * g[d]
}
"""


def errors(src: str) -> list[str]:
    with pytest.raises(CompileError) as ei:
        compile_source(src, "c.nf")
    return [f"{d.loc.line}:{d.loc.col}: {d.message}" for d in ei.value.diagnostics]


def test_reductions_over_a_failed_result_add_nothing() -> None:
    src = LN + """model m {
  input x: f32[2, 4]
  input g: f32[5]
  z = ln(x, g)
  s[n] = sum(d) z[n, d]
  t[j] = (sum(n) z[n, j]) + 1.0
  u = (sum(n, d) z[n, d]) / 2.0
  w = reshape<[8]>(z)
  output s, t, u, w
}
"""
    found = errors(src)
    assert len(found) == 1 and found[0].startswith("7:13: shape mismatch for argument 2")


def test_an_unknown_tensor_is_reported_instead_of_a_range() -> None:
    src = "model m {\n  input x: f32[2]\n  y[i] = sum(k) nothing[i, k]\n  output y\n}\n"
    assert errors(src) == ["3:17: unknown name 'nothing'"]


def test_independent_errors_are_still_reported() -> None:
    src = LN + """model m {
  input x: f32[2, 4]
  input g: f32[5]
  z = ln(x, g)
  s[n] = sum(d) z[n, d]
  q[i] = 1.0
  output s, q
}
"""
    found = errors(src)
    assert len(found) == 2
    assert found[1].startswith("9:5: cannot infer the range of index 'i'")


@pytest.mark.parametrize("sig,size,message", [
    ("x: T[G * g]", 5, "dimension 0 of argument 1 of 'f' has size 5, but parameter 'x' needs "
                      "G * g with g = 2: 5 is not a multiple of 2"),
    ("x: T[C * g * g]", 6, "dimension 0 of argument 1 of 'f' has size 6, but parameter 'x' "
                           "needs C * g * g with g = 2: 6 is not a multiple of 4"),
    ("x: T[2 * H + 1]", 6, "dimension 0 of argument 1 of 'f' has size 6, but parameter 'x' "
                           "needs 2 * H + 1: 6 - 1 is not a multiple of 2"),
])
def test_not_a_multiple(sig: str, size: int, message: str) -> None:
    src = f"""op f<g: int = 2>({sig}) -> T[] {{
  y[] = x[0]
}}
model m {{
  input a: f32[{size}]
  y = f(a)
  output y
}}
"""
    assert errors(src) == [f"6:9: {message}"]
