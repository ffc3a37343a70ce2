"""The `layout` pass: convolution activations stored NCHW[c]c, the layout propagated through
elementwise ops and reductions, parameters stored blocked (weight pre-transformation).

Checked: the blocked forward of every convolutional example model against the interpreter
(within the float32 error bound of the unblocked forward); three SGD-with-momentum and Adam
steps with and without the pass in float64 (every parameter and optimizer state by name);
the native artifact: the same initial values by name, the logical shapes outside, its train
steps against the interpreter, checkpoints moving between the two builds; the options."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from laid_out_lib import check_laid_out_build

from nfc.blocked import is_blocked, pack, unpack
from nfc.codegen.artifact.initgen import reference_init, reference_init_layout
from nfc.diagnostics import CompileError
from nfc.interp import run
from nfc.ir import Func, Module
from nfc.runtime.build import build_module, load_model
from nfc.testing import (
    as_f64,
    assert_close_f64,
    assert_within_bounds,
    run_bounded,
    widen,
)

ROOT = Path(__file__).resolve().parents[2]
EX = ROOT / "examples"
PLAIN = "im2col,training-functions,inline,canonicalize,cse,dce"
LAID = "layout{block=8}," + PLAIN

#: Every convolutional example model, at sizes the interpreter runs in a second or two.
MODELS = [
    ("lenet5.nf", {"batch": 2}),
    ("resnet_block.nf", {"batch": 2}),
    ("shufflenet_unit.nf", {"batch": 2}),
    ("capsule.nf", {"batch": 2}),
    ("models/mobilenet.nf", {"batch": 2, "image": 8, "width": 8}),
    ("models/squeezenet.nf", {"batch": 2, "image": 16}),
    ("models/resnet18.nf", {"batch": 2, "image": 8, "width": 8}),
    ("models/capsnet.nf", {"batch": 2, "image": 12, "kernel": 3, "channels": 16, "types": 2,
                           "pdim": 8, "ddim": 4, "classes": 3, "rounds": 1}),
]


def _layouts(func: Func) -> dict[str, dict[str, Any]]:
    return {a.name: at["nf.layout"] for a, at in zip(func.args, func.arg_attrs, strict=True)
            if is_blocked(at.get("nf.layout"))}


def _inputs(func: Func, seed: int) -> dict[str, np.ndarray]:
    """Random inputs and initial persistent tensors (logical shapes) of `func`."""
    rng = np.random.default_rng(seed)
    out = {}
    for a, at in zip(func.args, func.arg_attrs, strict=True):
        role = at.get("nf.role")
        if role == "input":
            out[a.name] = (rng.standard_normal(a.shape).astype(a.dtype.numpy)
                           if a.dtype.is_float else rng.integers(0, 2, a.shape).astype(
                               a.dtype.numpy))
        else:
            out[a.name] = reference_init(a.name, str(at.get("nf.init", "zeros")), a.shape,
                                         a.dtype, seed)
    return out


def _args(func: Func, named: dict[str, np.ndarray]) -> list[np.ndarray]:
    """`named` (logical shapes) as the arguments of `func`, blocked ones packed."""
    lays = _layouts(func)
    return [pack(named[a.name], lays[a.name]) if a.name in lays else named[a.name]
            for a in func.args]


@pytest.mark.parametrize(("path", "params"), MODELS, ids=[m[0] for m in MODELS])
def test_blocked_forward_of_example_models_within_error_bound(path: str,
                                                              params: dict[str, int]) -> None:
    plain, _ = build_module(EX / path, params, pipeline="inline")
    laid, ctx = build_module(EX / path, params, pipeline="layout{block=8}")
    fp, fl = plain.func("forward"), laid.func("forward")
    remark = ctx.remarks["layout"]
    assert "0 computes blocked" not in remark, remark
    named = _inputs(fp, 1)
    got = run(fl, _args(fl, named), module=laid)
    bounds = run_bounded(fp, [named[a.name] for a in fp.args], module=plain)
    for n, (g, (value, err)) in enumerate(zip(got, bounds, strict=True)):
        assert_within_bounds(np.asarray(g), value, err, name=f"{path} result {n}")


def _steps(module: Module, state: dict[str, np.ndarray], batches: list[dict[str, np.ndarray]]
           ) -> list[float]:
    f = module.func("train_step")
    losses = []
    for b in batches:
        res = run(f, [b[a.name] if a.name in b else state[a.name] for a in f.args],
                  module=module)
        for name, r in zip(f.attrs["nf.results"], res, strict=True):
            if ":" in name:
                state[name.split(":", 1)[1]] = r
        losses.append(float(res[0]))
    return losses


def _state(func: Func, seed: int) -> dict[str, np.ndarray]:
    """The persistent tensors as the artifact's generator draws them (stored shapes)."""
    out = {}
    for a, at in zip(func.args, func.arg_attrs, strict=True):
        if at.get("nf.role") in ("param", "state", "opt_state"):
            lay = at.get("nf.layout")
            out[a.name] = (reference_init_layout(dict(lay, name=a.name,
                                                      init=at.get("nf.init", "zeros")),
                                                 a.shape, a.dtype, seed)
                           if is_blocked(lay) else
                           reference_init(a.name, str(at.get("nf.init", "zeros")), a.shape,
                                          a.dtype, seed))
    return out


