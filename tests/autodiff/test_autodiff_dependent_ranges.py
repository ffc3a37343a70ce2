"""Reduction ranges that depend on enclosing indices (`sum(j in 0..i + 1)`): the range is the
hull over the enclosing index's range and the body is guarded, so values agree with numpy and
gradients with finite differences."""

from __future__ import annotations

import numpy as np
import pytest

from nfc.diagnostics import CompileError

SRC = """
model m {
  input x: f64[6]
  input s: f64[6, 6]
  input v: f64[6, 3]
  cum[i in 0..6] = sum(j in 0..i + 1) x[j]
  # causal attention: row i sees the keys 0..i, softmax stabilised by the causal max
  mx[i in 0..6] = max(j in 0..i + 1) s[i, j]
  e[i, j] = exp(s[i, j] - mx[i]) if j <= i else 0.0
  z[i in 0..6] = sum(j in 0..i + 1) e[i, j]
  o[i, d] = (sum(j in 0..i + 1) e[i, j] * v[j, d]) / z[i]
  # a window that starts at an enclosing index, and a range within the same head
  win[i in 0..6] = sum(j in i..min2) x[j] * x[j]
  up = sum(i, j in i..6) s[i, j]
  rev[i in 0..6] = min(j in 0..6 - i) x[i + j]
  output cum, o, win, up, rev
}
"""


def _src() -> str:
    return SRC.replace("min2", "6")


def _data(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {"x": rng.standard_normal(6), "s": rng.standard_normal((6, 6)),
            "v": rng.standard_normal((6, 3))}


def _numpy(x: np.ndarray, s: np.ndarray, v: np.ndarray) -> list[np.ndarray]:
    mask = np.tril(np.ones((6, 6), bool))
    sm = np.where(mask, s, -np.inf)
    p = np.exp(sm - sm.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    return [np.cumsum(x), p @ v, np.cumsum((x * x)[::-1])[::-1], np.triu(s).sum(),
            np.minimum.accumulate(x[::-1])[::-1]]


def test_values_match_numpy(rng):
    from nfc.frontend import compile_source
    from nfc.interp import run

    data = _data(rng)
    outs = run(compile_source(_src(), "m.nf").func("forward"), data)
    for got, want in zip(outs, _numpy(**data), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_the_body_is_guarded_over_the_hull():
    from nfc.frontend import compile_source
    from nfc.printer import print_module

    text = print_module(compile_source(_src(), "m.nf"))
    assert "%cum = nf.compute [i: 6] sum [j: 6] (select(j < i + 1, %x[j], 0.0))" in text
    assert "max [j: 6] (select(j < i + 1, %s[i, j], -inf))" in text
    assert "sum [i: 6, j: 6] (select(i <= j, %s[i, j], 0.0))" in text
    assert "min [j: 6] (select(j < 6 - i, %x[i + j], inf))" in text


def test_gradients_match_finite_differences(gradcheck, rng):
    from nfc.frontend import compile_source

    module = compile_source(_src(), "m.nf")
    f = module.func("forward")
    gradcheck(f, _data(rng), ["x", "s", "v"], module=module, elementwise=0)


def test_cumulative_sum_trains_through_the_guard(gradcheck, rng):
    """A cumulative sum inside a loss: d loss / d x[j] counts the prefixes holding j."""
    from nfc.frontend import compile_source
    from nfc.interp import run
    from nfc.passes.autodiff.graph import grad_func

    src = """
model m(n = 5) {
  input x: f64[n]
  c[i in 0..n] = sum(j in 0..i + 1) x[j]
  loss = sum(i) c[i]
  minimize loss with sgd(lr = 0.1)
}
"""
    f = compile_source(src, "m.nf").func("forward")
    x = rng.standard_normal(5)
    g = grad_func(f, ["x"], loss_index=0)
    np.testing.assert_allclose(run(g, {"x": x})[1], [5.0, 4.0, 3.0, 2.0, 1.0])
    gradcheck(f, {"x": x}, ["x"], results=[0])


@pytest.mark.parametrize("body,msg", [
    ("t[i in 0..4, j in 0..i + 1] = x[j]",
     "5:24: error: the range of output index 'j' depends on index 'i'; the ranges of output "
     "indices must be compile-time constants: give the whole range and guard the value, e.g. "
     "`t[i, j] = (... if j < i + 1 else 0.0)`"),
    ("t[i in 0..4] = sum(j in 0..4 // (i + 1)) x[j]",
     "error: a range bound that uses indices must be affine in them"),
    ("t[i in 0..4] = sum(j in i + 6..5) x[j]",
     "error: range of index 'j' is empty for every value of the indices its bounds use "
     "(at most 6..5)"),
    ("t[i in 0..4] = sum(j in 0..i + 2) x[j]",
     "error: access 'x' dimension 0 can reach 4 but the tensor has size 4"),
])
def test_errors(body, msg):
    from nfc.frontend import compile_source

    src = f"model m {{\n  input x: f64[4]\n\n\n  {body}\n  output t\n}}\n"
    with pytest.raises(CompileError) as err:
        compile_source(src, "m.nf")
    assert msg in str(err.value)
