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
                steps: int = 3) -> tuple[nfc.torch.Imported, object]:
    imported = nfc.torch.to_nf(module, (x,), name=type(module).__name__.lower(),
                               optimizer="sgd(lr = 0.1, momentum = 0.9)")
    model = load_model(imported.write(tmp_path / "imported.nf"))
    imported.load_into(model)
    opt = torch.optim.SGD(module.parameters(), lr=0.1, momentum=0.9)
    for _ in range(steps):
        got = model.train_step(x=x.numpy(), y=y.numpy().astype(np.int32))
        opt.zero_grad()
        loss = F.cross_entropy(module(x), y)
        loss.backward()
        opt.step()
        assert float(got["loss"]) == pytest.approx(float(loss.detach()), rel=1e-9)
    state = module.state_dict()
    for name, torch_name in imported.names.items():
        want = state[torch_name].numpy()
        np.testing.assert_allclose(model.tensors[name], want, rtol=1e-9, atol=1e-12,
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
