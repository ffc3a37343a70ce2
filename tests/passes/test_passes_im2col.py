"""The im2col pass: which convolutions it rewrites (and which it leaves), that the rewritten
forward and training functions compute what the originals do (interpreter, float64), and that
the contractions it leaves behind — forward, weight gradient, input gradient — are the GEMMs
the code generator recognises."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from nfc.contraction import match_contraction
from nfc.interp import run as interp_run
from nfc.ir import ComputeOp, DType
from nfc.passes.im2col import im2col_func

MODEL = """
import std.nn

model convs(batch = 2) {{
  input  x: f32[batch, 3, 9, 9]
  input  y: i32[batch]
  param  k1: f32[8, 3, 3, 3] = he_normal
  param  k2: f32[6, 8, 3, 3] = he_normal
  param  kd: f32[8, 1, 3, 3] = he_normal
  param  w: f32[{flat}, 4] = glorot_uniform
  param  b: f32[4] = zeros
  h1 = relu_4d(conv2d<padding = 1>(x, k1))                 # 8 x 9 x 9
  hd = depthwise_conv2d<padding = 1>(h1, kd)               # left alone: no output channel GEMM
  h2 = relu_4d(conv2d<stride = 2, dilation = {dil}>(hd, k2))
  loss = softmax_cross_entropy(linear(flatten(h2), w, b), y)
  minimize loss with sgd(lr = 0.1)
}}
"""


def _model(tmp_path: Path, dil: int = 1) -> Path:
    side = (9 - dil * 2 - 1) // 2 + 1
    p = tmp_path / "convs.nf"
    p.write_text(MODEL.format(flat=6 * side * side, dil=dil), encoding="utf-8")
    return p


def _inputs(func, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for a in func.args:
        if a.dtype is DType.I32:
            out[a.name] = rng.integers(0, 4, a.shape).astype(np.int32)
        else:
            out[a.name] = rng.standard_normal(a.shape).astype(a.dtype.numpy)
    return out


def _f64(func, feeds):
    return {k: v.astype(np.float64) if v.dtype == np.float32 else v for k, v in feeds.items()}


def test_rewrites_the_convolutions_and_leaves_the_depthwise_one(tmp_path):
    from nfc.runtime.build import model_module

    m = model_module(_model(tmp_path), im2col=False)
    fwd = m.func("forward")
    assert im2col_func(fwd) == 2
    cols = [op for op in fwd.body.ops if isinstance(op, ComputeOp) and op.attrs.get("nf.im2col")]
    assert [c.result.shape for c in cols] == [(2, 3, 3, 3, 9, 9), (2, 8, 3, 3, 4, 4)]
    convs = [op for op in fwd.body.ops if isinstance(op, ComputeOp)
             and any(v is c.result for c in cols for v in op.operands)]
    for op in convs:
        c = match_contraction(op)
        assert c is not None and len(c.k) == 3 and c.batch == ("n",)
    assert im2col_func(fwd) == 0  # idempotent: nothing left to gather


@pytest.mark.parametrize("dil", [1, 2])
def test_training_step_is_unchanged_by_the_rewrite(tmp_path, dil):
    from nfc.runtime.build import model_module

    path = _model(tmp_path, dil)
    plain = model_module(path, im2col=False)
    cols = model_module(path)
    assert sum(1 for op in cols.func("train_step").body.ops
               if isinstance(op, ComputeOp) and op.attrs.get("nf.im2col")) == 2
    for name in ("forward", "train_step"):
        feeds = _inputs(plain.func(name), seed=3)
        want = interp_run(plain.func(name), feeds, module=plain)
        got = interp_run(cols.func(name), feeds, module=cols)
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-6)


def test_gradients_are_gemms_and_a_cheap_gather(tmp_path):
    from nfc.runtime.build import model_module

    m = model_module(_model(tmp_path))
    ops = [op for op in m.func("train_step").body.ops if isinstance(op, ComputeOp)]
    back = [op for op in ops if op.attrs.get("nf.phase") == "backward"]
    # dk1, dk2 (weight gradients) and dcols of the second convolution (input gradient)
    gemms = [op for op in back if match_contraction(op) is not None]
    names = {op.result.name for op in gemms}
    assert {"d_k1", "d_k2"} <= names and any("cols" in (n or "") for n in names), names
    # the gradient of a gather reads the column gradient, reducing over window taps only
    taps = [op for op in back if any("cols" in (v.name or "") for v in op.operands)
            and op.raxes and match_contraction(op) is None]
    assert taps and all(np.prod([a.extent for a in op.raxes]) <= 9 for op in taps)


def test_pass_runs_from_the_command_line(tmp_path):
    out = subprocess.run([sys.executable, "-m", "nfc", "opt", "--pass=im2col",
                          str(_model(tmp_path))], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("nf.im2col = true") == 2


def test_compile_applies_it_by_default_and_no_im2col_skips_it(tmp_path):
    src = str(_model(tmp_path))
    texts = []
    for extra in ([], ["--no-im2col"]):
        out = subprocess.run([sys.executable, "-m", "nfc", "compile", src, "--emit=ir",
                              "--no-fuse", "--no-tuning", *extra],
                             capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        texts.append(out.stdout)
    # forward, train_step and eval each gather the columns of both convolutions
    assert texts[0].count("nf.im2col = true") == 6
    assert "nf.im2col" not in texts[1]
