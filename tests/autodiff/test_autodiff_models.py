"""Gradient checks of recurrent cells and whole models written in .nf, and training runs."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest

from nfc.ir import DType, Func, TensorType

MODELS = Path(__file__).parent / "models"


def _types(arrays):
    return [TensorType(a.shape, DType.F64) for a in arrays]


CELLS = {
    "milstm_cell": [(2, 3), (2, 4), (2, 4), (3, 16), (4, 16), (16,), (16,), (16,), (16,)],
    "scrnn_cell": [(2, 3), (2, 4), (2, 5), (3, 5), (5, 4), (3, 4), (4, 4)],
    "sublstm_cell": [(2, 3), (2, 4), (2, 4), (7, 16), (16,)],
    "lltm_cell": [(2, 3), (2, 4), (2, 4), (7, 12), (12,)],
}


@pytest.mark.parametrize("name", sorted(CELLS))
def test_cell_gradients(gradcheck, rng, name):
    from nfc.frontend import compile_op

    arrays = [rng.standard_normal(s) * 0.7 for s in CELLS[name]]
    module = compile_op(MODELS / "cells.nf", name, _types(arrays))
    func = module.func(name)
    inputs = {a.name: x for a, x in zip(func.args, arrays, strict=True)}
    gradcheck(func, inputs, list(inputs), module=module, elementwise=0)


def init_value(spec: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """A parameter initial value from its `nf.init` text (test-side stand-in for the runtime)."""
    m = re.fullmatch(r"(\w+)(?:\((.*)\))?", spec.strip())
    assert m, spec
    kind, args = m.group(1), [float(a) for a in (m.group(2) or "").split(",") if a.strip()]
    if kind == "zeros":
        return np.zeros(shape)
    if kind == "ones":
        return np.ones(shape)
    if kind == "const":
        return np.full(shape, args[0])
    if kind == "normal":
        return rng.normal(args[0], args[1], shape)
    if kind == "uniform":
        return rng.uniform(args[0], args[1], shape)
    fan_in = math.prod(shape[1:]) if len(shape) > 1 else shape[0]
    if kind == "he_normal":
        return rng.normal(0.0, math.sqrt(2.0 / fan_in), shape)
    lim = math.sqrt(6.0 / (fan_in + shape[0]))
    return rng.uniform(-lim, lim, shape)


def model_inputs(func: Func, rng: np.random.Generator, data: dict[str, np.ndarray]
                 ) -> dict[str, np.ndarray]:
    """Values for every argument: `data` for inputs, initial values for the rest."""
    out = {}
    for a, attrs in zip(func.args, func.arg_attrs, strict=True):
        role = attrs.get("nf.role")
        if a.name in data:
            out[a.name] = data[a.name]
        elif role == "rng":
            out[a.name] = np.array([1234, 0], np.int64)
        else:
            out[a.name] = init_value(attrs.get("nf.init", "zeros"), a.shape, rng).astype(
                a.dtype.numpy)
    return out


def test_unrolled_rnn_gradient(gradcheck, rng):
    from nfc.frontend import compile_file

    module = compile_file(MODELS / "rnn4.nf")
    fwd = module.func("forward")
    data = {"xs": rng.standard_normal((4, 3, 2)), "y": np.array([0, 2, 1], np.int32)}
    inputs = model_inputs(fwd, rng, data)
    gradcheck(fwd, inputs, ["wx", "wh", "bh", "wo"], results=[0], elementwise=0)


def test_batch_norm_dropout_model_gradient(gradcheck, rng):
    from nfc.frontend import compile_file

    module = compile_file(MODELS / "bn_dropout.nf")
    fwd = module.func("forward")
    data = {"x": rng.standard_normal((4, 2, 5, 5)), "y": np.array([0, 2, 1, 1], np.int32)}
    inputs = model_inputs(fwd, rng, data)
    inputs["g"] = rng.uniform(0.5, 1.5, 3)
    inputs["b"] = rng.standard_normal(3) * 0.1
    # the mask is a forward value (philox of the rng argument): the same in both runs of the
    # finite differences and in the backward
    gradcheck(fwd, inputs, ["k", "g", "b", "w", "x"], results=[0], elementwise=0)


def test_batch_norm_dropout_training_graph(rng):
    from nfc.interp import run
    from nfc.passes.autodiff.train import build_training_module

    module = build_training_module(MODELS / "bn_dropout.nf")
    step, ev = module.func("train_step"), module.func("eval")
    assert not any("philox" in str(op.body) for op in ev.body.ops if hasattr(op, "body"))
    assert ev.attrs["nf.results"] == ["loss", "logits"]
    assert step.attrs["nf.results"][:4] == ["loss", "logits", "state:rm", "state:rv"]
    inplace = step.attrs["nf.inplace"]
    assert inplace["2"] == "rm" and inplace["3"] == "rv"
    data = {"x": rng.standard_normal((4, 2, 5, 5)), "y": np.array([0, 2, 1, 1], np.int32)}
    args = model_inputs(step, rng, data)
    outs = run(step, args)
    # running statistics: 0.9 * old + 0.1 * batch statistics of the conv output
    conv = module.func("forward")
    fargs = {a.name: args[a.name] for a in conv.args}
    probe = conv.clone("probe")
    mean_v = next(op.result for op in probe.body.ops if op.result.name == "mean")
    probe.ret.values = [mean_v]
    mean = run(probe, fargs)[0]
    np.testing.assert_allclose(outs[2], 0.9 * args["rm"] + 0.1 * mean, rtol=1e-12)
    # eval reads the running statistics and draws no random numbers
    eargs = {a.name: args[a.name] for a in ev.args}
    assert np.isfinite(run(ev, eargs)[0]).all()


def _digits_like(rng, n=64, d=12, classes=3):
    centers = rng.standard_normal((classes, d)) * 1.5
    y = rng.integers(0, classes, n).astype(np.int32)
    x = centers[y] + rng.standard_normal((n, d)) * 0.7
    return x, y


MLP = """
import std.nn
model mlp(batch = 64, features = 12, hidden = 16, classes = 3) {
  input  x: f64[batch, features]
  input  y: i32[batch]
  param  w1: f64[features, hidden] = normal(0.0, 0.3)
  param  b1: f64[hidden] = zeros
  param  w2: f64[hidden, classes] = normal(0.0, 0.3)
  param  b2: f64[classes] = zeros
  h = tanh(linear(x, w1, b1))
  logits = linear(h, w2, b2)
  loss = softmax_cross_entropy(logits, y)
  output logits
  minimize loss with OPT
}
"""


@pytest.mark.parametrize("opt", ["sgd(lr = 0.5, momentum = 0.9)", "adam(lr = 0.05)"])
def test_training_reduces_loss(rng, opt):
    from nfc.frontend import compile_source
    from nfc.interp import run
    from nfc.passes.autodiff.train import add_training_functions

    module = compile_source(MLP.replace("OPT", opt), "mlp.nf")
    add_training_functions(module)
    step = module.func("train_step")
    x, y = _digits_like(rng)
    args = model_inputs(step, rng, {"x": x, "y": y})
    inplace = {int(k): v for k, v in step.attrs["nf.inplace"].items()}
    losses = []
    for _ in range(150):
        outs = run(step, args)
        losses.append(float(outs[0]))
        for i, name in inplace.items():
            args[name] = outs[i]
    assert losses[-1] < 0.2 * losses[0], losses[::15]
    logits = run(module.func("eval"), {a.name: args[a.name] for a in
                                      module.func("eval").args})[1]
    assert np.mean(np.argmax(logits, 1) == y) > 0.9


def test_training_step_matches_torch(rng):
    torch = pytest.importorskip("torch")
    from nfc.frontend import compile_source
    from nfc.interp import run
    from nfc.passes.autodiff.train import add_training_functions

    module = compile_source(MLP.replace("OPT", "adam(lr = 0.01, weight_decay = 0.01)"),
                            "mlp.nf")
    add_training_functions(module)
    step = module.func("train_step")
    x, y = _digits_like(rng)
    args = model_inputs(step, rng, {"x": x, "y": y})
    names = ["w1", "b1", "w2", "b2"]
    tp = {n: torch.tensor(args[n], requires_grad=True) for n in names}
    opt = torch.optim.Adam(list(tp.values()), lr=0.01, weight_decay=0.01)
    inplace = {int(k): v for k, v in step.attrs["nf.inplace"].items()}
    for _ in range(3):
        outs = run(step, args)
        opt.zero_grad()
        h = torch.tanh(torch.tensor(x) @ tp["w1"] + tp["b1"])
        loss = torch.nn.functional.cross_entropy(h @ tp["w2"] + tp["b2"],
                                                 torch.tensor(y, dtype=torch.long))
        loss.backward()
        opt.step()
        np.testing.assert_allclose(outs[0], loss.item(), rtol=1e-5)
        for i, name in inplace.items():
            args[name] = outs[i]
        for n in names:
            np.testing.assert_allclose(args[n], tp[n].detach().numpy(), rtol=1e-5, atol=1e-8)


def test_opt_cli_prints_training_graph(tmp_path, capsys):
    from nfc.cli import main

    src = tmp_path / "mlp.nf"
    src.write_text(MLP.replace("OPT", "sgd(lr = 0.1)"))
    assert main(["opt", str(src), "--pass=autodiff", "--no-locs"]) == 0
    out = capsys.readouterr().out
    assert "nf.func @train_step" in out and "nf.func @eval" in out
    assert 'nf.inplace = {"2" = "w1", "3" = "b1", "4" = "w2", "5" = "b2"}' in out
    assert out.count('{nf.phase = "update"}') == 4


def test_autodiff_pass_is_registered():
    from nfc.passmanager import get_pass

    cls = get_pass("autodiff")
    assert cls.name == "autodiff" and cls.__name__ == "Autodiff"


RESHAPES = """
import std.nn
model rs(batch = 2) {
  input  x: f64[batch, 12]
  param  w: f64[12, 12] = normal(0.0, 0.5)
  h = matmul(x, w)
  r = reshape<[batch, 3, 2, 2]>(h)
  t = transpose<[0, 2, 3, 1]>(r)
  f = reshape<[batch * 4, 3]>(t)
  loss[] = sum(i in 0..8, j in 0..3) f[i, j] * f[i, j] * f[i, j]
  minimize loss with sgd(lr = 0.1)
}
"""


def test_reshape_transpose_builtins_invert_to_pure_gathers(gradcheck, rng):
    from nfc.frontend import compile_source
    from nfc.passes.autodiff.graph import reverse_mode

    module = compile_source(RESHAPES, "rs.nf")
    fwd = module.func("forward")
    ops, _ = reverse_mode(fwd, fwd.ret.values[0], [fwd.arg("w")])
    # reshape and transpose gradients: no reduction axes, no guards
    gathers = [op for op in ops if op.result.name in ("d_t", "d_r", "d_y")]
    assert len(gathers) == 3
    assert all(op.reduce is None and "select" not in str(op.body) for op in gathers)
    inputs = {"x": rng.standard_normal((2, 12)), "w": rng.standard_normal((12, 12)) * 0.5}
    gradcheck(fwd, inputs, ["w", "x"], results=[0], elementwise=0)
