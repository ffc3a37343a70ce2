"""The four passes through the registry and the pass manager, on frontend output."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from passes_testlib import random_inputs, run_func, text

from nfc.frontend import compile_file, compile_source
from nfc.ir import ComputeOp, Module
from nfc.passes.canonicalize import Canonicalize
from nfc.passes.cse import CSE
from nfc.passes.dce import DCE
from nfc.passes.inline import Inline
from nfc.passmanager import PassManager, get_pass

EXAMPLES = Path(__file__).parents[2] / "examples"
PIPELINE = ("inline", "canonicalize", "cse", "dce")


def run_pipeline(module: Module, names: tuple[str, ...] = PIPELINE) -> Module:
    return PassManager([get_pass(n)() for n in names]).run(module)


def same_numbers(before: Module, after: Module) -> None:
    inputs = random_inputs(before.func("forward"), 3)
    want = run_func(before, "forward", inputs)
    got = run_func(after, "forward", inputs)
    for w, g in zip(want, got, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_registered_with_their_options() -> None:
    assert get_pass("inline") is Inline and get_pass("canonicalize") is Canonicalize
    assert get_pass("cse") is CSE and get_pass("dce") is DCE
    assert [o.name for o in Inline.options()] == ["keep_funcs"]
    assert [o.name for o in Canonicalize.options()] == ["fast"]
    assert Inline.from_options({"keep-funcs": "true"}) == Inline(keep_funcs=True)
    for cls in (Inline, Canonicalize, CSE, DCE):
        assert cls.summary() and "Before:" in (cls.__doc__ or "")


SOURCE = """
op pad<p: int>(x: T[N, H]) -> T[N, H + 2*p] {
  y[n, h] = x[n, h - p] if p <= h < H + p else 0.0
}
op scale(x: T[N, H]) -> T[N, H] {
  y[n, h] = x[n, h] * 1.0 - 0.0 * 2.0
}
model m(batch = 4) {
  input  x: f32[batch, 12]
  param  w: f32[12, 12] = normal(0.0, 0.1)
  a = pad<p=0>(scale(x))
  f = reshape<[batch * 12]>(a)
  g = reshape<[batch, 12]>(f)
  t = transpose<[1, 0]>(transpose<[1, 0]>(g))
  h1[n, j] = sum(k) t[n, k] * w[k, j]
  h2[n, j] = sum(k) g[n, k] * w[k, j]
  out[n, j] = h1[n, j] - h2[n, j] + tanh(h1[n, j])
  output out
}
"""


def test_pipeline_on_frontend_output() -> None:
    before = compile_source(SOURCE, "m.nf", training=False)
    after = run_pipeline(compile_source(SOURCE, "m.nf", training=False))
    same_numbers(before, after)
    cs = [op for op in after.func("forward").walk() if isinstance(op, ComputeOp)]
    printed = text(after)
    # the pad by 0 and the x*1 scale become copies of %x and go, h1 and h2 merge; the two
    # reshapes stay (composing them means inlining a producer: fusion's job)
    assert "select" not in printed and "* 1.0" not in printed
    assert len([c for c in cs if c.reduce == "sum"]) == 1
    assert [c.result.name for c in cs] == ["f", "g", "h1", "out"], printed
    assert cs[0].body.tensor is after.func("forward").args[0]  # type: ignore[attr-defined]


def test_pipeline_is_idempotent() -> None:
    once = run_pipeline(compile_source(SOURCE, "m.nf", training=False))
    printed = text(once)
    assert text(run_pipeline(once, ("canonicalize", "cse", "dce"))) == printed


@pytest.mark.parametrize("name", ["mlp", "shufflenet_unit", "resnet_block"])
def test_pipeline_on_examples(name: str) -> None:
    path = EXAMPLES / f"{name}.nf"
    if not path.exists():
        pytest.skip(f"{path} is not there")
    before = compile_file(path, params={"batch": 2}) if name == "mlp" else compile_file(path)
    after = run_pipeline(compile_file(path, params={"batch": 2}) if name == "mlp"
                         else compile_file(path))
    same_numbers(before, after)
    printed = text(after)
    assert text(run_pipeline(after, ("canonicalize", "cse", "dce"))) == printed
