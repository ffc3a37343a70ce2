"""`stop_gradient(v)` inside element expressions (comprehensions, reductions, guards, ranges
that depend on an outer index) and in tensor expressions, checked against finite differences.

The check: with `A * stop_gradient(A)` the loss has the value of `A * A`, but autodiff sees the
second factor as a constant, so the gradient is exactly half the gradient of `A * A`, which
central differences of the model without the stop give independently.
"""

from __future__ import annotations

import numpy as np
import pytest

from nfc.diagnostics import CompileError
from nfc.frontend import compile_source
from nfc.interp import run
from nfc.passes.autodiff.graph import grad_func

HEAD = """
model m {
  input  x: f64[3, 4]
  param  w: f64[4, 4] = normal(0.0, 0.5)
"""

#: name -> the body of a model whose loss is `loss`; `SG(...)` is stop_gradient or nothing
CASES = {
    # a map: one value per output element
    "map": "  y[n, j] = tanh(x[n, j] * w[j, j]) * SG(tanh(x[n, j] * w[j, j]))\n"
           "  loss = sum(n, j) y[n, j]\n",
    # a reduction inside the stopped value, and a map around it
    "reduction_inside": "  y[n, j] = (sum(k) x[n, k] * w[k, j]) * SG(sum(k) x[n, k] * w[k, j])\n"
                        "  loss = sum(n, j) y[n, j]\n",
    # the stop inside a reduction's body, over the reduction index too
    "in_reduction": "  loss = sum(n, k, j) x[n, k] * w[k, j] * SG(x[n, k] * w[k, j])\n",
    # under a guard: the stopped value reads w[i - 1], in bounds only where i > 0
    "guarded": "  y[i in 0..4, j] = (w[i - 1, j] * SG(w[i - 1, j]) if i > 0 else x[1, j])"
               " * x[0, j]\n  loss = sum(i, j) y[i, j]\n",
    # a reduction whose range depends on the outer index (a causal pattern)
    "dependent_range": "  y[i in 0..4] = sum(j in 0..i + 1) exp(w[i, j]) * SG(exp(w[i, j]))\n"
                       "  loss = sum(i) y[i]\n",
    # the whole-tensor builtin inside a tensor expression
    "tensor_expression": "  h = w * w\n  z = h * SG(h) + x[0, 0]\n"
                         "  loss = sum(i, j) z[i, j]\n",
}


def _source(body: str, stop: bool) -> str:
    body = body.replace("SG(", "stop_gradient(" if stop else "(")
    return HEAD + body + "  minimize loss with sgd(lr = 0.1)\n}\n"


def _loss(func, args) -> float:
    return float(run(func, dict(args))[0])


def _fd(func, args, name: str, eps: float = 1e-6) -> np.ndarray:
    out = np.zeros_like(args[name])
    for i in np.ndindex(out.shape):
        hi, lo = dict(args), dict(args)
        hi[name] = args[name].copy()
        lo[name] = args[name].copy()
        hi[name][i] += eps
        lo[name][i] -= eps
        out[i] = (_loss(func, hi) - _loss(func, lo)) / (2 * eps)
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_stop_gradient_halves_the_gradient_of_a_square(case):
    rng = np.random.default_rng(20261125)
    stopped = compile_source(_source(CASES[case], True), "m.nf").func("forward")
    plain = compile_source(_source(CASES[case], False), "m.nf").func("forward")
    marks = [op for op in stopped.body.ops if op.attrs.get("nf.stop_gradient") is True]
    assert marks, "no compute carries nf.stop_gradient"
    args = {a.name: rng.standard_normal(a.shape) for a in stopped.args}
    # the stop changes no value
    np.testing.assert_allclose(_loss(stopped, args), _loss(plain, args), rtol=1e-12)
    grad = grad_func(stopped, ["w"])
    sym = np.asarray(run(grad, dict(args))[1])
    want = 0.5 * _fd(plain, args, "w")
    assert np.abs(want).max() > 1e-3  # the check can fail: the gradient is not zero
    np.testing.assert_allclose(sym, want, rtol=1e-6, atol=1e-8)


