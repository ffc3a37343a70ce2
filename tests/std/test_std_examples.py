"""Every examples/*.nf model compiles and runs forward through the interpreter."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from nfc.ir import Func

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

# (file, params shrinking the batch, expected logits shape)
CASES = [
    ("mlp.nf", {"batch": 4}, (4, 10)),
    ("mlp.nf", {"batch": 3, "inputs": 64, "hidden1": 128, "hidden2": 64}, (3, 10)),
    ("mlp_digits.nf", {"batch": 4}, (4, 10)),
    ("lenet5.nf", {"batch": 2}, (2, 10)),
    ("capsule.nf", {"batch": 2}, (2, 10)),
    ("shufflenet_unit.nf", {"batch": 2}, (2, 10)),
    ("lstm_cell.nf", {"batch": 3}, (3, 4)),
    ("milstm.nf", {"batch": 3}, (3, 4)),
    ("resnet_block.nf", {"batch": 2}, (2, 10)),
]


def make_inputs(func: Func, rng: np.random.Generator) -> list[np.ndarray]:
    """Plausible arguments by role: labels 0/1, small params, positive states."""
    out = []
    for arg, attrs in zip(func.args, func.arg_attrs, strict=True):
        role = attrs.get("nf.role")
        dt = arg.dtype.numpy
        if role == "rng":
            out.append(np.array([7, 0], dtype=dt))
        elif arg.dtype.is_int:
            out.append(rng.integers(0, 2, size=arg.shape).astype(dt))
        elif role == "param":
            out.append((0.1 * rng.standard_normal(arg.shape)).astype(dt))
        elif role == "state":
            out.append((0.5 + rng.random(arg.shape)).astype(dt))
        else:
            out.append(rng.standard_normal(arg.shape).astype(dt))
    return out


def run_forward(path: Path, params: dict, training: bool, seed: int = 0):
    from nfc.frontend import compile_file
    from nfc.interp import run
    from nfc.verifier import verify
    module = compile_file(str(path), params=params, training=training)
    verify(module)
    func = module.func("forward")
    inputs = make_inputs(func, np.random.default_rng(seed))
    results = run(func, inputs, module=module)
    names = func.attrs.get("nf.results", [])
    return module, func, inputs, dict(zip(names, results, strict=True))


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("name,params,logits_shape", CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_example_runs_forward(name, params, logits_shape, training):
    _, func, _, res = run_forward(EXAMPLES / name, params, training)
    assert "loss" in res
    assert np.asarray(res["loss"]).shape == ()
    logits = [v for k, v in res.items() if k not in ("loss",) and not k.startswith("state:")]
    assert len(logits) == 1 and np.asarray(logits[0]).shape == logits_shape
    for key, value in res.items():
        assert np.isfinite(value).all(), f"{name}: result {key} is not finite"
        assert value.dtype == np.float32, f"{name}: result {key} is {value.dtype}"


@pytest.mark.parametrize("name", sorted({c[0] for c in CASES}))
def test_example_compiles_at_full_size(name):
    from nfc.frontend import compile_file
    from nfc.verifier import verify
    module = compile_file(str(EXAMPLES / name))
    verify(module)
    assert module.attrs["nf.loss"] == "loss" and "nf.optimizer" in module.attrs


def test_every_example_is_tested():
    assert {p.name for p in EXAMPLES.glob("*.nf")} == {c[0] for c in CASES}


def test_mlp_loss_matches_numpy():
    _, func, inputs, res = run_forward(EXAMPLES / "mlp.nf", {"batch": 5}, True, seed=3)
    a = {arg.name: v.astype(np.float64) for arg, v in zip(func.args, inputs, strict=True)}
    h1 = np.maximum(a["x"] @ a["w1"] + a["b1"], 0)
    h2 = np.maximum(h1 @ a["w2"] + a["b2"], 0)
    logits = h2 @ a["w3"] + a["b3"]
    ex = np.exp(logits - logits.max(1, keepdims=True))
    lp = np.log(ex / ex.sum(1, keepdims=True))
    labels = a["y"].astype(int)
    loss = -lp[np.arange(5), labels].mean()
    np.testing.assert_allclose(res["loss"], loss, rtol=1e-4)
    np.testing.assert_allclose(res["logits"], logits, rtol=1e-4, atol=1e-5)


def test_batch_norm_models_update_running_stats_only_in_training():
    for name in ("shufflenet_unit.nf", "resnet_block.nf"):
        _, _, _, train = run_forward(EXAMPLES / name, {"batch": 2}, True)
        _, _, _, infer = run_forward(EXAMPLES / name, {"batch": 2}, False)
        assert any(k.startswith("state:") for k in train), name
        assert not any(k.startswith("state:") for k in infer), name


@pytest.mark.parametrize("name,params", [(c[0], c[1]) for c in CASES],
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_example_differentiates(name, params):
    graph = pytest.importorskip("nfc.passes.autodiff.graph")
    from nfc.frontend import compile_file
    from nfc.interp import run
    module = compile_file(str(EXAMPLES / name), params=params)
    func = module.func("forward")
    wrt = [a.name for a, at in zip(func.args, func.arg_attrs, strict=True)
           if at.get("nf.role") == "param"]
    grad = graph.grad_func(func, wrt, loss_index=func.attrs["nf.results"].index("loss"))
    results = run(grad, make_inputs(func, np.random.default_rng(0)), module=module)
    for pname, g in zip(wrt, results[1:], strict=True):
        assert g.shape == func.arg(pname).shape
        assert np.isfinite(g).all() and np.abs(g).max() > 0, f"{name}: d loss / d {pname}"
