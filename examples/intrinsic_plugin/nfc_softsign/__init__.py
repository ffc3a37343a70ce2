"""An out-of-tree nfc intrinsic, registered through the `nfc.intrinsics` entry-point group.

    pip install -e examples/intrinsic_plugin
    nfc opt model.nf          # a model that calls softsign(x)

The row says everything nfc needs: the typing rule (float operands), the numpy semantics the
interpreter runs (the oracle), the compile-time value, the derivative, the FLOP count, and how
the CPU backend emits it (`nfc_softsign.llvm`, imported only when a kernel uses it). `expand`
writes it with built-in operators, for a backend that has no hook for it.
"""

from __future__ import annotations

from typing import Any

from nfc.ir import Binary, Call, Const, Expr
from nfc.ops import Grad, Op
from nfc.ops.lattice import FLOAT

__all__ = ["SOFTSIGN"]


def _numpy(v: Any) -> Any:
    import numpy as np

    return v / (v.dtype.type(1) + np.abs(v))


def _grad(g: Grad) -> Expr | None:
    # d softsign(u) = du / (1 + |u|)**2
    (u,) = g.args
    den = Binary("+", Const(1.0), Call("abs", (u,)))
    return g.mul(g.d(0), Binary("/", Const(1.0), Binary("*", den, den)))


SOFTSIGN = Op(
    "softsign", Call, 1, FLOAT,
    numpy=_numpy,
    scalar=lambda x: x / (1.0 + abs(x)),
    grad=_grad,
    flops=1.0,
    lower={"llvm": "nfc_softsign.llvm:softsign"},
    expand=lambda x: Binary("/", x, Binary("+", Const(1.0), Call("abs", (x,)))),
    doc="x / (1 + |x|)",
)
