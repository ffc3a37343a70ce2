"""Constant folding: every operator, intrinsic and cast of literals, in the literals' dtype.

Typed literals compute in numpy with that dtype (integer overflow wraps, floats round); two
weak literals give a weak literal computed in int64 or float64, as the interpreter computes
weak-only sub-expressions. Division by an integer zero and `/` on integers are left alone for
the verifier and the runtime to report.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from nfc.ir import COMPARISONS, Binary, Call, Cast, Const, DType, Expr, Unary
from nfc.simplify.pattern import B, C, F, K, Rule, S, U, V

_INT64 = (-(1 << 63), (1 << 63) - 1)



def _is_bool(c: Const) -> bool:
    return isinstance(c.value, bool) or c.dtype == DType.I1


def _const_of(value: Any, dtype: DType | None) -> Const | None:
    """A literal holding a numpy or Python result, None when it cannot be represented."""
    if isinstance(value, np.generic | np.ndarray):
        value = np.asarray(value).reshape(()).item()
    if isinstance(value, bool) or dtype == DType.I1:
        return Const(bool(value), DType.I1)
    if dtype is not None and dtype.is_float:
        return Const(float(value), dtype)
    if isinstance(value, float):
        return Const(value, dtype)
    if dtype is None and not _INT64[0] <= value <= _INT64[1]:
        return None  # a weak literal that no integer type can hold: leave it to the verifier
    return Const(int(value), dtype)


def _arr(c: Const, dtype: DType) -> np.ndarray | None:
    try:
        return np.array([c.value], dtype=dtype.numpy)
    except (OverflowError, ValueError):
        return None


_NP_BINARY: dict[str, Callable[..., Any]] = {
    "+": np.add, "-": np.subtract, "*": np.multiply, "/": np.true_divide,
    "//": np.floor_divide, "%": np.mod, "max": np.maximum, "min": np.minimum, "pow": np.power,
    "<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal,
    "==": np.equal, "!=": np.not_equal, "and": np.logical_and, "or": np.logical_or,
}


def fold_binary(op: str, a: Const, b: Const) -> Const | None:
    """`a op b` for two literals (also `max`, `min`, `pow`), or None when it must not fold."""
    if op in ("and", "or"):
        if not (_is_bool(a) and _is_bool(b)):
            return None
        return Const(bool(a.value) and bool(b.value) if op == "and"
                     else bool(a.value) or bool(b.value), DType.I1)
    if a.dtype is not None and b.dtype is not None and a.dtype != b.dtype:
        return None  # ill-typed; the verifier reports it
    dtype = a.dtype or b.dtype
    if _is_bool(a) or _is_bool(b):
        return Const(_NP_BINARY[op](a.value, b.value).item(), DType.I1) if op in (
            "==", "!=") else None
    is_int = not (a.is_float or b.is_float) and (dtype is None or dtype.is_int)
    if is_int and (op == "/" or (op in ("//", "%") and b.value == 0)):
        return None  # `/` on integers is a type error, division by zero a run-time one
    if is_int and op == "pow" and b.value < 0:
        return None
    if dtype is None:
        if is_int:
            if op == "pow" and b.value * max(1, abs(a.value)).bit_length() > 64:
                return None
            x, y = np.array([a.value], dtype=object), np.array([b.value], dtype=object)
        else:
            x, y = np.array([a.value], np.float64), np.array([b.value], np.float64)
    else:
        xa, ya = _arr(a, dtype), _arr(b, dtype)
        if xa is None or ya is None:
            return None
        x, y = xa, ya
    with np.errstate(all="ignore"):
        r = _NP_BINARY[op](x, y)
    if op in COMPARISONS:
        return Const(bool(r[0]), DType.I1)
    return _const_of(r[0] if dtype is None else r, dtype)


_UNARY_FNS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "exp": np.exp, "log": np.log, "sqrt": np.sqrt, "rsqrt": lambda x: 1.0 / np.sqrt(x),
    "tanh": np.tanh, "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "erf": np.vectorize(math.erf, otypes=[np.float64]), "abs": np.abs,
}


def fold_unary(fn: str, a: Const) -> Const | None:
    """`neg`, `not` or a one-argument intrinsic of a literal, or None."""
    if fn == "not":
        return Const(not a.value, DType.I1) if _is_bool(a) else None
    if _is_bool(a):
        return None
    if fn in ("neg", "abs") and a.dtype is None:
        return _const_of(-a.value if fn == "neg" else abs(a.value), None)
    if fn != "neg" and fn != "abs" and a.dtype is not None and a.dtype.is_int:
        return None  # exp of an integer is ill-typed
    x = _arr(a, a.dtype) if a.dtype is not None else np.array([float(a.value)])
    if x is None:
        return None
    with np.errstate(all="ignore"):
        if fn in ("neg", "abs"):
            r = np.negative(x) if fn == "neg" else np.abs(x)
        else:
            r = _UNARY_FNS[fn](x.astype(np.float64)).astype(x.dtype)
    return _const_of(r, a.dtype)


def fold_cast(dtype: DType, a: Const) -> Const | None:
    """`dtype(a)` for a literal, converting like numpy's `astype` (the interpreter's rule)."""
    if dtype == DType.I1:
        return Const(bool(a.value), DType.I1)
    src = a.dtype or (DType.F64 if a.is_float else DType.I64)
    x = _arr(a, src)
    if x is None:
        return None
    if dtype.is_int and src.is_float and not np.isfinite(x[0]):
        return None  # undefined in numpy and in C
    with np.errstate(all="ignore"):
        return _const_of(x.astype(dtype.numpy), dtype)


def _fold(m: Any) -> Expr | None:
    e = m.e
    if isinstance(e, Binary):
        return fold_binary(e.op, e.a, e.b)
    if isinstance(e, Unary):
        return fold_unary(e.op, e.x)
    if isinstance(e, Cast):
        return fold_cast(e.dtype, e.x)
    if isinstance(e, Call) and e.fn != "philox":
        if len(e.args) == 2:
            return fold_binary(e.fn, *e.args)
        return fold_unary(e.fn, e.args[0])
    return None


FOLD_RULES: list[Rule] = [
    (B(None, K(), K()), _fold),
    (U("neg", K()), _fold),
    (U("not", K()), _fold),
    (F(None, K()), _fold),
    (F(None, K(), K()), _fold),
    (C(K()), _fold),
    (S(K("c", True), V("a"), V("b")), lambda m: m.a),
    (S(K("c", False), V("a"), V("b")), lambda m: m.b),
]

