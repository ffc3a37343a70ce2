"""nfc ops under torch.compile(fullgraph=True): traced through their fake implementations
(shapes from the `.nf` signature), no graph break, the same values and gradients as eager."""

import pytest

pytest.importorskip("torch.library")  # without PyTorch, `torch` would be this folder
import torch  # noqa: E402
from nfc_torch_cases import CAPSULE_NF, capsule_layer_ref  # noqa: E402

import nfc.torch  # noqa: E402


class CapsuleHead(torch.nn.Module):
    """conv -> pose capsules -> nfc capsule layer -> capsule lengths."""

    def __init__(self, layer) -> None:  # noqa: ANN001
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.conv = torch.nn.Conv2d(1, 8, 3)
        self.k = torch.nn.Parameter(torch.randn(3, 2, 3, 3, 2, 2, generator=g) * 0.3)
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = torch.relu(self.conv(x))                                  # [B, 8, H, W]
        b, _, h, w = a.shape
        poses = a.view(b, 2, 4, h, w).permute(0, 1, 3, 4, 2).contiguous().view(b, 2, h, w, 2, 2)
        v = self.layer(poses, self.k)
        return (v * v).sum(dim=(-2, -1)).sqrt().mean()


def _grads(model: torch.nn.Module, f, x: torch.Tensor):  # noqa: ANN001, ANN202
    model.zero_grad()
    loss = f(x)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


def _close(a, b, n_terms: int) -> bool:  # noqa: ANN001
    """float32 results of the same computation in another order of summation: at most
    n_terms roundings apart, relative to the larger magnitude."""
    tol = 2 * n_terms * torch.finfo(torch.float32).eps * max(float(a.abs().max()), 1.0)
    return float((a - b).abs().max()) <= tol


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_fullgraph_matches_eager(dynamic: bool) -> None:
    torch._dynamo.reset()
    layer = nfc.torch.load_op(CAPSULE_NF, "capsule_layer")
    model = CapsuleHead(layer)
    compiled = torch.compile(model, fullgraph=True, dynamic=dynamic, backend="aot_eager")
    for batch, size in [(2, 11), (3, 13)]:  # shapes within the signature: recompiled per shape
        x = torch.rand(batch, 1, size, size, generator=torch.Generator().manual_seed(batch))
        loss_c, grads_c = _grads(model, compiled, x)
        loss_e, grads_e = _grads(model, model, x)
        assert _close(loss_c, loss_e, 200)
        for gc, ge in zip(grads_c, grads_e, strict=True):
            assert _close(gc, ge, 2000)


def test_fullgraph_inductor_matches_the_pytorch_formulation() -> None:
    """The default backend (Inductor) around the nfc op, against the same model with the
    capsule layer written in PyTorch primitives."""
    torch._dynamo.reset()
    layer = nfc.torch.load_op(CAPSULE_NF, "capsule_layer")
    model = CapsuleHead(layer)
    twin = CapsuleHead(capsule_layer_ref)
    twin.load_state_dict(model.state_dict())
    x = torch.rand(2, 1, 11, 11, generator=torch.Generator().manual_seed(7))
    loss_c, grads_c = _grads(model, torch.compile(model, fullgraph=True), x)
    loss_t, grads_t = _grads(twin, twin, x)
    assert _close(loss_c, loss_t, 200)
    for gc, gt in zip(grads_c, grads_t, strict=True):
        assert _close(gc, gt, 2000)