def test_the_stopped_compute_keeps_the_guard():
    # the stopped value reads w[i - 1]: its own compute holds the guard i > 0 (else the
    # compiler's bounds check would refuse the access at i = 0)
    func = compile_source(_source(CASES["guarded"], True), "m.nf").func("forward")
    from nfc.ir import Select
    from nfc.printer import format_expr

    (op,) = [op for op in func.body.ops if op.attrs.get("nf.stop_gradient") is True]
    assert isinstance(op.body, Select) and format_expr(op.body.cond) == "i > 0", op.body


def test_values_without_a_gradient_are_left_alone():
    # an index, a constant and an integer tensor: nothing to stop, no extra compute
    src = HEAD + """  input  ids: i32[3]
  y[n, j in 0..4] = x[n, stop_gradient(j)] * stop_gradient(2.0) + f64(stop_gradient(ids[n]))
  loss = sum(n, j) y[n, j] * w[j, j]
  minimize loss with sgd(lr = 0.1)
}
"""
    func = compile_source(src, "m.nf").func("forward")
    assert not any(op.attrs.get("nf.stop_gradient") for op in func.body.ops)


@pytest.mark.parametrize(("call", "message"), [
    ("stop_gradient(x[n, j], w[j, j])", "'stop_gradient' takes 1 argument"),
    ("stop_gradient<p = 2>(x[n, j])", "'stop_gradient' takes no compile-time arguments"),
])
def test_misuse_is_a_located_error(call, message):
    src = HEAD + f"  y[n, j] = {call} * w[j, j]\n  loss = sum(n, j) y[n, j]\n" \
                 "  minimize loss with sgd(lr = 0.1)\n}\n"
    with pytest.raises(CompileError) as ei:
        compile_source(src, "m.nf")
    text = str(ei.value)
    assert message in text and "m.nf:5:" in text, text


def test_compiled_step_agrees_with_the_interpreter(tmp_path):
    # the stopped compute through the whole build (fusion included), in f64 against the
    # interpreter's step
    import nfc
    from nfc.passes.autodiff.train import add_training_functions
    from nfc.runtime.build import compile_model
    from nfc.testing import assert_close_f64

    src = _source(CASES["guarded"], True)
    path = tmp_path / "m.nf"
    path.write_text(src)
    lib = nfc.load(compile_model(path, str(tmp_path / "m.so"), use_cache=False).path)
    lib.init(seed=0)
    x = np.random.default_rng(3).standard_normal((3, 4))
    w0 = lib.params["w"].copy()
    lib.train_step(x=x)
    module = compile_source(src, "m.nf")
    add_training_functions(module)
    step = module.func("train_step")
    outs = run(step, {"x": x, "w": w0})
    want = dict(zip(step.attrs["nf.results"], outs, strict=True))["param:w"]
    moved = float(np.abs(want - w0).max())
    assert moved > 1e-3
    assert_close_f64(lib.params["w"], np.asarray(want), "param:w", scale=moved)


@pytest.mark.parametrize("use", ["t = stop_gradient<2>(x)", "t = exp<2>(x)",
                                 "t = linear_nobias + 1.0"])
def test_a_function_used_as_a_value_says_so(use):
    # `f<2>(x)` parses as comparisons (compile-time arguments go by name): the error names
    # the function instead of calling it an unknown name
    src = f"import std.nn\nmodel m {{\n  input x: f32[3]\n  {use}\n  output t\n}}\n"
    with pytest.raises(CompileError) as ei:
        compile_source(src, "m.nf")
    text = str(ei.value)
    name = use.split("= ")[1].split("<")[0].split(" ")[0]
    assert f"m.nf:4:7: error: '{name}' is a function, not a value" in text, text
    assert "unknown name" not in text
