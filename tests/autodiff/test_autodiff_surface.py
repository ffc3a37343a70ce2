"""`param ... frozen`, `stop_gradient(x)` and `input ... grad`: the surface syntax of the
autodiff attributes, checked end to end through the interpreter and finite differences."""

from __future__ import annotations

import numpy as np
import pytest

from nfc.diagnostics import CompileError
from nfc.frontend import compile_source
from nfc.interp import run
from nfc.passes.autodiff.train import add_training_functions

MODEL = """
model m(batch = 4) {
  input  x: f64[batch, 3] XFLAG
  input  y: f64[batch, 2]
  param  w: f64[3, 2] = normal(0.0, 0.5) WFLAG
  param  v: f64[2, 2] = normal(0.0, 0.5)
  h[n, j] = sum(k) x[n, k] * w[k, j]
  BODY
  p[n, j] = sum(k) tanh(g[n, k]) * v[k, j]
  loss = (sum(n, j) (p[n, j] - y[n, j]) * (p[n, j] - y[n, j])) / batch
  minimize loss with sgd(lr = 0.1)
}
"""


def _module(xflag="", wflag="", body="g = h"):
    src = MODEL.replace("XFLAG", xflag).replace("WFLAG", wflag).replace("BODY", body)
    module = compile_source(src, "m.nf")
    add_training_functions(module)
    return module


def _args(func, rng):
    return {a.name: rng.standard_normal(a.shape) for a in func.args}


def _loss(module, args):
    fwd = module.func("forward")
    return float(run(fwd, {a.name: args[a.name] for a in fwd.args})[0])


def _fd(module, args, name, eps=1e-6):
    out = np.zeros_like(args[name])
    for i in np.ndindex(out.shape):
        hi, lo = dict(args), dict(args)
        hi[name] = args[name].copy()
        lo[name] = args[name].copy()
        hi[name][i] += eps
        lo[name][i] -= eps
        out[i] = (_loss(module, hi) - _loss(module, lo)) / (2 * eps)
    return out


def _step(module, args):
    step = module.func("train_step")
    outs = run(step, {a.name: args[a.name] for a in step.args})
    return dict(zip(step.attrs["nf.results"], outs, strict=True))


def test_frozen_param_is_not_updated(rng):
    module = _module(wflag="frozen")
    fwd = module.func("forward")
    attrs = dict(zip([a.name for a in fwd.args], fwd.arg_attrs, strict=True))
    assert attrs["w"]["nf.trainable"] is False and attrs["v"]["nf.trainable"] is True
    args = _args(fwd, rng)
    res = _step(module, args)
    assert "param:w" not in res
    # v moves by exactly -lr times its finite-difference gradient
    np.testing.assert_allclose(res["param:v"], args["v"] - 0.1 * _fd(module, args, "v"),
                               rtol=1e-6, atol=1e-8)
    assert not np.allclose(res["param:v"], args["v"])


def test_unfrozen_param_is_updated(rng):
    res = _step(_module(), _args(_module().func("forward"), rng))
    assert "param:w" in res and "param:v" in res


def test_stop_gradient_blocks_its_operand(rng):
    # g = stop_gradient(h) cuts the only path from w to the loss: w gets a zero gradient
    # (it stays put) and v's gradient still matches finite differences
    module = _module(body="g = stop_gradient(h)")
    assert any(op.attrs.get("nf.stop_gradient") is True
               for op in module.func("forward").body.ops)
    args = _args(module.func("forward"), rng)
    res = _step(module, args)
    np.testing.assert_array_equal(res["param:w"], args["w"])
    np.testing.assert_allclose(res["param:v"], args["v"] - 0.1 * _fd(module, args, "v"),
                               rtol=1e-6, atol=1e-8)


def test_stop_gradient_of_one_term(rng):
    # g = h + stop_gradient(h): the gradient of w is half what it would be without the stop
    module = _module(body="g = h + stop_gradient(h)")
    plain = _module(body="g = h + h")
    args = _args(module.func("forward"), rng)
    np.testing.assert_allclose(_loss(module, args), _loss(plain, args))
    dw = (args["w"] - _step(module, args)["param:w"]) / 0.1
    np.testing.assert_allclose(dw, 0.5 * _fd(plain, args, "w"), rtol=1e-6, atol=1e-8)


