"""The `precision` pass (mixed-precision contractions): the rewritten functions within the
error bound of bf16 operands (nfc.testing.run_bounded charges each rounding to bf16 its unit
roundoff 2^-8), compiled and interpreted alike, contractions kept as contractions (so they
keep their GEMM schedules), the pipeline edit of `--precision`, and a short training run
whose bf16 loss curve follows the f32 one. The golden test of its output is
tests/golden/passes/precision/."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
from passes_testlib import apply, random_inputs

from nfc.contraction import match_contraction
from nfc.interp import run
from nfc.ir import ComputeOp, DType
from nfc.irparser import parse_module
from nfc.passes.precision import Precision, with_precision
from nfc.testing import assert_within_bounds, run_bounded
from nfc.testing.errbound import UBF16

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

MLP = """
nf.func @forward(%x: tensor<24x96xf32>, %w1: tensor<96x40xf32>, %w2: tensor<40x10xf32>)
    -> (tensor<24x10xf32>) {
  %h = nf.compute [i: 24, j: 40] sum [k: 96] (%x[i, k] * %w1[k, j]) : tensor<24x40xf32>
  %r = nf.compute [i: 24, j: 40] (max(%h[i, j], 0.0)) : tensor<24x40xf32>
  %y = nf.compute [i: 24, j: 10] sum [k: 40] (%r[i, k] * %w2[k, j]) : tensor<24x10xf32>
  nf.return %y : tensor<24x10xf32>
}
"""


def test_rewritten_function_within_the_bf16_bound():
    module = apply(parse_module(MLP), Precision())
    func = module.func("forward")
    contractions = [op for op in func.walk() if isinstance(op, ComputeOp) and op.reduce]
    assert len(contractions) == 2
    assert all(match_contraction(op) is not None for op in contractions)
    assert sum(op.result.dtype is DType.BF16 for op in func.walk()
               if isinstance(op, ComputeOp)) == 4
    ins = random_inputs(func, 3)
    (v, e), = run_bounded(func, ins)  # exact values of the f32 program, bf16 error bound
    got = run(func, ins)[0]
    assert_within_bounds(got, v, e)
    # the rounding is real: the f32 program differs by more than f32 rounding would
    f32 = run(parse_module(MLP).func("forward"), ins)[0]
    assert np.abs(got - f32).max() > 64 * 2.0 ** -24 * np.abs(f32).max()


def test_compiled_like_interpreted():
    from nfc.codegen.jit import compile_kernels

    module = apply(parse_module(MLP), Precision())
    func = module.func("forward")
    ops = [op for op in func.walk() if isinstance(op, ComputeOp)]
    env = dict(zip([id(a) for a in func.args], random_inputs(func, 5), strict=True))
    for op, kernel in zip(ops, compile_kernels(ops), strict=True):
        ins = [env[id(v)] for v in kernel.info.inputs]
        got = np.asarray(kernel(*ins)).astype(np.float32)
        want = run(_single(op, kernel.info.inputs), ins)[0]
        env[id(op.result)] = want
        if op.result.dtype is DType.BF16:  # a cast: both round to nearest even
            np.testing.assert_array_equal(got, want)
        else:  # f32 sums of exact products: f32 rounding only
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def _single(op, inputs):
    from nfc.ir import Block, Func, ReturnOp

    return Func("f", list(inputs), Block([op, ReturnOp([op.result])]))


def test_pipeline_edit():
    base = "im2col,training-functions,inline,canonicalize,cse,dce,apply-tuning,fuse"
    assert with_precision(base, "bf16") == (
        "im2col,training-functions,inline,precision,canonicalize,cse,dce,apply-tuning,fuse")
    assert with_precision(base, "f16").split(",")[3] == "precision{dtype=f16}"
    assert with_precision(base, "f32") == base
    assert with_precision("cse", "bf16") == "precision,cse"
    twice = with_precision(with_precision(base, "bf16"), "bf16")
    assert twice.count("precision") == 1


def test_cli_print_pipeline_and_bad_dtype(tmp_path):
    nfc = [sys.executable, "-m", "nfc"]
    out = subprocess.run([*nfc, "train", str(EXAMPLES / "mlp.nf"), "--precision", "bf16",
                          "--print-pipeline"], capture_output=True, text=True, check=True)
    assert ",inline,precision," in out.stdout
    src = tmp_path / "m.nfir"
    src.write_text(MLP)
    bad = subprocess.run([*nfc, "opt", str(src), "-p", "precision{dtype=f32}"],
                         capture_output=True, text=True)
    assert bad.returncode == 1 and "Traceback" not in bad.stderr
    assert "must be bf16 or f16" in bad.stderr


def test_bf16_training_follows_f32():
    """MLP-3 (narrowed) trained 40 SGD-momentum steps on synthetic data in f32 and with bf16
    contractions from the same start: the first loss (forward only) within 4 u_bf16
    relative, every later one within 10 % (measured: 2.5 % at most; the curves drift apart
    by rounding fed back through the updates, a wrong conversion is off by far more), and
    not identical (the bf16 run did round)."""
    from nfc.runtime.build import pipeline_for
    from nfc.runtime.train import TrainConfig, train

    src, steps = str(EXAMPLES / "mlp.nf"), 40
    curves = {}
    for p in ("f32", "bf16"):
        cfg = TrainConfig(source=src, data="synthetic", max_steps=steps, epochs=100, batch=32,
                          seed=0, settings=("hidden1=64", "hidden2=32"), threads=1,
                          progress=False, evaluate=False, use_cache=False,
                          pipeline=with_precision(pipeline_for(src), p), log=lambda s: None)
        curves[p] = np.array(train(cfg).losses)
    f32, bf16 = curves["f32"], curves["bf16"]
    assert len(f32) == len(bf16) == steps and np.isfinite(bf16).all()
    assert abs(bf16[0] - f32[0]) <= 4 * UBF16 * f32[0]
    assert (np.abs(bf16 - f32) <= 0.10 * f32).all(), np.abs(bf16 - f32) / f32
    assert not np.array_equal(bf16, f32)
    assert f32[-10:].mean() < f32[:5].mean()  # the run learned something
