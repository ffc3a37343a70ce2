"""std.nn matrix products, bias adds and embedding against numpy."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.mark.parametrize("n,k,m", [(1, 1, 1), (3, 5, 4), (8, 16, 3)])
def test_matmul(std, close, rng, n, k, m):
    a, b = rng.standard_normal((n, k)), rng.standard_normal((k, m))
    (y,) = std("matmul", a, b)
    close(y, a @ b)
    assert y.dtype == np.float64


@pytest.mark.parametrize("bsz,n,k,m", [(1, 2, 3, 4), (3, 4, 5, 2)])
def test_bmm(std, close, rng, bsz, n, k, m):
    a, b = rng.standard_normal((bsz, n, k)), rng.standard_normal((bsz, k, m))
    (y,) = std("bmm", a, b)
    close(y, np.stack([a[i] @ b[i] for i in range(bsz)]))


@pytest.mark.parametrize("n,k,m", [(2, 3, 4), (5, 7, 1)])
def test_linear(std, close, rng, n, k, m):
    x, w, b = rng.standard_normal((n, k)), rng.standard_normal((k, m)), rng.standard_normal(m)
    (y,) = std("linear", x, w, b)
    close(y, x @ w + b[None, :])
    (y0,) = std("linear_nobias", x, w)
    close(y0, x @ w)


def test_bias_add(std, close, rng):
    x, b = rng.standard_normal((3, 4)), rng.standard_normal(4)
    (y,) = std("bias_add", x, b)
    close(y, x + b)


def test_bias_add_nchw(std, close, rng):
    x, b = rng.standard_normal((2, 3, 4, 5)), rng.standard_normal(3)
    (y,) = std("bias_add_nchw", x, b)
    close(y, x + b.reshape(1, 3, 1, 1))


def test_embedding(std, close, rng):
    table = rng.standard_normal((7, 5))
    ids = np.array([0, 6, 3, 3, 1], dtype=np.int32)
    (y,) = std("embedding", ids, table)
    close(y, np.stack([table[i] for i in ids]))
