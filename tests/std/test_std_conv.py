"""std.nn convolutions and pooling against loop-over-kernel-offsets numpy references."""

from __future__ import annotations

import numpy as np
import pytest


def out_size(size: int, k: int, stride: int, padding: int, dilation: int = 1) -> int:
    return (size + 2 * padding - dilation * (k - 1) - 1) // stride + 1


def conv2d_ref(x, w, stride=1, padding=0, dilation=1, groups=1):
    """Cross-correlation: np.pad, then one strided window slice per kernel offset."""
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    assert c == cg * groups and o % groups == 0
    ho, wo = out_size(h, kh, stride, padding, dilation), out_size(wd, kw, stride, padding, dilation)
    xp = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    out = np.zeros((n, o, ho, wo), dtype=x.dtype)
    og = o // groups
    for g in range(groups):
        xg, wg = xp[:, g * cg:(g + 1) * cg], w[g * og:(g + 1) * og]
        for r in range(kh):
            for s in range(kw):
                win = xg[:, :, r * dilation:r * dilation + stride * (ho - 1) + 1:stride,
                         s * dilation:s * dilation + stride * (wo - 1) + 1:stride]
                out[:, g * og:(g + 1) * og] += np.einsum("nchw,oc->nohw", win, wg[:, :, r, s])
    return out


def pool_ref(x, size, stride, padding, kind):
    n, c, h, wd = x.shape
    ho, wo = out_size(h, size, stride, padding), out_size(wd, size, stride, padding)
    fill = -np.inf if kind == "max" else 0.0
    xp = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)),
                constant_values=fill)
    acc = np.full((n, c, ho, wo), fill)
    for r in range(size):
        for s in range(size):
            win = xp[:, :, r:r + stride * (ho - 1) + 1:stride, s:s + stride * (wo - 1) + 1:stride]
            acc = np.maximum(acc, win) if kind == "max" else acc + win
    return acc if kind == "max" else acc / (size * size)


CONV_CASES = [
    # n, c, h, w, o, kh, kw, stride, padding, dilation, groups
    (2, 3, 7, 7, 4, 3, 3, 1, 0, 1, 1),
    (2, 3, 8, 7, 5, 3, 2, 2, 1, 1, 1),
    (1, 4, 9, 9, 6, 3, 3, 1, 2, 2, 2),
    (2, 4, 6, 6, 4, 1, 1, 1, 0, 1, 2),
    (1, 2, 7, 8, 4, 3, 3, 2, 1, 2, 1),
    (1, 6, 5, 5, 6, 3, 3, 1, 1, 1, 3),
    (1, 2, 6, 6, 3, 5, 5, 1, 2, 1, 1),
]


@pytest.mark.parametrize("n,c,h,w,o,kh,kw,stride,padding,dilation,groups", CONV_CASES)
def test_conv2d(std, close, rng, n, c, h, w, o, kh, kw, stride, padding, dilation, groups):
    x = rng.standard_normal((n, c, h, w))
    k = rng.standard_normal((o, c // groups, kh, kw))
    params = {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups}
    (y,) = std("conv2d", x, k, params=params)
    close(y, conv2d_ref(x, k, stride, padding, dilation, groups))


def test_conv2d_defaults(std, close, rng):
    x, k = rng.standard_normal((1, 2, 5, 5)), rng.standard_normal((3, 2, 3, 3))
    (y,) = std("conv2d", x, k)
    assert y.shape == (1, 3, 3, 3)
    close(y, conv2d_ref(x, k))


@pytest.mark.parametrize("stride,padding,dilation", [(1, 1, 1), (2, 1, 1), (1, 2, 2), (2, 0, 1)])
def test_depthwise_conv2d(std, close, rng, stride, padding, dilation):
    x, k = rng.standard_normal((2, 3, 7, 6)), rng.standard_normal((3, 1, 3, 3))
    params = {"stride": stride, "padding": padding, "dilation": dilation}
    (y,) = std("depthwise_conv2d", x, k, params=params)
    close(y, conv2d_ref(x, k, stride, padding, dilation, groups=3))


POOL_CASES = [(2, 2, 0), (3, 2, 1), (3, 1, 1), (2, 1, 0), (3, 3, 0)]


@pytest.mark.parametrize("size,stride,padding", POOL_CASES)
def test_max_pool2d(std, close, rng, size, stride, padding):
    x = rng.standard_normal((2, 3, 7, 6))
    (y,) = std("max_pool2d", x, params={"size": size, "stride": stride, "padding": padding})
    close(y, pool_ref(x, size, stride, padding, "max"))


def test_max_pool2d_negative_inputs_ignore_padding(std, close, rng):
    # all inputs negative: a padded zero must never win the max
    x = -1.0 - rng.random((1, 2, 4, 4))
    (y,) = std("max_pool2d", x, params={"size": 3, "stride": 1, "padding": 1})
    assert (y < -1.0).all()
    close(y, pool_ref(x, 3, 1, 1, "max"))


@pytest.mark.parametrize("size,stride,padding", POOL_CASES)
def test_avg_pool2d(std, close, rng, size, stride, padding):
    x = rng.standard_normal((2, 3, 7, 6))
    (y,) = std("avg_pool2d", x, params={"size": size, "stride": stride, "padding": padding})
    close(y, pool_ref(x, size, stride, padding, "avg"))


def test_global_avg_pool(std, close, rng):
    x = rng.standard_normal((2, 3, 4, 5))
    (y,) = std("global_avg_pool", x)
    close(y, x.mean(axis=(2, 3)))


@pytest.mark.parametrize("p", [0, 1, 2])
def test_pad2d(std, close, rng, p):
    x = rng.standard_normal((2, 2, 3, 4))
    (y,) = std("pad2d", x, params={"p": p})
    close(y, np.pad(x, ((0, 0), (0, 0), (p, p), (p, p))))
