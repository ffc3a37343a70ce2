"""softsign in LLVM IR, for scalars and vectors alike (the CPU backend imports this module
the first time a kernel uses the intrinsic)."""

from __future__ import annotations

from llvmlite import ir

from nfc.codegen.llvm.intrinsics import const, intrinsic


def softsign(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """x / (1 + |x|): one fabs, one add, one division."""
    return b.fdiv(x, b.fadd(const(x.type, 1.0), intrinsic(b, "fabs", [x])))
