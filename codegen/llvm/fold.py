"""Folding of integer arithmetic at emission time.

Index arithmetic of unrolled loops and of single-iteration loops is all constants, and many
guards are decided at compile time (`k.0 == 0` when `k.0` has one iteration). Emitting that
arithmetic as instructions used to triple the LLVM IR handed to the optimiser; the emitter
computes it here instead (in Python, with the IR's floor semantics for `//` and `%`).
"""

from __future__ import annotations

from collections.abc import Callable

from llvmlite import ir

from nfc import ops
from nfc.codegen.llvm import intrinsics
from nfc.ir import Binary


def const_ints(v: ir.Value) -> list[int] | None:
    """The lane values of an integer (or i1) constant, scalar or vector; None when `v` is not
    a fully known integer constant."""
    if not isinstance(v, ir.Constant) or not isinstance(intrinsics.elem(v.type), ir.IntType):
        return None
    c = v.constant
    items = c if isinstance(c, list | tuple) else [c]
    out = []
    for x in items:
        x = x.constant if isinstance(x, ir.Constant) else x
        if not isinstance(x, int):  # undef, or an expression
            return None
        out.append(int(x))
    return out


def int_constant(t: ir.Type, values: list[int]) -> ir.Constant | None:
    """A constant of the integer (vector) type `t` from lane values; None when a value does
    not fit (then the instruction is emitted and LLVM wraps as usual)."""
    e = intrinsics.elem(t)
    assert isinstance(e, ir.IntType)
    if e.width == 1:
        vals: list[int | bool] = [bool(x & 1) for x in values]
    else:
        lo, hi = -(1 << (e.width - 1)), (1 << (e.width - 1)) - 1
        if any(x < lo or x > hi for x in values):
            return None
        vals = list(values)
    n = intrinsics.lanes(t)
    if n is None:
        return ir.Constant(t, vals[0])
    if len(vals) == 1:
        vals = vals * n
    return ir.Constant(t, [ir.Constant(e, x) for x in vals])


#: Integer semantics of the binary operators (floor `//` and `%`, like the IR): the operator
#: table's compile-time evaluation (`scalar`), on Python integers. `/` is not an integer one.
_INT_OPS: dict[str, Callable[[int, int], int | bool]] = {
    r.name: r.scalar for r in ops.ROWS
    if r.node is Binary and r.scalar is not None and r.name != "/"}


def fold_int(op: str, x: ir.Value, y: ir.Value, rtype: ir.Type) -> ir.Value | None:
    """`x op y` of integer (or i1) values, without an instruction when the result is known:
    both constant, or an identity (`+ 0`, `* 1`, `* 0`, `and true`, ...); None otherwise."""
    if op not in _INT_OPS:
        return None
    if op in ("<", "<=", ">", ">=") and intrinsics.elem(x.type) == intrinsics.I1:
        return None  # LLVM's signed i1 compares read true as -1
    cx, cy = const_ints(x), const_ints(y)
    if cx is None and cy is None:
        return None
    if cx is not None and cy is not None:
        if op in ("//", "%") and 0 in cy:
            return None
        n = max(len(cx), len(cy))
        cx, cy = cx * (n // len(cx)), cy * (n // len(cy))
        return int_constant(rtype, [int(_INT_OPS[op](a, b)) for a, b in zip(cx, cy, strict=True)])
    same = x.type == y.type == rtype

    def uniform(c: list[int] | None, k: int) -> bool:
        return c is not None and all(v == k for v in c)
    if not same:
        return None
    if op == "+":
        return y if uniform(cx, 0) else x if uniform(cy, 0) else None
    if op == "-":
        return x if uniform(cy, 0) else None
    if op == "*":
        if uniform(cx, 1):
            return y
        if uniform(cy, 1):
            return x
        return x if uniform(cx, 0) else y if uniform(cy, 0) else None
    if op == "and":
        return y if uniform(cx, 1) else x if uniform(cy, 1) else (
            x if uniform(cx, 0) else y if uniform(cy, 0) else None)
    if op == "or":
        return y if uniform(cx, 0) else x if uniform(cy, 0) else (
            x if uniform(cx, 1) else y if uniform(cy, 1) else None)
    if op in ("//", "%") and uniform(cy, 1):
        return x if op == "//" else int_constant(rtype, [0])
    return None
