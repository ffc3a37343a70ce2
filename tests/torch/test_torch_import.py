"""nfc.torch.to_nf: torch.nn.Modules imported (torch.export, Core ATen) as .nf models of
std.nn calls, compiled by nfc, trained side by side with PyTorch.

Everything runs in float64: both sides evaluate the same expressions in other orders, so a
step differs by at most some thousand roundings (~1e-13 relative); three SGD steps with these
learning rates stay far below the 1e-9 the comparisons allow.
"""

import numpy as np
import pytest

pytest.importorskip("torch.library")  # without PyTorch, `torch` would be this folder
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import nfc.torch  # noqa: E402
from nfc.runtime.build import load_model  # noqa: E402


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(12, 16)
        self.fc2 = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


class ConvNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(2, 4, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(4)
        self.conv2 = torch.nn.Conv2d(4, 4, 3, stride=2, padding=1, groups=2)
        self.fc = torch.nn.Linear(4 * 2 * 2, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.max_pool2d(torch.relu(self.bn(self.conv(x))), 2)            # [B, 4, 4, 4]
        h = torch.sigmoid(self.conv2(h)) * 2.0 - 0.5                       # [B, 4, 2, 2]
        return self.fc(torch.flatten(h, 1))


def _train_both(module: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, tmp_path,  # noqa: ANN001
                steps: int = 3, lr: float = 0.1, pipeline: str | None = None,
                ) -> tuple[nfc.torch.Imported, object]:
    imported = nfc.torch.to_nf(module, (x,), name=type(module).__name__.lower(),
                               optimizer=f"sgd(lr = {lr}, momentum = 0.9)")
    model = load_model(imported.write(tmp_path / "imported.nf"), pipeline=pipeline)
    imported.load_into(model)
    opt = torch.optim.SGD(module.parameters(), lr=lr, momentum=0.9)
    for _ in range(steps):
        got = model.train_step(x=x.numpy(), y=y.numpy().astype(np.int32))
        opt.zero_grad()
        loss = F.cross_entropy(module(x), y)
        loss.backward()
        opt.step()
        assert float(got["loss"]) == pytest.approx(float(loss.detach()), rel=1e-9)
    state = module.state_dict()
    logical = model.named_tensors()  # by logical shape, whatever layout the build chose
    for name, torch_name in imported.names.items():
        want = state[torch_name].numpy()
        np.testing.assert_allclose(logical[name], want, rtol=1e-9, atol=1e-12,
                                   err_msg=name)
    return imported, model


def test_imported_mlp_trains_like_pytorch(tmp_path) -> None:  # noqa: ANN001
    torch.manual_seed(0)
    mlp = MLP().double()
    x = torch.rand(8, 12, dtype=torch.float64)
    y = torch.tensor([0, 1, 2, 3, 0, 1, 2, 3])
    imported, _ = _train_both(mlp, x, y, tmp_path)
    assert "linear(" in imported.source and "relu(" in imported.source
    assert "param fc1_weight: f64[16, 12] = zeros" in imported.source


def test_imported_convnet_with_batch_norm_trains_like_pytorch(tmp_path) -> None:  # noqa: ANN001
    """conv (padding, stride, groups), training batch norm with its running statistics,
    max pooling, sigmoid, scalar arithmetic, flatten, linear."""
    torch.manual_seed(1)
    net = ConvNet().double()
    x = torch.rand(4, 2, 8, 8, dtype=torch.float64)
    y = torch.tensor([0, 1, 2, 1])
    imported, model = _train_both(net, x, y, tmp_path)
    assert "update bn_running_var" in imported.source
    assert "bn_num_batches_tracked" not in imported.source


def test_eval_mode_forward_matches(tmp_path) -> None:  # noqa: ANN001
    """A module exported in eval() mode: batch norm with running statistics, average pooling,
    global average pooling and log_softmax."""

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(1, 3, 3)
            self.bn = torch.nn.BatchNorm2d(3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = F.avg_pool2d(torch.tanh(self.bn(self.conv(x))), 2, padding=1)
            return F.log_softmax(h.mean(dim=(2, 3)), dim=-1)

    torch.manual_seed(2)
    net = Net().double()
    net.bn.running_mean.uniform_(-0.5, 0.5)
    net.bn.running_var.uniform_(0.5, 1.5)
    net.eval()
    x = torch.rand(2, 1, 7, 7, dtype=torch.float64)
    imported = nfc.torch.to_nf(net, (x,), optimizer="sgd(lr = 0.0)")
    assert "batch_norm_eval" in imported.source
    model = load_model(imported.write(tmp_path / "net.nf"))
    imported.load_into(model)
    out = model.forward(x=x.numpy(), y=np.zeros(2, np.int32))["out"]
    want = net(x).detach().numpy()
    np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-12)


def test_what_is_not_covered_is_listed() -> None:
    class Odd(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.cumsum(F.gelu(x), dim=1)

    with pytest.raises(nfc.torch.UnsupportedError,
                       match=r"does not cover:\n  (.|\n)*cumsum(.|\n)*covered: addmm"):
        nfc.torch.to_nf(Odd(), (torch.rand(2, 3),))


class LeNet5(torch.nn.Module):
    """LeNet-5 as in the seed papers (MNIST-sized input, max pooling, ReLU)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 6, 5, padding=2)
        self.conv2 = torch.nn.Conv2d(6, 16, 5)
        self.fc1 = torch.nn.Linear(16 * 5 * 5, 120)
        self.fc2 = torch.nn.Linear(120, 84)
        self.fc3 = torch.nn.Linear(84, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.max_pool2d(torch.relu(self.conv1(x)), 2)
        h = F.max_pool2d(torch.relu(self.conv2(h)), 2)
        h = torch.flatten(h, 1)
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(h)))))


class ResidualBlock(torch.nn.Module):
    """A ResNet basic block with a strided projection shortcut, then a classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, stride=2, padding=1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(8)
        self.conv2 = torch.nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(8)
        self.proj = torch.nn.Conv2d(3, 8, 1, stride=2, bias=False)
        self.bnp = torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8 * 4 * 4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.bn1(self.conv1(x)))
        h = self.bn2(self.conv2(h))
        h = torch.relu(h + self.bnp(self.proj(x)))
        return self.fc(torch.flatten(h, 1))


def test_imported_lenet5_trains_like_pytorch(tmp_path) -> None:  # noqa: ANN001
    torch.manual_seed(2)
    net = LeNet5().double()
    x = torch.rand(3, 1, 28, 28, dtype=torch.float64)
    y = torch.tensor([0, 7, 3])
    imported, _ = _train_both(net, x, y, tmp_path)
    assert imported.source.count("conv2d") >= 2


@pytest.mark.parametrize("pipeline", [None, "layout{block=8},im2col,training-functions,"
                                      "inline,canonicalize,cse,dce,apply-tuning,fuse"],
                         ids=["default", "blocked"])
def test_imported_residual_block_trains_like_pytorch(tmp_path, pipeline) -> None:  # noqa: ANN001
    """Also with the layout pass forced on: `load_into` packs PyTorch's weights into the
    blocked parameters (a raw copy of the bytes trained a scrambled network)."""
    torch.manual_seed(3)
    net = ResidualBlock().double()
    x = torch.rand(4, 3, 8, 8, dtype=torch.float64)
    y = torch.tensor([0, 4, 2, 1])
    _, model = _train_both(net, x, y, tmp_path, pipeline=pipeline)
    if pipeline is not None:  # (the default build may block it too: on AVX2, block 8)
        assert model.metadata.get("views")


class _Basic(torch.nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.c1 = torch.nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.b1 = torch.nn.BatchNorm2d(cout)
        self.c2 = torch.nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.b2 = torch.nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = torch.nn.Sequential(
                torch.nn.Conv2d(cin, cout, 1, stride=stride, bias=False),
                torch.nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.b2(self.c2(torch.relu(self.b1(self.c1(x)))))
        return torch.relu(h + (x if self.down is None else self.down(x)))


class ResNet18(torch.nn.Module):
    """torchvision's ResNet-18 layout (7x7/2 stem, 3x3/2 max pool, four stages of two basic
    blocks, global average pooling, classifier) at a quarter of the width."""

    def __init__(self, width: int = 16, classes: int = 10) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, width, 7, stride=2, padding=3, bias=False)
        self.bn = torch.nn.BatchNorm2d(width)
        chans = [width, 2 * width, 4 * width, 8 * width]
        blocks, cin = [], width
        for i, c in enumerate(chans):
            blocks += [_Basic(cin, c, 1 if i == 0 else 2), _Basic(c, c, 1)]
            cin = c
        self.blocks = torch.nn.Sequential(*blocks)
        self.fc = torch.nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.max_pool2d(torch.relu(self.bn(self.stem(x))), 3, stride=2, padding=1)
        h = self.blocks(h)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(h, 1), 1))


def test_imported_resnet18_trains_like_pytorch(tmp_path) -> None:  # noqa: ANN001
    torch.manual_seed(4)
    net = ResNet18().double()
    # 64x64 inputs and batch 4 keep 16 values per channel in the last stage's batch norm: with
    # fewer, its variance is tiny and normalising amplifies rounding differences by orders
    x = torch.rand(4, 3, 64, 64, dtype=torch.float64)
    y = torch.tensor([3, 8, 0, 5])
    # a small learning rate: with batch 2, 0.1 makes the deep net diverge within 3 steps,
    # and a divergent run amplifies the ~1e-16 summation-order differences past 1e-9
    imported, _ = _train_both(net, x, y, tmp_path, lr=0.005)
    assert imported.source.count("conv2d") >= 20
