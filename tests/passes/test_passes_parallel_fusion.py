"""parallel-fusion: sibling computes sharing an input merged into one (NeoFlow section 4);
numerics unchanged (the interpreter is the oracle), on small IR and on the example models'
forward and train step."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from passes_testlib import apply, check_pass, computes

from nfc.interp import run
from nfc.ir import Func, Module
from nfc.passes.parallel_fusion import ParallelFusion
from nfc.runtime.build import build_module

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
CLEANUP = "im2col,training-functions,inline,canonicalize,cse,dce"


def _sums(m: Module, func: str = "forward") -> int:
    return sum(1 for c in computes(m, func) if c.reduce is not None)


def test_two_matmuls_sharing_x() -> None:
    src = """
    nf.func @forward(%x: tensor<4x6xf32>, %w1: tensor<6x3xf32>, %w2: tensor<6x5xf32>,
                     %w3: tensor<6x3xf32>) -> (tensor<4x3xf32>, tensor<4x5xf32>, tensor<4x3xf32>) {
      %a = nf.compute [i: 4, j: 3] sum [k: 6] (%x[i, k] * %w1[k, j]) : tensor<4x3xf32>
      %b = nf.compute [p: 4, q: 5] sum [r: 6] (%w2[r, q] * %x[p, r]) : tensor<4x5xf32>
      %c = nf.compute [i: 4, j: 3] sum [k: 6] (%x[i, k] * %w3[k, j]) : tensor<4x3xf32>
      nf.return %a, %b, %c : tensor<4x3xf32>, tensor<4x5xf32>, tensor<4x3xf32>
    }
    """
    m = check_pass(src, ParallelFusion())
    # %b loads in another order: a different template, left alone; %a and %c fuse
    assert _sums(m) == 2
    m = check_pass(src, ParallelFusion(max_width=1))
    assert _sums(m) == 3


def test_dependent_siblings_are_not_fused_and_readers_move() -> None:
    src = """
    nf.func @forward(%x: tensor<4x4xf32>, %w1: tensor<4x4xf32>, %w2: tensor<4x4xf32>,
                     %w3: tensor<4x4xf32>) -> (tensor<4x4xf32>, tensor<4x4xf32>) {
      %a = nf.compute [i: 4, j: 4] sum [k: 4] (%x[i, k] * %w1[k, j]) : tensor<4x4xf32>
      %t = nf.compute [i: 4, j: 4] (%a[i, j] + 1.0) : tensor<4x4xf32>
      %b = nf.compute [i: 4, j: 4] sum [k: 4] (%x[i, k] * %t[k, j]) : tensor<4x4xf32>
      %c = nf.compute [i: 4, j: 4] sum [k: 4] (%x[i, k] * %w3[k, j]) : tensor<4x4xf32>
      %d = nf.compute [i: 4, j: 4] (%b[i, j] * %c[i, j]) : tensor<4x4xf32>
      nf.return %d, %t : tensor<4x4xf32>, tensor<4x4xf32>
    }
    """
    m = check_pass(src, ParallelFusion())
    # %b depends on %a (through %t): only %a and %c fuse; %t and %b move after the slices
    assert _sums(m) == 2
    fused = [c for c in computes(m) if c.reduce is not None][0]
    assert fused.result.shape == (4, 8)


def test_shared_load_on_the_fused_dim_is_not_fused() -> None:
    # both read %x along j: concatenating along j would change what %x[i, j] means
    src = """
    nf.func @forward(%x: tensor<4x4xf32>, %w1: tensor<4x4xf32>, %w2: tensor<4x4xf32>)
        -> (tensor<4x4xf32>, tensor<4x4xf32>) {
      %a = nf.compute [i: 4, j: 4] sum [k: 4] (%x[i, j] * %w1[k, j]) : tensor<4x4xf32>
      %b = nf.compute [i: 4, j: 4] sum [k: 4] (%x[i, j] * %w2[k, j]) : tensor<4x4xf32>
      nf.return %a, %b : tensor<4x4xf32>, tensor<4x4xf32>
    }
    """
    assert _sums(check_pass(src, ParallelFusion())) == 2


def _inputs(func: Func, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for a in func.args:
        if a.dtype.is_float:
            out.append((0.1 * rng.standard_normal(a.shape)).astype(a.dtype.numpy))
        else:  # token ids and labels: 0 and 1 are in range for every model here
            out.append(rng.integers(0, 2, a.shape).astype(a.dtype.numpy))
    return out


@pytest.mark.parametrize(("model", "fused", "params"), [
    ("models/bert.nf", 2, {}),
    ("models/lstm_lm.nf", 2, {"steps": 4, "hidden": 32}),
    ("models/mi_lstm.nf", 1, {"batch": 4, "steps": 2, "inputs": 16, "hidden": 32}),
])
def test_models_forward_and_train_step(model: str, fused: int, params: dict[str, int]) -> None:
    before, _ = build_module(EXAMPLES / model, params, pipeline=CLEANUP)
    after, _ = build_module(EXAMPLES / model, params, pipeline=CLEANUP)
    apply(after, ParallelFusion())
    assert _sums(after) <= _sums(before) - fused
    for name in ("forward", "train_step"):
        f = before.func(name)
        inputs = _inputs(f, 0)
        want = run(f, inputs, module=before)
        got = run(after.func(name), inputs, module=after)
        for w, g in zip(want, got, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("model", ["models/bert.nf", "models/lstm_lm.nf"])
def test_autodiff_of_the_fused_forward(model: str) -> None:
    # parallel-fusion before training-functions: autodiff differentiates the concatenation,
    # the fused product and the slices
    params = {"steps": 4, "hidden": 32} if "lstm" in model else {}
    before, _ = build_module(EXAMPLES / model, params, pipeline=CLEANUP)
    after, _ = build_module(
        EXAMPLES / model, params,
        pipeline="im2col,inline,canonicalize,cse,dce,parallel-fusion,training-functions,"
                 "inline,canonicalize,cse,dce")
    assert _sums(after) < _sums(before)
    f = before.func("train_step")
    inputs = _inputs(f, 1)
    want = run(f, inputs, module=before)
    got = run(after.func("train_step"), inputs, module=after)
    for w, g in zip(want, got, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
