"""std.nn losses against numpy."""

from __future__ import annotations

import numpy as np
import pytest


def _log_softmax(x):
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return np.log(e / e.sum(axis=1, keepdims=True))


@pytest.mark.parametrize("n,c", [(1, 2), (5, 3), (8, 10)])
def test_softmax_cross_entropy(std, close, rng, n, c):
    logits = 2 * rng.standard_normal((n, c))
    labels = rng.integers(0, c, size=n).astype(np.int32)
    (loss,) = std("softmax_cross_entropy", logits, labels)
    assert loss.shape == ()
    close(loss, -np.mean(_log_softmax(logits)[np.arange(n), labels]))


def test_softmax_cross_entropy_large_logits(std, close):
    logits = np.array([[1000.0, 0.0], [0.0, 1000.0]])
    labels = np.array([0, 0], dtype=np.int32)
    (loss,) = std("softmax_cross_entropy", logits, labels)
    close(loss, np.array(500.0))


def test_mse(std, close, rng):
    a, b = rng.standard_normal((4, 3)), rng.standard_normal((4, 3))
    (loss,) = std("mse", a, b)
    assert loss.shape == ()
    close(loss, np.array(((a - b) ** 2).mean()))


@pytest.mark.parametrize("params", [{}, {"m_pos": 0.8, "m_neg": 0.2, "lam": 0.25}])
def test_margin_loss(std, close, rng, params):
    n, k = 6, 4
    lengths = rng.random((n, k))
    labels = rng.integers(0, k, size=n).astype(np.int32)
    (loss,) = std("margin_loss", lengths, labels, params=params)
    m_pos, m_neg, lam = params.get("m_pos", 0.9), params.get("m_neg", 0.1), params.get("lam", 0.5)
    onehot = np.eye(k)[labels]
    per = (onehot * np.clip(m_pos - lengths, 0, None) ** 2
           + lam * (1 - onehot) * np.clip(lengths - m_neg, 0, None) ** 2)
    close(loss, np.array(per.sum() / n))