def _logical(func: Func, state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """`state` unpacked by name (optimizer state `<p>_m` etc. laid out like `p`)."""
    lays = _layouts(func)
    out = {}
    for k, v in state.items():
        base = next((p for p in lays if k == p or (k.startswith(p + "_") and k[len(p) + 1:]
                                                    in ("m", "v", "mom"))), None)
        out[k] = unpack(v, lays[base]) if base is not None and v.ndim > 0 else v
    return out


@pytest.mark.parametrize("opt", [{"name": "sgd", "lr": 0.1, "momentum": 0.9},
                                 {"name": "adam", "lr": 0.01}])
def test_blocked_and_plain_train_alike_in_f64(opt: dict[str, Any]) -> None:
    src, params = EX / "resnet_block.nf", {"batch": 2}
    plain, _ = build_module(src, params, opt, pipeline=PLAIN)
    laid, _ = build_module(src, params, opt, pipeline=LAID)
    fl = laid.func("train_step")
    lays = _layouts(fl)
    assert {"k1", "k3", "g1"} <= set(lays)
    assert lays["k3"]["shape"] == [16, 8, 3, 3] and fl.arg("k3").shape == (2, 1, 3, 3, 8, 8)
    s0, l0 = _state(plain.func("train_step"), 4), _state(fl, 4)
    named0 = _logical(fl, l0)
    assert named0.keys() == s0.keys()
    for k, v in s0.items():  # the same starting point, drawn logically and packed
        np.testing.assert_array_equal(named0[k], v, err_msg=k)
    ws, wl = widen(plain), widen(laid)
    ss, ls = as_f64(s0), as_f64(l0)
    rng = np.random.default_rng(5)
    fp = plain.func("train_step")
    batches = [{a.name: (rng.standard_normal(a.shape) if a.dtype.is_float
                         else rng.integers(0, 10, a.shape).astype(np.int32))
                for a, at in zip(fp.args, fp.arg_attrs, strict=True)
                if at.get("nf.role") == "input"} for _ in range(3)]
    for a, b in zip(_steps(wl, ls, batches), _steps(ws, ss, batches), strict=True):
        assert_close_f64(np.float64(a), np.float64(b), "loss")
    named = _logical(wl.func("train_step"), ls)
    roles = {a.name: at.get("nf.role") for a, at in zip(fp.args, fp.arg_attrs, strict=True)}
    moved = max(float(np.abs(ss[k] - as_f64(s0)[k]).max()) for k in ss
                if roles[k] == "param")
    assert moved > 0
    for k, v in ss.items():
        if v.dtype.kind != "f":
            np.testing.assert_array_equal(named[k], v, err_msg=k)
        elif roles[k] == "param":
            assert_close_f64(named[k], v, k, scale=moved)
        else:
            assert_close_f64(named[k], v, k)


def _native(pipeline: str, opt: str) -> Any:
    return load_model(EX / "resnet_block.nf", settings=["batch=2", f"opt.name={opt}",
                                                        "opt.lr=0.05"],
                      pipeline=f"{pipeline},apply-tuning,fuse")


def test_native_blocked_parameters_init_views_steps_and_checkpoints(tmp_path: Path) -> None:
    plain, laid = _native(PLAIN, "adam"), _native(LAID, "adam")
    views = {v["name"]: v for v in laid.metadata.get("views", [])}
    assert views["k3"]["kind"] == "blocked" and views["k3"]["shape"] == [16, 8, 3, 3]
    assert "k3_m" in views and "k3_v" in views  # Adam's state laid out like its parameter
    assert laid.tensors["k3"].shape == (2, 1, 3, 3, 8, 8)
    named = laid.named_tensors()
    assert named["k3"].shape == (16, 8, 3, 3) and not named["k3"].flags.writeable
    assert laid.named_specs()["k3"].shape == (16, 8, 3, 3)
    plain.init(5)
    laid.init(5)
    a, b = plain.state_dict(), laid.state_dict()
    assert a.keys() == b.keys()
    for k in a:  # the native generator: the logical tensor drawn, stored blocked
        np.testing.assert_array_equal(b[k], a[k], err_msg=k)
    np.testing.assert_array_equal(laid.tensors["k3"], pack(a["k3"], views["k3"]))
    # the native blocked train step against the interpreter (float32 error bound)
    lmod, _ = build_module(EX / "resnet_block.nf", {"batch": 2}, {"name": "adam", "lr": 0.05},
                           pipeline=LAID)
    rng = np.random.default_rng(2)
    batches = [{"x": rng.standard_normal((2, 3, 16, 16)).astype(np.float32),
                "y": rng.integers(0, 10, 2).astype(np.int32)} for _ in range(3)]
    pmod, _ = build_module(EX / "resnet_block.nf", {"batch": 2}, {"name": "adam", "lr": 0.05},
                           pipeline=PLAIN)
    check_laid_out_build(laid, plain, lmod, pmod, batches, tmp_path)
    bt = batches[2]
    # the artifact's eval function reads the stored (pre-transformed) weights: from the same
    # logical state as the plain build, within the error bound of the plain eval
    laid.load_state_dict(plain.state_dict())
    ev = pmod.func("eval")
    args = [bt[x.name] if x.name in bt else plain.tensors[x.name].copy() for x in ev.args]
    got = laid.eval(**bt)
    for name, (value, err) in zip(ev.attrs["nf.results"], run_bounded(ev, args, module=pmod),
                                  strict=True):
        assert_within_bounds(np.asarray(got[name]), value, err, name=f"eval {name}")


_ONE = """
nf.module @m attributes {nf.optimizer = {name = "OPT", lr = 0.01}} {
  nf.func @forward(%x: tensor<1x3x4x4xf32> {nf.role = "input"},
      %k: tensor<8x3x1x1xf32> {nf.role = "param", nf.init = "he_normal", nf.trainable = TRAIN})
      -> (tensor<1x8x4x4xf32>) {
    %y = nf.compute [n: 1, o: 8, i: 4, j: 4] sum [c: 3] (%x[n, c, i, j] * %k[o, c, 0, 0])
      : tensor<1x8x4x4xf32>
    nf.return %y : tensor<1x8x4x4xf32>
  }
}
"""


@pytest.mark.parametrize(("opt", "train", "stored"), [
    ("adamw", "true", True),
    ("lamb", "true", False),   # not an elementwise optimizer: packed every step instead
    ("sgd", "false", False),   # a frozen parameter: packed every step
])
def test_stored_only_for_trainable_parameters_and_elementwise_optimizers(
        tmp_path: Path, opt: str, train: str, stored: bool) -> None:
    p = tmp_path / "one.nfir"
    p.write_text(_ONE.replace("OPT", opt).replace("TRAIN", train), encoding="utf-8")
    m, ctx = build_module(p, {}, pipeline="layout{block=8}")
    f = m.func("forward")
    assert bool(_layouts(f)) is stored
    packed = any(op.result.name == "k_packed" for op in f.body.ops[:-1])
    assert packed is not stored, ctx.remarks["layout"]


def test_bad_block_is_a_diagnostic(tmp_path: Path) -> None:
    p = tmp_path / "one.nfir"
    p.write_text(_ONE.replace("OPT", "sgd").replace("TRAIN", "true"), encoding="utf-8")
    with pytest.raises(CompileError, match="block must be 'auto' or a positive integer"):
        build_module(p, {}, pipeline="layout{block=wide}")
    r = subprocess.run([sys.executable, "-m", "nfc", "opt", str(p), "-p", "layout{block=0}"],
                       capture_output=True, text=True, check=False)
    assert r.returncode == 1 and "positive integer" in r.stderr
    assert "Traceback" not in r.stderr


def test_default_block_follows_the_vector_width(monkeypatch: pytest.MonkeyPatch) -> None:
    from nfc.passes.layout import default_block

    default_block.cache_clear()
    monkeypatch.setenv("NFC_CPU_FEATURES",
                       "-avx512f,-avx512bw,-avx512dq,-avx512vl,-avx512bf16,-avx512vnni,+avx")
    try:
        assert default_block() == 8
        default_block.cache_clear()
        monkeypatch.setenv("NFC_CPU_FEATURES", "-avx512f,-avx")
        assert default_block() == 4
    finally:
        default_block.cache_clear()
