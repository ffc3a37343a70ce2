"""parallel-fusion{layout=true}: sibling weights stored as one concatenated parameter (NeoFlow's
weight pre-transformation). The fused and the unfused build start from the same values, train
the same (three SGD and Adam steps, every part compared by name in float64), their gradients
match finite differences, the native artifact agrees with the interpreter within the float32
error bound, and a checkpoint written by one build resumes in the other."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from laid_out_lib import check_laid_out_build

from nfc.codegen.artifact.initgen import reference_init, reference_init_layout
from nfc.interp import run
from nfc.ir import Func, Module
from nfc.runtime import checkpoint as ckpt
from nfc.runtime.build import build_module, load_model
from nfc.testing import (
    as_f64,
    assert_close_f64,
    assert_within_bounds,
    run_bounded,
    widen,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SPLIT = "im2col,training-functions,inline,canonicalize,cse,dce"
CONCAT = ("im2col,inline,canonicalize,cse,dce,parallel-fusion{layout=true},"
          "training-functions,inline,canonicalize,cse,dce")

#: An LSTM cell whose four gates have their own input and recurrent weights.
LSTM4 = """
import std.nn

op cell4(x: T[N, I], h: T[N, H], c: T[N, H],
         wi: T[I, H], wf: T[I, H], wg: T[I, H], wo: T[I, H],
         ui: T[H, H], uf: T[H, H], ug: T[H, H], uo: T[H, H],
         b: T[4, H]) -> (h_out: T[N, H], c_out: T[N, H]) {
  ig[n, j] = sigmoid((sum(k) x[n, k] * wi[k, j]) + (sum(k) h[n, k] * ui[k, j]) + b[0, j])
  fg[n, j] = sigmoid((sum(k) x[n, k] * wf[k, j]) + (sum(k) h[n, k] * uf[k, j]) + b[1, j])
  gg[n, j] = tanh((sum(k) x[n, k] * wg[k, j]) + (sum(k) h[n, k] * ug[k, j]) + b[2, j])
  og[n, j] = sigmoid((sum(k) x[n, k] * wo[k, j]) + (sum(k) h[n, k] * uo[k, j]) + b[3, j])
  c_out[n, j] = fg[n, j] * c[n, j] + ig[n, j] * gg[n, j]
  h_out[n, j] = og[n, j] * tanh(c_out[n, j])
}

