"""Optimizer updates of @train_step checked against numpy versions of PyTorch's formulas."""

from __future__ import annotations

import numpy as np
import pytest

from nfc.diagnostics import CompileError
from nfc.ir import Func

_MODEL = """
nf.module @q attributes {{nf.loss = "loss", nf.optimizer = {opt}}} {{
  nf.func @forward(%x: tensor<3xf64> {{nf.role = "input"}},
                   %w: tensor<3xf64> {{nf.role = "param", nf.init = "zeros"}},
                   %b: tensor<f64> {{nf.role = "param", nf.init = "zeros"}},
                   %k: tensor<3xf64> {{nf.role = "param", nf.init = "ones", nf.trainable = false}})
      -> (tensor<f64>, tensor<3xf64>) attributes {{nf.results = ["loss", "d"]}} {{
    %d = nf.compute [i: 3] (%w[i] * %k[i] + %b[] - %x[i]) : tensor<3xf64>
    %l = nf.compute [] sum [i: 3] (%d[i] * %d[i] * %d[i] * %d[i]) : tensor<f64>
    nf.return %l, %d : tensor<f64>, tensor<3xf64>
  }}
}}
"""


def run_steps(step: Func, args: dict[str, np.ndarray], n: int) -> list[dict[str, np.ndarray]]:
    """Run `step` n times, writing in-place results back into their arguments (as the
    runtime does); the argument values after each step."""
    from nfc.interp import run

    inplace = {int(k): v for k, v in step.attrs["nf.inplace"].items()}
    history = []
    args = dict(args)
    for _ in range(n):
        outs = run(step, args)
        for i, name in inplace.items():
            args[name] = np.asarray(outs[i])
        history.append(dict(args))
    return history