def test_input_gradient_matches_finite_differences(rng):
    module = _module(xflag="grad")
    args = _args(module.func("forward"), rng)
    res = _step(module, args)
    np.testing.assert_allclose(res["grad:x"], _fd(module, args, "x"), rtol=1e-6, atol=1e-8)
    assert not any(n.startswith("grad:y") for n in res)
    # the gradient is a result, not written back in place
    step = module.func("train_step")
    names = step.attrs["nf.results"]
    assert str(names.index("grad:x")) not in step.attrs["nf.inplace"]


def test_flags_are_names_elsewhere():
    # `frozen` and `grad` stay ordinary names outside the end of a declaration
    src = MODEL.replace("XFLAG", "").replace("WFLAG", "").replace(
        "BODY", "grad = h\n  frozen = grad * 2.0\n  g = frozen")
    compile_source(src, "m.nf")


@pytest.mark.parametrize(("xflag", "wflag", "message", "col"), [
    ("frozen", "", "'frozen' applies only to param declarations, not to an input", 27),
    ("", "grad", "'grad' applies only to input declarations, not to a param", 42),
])
def test_misplaced_flag_is_a_located_error(xflag, wflag, message, col):
    src = MODEL.replace("XFLAG", xflag).replace("WFLAG", wflag).replace("BODY", "g = h")
    with pytest.raises(CompileError) as ei:
        compile_source(src, "m.nf")
    text = str(ei.value)
    assert message in text, text
    assert f"m.nf:{3 if xflag else 5}:{col}: error:" in text, text


def test_integer_input_has_no_gradient():
    src = "model m { input ids: i32[4] grad\n param w: f32[4] = zeros\n" \
          " l = sum(i) w[i] * f32(ids[i])\n minimize l with sgd(lr = 0.1) }"
    with pytest.raises(CompileError, match="input 'ids' is i32: only a float input"):
        compile_source(src, "m.nf")


def test_input_gradients_with_every_param_frozen(rng):
    # a fixed network and the gradient of its input only (saliency, adversarial examples)
    src = MODEL.replace("XFLAG", "grad").replace("WFLAG", "frozen").replace("BODY", "g = h")
    src = src.replace("normal(0.0, 0.5)\n  h", "normal(0.0, 0.5) frozen\n  h")
    module = compile_source(src, "m.nf")
    add_training_functions(module)
    args = _args(module.func("forward"), rng)
    res = _step(module, args)
    assert not any(n.startswith("param:") for n in res)
    np.testing.assert_allclose(res["grad:x"], _fd(module, args, "x"), rtol=1e-6, atol=1e-8)


COMPILED = """
model m(batch = 4) {
  input  x: f32[batch, 3] grad
  param  w: f32[3, 2] = normal(0.0, 0.5) frozen
  param  v: f32[2, 2] = normal(0.0, 0.5)
  h[n, j] = sum(k) x[n, k] * w[k, j]
  g = stop_gradient(h) + h
  p[n, j] = sum(k) tanh(g[n, k]) * v[k, j]
  loss = (sum(n, j) p[n, j] * p[n, j]) / batch
  minimize loss with sgd(lr = 0.1)
}
"""


def test_the_compiled_step_agrees_with_the_interpreter(tmp_path, rng):
    import nfc
    from nfc.runtime.build import compile_model

    src = tmp_path / "m.nf"
    src.write_text(COMPILED)
    lib = nfc.load(compile_model(src, str(tmp_path / "m.so"), use_cache=False).path)
    lib.init(seed=0)
    x = rng.standard_normal((4, 3)).astype(np.float32)
    args = {"x": x, **{k: v.copy() for k, v in lib.params.items()}}
    out = lib.train_step(x=x)
    np.testing.assert_array_equal(lib.params["w"], args["w"])  # frozen
    module = compile_source(COMPILED, "m.nf")
    add_training_functions(module)
    want = _step(module, args)
    np.testing.assert_allclose(out["grad:x"], want["grad:x"], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(lib.params["v"], want["param:v"], rtol=1e-4, atol=1e-6)


def test_a_flag_before_a_closing_brace():
    src = ("model m { input x: f64[3] grad\n param w: f64[3] = ones frozen\n"
           " l = sum(i) x[i] * w[i]\n minimize l with sgd(lr = 0.1) }")
    f = compile_source(src, "m.nf").func("forward")
    assert f.arg_attrs[0]["nf.grad"] is True and f.arg_attrs[1]["nf.trainable"] is False
    # a flag that is not last on its line is a syntax error, not silently a name
    with pytest.raises(CompileError, match=r"m.nf:1:\d+: error: unexpected"):
        compile_source(src.replace("grad\n", "grad param v: f64[3] = ones\n"), "m.nf")
