"""Constant folding: every operator, intrinsic and cast of literals, in the literals' dtype.

The evaluation is the operator table's (`nfc.ops.fold`, with each row's numpy function):
typed literals compute in numpy with that dtype (integer overflow wraps, floats round); two
weak literals give a weak literal computed exactly (integers) or in float64, as the interpreter
computes weak-only sub-expressions. Ill-typed operands, division by an integer zero and what a
row marks unfoldable (`philox` draws) are left alone for the verifier and the runtime.
"""

from __future__ import annotations

from typing import Any

from nfc import ops
from nfc.ir import Binary, Call, Const, Expr, Unary
from nfc.ops import fold_cast
from nfc.simplify.pattern import B, C, F, K, Rule, S, U, V

__all__ = ["FOLD_RULES", "fold_binary", "fold_cast", "fold_unary"]


def _node(name: str, args: tuple[Const, ...]) -> Expr:
    row = ops.get(name)
    if row is not None and row.node is Binary:
        return Binary(name, *args)
    if row is not None and row.node is Unary:
        return Unary(name, args[0])
    return Call(name, args)


def fold_binary(op: str, a: Const, b: Const) -> Const | None:
    """`a op b` for two literals (also `max`, `min`, `pow`), or None when it must not fold."""
    return ops.fold(_node(op, (a, b)))


def fold_unary(fn: str, a: Const) -> Const | None:
    """`neg`, `not` or a one-argument intrinsic of a literal, or None."""
    return ops.fold(_node(fn, (a,)))


def _fold(m: Any) -> Expr | None:
    return ops.fold(m.e)


FOLD_RULES: list[Rule] = [
    (B(None, K(), K()), _fold),
    (U("neg", K()), _fold),
    (U("not", K()), _fold),
    (F(None), _fold),  # any intrinsic; `ops.fold` needs every argument to be a literal
    (C(K()), _fold),
    (S(K("c", True), V("a"), V("b")), lambda m: m.a),
    (S(K("c", False), V("a"), V("b")), lambda m: m.b),
]
