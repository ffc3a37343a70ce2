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


FAILED_LAST = """op f(x: T[N, D], w: T[D, H]) -> T[N, D] {
  y[n, h] = sum(d) x[n, d] * w[d, h]
  z[n, d] = (sum(j) y[n, j] * x[n, j]) + x[n, d]
}

model m {
  input x: f64[3, 5]
  param w: f64[5, 20] = zeros
  o = f(x, w)
  q = o * 2.0
  output q
}
"""


def test_a_failed_last_statement_does_not_blame_an_earlier_one() -> None:
    # the last statement fails; `y` (valid, of another shape) is not taken for the result
    # and blamed with "result of 'f' is f64[3, 20] but the op declares T[N, D]"
    assert errors(FAILED_LAST) == [
        "3:36: conflicting ranges for index 'j': 'y' dimension 1 has size 20 but 'x' "
        "dimension 1 has size 5"]


def test_a_wrong_result_is_still_reported_when_the_body_is_valid() -> None:
    # a valid last statement of the wrong shape is the op's error, reported once
    src = FAILED_LAST.replace("  z[n, d] = (sum(j) y[n, j] * x[n, j]) + x[n, d]\n",
                              "  t = transpose<[1, 0]>(x)\n")
    assert errors(src) == ["3:3: cannot broadcast shapes [5, 3] and [3, 5] in the result"]
