"""std.nn activations and (log-)softmax against numpy."""

from __future__ import annotations

import math

import numpy as np
import pytest

_erf = np.vectorize(math.erf)


def test_relu(std, close, rng):
    x = rng.standard_normal((4, 5))
    (y,) = std("relu", x)
    close(y, np.where(x > 0, x, 0.0))


def test_relu_4d(std, close, rng):
    x = rng.standard_normal((2, 3, 2, 4))
    (y,) = std("relu_4d", x)
    close(y, np.where(x > 0, x, 0.0))


@pytest.mark.parametrize("alpha", [0.01, 0.2])
def test_leaky_relu(std, close, rng, alpha):
    x = rng.standard_normal((4, 5))
    (y,) = std("leaky_relu", x, params={"alpha": alpha})
    close(y, np.where(x > 0, x, alpha * x))


def test_leaky_relu_default_alpha(std, close, rng):
    x = rng.standard_normal((3, 3))
    (y,) = std("leaky_relu", x)
    close(y, np.where(x > 0, x, 0.01 * x))


@pytest.mark.parametrize("alpha", [1.0, 0.5])
def test_elu(std, close, rng, alpha):
    x = 2 * rng.standard_normal((4, 5))
    (y,) = std("elu", x, params={"alpha": alpha})
    close(y, np.where(x > 0, x, alpha * np.expm1(x)))


def test_gelu(std, close, rng):
    x = 3 * rng.standard_normal((4, 6))
    (y,) = std("gelu", x)
    close(y, x * 0.5 * (1.0 + _erf(x / math.sqrt(2.0))))


def test_sigmoid(std, close, rng):
    x = 4 * rng.standard_normal((3, 7))
    (y,) = std("sigmoid", x)
    close(y, 1.0 / (1.0 + np.exp(-x)))


def test_tanh(std, close, rng):
    x = 2 * rng.standard_normal((3, 7))
    (y,) = std("tanh", x)
    e2 = np.exp(2 * x)
    close(y, (e2 - 1) / (e2 + 1))


@pytest.mark.parametrize("shape", [(1, 1), (3, 5), (4, 10)])
def test_softmax(std, close, rng, shape):
    x = rng.standard_normal(shape)
    (y,) = std("softmax", x)
    ex = np.exp(x)
    close(y, ex / ex.sum(axis=1, keepdims=True))


@pytest.mark.parametrize("shape", [(1, 1), (3, 5), (4, 10)])
def test_log_softmax(std, close, rng, shape):
    x = rng.standard_normal(shape)
    (y,) = std("log_softmax", x)
    ex = np.exp(x)
    close(y, np.log(ex / ex.sum(axis=1, keepdims=True)))


def test_softmax_is_stable_for_huge_logits(std, close, rng):
    # exp(1000) overflows f64: only the max-subtracted form stays finite
    x = 1000.0 + rng.standard_normal((3, 4))
    (y,) = std("softmax", x)
    (ly,) = std("log_softmax", x)
    assert np.isfinite(y).all() and np.isfinite(ly).all()
    shifted = x - 1000.0
    ex = np.exp(shifted)
    close(y, ex / ex.sum(axis=1, keepdims=True))
    close(ly, np.log(ex / ex.sum(axis=1, keepdims=True)))