def _init(step: Func, given: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    args = dict(given)
    for a, attrs in zip(step.args, step.arg_attrs, strict=True):
        if a.name not in args:
            assert attrs["nf.role"] == "opt_state" and attrs["nf.init"] == "zeros"
            args[a.name] = np.zeros(a.shape, a.dtype.numpy)
    return args


def _reference(opt: dict, x: np.ndarray, w: np.ndarray, b: float, steps: int) -> list:
    """(w, b) after each step, PyTorch semantics."""
    lr = opt["lr"]
    wd = opt.get("weight_decay", 0.0 if opt["name"] != "adamw" else 0.01)
    params = [w.copy(), np.array(b)]
    bufs = [np.zeros_like(p) for p in params]
    m = [np.zeros_like(p) for p in params]
    v = [np.zeros_like(p) for p in params]
    out = []
    for t in range(1, steps + 1):
        d = params[0] + params[1] - x
        grads = [4 * d**3, np.array(np.sum(4 * d**3))]
        if opt.get("clip_norm"):
            total = np.sqrt(sum(np.sum(g * g) for g in grads))
            coef = min(1.0, opt["clip_norm"] / (total + 1e-6))
            grads = [g * coef for g in grads]
        for i, (p, g) in enumerate(zip(params, grads, strict=True)):
            if opt["name"] == "sgd":
                g = g + wd * p
                if opt.get("momentum", 0.0):
                    bufs[i] = opt["momentum"] * bufs[i] + (1 - opt.get("dampening", 0.0)) * g
                    g = g + opt["momentum"] * bufs[i] if opt.get("nesterov") else bufs[i]
                params[i] = p - lr * g
            else:
                b1, b2, eps = opt.get("beta1", 0.9), opt.get("beta2", 0.999), opt.get("eps", 1e-8)
                if opt["name"] == "adamw":
                    p = p * (1 - lr * wd)
                else:
                    g = g + wd * p
                m[i] = b1 * m[i] + (1 - b1) * g
                v[i] = b2 * v[i] + (1 - b2) * g * g
                mhat = m[i] / (1 - b1**t)
                vhat = v[i] / (1 - b2**t)
                params[i] = p - lr * mhat / (np.sqrt(vhat) + eps)
        out.append((params[0].copy(), float(params[1])))
    return out


def _attr(opt: dict) -> str:
    def fmt(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return f'"{v}"'
        return repr(float(v))
    return "{" + ", ".join(f"{k} = {fmt(v)}" for k, v in opt.items()) + "}"


OPTIMIZERS = [
    {"name": "sgd", "lr": 0.01},
    {"name": "sgd", "lr": 0.01, "momentum": 0.9, "weight_decay": 0.05},
    {"name": "sgd", "lr": 0.01, "momentum": 0.8, "nesterov": True},
    {"name": "sgd", "lr": 0.01, "momentum": 0.9, "dampening": 0.3, "clip_norm": 0.7},
    {"name": "adam", "lr": 0.05},
    {"name": "adam", "lr": 0.05, "beta1": 0.8, "beta2": 0.99, "eps": 1e-6,
     "weight_decay": 0.1},
    {"name": "adamw", "lr": 0.05, "weight_decay": 0.2},
    {"name": "adamw", "lr": 0.05, "clip_norm": 1.0},
]


@pytest.mark.parametrize("opt", OPTIMIZERS, ids=lambda o: "-".join(
    f"{k}{v}" for k, v in o.items() if k != "lr"))
def test_optimizer_matches_numpy(parse, opt):
    from nfc.passes.autodiff.train import build_train_step

    module = parse(_MODEL.format(opt=_attr(opt)))
    step = build_train_step(module)
    x = np.array([0.3, -0.7, 1.1])
    w0 = np.array([0.5, 0.2, -0.4])
    args = _init(step, {"x": x, "w": w0, "b": np.array(0.1), "k": np.ones(3)})
    hist = run_steps(step, args, 6)
    ref = _reference(opt, x, w0, 0.1, 6)
    for got, (w, b) in zip(hist, ref, strict=True):
        np.testing.assert_allclose(got["w"], w, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(got["b"], b, rtol=1e-12, atol=1e-14)
        np.testing.assert_array_equal(got["k"], np.ones(3))  # not trainable
    if opt["name"] != "sgd":
        assert int(hist[-1]["step"]) == 6


def test_train_step_layout(parse):
    from nfc.passes.autodiff.train import build_train_step

    module = parse(_MODEL.format(opt=_attr({"name": "sgd", "lr": 0.1, "momentum": 0.9})))
    step = build_train_step(module)
    assert step.attrs["nf.results"] == ["loss", "d", "param:w", "param:b", "opt_state:w_mom",
                                        "opt_state:b_mom"]
    assert step.attrs["nf.inplace"] == {"2": "w", "3": "b", "4": "w_mom", "5": "b_mom"}
    roles = {a.name: attrs["nf.role"] for a, attrs in zip(step.args, step.arg_attrs,
                                                          strict=True)}
    assert roles == {"x": "input", "w": "param", "b": "param", "k": "param",
                     "w_mom": "opt_state", "b_mom": "opt_state"}


@pytest.mark.parametrize("opt,msg", [
    ({"name": "rmsprop", "lr": 0.1}, "unknown optimizer 'rmsprop'"),
    ({"name": "sgd", "lr": 0.1, "beta1": 0.9}, "optimizer 'sgd' has no option 'beta1'"),
    ({"name": "sgd", "momentum": 0.9}, "needs a learning rate"),
    ({"name": "sgd", "lr": 0.1, "nesterov": True}, "nesterov momentum needs momentum > 0"),
])
def test_bad_optimizer_is_a_diagnostic(parse, opt, msg):
    from nfc.passes.autodiff.train import build_train_step

    module = parse(_MODEL.format(opt=_attr(opt)))
    with pytest.raises(CompileError, match=msg):
        build_train_step(module)


def test_missing_loss_is_a_diagnostic(parse):
    from nfc.passes.autodiff.train import build_train_step

    text = _MODEL.format(opt=_attr({"name": "sgd", "lr": 0.1})).replace(
        'nf.loss = "loss", ', "")
    with pytest.raises(CompileError, match="has no nf.loss"):
        build_train_step(parse(text))
