"""The same training step in PyTorch eager, for timing comparisons (optional: needs torch).

Works for MLP models: parameters that pair up as a weight `[in, out]` followed by a bias
`[out]`, layer after layer (`linear` of std.nn), with ReLU between layers and softmax
cross-entropy (mean over the batch) on the logits, trained with the model's optimizer (SGD
with momentum / Nesterov / weight decay, Adam, AdamW: nfc's formulas follow PyTorch's). The
PyTorch model starts from the nfc model's current parameters, so the two first-step losses
printed side by side must agree (a check that the comparison is of the same computation).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from nfc.runtime.loader import Model


class TorchUnavailable(RuntimeError):
    """PyTorch is not installed, or the model is not one this module can mirror."""


@dataclass(frozen=True)
class Comparison:
    """Median seconds per step of both, on `threads` threads, and the first-step losses."""

    nfc_s: float
    torch_s: float
    threads: int
    nfc_loss: float
    torch_loss: float
    nfc_min_s: float = 0.0
    torch_min_s: float = 0.0
    """Fastest repeat of each (less sensitive to other load on the machine)."""


def mlp_layers(model: Model) -> list[tuple[str, str]]:
    """(weight, bias) names of an MLP model, in order; TorchUnavailable otherwise."""
    params = [t for t in model.metadata["tensors"] if t["role"] == "param"]
    if len(params) % 2 or not params:
        raise TorchUnavailable("the model is not an MLP of (weight, bias) layers")
    layers = []
    prev = None
    for w, b in zip(params[0::2], params[1::2], strict=True):
        ok = (len(w["shape"]) == 2 and b["shape"] == [w["shape"][1]]
              and (prev is None or w["shape"][0] == prev))
        if not ok:
            raise TorchUnavailable(f"the model is not an MLP ('{w['name']}', '{b['name']}' do "
                                   "not form a linear layer)")
        prev = w["shape"][1]
        layers.append((w["name"], b["name"]))
    return layers


def _torch():
    try:
        import torch
    except ImportError:
        raise TorchUnavailable("PyTorch is not installed (pip install torch)") from None
    return torch


def torch_mlp_step(model: Model) -> tuple[Callable[[Any, Any], Any], Any]:
    """(step(x, y) -> loss tensor, torch module) mirroring `model`'s MLP and optimizer."""
    torch = _torch()
    layers = mlp_layers(model)
    mods: list[Any] = []
    for n, (w, b) in enumerate(layers):
        wt = model.tensors[w]
        lin = torch.nn.Linear(wt.shape[0], wt.shape[1])
        with torch.no_grad():
            lin.weight.copy_(torch.from_numpy(wt.T.copy()))
            lin.bias.copy_(torch.from_numpy(model.tensors[b].copy()))
        mods.append(lin)
        if n + 1 < len(layers):
            mods.append(torch.nn.ReLU())
    net = torch.nn.Sequential(*mods)
    spec = dict(model.metadata.get("attributes", {}).get("nf.optimizer") or {"name": "sgd"})
    name = str(spec.get("name", "sgd")).lower()
    lr = float(spec.get("lr", 0.01))
    if name == "sgd":
        opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=float(spec.get("momentum", 0)),
                              dampening=float(spec.get("dampening", 0)),
                              nesterov=bool(spec.get("nesterov", False)),
                              weight_decay=float(spec.get("weight_decay", 0)))
    elif name in ("adam", "adamw"):
        cls = torch.optim.Adam if name == "adam" else torch.optim.AdamW
        opt = cls(net.parameters(), lr=lr,
                  betas=(float(spec.get("beta1", 0.9)), float(spec.get("beta2", 0.999))),
                  eps=float(spec.get("eps", 1e-8)),
                  weight_decay=float(spec.get("weight_decay", 0.0 if name == "adam" else 0.01)))
    else:
        raise TorchUnavailable(f"no PyTorch mirror of optimizer '{name}'")
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(x: Any, y: Any) -> Any:
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(net(x), y)
        loss.backward()
        opt.step()
        return loss

    return step, net


def _time(fn: Callable[[], Any], steps: int) -> float:
    t0 = time.perf_counter()
    for _ in range(steps):
        fn()
    return (time.perf_counter() - t0) / steps


def compare_step(model: Model, threads: int = 1, repeats: int = 7,
                 min_seconds: float = 0.05) -> Comparison:
    """Time `model.train_step` and its PyTorch mirror on one random batch, alternating
    repeats (so load on the machine hits both alike); the model's tensors are restored."""
    torch = _torch()
    from nfc.runtime.train import model_classes, model_io

    fn = model.functions["train_step"]
    x_spec, y_spec = model_io(fn.meta)
    if y_spec is None:
        raise TorchUnavailable("the model has no label input")
    saved = model.state_dict()
    step_before = model.step
    g = np.random.default_rng(0)
    x = g.standard_normal(x_spec.shape).astype(np.float32)
    y = g.integers(0, model_classes(model.metadata), y_spec.shape).astype(np.int32)
    old_threads = torch.get_num_threads()
    try:
        torch_step, _ = torch_mlp_step(model)
        torch.set_num_threads(threads)
        model.set_num_threads(threads)
        tx, ty = torch.from_numpy(x), torch.from_numpy(y.astype(np.int64))
        bound = fn.bind({x_spec.name: x, y_spec.name: y})
        nfc_loss = float(bound()["loss"])
        torch_loss = float(torch_step(tx, ty).detach())
        nfc_call = bound
        torch_call = lambda: torch_step(tx, ty)  # noqa: E731
        n_nfc = max(10, int(min_seconds / max(_time(nfc_call, 10), 1e-7)))
        n_torch = max(10, int(min_seconds / max(_time(torch_call, 10), 1e-7)))
        a, b = [], []
        for _ in range(repeats):
            a.append(_time(nfc_call, n_nfc))
            b.append(_time(torch_call, n_torch))
    finally:
        torch.set_num_threads(old_threads)
        model.load_state_dict(saved)
        model.step = step_before
    return Comparison(float(np.median(a)), float(np.median(b)), threads, nfc_loss, torch_loss,
                      float(np.min(a)), float(np.min(b)))
