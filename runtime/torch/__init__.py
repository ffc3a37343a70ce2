"""`nfc.torch`: an op of a `.nf` file as a PyTorch operator, forward and backward compiled by nfc.

    import nfc.torch
    capsule_conv = nfc.torch.load_op("capsule.nf", "capsule_conv", params={"stride": 2})
    y = capsule_conv(a, k)          # a torch.library custom op: autograd, torch.compile, opcheck
    y.sum().backward()              # nfc's derived backward, compiled to native code

    imported = nfc.torch.to_nf(mlp, (x,))   # the other way: a torch.nn.Module as a .nf model

The package lives in `runtime/torch/` (import name `nfc.runtime.torch`; the package facade
`nfc/__init__.py` also makes it importable as `nfc.torch`). PyTorch is imported here and
nowhere else in nfc; the compiler never depends on it. docs/torch.md is the user guide.
"""

from __future__ import annotations

try:
    # libgomp before PyTorch, whose bundled copy has the same name: the first one loaded
    # serves both, and nfc's has idle threads that back off to sleeping (nfc.codegen.jit)
    from nfc.codegen.jit import load_openmp

    load_openmp()
    import torch  # noqa: F401  (fails early with a clear message when PyTorch is missing)
except ImportError as exc:  # pragma: no cover - the test suite has torch
    raise ImportError("nfc.torch needs PyTorch: pip install 'nfc[torch]'") from exc

from nfc.runtime.native_op import NativeOp, OpError
from nfc.runtime.torch.importer import COVERED, Imported, UnsupportedError, to_nf
from nfc.runtime.torch.op import TorchOp, load_op

__all__ = ["load_op", "TorchOp", "NativeOp", "OpError", "to_nf", "Imported",
           "UnsupportedError", "COVERED"]
