"""The ops the nfc.torch tests load, each with a PyTorch formulation to check it against.

Every case names a `.nf` op (the standard library or a file under examples/), its
compile-time parameters, small float64 arguments for gradcheck, and `ref`, the same op written
with PyTorch primitives (an independent oracle: nothing here calls nfc).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
CAPSULE_NF = EXAMPLES / "torch_capsule" / "capsule.nf"


def capsule_conv_ref(a: torch.Tensor, k: torch.Tensor, stride: int = 2) -> torch.Tensor:
    """y[b,o,p,q,i,j] = sum(c,r,s,t) a[b,c,p*stride+r,q*stride+s,i,t] * k[o,c,r,s,t,j]."""
    kh, kw = k.shape[2], k.shape[3]
    win = a.unfold(2, kh, stride).unfold(3, kw, stride)        # [B, C, Ho, Wo, P, P, KH, KW]
    return torch.einsum("bcpqitrs,ocrstj->bopqij", win, k)


def squash_poses_ref(u: torch.Tensor, eps: float = 1e-7) -> torch.Tensor:
    """squash over each P x P pose read as a vector."""
    n2 = (u * u).sum(dim=(-2, -1), keepdim=True)
    return u * (n2 / (1.0 + n2)) * torch.rsqrt(n2 + eps)


def capsule_layer_ref(a: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """examples/torch_capsule/capsule.nf's capsule_layer (stride 2)."""
    return squash_poses_ref(capsule_conv_ref(a, k, 2))


def channel_shuffle_ref(x: torch.Tensor, groups: int) -> torch.Tensor:
    """torch.nn.ChannelShuffle's order."""
    n, c, h, w = x.shape
    return x.view(n, groups, c // groups, h, w).transpose(1, 2).reshape(n, c, h, w)


def milstm_ref(x, h, c, w, u, alpha, beta1, beta2, b):  # noqa: ANN001, ANN201
    """examples/milstm.nf's milstm_cell (gates i, f, g, o)."""
    wx, uh = x @ w, h @ u
    z = alpha * wx * uh + beta1 * uh + beta2 * wx + b
    zi, zf, zg, zo = z.chunk(4, dim=1)
    c2 = torch.sigmoid(zf) * c + torch.sigmoid(zi) * torch.tanh(zg)
    return torch.sigmoid(zo) * torch.tanh(c2), c2


def lltm_ref(x, h, c, w, b):  # noqa: ANN001, ANN201
    """examples/models/lltm.nf's lltm_cell: X = [h, x], gates i, o, candidate z (ELU)."""
    g = torch.cat([h, x], dim=1) @ w + b
    gi, go, gz = g.chunk(3, dim=1)
    c2 = c + F.elu(gz) * torch.sigmoid(gi)
    return torch.tanh(c2) * torch.sigmoid(go), c2


@dataclass
class Case:
    """One op under test."""

    name: str
    source: str | Path
    op: str
    params: dict[str, Any]
    shapes: list[tuple[int, ...]]
    ref: Callable[..., Any]
    depth: int = 1
    """The longest chain of roundings per result element (sum lengths and elementwise
    steps): tolerances are `depth * eps` relative to the magnitude the op sums (see
    `tolerance`)."""
    exact: bool = False
    """Pure data movement: results must be bit-identical."""
    magnitude: Callable[..., float] = lambda *a: 1.0
    """A bound on the largest intermediate (the sum of absolute products), from the
    arguments; errors of the activations that follow are at most as large (their
    derivatives are at most 1 in magnitude on the values a cell sees)."""

    def args(self, dtype: torch.dtype, seed: int = 0, grad: bool = False) -> list[torch.Tensor]:
        """Seeded arguments; random values in [-1, 1)."""
        g = torch.Generator().manual_seed(seed)
        return [(torch.rand(s, generator=g, dtype=torch.float64) * 2 - 1).to(dtype)
                .requires_grad_(grad) for s in self.shapes]


CASES = [
    # reduction length C*KH*KW*P = 2*3*3*2 = 36
    Case("capsule_conv", "std.nn", "capsule_conv", {"stride": 2},
         [(2, 2, 5, 5, 2, 2), (3, 2, 3, 3, 2, 2)],
         lambda a, k: capsule_conv_ref(a, k, 2), depth=36, magnitude=lambda a, k: float(
             capsule_conv_ref(a.abs(), k.abs(), 2).max())),
    # 36 for the convolution, 4 for the squared norm, ~10 for squash's arithmetic
    Case("capsule_layer", CAPSULE_NF, "capsule_layer", {},
         [(2, 2, 5, 5, 2, 2), (3, 2, 3, 3, 2, 2)], capsule_layer_ref, depth=50,
         magnitude=lambda a, k: float(capsule_conv_ref(a.abs(), k.abs(), 2).max())),
    Case("depth2space", "std.nn", "depth2space", {"r": 2}, [(2, 8, 3, 3)],
         lambda x: F.pixel_shuffle(x, 2), exact=True),
    Case("channel_shuffle", "std.nn", "channel_shuffle", {"groups": 3}, [(2, 6, 3, 2)],
         lambda x: channel_shuffle_ref(x, 3), exact=True),
    # I = 4, H = 5: matmuls of length 4 and 5, then ~20 elementwise steps through the gates
    Case("milstm_cell", EXAMPLES / "milstm.nf", "milstm_cell", {},
         [(3, 4), (3, 5), (3, 5), (4, 20), (5, 20), (20,), (20,), (20,), (20,)], milstm_ref,
         depth=30, magnitude=lambda x, h, c, w, u, al, b1, b2, b: float(
             (al.abs() * (x.abs() @ w.abs()) * (h.abs() @ u.abs()) + b1.abs() * (h.abs() @ u.abs())
              + b2.abs() * (x.abs() @ w.abs()) + b.abs() + c.abs().max()).max())),
    # H + I = 9: a matmul of length 9, then ~15 elementwise steps
    Case("lltm_cell", EXAMPLES / "models" / "lltm.nf", "lltm_cell", {},
         [(3, 4), (3, 5), (3, 5), (9, 15), (15,)], lltm_ref, depth=25,
         magnitude=lambda x, h, c, w, b: float(
             (torch.cat([h, x], 1).abs() @ w.abs() + b.abs() + c.abs().max()).max())),
]


def tolerance(case: Case, dtype: torch.dtype, magnitude: float) -> float:
    """Absolute tolerance for comparing nfc with the reference: both round at most
    `case.depth` times along each element's computation, each rounding off by at most eps
    relative to the largest intermediate (`magnitude`, bounded by the sum of the absolute
    products), so they differ by at most 2 * depth * eps * magnitude."""
    eps = torch.finfo(dtype).eps
    return 2 * case.depth * eps * magnitude
