"""std.nn shape ops against numpy reshape/transpose/concatenate formulations."""

from __future__ import annotations

import numpy as np
import pytest


def test_transpose2d(std, close, rng):
    x = rng.standard_normal((3, 5))
    (y,) = std("transpose2d", x)
    close(y, x.T)


def test_flatten(std, close, rng):
    x = rng.standard_normal((2, 3, 4, 5))
    (y,) = std("flatten", x)
    close(y, x.reshape(2, 60))


def test_concat2d(std, close, rng):
    a, b = rng.standard_normal((2, 3)), rng.standard_normal((4, 3))
    (y,) = std("concat2d_axis0", a, b)
    close(y, np.concatenate([a, b], axis=0))
    a, b = rng.standard_normal((2, 3)), rng.standard_normal((2, 5))
    (y,) = std("concat2d_axis1", a, b)
    close(y, np.concatenate([a, b], axis=1))


@pytest.mark.parametrize("axis", [0, 1, 2, 3])
def test_concat4d(std, close, rng, axis):
    shape_a, shape_b = [2, 3, 4, 5], [2, 3, 4, 5]
    shape_b[axis] = 2
    a, b = rng.standard_normal(shape_a), rng.standard_normal(shape_b)
    (y,) = std(f"concat4d_axis{axis}", a, b)
    close(y, np.concatenate([a, b], axis=axis))


@pytest.mark.parametrize("axis,start,size", [(0, 1, 2), (1, 0, 3), (1, 2, 3)])
def test_slice2d(std, close, rng, axis, start, size):
    x = rng.standard_normal((4, 5))
    (y,) = std(f"slice2d_axis{axis}", x, params={"start": start, "size": size})
    close(y, np.take(x, np.arange(start, start + size), axis=axis))


@pytest.mark.parametrize("axis", [0, 1, 2, 3])
def test_slice4d(std, close, rng, axis):
    x = rng.standard_normal((3, 4, 5, 6))
    (y,) = std(f"slice4d_axis{axis}", x, params={"start": 1, "size": 2})
    close(y, np.take(x, [1, 2], axis=axis))


def _pixel_shuffle(x, r):
    n, c, h, w = x.shape
    return (x.reshape(n, c // (r * r), r, r, h, w).transpose(0, 1, 4, 2, 5, 3)
            .reshape(n, c // (r * r), h * r, w * r))


@pytest.mark.parametrize("r,c", [(2, 4), (2, 8), (3, 9)])
def test_depth2space(std, close, rng, r, c):
    x = rng.standard_normal((2, c, 3, 2))
    (y,) = std("depth2space", x, params={"r": r})
    close(y, _pixel_shuffle(x, r))


def test_depth2space_matches_formula(std, close, rng):
    # the DCR definition from the task: out[n, c, h, w] = x[n, c*r*r + (h%r)*r + w%r, h//r, w//r]
    x = rng.standard_normal((1, 8, 2, 3))
    (y,) = std("depth2space", x, params={"r": 2})
    assert y[0, 1, 3, 4] == x[0, 1 * 4 + 1 * 2 + 0, 1, 2]


@pytest.mark.parametrize("r", [2, 3])
def test_space2depth(std, close, rng, r):
    x = rng.standard_normal((2, 3, 2 * r, 3 * r))
    (y,) = std("space2depth", x, params={"r": r})
    n, c, h, w = x.shape
    ref = (x.reshape(n, c, h // r, r, w // r, r).transpose(0, 1, 3, 5, 2, 4)
           .reshape(n, c * r * r, h // r, w // r))
    close(y, ref)
    close(_pixel_shuffle(y, r), x)


@pytest.mark.parametrize("groups,c", [(2, 6), (3, 6), (4, 8), (1, 3)])
def test_channel_shuffle(std, close, rng, groups, c):
    x = rng.standard_normal((2, c, 2, 3))
    (y,) = std("channel_shuffle", x, params={"groups": groups})
    n, _, h, w = x.shape
    close(y, x.reshape(n, groups, c // groups, h, w).transpose(0, 2, 1, 3, 4).reshape(x.shape))
