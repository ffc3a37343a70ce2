"""depth2space in both ONNX modes against numpy transcriptions of the ONNX DepthToSpace
definition (https://onnx.ai/onnx/operators/onnx__DepthToSpace.html)."""

from __future__ import annotations

import numpy as np
import pytest


def onnx_dcr(x: np.ndarray, r: int) -> np.ndarray:
    n, c, h, w = x.shape
    t = x.reshape(n, r, r, c // (r * r), h, w).transpose(0, 3, 4, 1, 5, 2)
    return t.reshape(n, c // (r * r), h * r, w * r)


def onnx_crd(x: np.ndarray, r: int) -> np.ndarray:
    n, c, h, w = x.shape
    t = x.reshape(n, c // (r * r), r, r, h, w).transpose(0, 1, 4, 2, 5, 3)
    return t.reshape(n, c // (r * r), h * r, w * r)


@pytest.mark.parametrize("r,c", [(2, 1), (2, 3), (3, 2)])
@pytest.mark.parametrize("mode", ["dcr", "crd"])
def test_depth2space_modes_match_onnx(std, close, rng, mode, r, c):
    x = rng.standard_normal((2, c * r * r, 3, 2))
    (y,) = std(f"depth2space_{mode}", x, params={"r": r})
    close(y, (onnx_dcr if mode == "dcr" else onnx_crd)(x, r))


def test_depth2space_is_crd_and_the_modes_differ(std, close, rng):
    x = rng.standard_normal((1, 12, 2, 2))
    (y,) = std("depth2space", x, params={"r": 2})
    close(y, onnx_crd(x, 2))
    assert not np.allclose(onnx_crd(x, 2), onnx_dcr(x, 2))


def test_space2depth_inverts_crd(std, close, rng):
    x = rng.standard_normal((1, 8, 2, 3))
    (y,) = std("depth2space_crd", x, params={"r": 2})
    (back,) = std("space2depth", y, params={"r": 2})
    close(back, x)


def test_torch_pixel_shuffle_is_crd(std, close, rng):
    torch = pytest.importorskip("torch")
    x = rng.standard_normal((1, 18, 2, 3))
    (y,) = std("depth2space_crd", x, params={"r": 3})
    close(y, torch.nn.functional.pixel_shuffle(torch.tensor(x), 3).numpy())
