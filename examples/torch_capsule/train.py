"""Train a small capsule network in PyTorch whose capsule layer is written in .nf.

    .venv/bin/python examples/torch_capsule/train.py [--epochs 3] [--batch 32] [--lr 0.01]
                                                     [--compile] [--check]

The network is examples/capsule.nf's, built from torch.nn pieces except one layer:

    conv 3x3 (1 -> 32) -> ReLU -> 2 capsule types of 4x4 poses    [B, 2, 10, 10, 4, 4]
    -> capsule_layer (capsule.nf: capsule convolution + squash)    [B, 4, 4, 4, 4, 4]
    -> linear to 10 class capsules of 16 -> squash -> lengths -> margin loss

`nfc.torch.load_op` compiles the layer's forward and the backward nfc derives from it into
native code; PyTorch's autograd and optimizer (SGD with momentum) do the rest. The data are
scikit-learn's 8x8 digits upsampled to 12x12 (synthetic blobs when scikit-learn is missing).
`--check` first compares the layer with the same computation written in PyTorch primitives,
values and gradients; `--compile` runs the model under torch.compile(fullgraph=True).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import nfc.torch

HERE = Path(__file__).resolve().parent


def capsule_layer_torch(a: torch.Tensor, k: torch.Tensor, stride: int = 2) -> torch.Tensor:
    """The same layer in PyTorch primitives (for --check and benchmarks/torch_op.py)."""
    win = a.unfold(2, k.shape[2], stride).unfold(3, k.shape[3], stride)
    u = torch.einsum("bcpqitrs,ocrstj->bopqij", win, k)
    n2 = (u * u).sum(dim=(-2, -1), keepdim=True)
    return u * (n2 / (1.0 + n2)) * torch.rsqrt(n2 + 1e-7)


def squash(v: torch.Tensor) -> torch.Tensor:
    n2 = (v * v).sum(-1, keepdim=True)
    return v * (n2 / (1.0 + n2)) * torch.rsqrt(n2 + 1e-7)


class CapsNet(torch.nn.Module):
    """examples/capsule.nf as a torch.nn.Module with the capsule layer from capsule.nf."""

    def __init__(self, layer, classes: int = 10) -> None:  # noqa: ANN001
        super().__init__()
        self.layer = layer
        self.conv = torch.nn.Conv2d(1, 32, 3)
        self.k1 = torch.nn.Parameter(torch.randn(4, 2, 3, 3, 4, 4) * 0.05)
        self.w2 = torch.nn.Linear(1024, classes * 16, bias=False)
        self.classes = classes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        a0 = torch.relu(self.conv(x))                                    # [B, 32, 10, 10]
        # 32 channels = 2 capsule types x a 4x4 pose: move the pose to the last two axes;
        # nfc ops take contiguous tensors (a non-contiguous one is an error, not a copy)
        p0 = a0.view(b, 2, 16, 10, 10).permute(0, 1, 3, 4, 2).contiguous()
        p1 = self.layer(p0.view(b, 2, 10, 10, 4, 4), self.k1)            # [B, 4, 4, 4, 4, 4]
        v2 = squash(self.w2(p1.reshape(b, 1024)).view(b, self.classes, 16))
        return torch.sqrt((v2 * v2).sum(-1) + 1e-7)                      # capsule lengths


def margin_loss(lengths: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    t = F.one_hot(y, lengths.shape[1]).to(lengths.dtype)
    loss = t * F.relu(0.9 - lengths) ** 2 + 0.5 * (1 - t) * F.relu(lengths - 0.1) ** 2
    return loss.sum(1).mean()


def digits() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x_train, y_train, x_test, y_test): 12x12 images in [0, 1] and labels."""
    try:
        from sklearn.datasets import load_digits

        d = load_digits()
        x = torch.tensor(d.images, dtype=torch.float32)[:, None] / 16.0
        y = torch.tensor(d.target, dtype=torch.int64)
    except ImportError:
        g = torch.Generator().manual_seed(0)
        y = torch.randint(0, 10, (1797,), generator=g)
        x = torch.rand(1797, 1, 8, 8, generator=g) * 0.2
        x[torch.arange(1797), 0, y % 8, y // 2] += 1.0
    x = F.interpolate(x, size=(12, 12), mode="bilinear", align_corners=False)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    x, y = x[perm], y[perm]
    return x[360:], y[360:], x[:360], y[:360]


def check(layer) -> None:  # noqa: ANN001
    """The nfc layer against the PyTorch formulation: values and gradients (float64)."""
    g = torch.Generator().manual_seed(1)
    a = torch.randn(2, 2, 10, 10, 4, 4, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(4, 2, 3, 3, 4, 4, generator=g, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(2, 4, 4, 4, 4, 4, generator=g, dtype=torch.float64)
    y1, y2 = layer(a, k), capsule_layer_torch(a, k)
    g1 = torch.autograd.grad(y1, (a, k), dy)
    g2 = torch.autograd.grad(y2, (a, k), dy)
    diff = max(float((p - q).abs().max()) for p, q in zip((y1.detach(), *g1),
                                                         (y2.detach(), *g2), strict=True))
    print(f"check: nfc layer vs PyTorch primitives, largest difference {diff:.2e} (float64)")


def main(argv: list[str] | None = None) -> list[float]:
    """Train; returns the mean training loss of each epoch."""
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--steps", type=int, default=0, help="stop each epoch after N steps")
    args = ap.parse_args(argv)

    torch.manual_seed(0)
    layer = nfc.torch.load_op(HERE / "capsule.nf", "capsule_layer", params={"stride": 2})
    print(layer)
    if args.check:
        check(layer)
    model = CapsNet(layer)
    run = torch.compile(model, fullgraph=True) if args.compile else model
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    xtr, ytr, xte, yte = digits()
    history = []
    for epoch in range(args.epochs):
        t0 = time.perf_counter()
        order = torch.randperm(len(ytr), generator=torch.Generator().manual_seed(epoch))
        total, steps = 0.0, 0
        for i in range(0, len(ytr) - args.batch + 1, args.batch):  # full batches only
            idx = order[i:i + args.batch]
            opt.zero_grad()
            loss = margin_loss(run(xtr[idx]), ytr[idx])
            loss.backward()
            opt.step()
            total, steps = total + float(loss.detach()), steps + 1
            if steps == args.steps:
                break
        with torch.no_grad():
            acc = float((model(xte).argmax(1) == yte).float().mean())
        print(f"epoch {epoch + 1}: train loss {total / steps:.4f}, test accuracy {acc:.3f} "
              f"({time.perf_counter() - t0:.1f} s)")
        history.append(total / steps)
    return history


if __name__ == "__main__":
    main()
