"""std.nn normalisation and dropout against numpy."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.mark.parametrize("eps", [1e-5, 0.1])
def test_layer_norm(std, close, rng, eps):
    x = 3 + 2 * rng.standard_normal((4, 6))
    g, b = rng.standard_normal(6), rng.standard_normal(6)
    (y,) = std("layer_norm", x, g, b, params={"eps": eps})
    mu, var = x.mean(axis=1, keepdims=True), x.var(axis=1, keepdims=True)
    close(y, (x - mu) / np.sqrt(var + eps) * g + b)


def test_layer_norm_default_eps(std, close, rng):
    x, g, b = rng.standard_normal((2, 5)), np.ones(5), np.zeros(5)
    (y,) = std("layer_norm", x, g, b)
    close(y, (x - x.mean(1, keepdims=True)) / np.sqrt(x.var(1, keepdims=True) + 1e-5))


@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (1, 2, 3, 3)])
def test_batch_norm_train(std, close, rng, shape):
    x = 1 + rng.standard_normal(shape)
    c = shape[1]
    g, b = rng.standard_normal(c), rng.standard_normal(c)
    y, mean, var = std("batch_norm_train", x, g, b, params={"eps": 1e-3})
    ref_mean, ref_var = x.mean(axis=(0, 2, 3)), x.var(axis=(0, 2, 3))
    close(mean, ref_mean)
    close(var, ref_var)
    bc = (1, c, 1, 1)
    close(y, (x - ref_mean.reshape(bc)) / np.sqrt(ref_var.reshape(bc) + 1e-3) * g.reshape(bc)
          + b.reshape(bc))


def test_batch_norm_eval(std, close, rng):
    x = rng.standard_normal((2, 3, 2, 2))
    g, b, m, v = (rng.standard_normal(3), rng.standard_normal(3), rng.standard_normal(3),
                  rng.random(3) + 0.5)
    (y,) = std("batch_norm_eval", x, g, b, m, v)
    bc = (1, 3, 1, 1)
    close(y, (x - m.reshape(bc)) / np.sqrt(v.reshape(bc) + 1e-5) * g.reshape(bc)
          + b.reshape(bc))


def test_batch_norm1d(std, close, rng):
    x = rng.standard_normal((8, 3))
    g, b = rng.standard_normal(3), rng.standard_normal(3)
    y, mean, var = std("batch_norm1d_train", x, g, b)
    close(mean, x.mean(0))
    close(var, x.var(0))
    close(y, (x - x.mean(0)) / np.sqrt(x.var(0) + 1e-5) * g + b)
    (ye,) = std("batch_norm1d_eval", x, g, b, mean, var)
    close(ye, y)


@pytest.mark.parametrize("p", [0.0, 0.3, 0.75])
def test_dropout(std, close, rng, p):
    x, u = rng.standard_normal((5, 6)), rng.random((5, 6))
    (y,) = std("dropout", x, u, params={"p": p})
    close(y, np.where(u >= p, x / (1 - p), 0.0))


def test_dropout_4d(std, close, rng):
    x, u = rng.standard_normal((2, 3, 2, 2)), rng.random((2, 3, 2, 2))
    (y,) = std("dropout_4d", x, u, params={"p": 0.5})
    close(y, np.where(u >= 0.5, 2 * x, 0.0))
