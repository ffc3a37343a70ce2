"""FLOP and byte counts (nfc.cost, `nfc stats`) of gradients: the backward of a convolution or
a matmul costs about twice its forward, and guards do not inflate it."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

CONVNET = """
import std.nn
model convnet(batch = 8) {
  input  x: f32[batch, 3, 16, 16]
  input  y: i32[batch]
  param  k1: f32[16, 3, 3, 3] = he_normal
  param  k2: f32[32, 16, 3, 3] = he_normal
  param  w: f32[32, 10] = normal(0.0, 0.1)
  h1 = relu_4d(conv2d<padding = 1>(x, k1))
  h2 = relu_4d(conv2d<stride = 2, padding = 1>(h1, k2))
  logits = matmul(global_avg_pool(h2), w)
  loss = softmax_cross_entropy(logits, y)
  minimize loss with sgd(lr = 0.1)
}
"""


def _costs(module, fn):
    from nfc.cost import func_cost

    return {c.name: c for c in func_cost(module.func(fn))}


def test_conv_training_graph_backward_within_2_2x(tmp_path: Path):
    from nfc.cost import func_cost, phase_totals
    from nfc.frontend import compile_source
    from nfc.passes.autodiff.train import add_training_functions

    module = compile_source(CONVNET, str(tmp_path / "convnet.nf"))
    add_training_functions(module)
    totals = phase_totals(func_cost(module.func("train_step")))
    ratio = totals["backward"][0] / totals["forward"][0]
    # conv2 needs dX and dW (2x), conv1 only dW (1x): between 1 and 2.2
    assert 1.0 < ratio <= 2.2, ratio


@pytest.mark.parametrize("stride,dil,pad", [(1, 1, 0), (2, 1, 1), (2, 2, 2), (3, 1, 0)])
def test_conv_gradients_cost_like_the_forward(parse, conv_ir, scalar_loss, stride, dil, pad):
    from nfc.cost import func_cost
    from nfc.passes.autodiff.graph import grad_func

    text, _ = conv_ir(4, 8, 16, 16, 3, stride, dil, pad)
    f = parse(text).func("f")
    g = grad_func(scalar_loss(f), ["x", "w"])
    costs = {c.name: c for c in func_cost(g)}
    fwd, dx, dw = costs["%y"], costs["%d_x"], costs["%d_w"]
    # useful multiply-adds are the forward's (minus padded taps the forward multiplies by 0)
    assert 0.6 * fwd.flops <= dx.flops <= fwd.flops * 1.0001
    assert 0.6 * fwd.flops <= dw.flops <= fwd.flops * 1.0001
    # the iteration space of the gather stays within a small factor of the useful points:
    # a stride-s window of k iterates ceil(k / s) offsets per axis, not k. (When stride and
    # dilation share a factor g, only every g-th input row is ever read; the other rows of
    # dX are zero by a guard on the output index, and their reductions still iterate.)
    g = math.gcd(stride, dil)
    assert dx.points <= 2.0 * g * g * fwd.points
    assert dw.points <= fwd.points


def test_matmul_backward_is_twice_forward(parse):
    from nfc.cost import func_cost, phase_totals
    from nfc.passes.autodiff.graph import grad_func

    text = """
nf.module @m {
  nf.func @f(%a: tensor<32x64xf32>, %b: tensor<64x16xf32>) -> (tensor<f32>) {
    %y = nf.compute [i: 32, j: 16] sum [k: 64] (%a[i, k] * %b[k, j]) : tensor<32x16xf32>
    %l = nf.compute [] sum [i: 32, j: 16] (%y[i, j] * %y[i, j]) : tensor<f32>
    nf.return %l : tensor<f32>
  }
}
"""
    g = grad_func(parse(text).func("f"), ["a", "b"])
    costs = {c.name: c for c in func_cost(g)}
    assert costs["%y"].flops == 2 * 32 * 16 * 64
    assert costs["%d_a"].flops == costs["%d_b"].flops == costs["%y"].flops
    t = phase_totals(costs.values())
    assert t["backward"][0] == pytest.approx(2 * costs["%y"].flops, rel=0.01)
    assert costs["%y"].bytes == (32 * 64 + 64 * 16 + 32 * 16) * 4


def test_guard_fraction_is_exact(parse):
    from nfc.cost import func_cost

    text = """
nf.module @m {
  nf.func @f(%x: tensor<10xf32>) -> (tensor<12xf32>) {
    %y = nf.compute [i: 12] sum [r: 3] (select(1 <= i + r - 1 and i + r - 1 < 11,
                                                %x[i + r - 2] * 2.0, 0.0)) : tensor<12xf32>
    nf.return %y : tensor<12xf32>
  }
}
"""
    (c,) = func_cost(parse(text).func("f"))
    # taken where 2 <= i + r <= 11: 30 of 36 points, one multiply and one add each
    assert c.points == 36
    assert c.flops == pytest.approx(2 * 30)


def test_stats_cli(tmp_path: Path, capsys):
    from nfc.cli import main

    src = tmp_path / "convnet.nf"
    src.write_text(CONVNET)
    assert main(["stats", str(src), "--pass", "autodiff", "--func", "train_step"]) == 0
    out = capsys.readouterr().out
    assert "@train_step" in out and "@forward" not in out
    assert "total backward" in out and "total update" in out
    ratio = float(out.split("backward/forward flops:")[1].split()[0])
    assert 1.0 < ratio <= 2.2
