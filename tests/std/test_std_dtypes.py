"""The same std.nn ops instantiated in f32 (dtype variable T) agree with f64 references."""

from __future__ import annotations

import numpy as np


def _f32(*arrays):
    return [a.astype(np.float32) for a in arrays]


def test_linear_f32(std, close, rng):
    x, w, b = rng.standard_normal((4, 8)), rng.standard_normal((8, 3)), rng.standard_normal(3)
    (y,) = std("linear", *_f32(x, w, b))
    assert y.dtype == np.float32
    close(y, x.astype(np.float32).astype(np.float64) @ w.astype(np.float32) + b, rtol=1e-5,
          atol=1e-5)


def test_conv2d_f32(std, close, rng):
    x, k = rng.standard_normal((1, 2, 5, 5)), rng.standard_normal((4, 1, 3, 3))
    (y,) = std("conv2d", *_f32(x, k), params={"stride": 2, "padding": 1, "groups": 2})
    assert y.dtype == np.float32 and y.shape == (1, 4, 3, 3)
    (y64,) = std("conv2d", *(a.astype(np.float32).astype(np.float64) for a in (x, k)),
                 params={"stride": 2, "padding": 1, "groups": 2})
    close(y, y64, rtol=1e-5, atol=1e-5)


def test_softmax_cross_entropy_f32(std, close, rng):
    logits = rng.standard_normal((6, 5)).astype(np.float32)
    labels = rng.integers(0, 5, size=6).astype(np.int32)
    (loss,) = std("softmax_cross_entropy", logits, labels)
    assert loss.dtype == np.float32
    lg = logits.astype(np.float64)
    lp = lg - np.log(np.exp(lg).sum(1, keepdims=True))
    close(loss, np.array(-lp[np.arange(6), labels].mean()), rtol=1e-5, atol=1e-6)


def test_batch_norm_train_f32(std, close, rng):
    x = rng.standard_normal((2, 3, 4, 4)).astype(np.float32)
    g, b = np.ones(3, np.float32), np.zeros(3, np.float32)
    y, mean, var = std("batch_norm_train", x, g, b)
    assert {y.dtype, mean.dtype, var.dtype} == {np.dtype(np.float32)}
    x64 = x.astype(np.float64)
    close(mean, x64.mean((0, 2, 3)), rtol=1e-5, atol=1e-6)
    close(var, x64.var((0, 2, 3)), rtol=1e-5, atol=1e-6)


def test_max_pool_and_gelu_f32(std, close, rng):
    x = rng.standard_normal((1, 2, 4, 4)).astype(np.float32)
    (y,) = std("max_pool2d", x, params={"size": 3, "stride": 1, "padding": 1})
    assert y.dtype == np.float32
    (y64,) = std("max_pool2d", x.astype(np.float64), params={"size": 3, "stride": 1,
                                                             "padding": 1})
    close(y, y64, rtol=0, atol=0)
    z = rng.standard_normal((3, 4)).astype(np.float32)
    (g,) = std("gelu", z)
    (g64,) = std("gelu", z.astype(np.float64))
    assert g.dtype == np.float32
    close(g, g64, rtol=1e-5, atol=1e-6)
