"""Small torch.nn.Modules with an nfc op inside train with torch optimizers.

Each module exists twice: with the nfc op (loaded from `.nf`, compiled forward and backward)
and with the same op written in PyTorch primitives. Trained side by side in float64 from the
same initial parameters, they stay together step after step; in float32 with Adam, the nfc
module's loss falls.
"""

import pytest

pytest.importorskip("torch.library")  # without PyTorch, `torch` would be this folder
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from nfc_torch_cases import (  # noqa: E402
    CAPSULE_NF,
    EXAMPLES,
    capsule_layer_ref,
    channel_shuffle_ref,
    lltm_ref,
    milstm_ref,
)

import nfc.torch  # noqa: E402


def _margin_loss(lengths: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    t = F.one_hot(y, lengths.shape[1]).to(lengths.dtype)
    per_class = t * F.relu(0.9 - lengths) ** 2 + 0.5 * (1 - t) * F.relu(lengths - 0.1) ** 2
    return per_class.sum(1).mean()


class CapsNet(torch.nn.Module):
    """conv -> 2 types of 2x2 pose capsules -> capsule layer (conv + squash) -> class capsules."""

    def __init__(self, layer, classes: int = 3) -> None:  # noqa: ANN001
        super().__init__()
        self.layer = layer
        self.conv = torch.nn.Conv2d(1, 8, 3)
        self.k = torch.nn.Parameter(torch.randn(3, 2, 3, 3, 2, 2) * 0.3)
        self.classes = torch.nn.Linear(3 * 3 * 3 * 4, classes * 4, bias=False)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        a = torch.relu(self.conv(x))                                    # [B, 8, 7, 7]
        b = a.shape[0]
        poses = a.view(b, 2, 4, 7, 7).permute(0, 1, 3, 4, 2).contiguous().view(b, 2, 7, 7, 2, 2)
        u = self.layer(poses, self.k)                                   # [B, 3, 3, 3, 2, 2]
        v = self.classes(u.reshape(b, -1)).view(b, -1, 4)
        n2 = (v * v).sum(-1, keepdim=True)
        v = v * n2 / (1 + n2) / torch.sqrt(n2 + 1e-7)
        return _margin_loss(torch.sqrt((v * v).sum(-1) + 1e-7), y)


class SubPixel(torch.nn.Module):
    """conv to 4x the channels -> depth-to-space -> conv; MSE against a target image."""

    def __init__(self, d2s) -> None:  # noqa: ANN001
        super().__init__()
        self.d2s = d2s
        self.up = torch.nn.Conv2d(2, 12, 3, padding=1)
        self.out = torch.nn.Conv2d(3, 1, 3, padding=1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(self.out(torch.tanh(self.d2s(self.up(x)))), y)


class Shuffle(torch.nn.Module):
    """grouped 1x1 conv -> channel shuffle -> grouped 3x3 conv -> pool -> classifier."""

    def __init__(self, shuffle, classes: int = 3) -> None:  # noqa: ANN001
        super().__init__()
        self.shuffle = shuffle
        self.c1 = torch.nn.Conv2d(4, 6, 1, groups=2)
        self.c2 = torch.nn.Conv2d(6, 6, 3, padding=1, groups=3)
        self.fc = torch.nn.Linear(6, classes)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = self.c2(self.shuffle(torch.relu(self.c1(x))))
        return F.cross_entropy(self.fc(torch.relu(h).mean(dim=(2, 3))), y)


class Recurrent(torch.nn.Module):
    """A cell unrolled over the sequence (its two outputs h, c fed back), then a classifier."""

    def __init__(self, cell, kind: str, inputs: int = 4, hidden: int = 5,  # noqa: ANN001
                 classes: int = 3) -> None:
        super().__init__()
        self.cell, self.kind, self.hidden = cell, kind, hidden
        r = lambda *s, scale=0.5: torch.nn.Parameter(torch.randn(*s) * scale)  # noqa: E731
        if kind == "milstm":
            self.w, self.u = r(inputs, 4 * hidden), r(hidden, 4 * hidden)
            self.alpha = torch.nn.Parameter(torch.ones(4 * hidden))
            self.beta1 = torch.nn.Parameter(torch.full((4 * hidden,), 0.5))
            self.beta2 = torch.nn.Parameter(torch.full((4 * hidden,), 0.5))
            self.b = torch.nn.Parameter(torch.zeros(4 * hidden))
        else:
            self.w = r(hidden + inputs, 3 * hidden)
            self.b = torch.nn.Parameter(torch.zeros(3 * hidden))
        self.fc = torch.nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = c = x.new_zeros(x.shape[0], self.hidden)
        for t in range(x.shape[1]):
            xt = x[:, t].contiguous()
            if self.kind == "milstm":
                h, c = self.cell(xt, h, c, self.w, self.u, self.alpha, self.beta1, self.beta2,
                                 self.b)
            else:
                h, c = self.cell(xt, h, c, self.w, self.b)
        return F.cross_entropy(self.fc(h), y)


def _capsnet(nfc_op: bool) -> CapsNet:
    return CapsNet(nfc.torch.load_op(CAPSULE_NF, "capsule_layer") if nfc_op else capsule_layer_ref)


def _subpixel(nfc_op: bool) -> SubPixel:
    return SubPixel(nfc.torch.load_op("std.nn", "depth2space", {"r": 2}) if nfc_op
                    else lambda x: F.pixel_shuffle(x, 2))


def _shuffle(nfc_op: bool) -> Shuffle:
    return Shuffle(nfc.torch.load_op("std.nn", "channel_shuffle", {"groups": 3}) if nfc_op
                   else lambda x: channel_shuffle_ref(x, 3))


def _milstm(nfc_op: bool) -> Recurrent:
    return Recurrent(nfc.torch.load_op(EXAMPLES / "milstm.nf", "milstm_cell") if nfc_op
                     else milstm_ref, "milstm")


def _lltm(nfc_op: bool) -> Recurrent:
    return Recurrent(nfc.torch.load_op(EXAMPLES / "models" / "lltm.nf", "lltm_cell") if nfc_op
                     else lltm_ref, "lltm")


def _data(name: str, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(11)
    if name == "capsnet":
        x = torch.rand(6, 1, 9, 9, generator=g)
    elif name == "subpixel":
        x = torch.rand(4, 2, 4, 4, generator=g)
        return x.to(dtype), F.avg_pool2d(F.interpolate(x[:, :1], scale_factor=2), 1).to(dtype)
    elif name == "shuffle":
        x = torch.rand(6, 4, 5, 5, generator=g)
    else:
        x = torch.rand(6, 3, 4, generator=g)
    y = torch.randint(0, 3, (6,), generator=g)
    return x.to(dtype), y


MODELS = {"capsnet": _capsnet, "subpixel": _subpixel, "shuffle": _shuffle,
          "milstm": _milstm, "lltm": _lltm}


def _twins(name: str, dtype: torch.dtype) -> tuple[torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(3)
    mine = MODELS[name](True).to(dtype)
    ref = MODELS[name](False).to(dtype)
    ref.load_state_dict(mine.state_dict())
    return mine, ref


@pytest.mark.parametrize("name", list(MODELS))
def test_trains_like_the_pytorch_formulation_in_float64(name: str) -> None:
    """Three SGD-with-momentum steps: losses and parameters agree with the PyTorch twin.

    Both compute the same float64 expressions in other orders; a step's results differ by
    some thousand roundings at most (~1e-12 relative), and three steps of SGD with this
    learning rate do not amplify that past 1e-9."""
    mine, ref = _twins(name, torch.float64)
    x, y = _data(name, torch.float64)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (mine, ref)]
    for _ in range(3):
        losses = []
        for m, opt in zip((mine, ref), opts, strict=True):
            opt.zero_grad()
            loss = m(x, y)
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
        assert losses[0] == pytest.approx(losses[1], rel=1e-9, abs=1e-12)
    for (n, p), q in zip(mine.named_parameters(), ref.parameters(), strict=True):
        assert torch.allclose(p, q, rtol=1e-9, atol=1e-12), n


@pytest.mark.parametrize("name", list(MODELS))
def test_loss_falls_with_adam_in_float32(name: str) -> None:
    mine, _ = _twins(name, torch.float32)
    x, y = _data(name, torch.float32)
    opt = torch.optim.Adam(mine.parameters(), lr=0.05)
    losses = []
    for _ in range(15):
        opt.zero_grad()
        loss = mine(x, y)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < 0.8 * losses[0], losses