model lstm4(batch = 3, steps = 3, inputs = 5, hidden = 4, classes = 3) {
  input  x: f32[batch, steps, inputs]
  input  y: i32[batch]
  param  wi: f32[inputs, hidden] = glorot_uniform
  param  wf: f32[inputs, hidden] = glorot_uniform
  param  wg: f32[inputs, hidden] = normal(0.0, 0.3)
  param  wo: f32[inputs, hidden] = uniform(-0.5, 0.5)
  param  ui: f32[hidden, hidden] = glorot_uniform
  param  uf: f32[hidden, hidden] = glorot_uniform
  param  ug: f32[hidden, hidden] = glorot_uniform
  param  uo: f32[hidden, hidden] = glorot_uniform
  param  b: f32[4, hidden] = ones
  param  wc: f32[hidden, classes] = glorot_uniform
  param  bc: f32[classes] = zeros
  h[n in 0..batch, j in 0..hidden] = 0.5
  c[n in 0..batch, j in 0..hidden] = 0.0
  for t in 0..steps {
    x_t[n, i] = x[n, t, i]
    h, c = cell4(x_t, h, c, wi, wf, wg, wo, ui, uf, ug, uo, b)
  }
  logits = linear(h, wc, bc)
  loss = softmax_cross_entropy(logits, y)
  output logits
  minimize loss with sgd(lr = 0.5)
}
"""

BERT = {"batch": 2, "seq": 4, "vocab": 8, "hidden": 8, "heads": 2, "ffn": 8, "layers": 2}


def _source(tmp_path: Path, which: str) -> tuple[Path, dict[str, int]]:
    if which == "lstm4":
        p = tmp_path / "lstm4.nf"
        p.write_text(LSTM4, encoding="utf-8")
        return p, {}
    return EXAMPLES / "models/bert.nf", dict(BERT)


def _layouts(func: Func) -> dict[str, dict[str, Any]]:
    return {a.name: at["nf.layout"] for a, at in zip(func.args, func.arg_attrs, strict=True)
            if "nf.layout" in at}


def _split(name: str, arr: np.ndarray, layout: dict[str, Any] | None,
           suffix: str = "") -> dict[str, np.ndarray]:
    """A laid-out tensor as its parts, by name (the unfused build's names)."""
    if layout is None:
        return {name: arr}
    axis, offs = layout["axis"], list(layout["offsets"]) + [arr.shape[layout["axis"]]]
    return {f"{p}{suffix}": np.take(arr, range(offs[k], offs[k + 1]), axis=axis)
            for k, p in enumerate(layout["parts"])}


def _named(func: Func, state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    lays = _layouts(func)
    out: dict[str, np.ndarray] = {}
    for name, arr in state.items():
        lay = lays.get(name)
        suffix = ""
        if lay is None:  # optimizer state of a laid-out parameter: `<fused>_m`, ...
            for p, q in lays.items():
                if name.startswith(p + "_") and name[len(p) + 1:] in ("m", "v", "mom"):
                    lay, suffix = q, name[len(p):]
        out.update(_split(name, arr, lay, suffix))
    return out


def _initial(func: Func, seed: int) -> dict[str, np.ndarray]:
    """The persistent tensors of `func` as the artifact's generator draws them."""
    out = {}
    for a, at in zip(func.args, func.arg_attrs, strict=True):
        if at.get("nf.role") not in ("param", "opt_state"):
            continue
        if "nf.layout" in at:
            out[a.name] = reference_init_layout(at["nf.layout"], a.shape, a.dtype, seed)
        else:
            out[a.name] = reference_init(a.name, str(at.get("nf.init", "zeros")), a.shape,
                                         a.dtype, seed)
    return out


def _batches(func: Func, n: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(7)
    out = []
    for _ in range(n):
        b = {}
        for a, at in zip(func.args, func.arg_attrs, strict=True):
            if at.get("nf.role") == "input":
                b[a.name] = (rng.standard_normal(a.shape).astype(a.dtype.numpy)
                             if a.dtype.is_float else rng.integers(0, 2, a.shape).astype(
                                 a.dtype.numpy))
        out.append(b)
    return out


def _steps(module: Module, state: dict[str, np.ndarray], batches: list[dict[str, np.ndarray]]
           ) -> list[float]:
    """Train steps in the interpreter; `state` updated; the losses."""
    f = module.func("train_step")
    losses = []
    for b in batches:
        args = [b[a.name] if a.name in b else state[a.name] for a in f.args]
        res = run(f, args, module=module)
        for name, r in zip(f.attrs["nf.results"], res, strict=True):
            if ":" in name:
                state[name.split(":", 1)[1]] = r
        losses.append(float(res[0]))
    return losses


def _build(src: Path, params: dict[str, int], pipeline: str, opt: dict[str, Any]) -> Module:
    m, _ = build_module(src, params, opt, pipeline=pipeline)
    return m


@pytest.mark.parametrize("which", ["lstm4", "bert"])
@pytest.mark.parametrize("opt", [{}, {"name": "adam", "lr": 0.05}])
def test_fused_and_unfused_train_alike(tmp_path: Path, which: str, opt: dict[str, Any]) -> None:
    src, params = _source(tmp_path, which)
    split = _build(src, params, SPLIT, opt)
    fused = _build(src, params, CONCAT, opt)
    lays = _layouts(fused.func("forward"))
    want_parts = {"lstm4": [["wi", "wf", "wg", "wo"], ["ui", "uf", "ug", "uo"]],
                  "bert": [["wq", "wk", "wv"]]}[which]
    assert sorted(v["parts"] for v in lays.values()) == sorted(want_parts)
    assert _layouts(fused.func("train_step")) == lays
    # the same starting point, part by part (each part drawn by its own name)
    s0, f0 = _initial(split.func("train_step"), 11), _initial(fused.func("train_step"), 11)
    named0 = _named(fused.func("train_step"), f0)
    assert named0.keys() == s0.keys()
    for k, v in s0.items():
        np.testing.assert_array_equal(named0[k], v, err_msg=k)
    # three steps in float64 (machine-independent tolerance), every part by name
    ws, wf = widen(split), widen(fused)
    ss, fs = as_f64(s0), as_f64(f0)
    batches = [as_f64(b) for b in _batches(split.func("train_step"), 3)]
    ls = _steps(ws, ss, batches)
    lf = _steps(wf, fs, batches)
    for a, b in zip(lf, ls, strict=True):
        assert_close_f64(np.float64(a), np.float64(b), "loss")
    named = _named(fused.func("train_step"), fs)
    assert named.keys() == ss.keys()
    s0_64 = as_f64(s0)
    # the scale: how far the parameters moved (a tensor whose gradient is zero in exact
    # arithmetic, BERT's key bias under softmax, moves by rounding noise only)
    params = {a.name for a, at in zip(split.func("train_step").args,
                                      split.func("train_step").arg_attrs, strict=True)
              if at.get("nf.role") == "param"}
    moved = max(float(np.abs(ss[k] - s0_64[k]).max(initial=0.0)) for k in params)
    assert moved > 0
    for k, v in ss.items():
        if v.dtype.kind != "f":  # Adam's step counter
            np.testing.assert_array_equal(named[k], v, err_msg=k)
        elif k in params:
            assert_close_f64(named[k], v, k, scale=moved)
        else:  # optimizer state: relative to the largest state of its kind (`_m`, `_mom`)
            kind = k.rsplit("_", 1)[-1]
            size = max(float(np.abs(x).max(initial=0.0)) for n, x in ss.items()
                       if n not in params and n.rsplit("_", 1)[-1] == kind)
            assert_close_f64(named[k], v, k, scale=size)


def test_gradient_of_the_fused_parameter_matches_finite_differences(tmp_path: Path) -> None:
    src, params = _source(tmp_path, "lstm4")
    fused = widen(_build(src, params, CONCAT, {"name": "sgd", "lr": 1.0}))
    f = fused.func("train_step")
    state = as_f64(_initial(f, 3))
    batch = as_f64(_batches(f, 1)[0])
    name = next(iter(_layouts(f)))

    def loss(w: np.ndarray) -> float:
        args = [batch[a.name] if a.name in batch else (w if a.name == name else state[a.name])
                for a in f.args]
        return float(run(f, args, module=fused)[0])

    # with sgd(lr = 1) the update is w - grad: the gradient is what the step subtracts
    args = [batch[a.name] if a.name in batch else state[a.name] for a in f.args]
    res = dict(zip(f.attrs["nf.results"], run(f, args, module=fused), strict=True))
    grad = state[name] - res[f"param:{name}"]
    rng = np.random.default_rng(0)
    w0 = state[name]
    for _ in range(6):  # elements in every part
        idx = tuple(int(rng.integers(0, n)) for n in w0.shape)
        h = 1e-6
        wp, wm = w0.copy(), w0.copy()
        wp[idx] += h
        wm[idx] -= h
        fd = (loss(wp) - loss(wm)) / (2 * h)
        assert abs(fd - grad[idx]) <= 1e-6 * max(1.0, abs(fd)), (idx, fd, grad[idx])


def _native(src: Path, params: dict[str, int], pipeline: str, opt: str) -> Any:
    settings = [f"{k}={v}" for k, v in params.items()] + [f"opt.name={opt}", "opt.lr=0.05"]
    return load_model(src, settings=settings,
                      pipeline=f"{pipeline},apply-tuning,fuse")


@pytest.mark.parametrize("opt", ["sgd", "adam"])
def test_native_builds_share_init_names_and_checkpoints(tmp_path: Path, opt: str) -> None:
    src, params = _source(tmp_path, "lstm4")
    split = _native(src, params, SPLIT, opt)
    fused = _native(src, params, CONCAT, opt)
    views = fused.metadata.get("views", [])
    assert {v["name"] for v in views} >= {"wi", "wf", "wg", "wo", "ui", "uf", "ug", "uo"}
    assert "wi" not in fused.tensors and "wi" in fused.named_tensors()
    split.init(5)
    fused.init(5)
    a, b = split.state_dict(), fused.state_dict()
    assert a.keys() == b.keys()
    for k in a:  # the native generator: every part drawn by its own name
        np.testing.assert_array_equal(b[k], a[k], err_msg=k)
    # the train steps agree with the interpreter within the float32 error bound
    fmod = _build(src, params, CONCAT, {"name": opt, "lr": 0.05})
    smod = _build(src, params, SPLIT, {"name": opt, "lr": 0.05})
    check_laid_out_build(fused, split, fmod, smod, _batches(fmod.func("train_step"), 3),
                         tmp_path)


def test_interpreter_agreement_of_the_fused_forward_on_bert() -> None:
    # the fused forward (one Q/K/V product per layer over slices of the fused parameter) in
    # the interpreter, within the float32 error bound of the unfused forward
    split = _build(EXAMPLES / "models/bert.nf", BERT, SPLIT, {})
    fused = _build(EXAMPLES / "models/bert.nf", BERT, CONCAT, {})
    fs, ff = split.func("forward"), fused.func("forward")
    assert _layouts(ff) and not _layouts(fs)
    st = _initial(fs, 2)
    for name, at in _layouts(ff).items():
        st[name] = np.concatenate([st[p] for p in at["parts"]], axis=at["axis"])
    b = _batches(fs, 1)[0]
    got = run(ff, [b.get(a.name, st.get(a.name)) for a in ff.args], module=fused)
    bounds = run_bounded(fs, [b.get(a.name, st.get(a.name)) for a in fs.args], module=split)
    for n, (g, (value, err)) in enumerate(zip(got, bounds, strict=True)):
        assert_within_bounds(np.asarray(g), value, err, name=f"result {n}")


_TWO = """
nf.module @m attributes {nf.optimizer = {name = "OPT", lr = 0.01}} {
  nf.func @forward(%x: tensor<4x6xf32> {nf.role = "input"},
      %w1: tensor<6x3xf32> {nf.role = "param", nf.init = "zeros", nf.trainable = true},
      %w2: tensor<6x3xf32> {nf.role = "param", nf.init = "zeros", nf.trainable = TRAIN})
      -> (tensor<4x3xf32>, tensor<4x3xf32>) {
    %a = nf.compute [i: 4, j: 3] sum [k: 6] (%x[i, k] * %w1[k, j]) : tensor<4x3xf32>
    %b = nf.compute [i: 4, j: 3] sum [k: 6] (%x[i, k] * %w2[k, j]) : tensor<4x3xf32>
    nf.return %a, %b : tensor<4x3xf32>, tensor<4x3xf32>
  }
}
"""


@pytest.mark.parametrize(("opt", "train", "laid"), [
    ("adamw", "true", True),
    ("lamb", "true", False),    # not an elementwise optimizer: parts kept apart
    ("sgd", "false", False),    # a frozen part: not a trainable parameter
])
def test_layout_only_for_trainable_parts_and_elementwise_optimizers(
        opt: str, train: str, laid: bool) -> None:
    from nfc.irparser import parse_module
    from nfc.passmanager import PassManager, build_pipeline

    m = parse_module(_TWO.replace("OPT", opt).replace("TRAIN", train), "two.nfir")
    PassManager(build_pipeline("parallel-fusion{layout=true}")).run(m)
    f = m.func("forward")
    assert bool(_layouts(f)) is laid
    assert [a.name for a in f.args] == (["x", "w1_w2"] if laid else ["x", "w1", "w2"])


def test_param_layout_option_edits_the_build_pipeline(tmp_path: Path) -> None:
    import subprocess
    import sys

    src, _ = _source(tmp_path, "lstm4")
    out = {}
    for flag in ("split", "concat"):
        r = subprocess.run([sys.executable, "-m", "nfc", "compile", str(src), "--param-layout",
                            flag, "--print-pipeline"], capture_output=True, text=True,
                           check=True)
        out[flag] = r.stdout.strip()
    assert "parallel-fusion" not in out["split"]
    before, _, after = out["concat"].partition("parallel-fusion{layout=true},")
    assert after.startswith("training-functions,") and before.endswith("dce,")
    assert out["concat"].replace("inline,canonicalize,cse,dce,parallel-fusion{layout=true},",
                                 "") == out["split"]


def test_nfc_train_resumes_an_unfused_checkpoint_with_the_layout(tmp_path: Path) -> None:
    import subprocess
    import sys

    src, _ = _source(tmp_path, "lstm4")
    ck = tmp_path / "ck"
    base = [sys.executable, "-m", "nfc", "train", str(src), "--data", "synthetic", "--seed",
            "3", "--no-eval", "--quiet", "--checkpoint", str(ck), "--every", "2"]
    subprocess.run([*base, "--max-steps", "2"], check=True, capture_output=True)
    subprocess.run([*base, "--max-steps", "4", "--resume", "--param-layout", "concat"],
                   check=True, capture_output=True)
    first = ckpt.load(ck / "ckpt-000000002.json")
    last = ckpt.load_latest(ck)
    assert last is not None and last.step == 4
    # the fused build wrote the parts, by the unfused build's names and shapes
    assert {k: v.shape for k, v in last.tensors.items()} == {
        k: v.shape for k, v in first[0].items()}
    assert "wi" in last.tensors and "wi_wf_wg_wo" not in last.tensors
    assert not np.array_equal(last.tensors["wi"], first[0]["wi"])  # it trained on


def test_a_malformed_layout_is_a_diagnostic(tmp_path: Path) -> None:
    import subprocess
    import sys

    src = tmp_path / "bad.nfir"
    src.write_text(_TWO.replace("OPT", "sgd").replace("TRAIN", "true").replace(
        '%w1: tensor<6x3xf32> {nf.role = "param", nf.init = "zeros", nf.trainable = true}',
        '%w1: tensor<6x3xf32> {nf.role = "param", nf.init = "zeros", nf.trainable = true, '
        'nf.layout = {parts = ["a", "b"], axis = 1, offsets = [0, 5], inits = ["zeros", '
        '"zeros"]}}'), encoding="utf-8")
    r = subprocess.run([sys.executable, "-m", "nfc", "compile", str(src), "-o",
                        str(tmp_path / "bad.so")], capture_output=True, text=True)
    assert r.returncode == 1, r.stderr
    assert "nf.layout offsets [0, 5]" in r.stderr and "Traceback" not in r.stderr
