"""std.nn capsule ops and the LSTM cell against numpy."""

from __future__ import annotations

import numpy as np
import pytest


def capsule_conv_ref(a, k, stride):
    bsz, c, h, w, p, _ = a.shape
    o, _, kh, kw, _, _ = k.shape
    ho, wo = (h - kh) // stride + 1, (w - kw) // stride + 1
    out = np.zeros((bsz, o, ho, wo, p, p))
    for r in range(kh):
        for s in range(kw):
            win = a[:, :, r:r + stride * (ho - 1) + 1:stride, s:s + stride * (wo - 1) + 1:stride]
            # per position: sum over input capsule types of pose(a) @ pose(k)
            out += np.einsum("bchwit,octj->bohwij", win, k[:, :, r, s])
    return out


@pytest.mark.parametrize("stride,h", [(2, 7), (1, 5), (2, 8)])
def test_capsule_conv(std, close, rng, stride, h):
    a = rng.standard_normal((2, 3, h, h, 4, 4))
    k = rng.standard_normal((2, 3, 3, 3, 4, 4))
    (y,) = std("capsule_conv", a, k, params={"stride": stride})
    close(y, capsule_conv_ref(a, k, stride))


def test_capsule_conv_pose_product(std, close, rng):
    # one type, one 1x1 window: each output pose is the matrix product of the two poses
    a, k = rng.standard_normal((1, 1, 1, 1, 3, 3)), rng.standard_normal((1, 1, 1, 1, 3, 3))
    (y,) = std("capsule_conv", a, k, params={"stride": 1})
    close(y[0, 0, 0, 0], a[0, 0, 0, 0] @ k[0, 0, 0, 0])


def test_squash(std, close, rng):
    x = rng.standard_normal((3, 4, 5))
    (y,) = std("squash", x, params={"eps": 0.0})
    norm = np.linalg.norm(x, axis=2, keepdims=True)
    close(y, norm**2 / (1 + norm**2) * x / norm)
    assert (np.linalg.norm(y, axis=2) < 1).all()


def test_capsule_length(std, close, rng):
    x = rng.standard_normal((3, 4, 5))
    (y,) = std("capsule_length", x, params={"eps": 0.0})
    close(y, np.linalg.norm(x, axis=2))


def test_lstm_cell(std, close, rng):
    n, i_dim, hid = 3, 4, 5
    x, h, c = (rng.standard_normal((n, i_dim)), rng.standard_normal((n, hid)),
               rng.standard_normal((n, hid)))
    w, b = rng.standard_normal((i_dim + hid, 4 * hid)), rng.standard_normal(4 * hid)
    h2, c2 = std("lstm_cell", x, h, c, w, b)
    wx, wh = w[:i_dim], w[i_dim:]
    z = x @ wx + h @ wh + b
    zi, zf, zg, zo = np.split(z, 4, axis=1)
    sig = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
    ref_c = sig(zf) * c + sig(zi) * np.tanh(zg)
    close(c2, ref_c)
    close(h2, sig(zo) * np.tanh(ref_c))
