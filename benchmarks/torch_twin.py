"""The base of the PyTorch twins of benchmarks/torch_models.py: `Twin` (parameters, state,
numpy arrays in and out, SGD steps), nfc's initializers (`_init`) and `BNTwin` (layers.nf's
batch norm). Nothing here imports nfc.
"""


from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F

Arrays = dict[str, np.ndarray]


class Twin(torch.nn.Module):
    """Base class: declares parameters and state, loads numpy arrays, runs SGD steps."""

    NF_FILE: ClassVar[str] = ""            # the .nf model, relative to the repository root
    DEFAULTS: ClassVar[dict[str, Any]] = {}
    LR: ClassVar[float] = 0.1
    MOMENTUM: ClassVar[float] = 0.0

    def __init__(self, **cfg: Any) -> None:
        super().__init__()
        unknown = set(cfg) - set(self.DEFAULTS)
        if unknown:
            raise TypeError(f"{type(self).__name__}: unknown model params {sorted(unknown)}")
        self.cfg = {**self.DEFAULTS, **cfg}
        self.inits: dict[str, str] = {}
        self.build(**self.cfg)
        self.opt: torch.optim.Optimizer | None = None

    # -- declarations ---------------------------------------------------------------------------
    def build(self, **cfg: Any) -> None:
        """Declare parameters (`self.param`) and state (`self.state`)."""
        raise NotImplementedError

    def param(self, name: str, shape: tuple[int, ...], init: str) -> None:
        """A trainable parameter initialised by `init` (the .nf initializer text)."""
        self.register_parameter(name, torch.nn.Parameter(_init(init, shape)))
        self.inits[name] = init

    def state(self, name: str, shape: tuple[int, ...], init: str) -> None:
        """A non-trainable buffer (the .nf `state`)."""
        self.register_buffer(name, _init(init, shape))
        self.inits[name] = init

    def named(self, name: str) -> torch.Tensor:
        """The parameter or state called `name`."""
        return getattr(self, name)

    # -- data -----------------------------------------------------------------------------------
    def input_specs(self) -> dict[str, tuple[tuple[int, ...], str, int]]:
        """{input name: (shape, "float" | "int", int upper bound)} in .nf declaration order."""
        raise NotImplementedError

    def make_inputs(self, rng: np.random.Generator) -> Arrays:
        """Random valid inputs: standard normal floats, integers uniform in [0, bound)."""
        out: Arrays = {}
        for name, (shape, kind, hi) in self.input_specs().items():
            if kind == "int":
                out[name] = rng.integers(0, hi, size=shape).astype(np.int32)
            else:
                out[name] = rng.standard_normal(shape).astype(np.float32)
        return out

    def torch_inputs(self, inputs: Arrays) -> dict[str, torch.Tensor]:
        """Numpy inputs as tensors: floats in the model's dtype, integers as int64."""
        dtype = next(self.parameters()).dtype
        return {k: (torch.from_numpy(np.asarray(v)).long() if np.asarray(v).dtype.kind in "iu"
                    else torch.from_numpy(np.asarray(v)).to(dtype)) for k, v in inputs.items()}

    def load(self, arrays: Arrays) -> None:
        """Copy parameter and state values from numpy arrays (shapes must match)."""
        with torch.no_grad():
            for name, t in list(self.named_parameters()) + list(self.named_buffers()):
                if name in arrays:
                    src = torch.from_numpy(np.asarray(arrays[name])).to(t.dtype)
                    if src.shape != t.shape:
                        raise ValueError(f"{name}: shape {tuple(src.shape)} != {tuple(t.shape)}")
                    t.copy_(src)

    def arrays(self) -> Arrays:
        """Parameter and state values as numpy arrays."""
        return {name: t.detach().cpu().numpy().copy()
                for name, t in list(self.named_parameters()) + list(self.named_buffers())}

    # -- training -------------------------------------------------------------------------------
    def optimizer(self) -> torch.optim.Optimizer:
        """The model's `minimize ... with sgd(...)`, created on first use."""
        if self.opt is None:
            self.opt = torch.optim.SGD(self.parameters(), lr=self.LR, momentum=self.MOMENTUM)
        return self.opt

    def train_step(self, inputs: Arrays | dict[str, torch.Tensor]) -> float:
        """One SGD step in training mode; the loss before the step."""
        self.train()
        opt = self.optimizer()
        opt.zero_grad(set_to_none=True)
        if all(isinstance(v, torch.Tensor) for v in inputs.values()):
            ins = dict(inputs)
        else:
            ins = self.torch_inputs(inputs)  # type: ignore[arg-type]
        loss = self(**ins)["loss"]
        loss.backward()
        opt.step()
        return float(loss.detach())


def _init(text: str, shape: tuple[int, ...]) -> torch.Tensor:
    """nfc's initializers (codegen/artifact/initgen.py documents the fans), torch's generator."""
    name, _, rest = text.partition("(")
    args = [float(a) for a in rest.rstrip(")").split(",") if a.strip()]
    if len(shape) == 0:
        fan_in = fan_out = 1
    elif len(shape) == 1:
        fan_in = fan_out = shape[0]
    elif len(shape) == 2:
        fan_in, fan_out = shape
    else:
        window = math.prod(shape[2:])
        fan_in, fan_out = shape[1] * window, shape[0] * window
    if name == "zeros":
        return torch.zeros(shape)
    if name == "ones":
        return torch.ones(shape)
    if name == "const":
        return torch.full(shape, args[0])
    if name == "normal":
        return torch.randn(shape) * args[1] + args[0]
    if name == "uniform":
        return torch.rand(shape) * (args[1] - args[0]) + args[0]
    if name == "glorot_uniform":
        lim = math.sqrt(6.0 / (fan_in + fan_out))
        return torch.rand(shape) * 2 * lim - lim
    if name == "he_normal":
        return torch.randn(shape) * math.sqrt(2.0 / fan_in)
    raise ValueError(f"unknown initializer {text!r}")


class BNTwin(Twin):
    """A twin with layers.nf's `bn`: torch batch norm (running variance unbiased)."""

    def bn_decl(self, prefix: str, c: int, names: tuple[str, str, str, str] = ("g", "b", "m", "v"),
                sep: str = "_") -> None:
        """Declare the scale, shift and running statistics of one batch norm."""
        g, b, m, v = (prefix + sep + s for s in names)
        self.param(g, (c,), "ones")
        self.param(b, (c,), "zeros")
        self.state(m, (c,), "zeros")
        self.state(v, (c,), "ones")

    def bn(self, x: torch.Tensor, prefix: str,
           names: tuple[str, str, str, str] = ("g", "b", "m", "v"),
           sep: str = "_") -> torch.Tensor:
        """Batch norm in the module's mode, updating the running statistics in training."""
        g, b, m, v = (self.named(prefix + sep + s) for s in names)
        return F.batch_norm(x, m, v, g, b, training=self.training, momentum=0.1, eps=1e-5)
