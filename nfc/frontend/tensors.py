"""Whole-tensor values of tensor-level statements (`g = h * 0.5 + 1.0`).

A `TensorExpr` is a lazy elementwise expression: a scalar body over the index variables i0, i1, ...
of its shape. Operators combine bodies with numpy broadcasting, so a whole elementwise
expression becomes one compute when it is materialised. Compile-time scalars are TVs of shape
() whose body is a weak constant.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from nfc.diagnostics import error
from nfc.frontend.limits import check_elements
from nfc.frontend.scalars import ScalarExpr, ScalarType, coerce, default_dtype, sty
from nfc.ir import (
    Axis,
    ComputeOp,
    Const,
    Expr,
    Index,
    Load,
    Loc,
    TensorType,
    Value,
    substitute_indices,
)


def idx(k: int) -> str:
    """Name of the k-th elementwise index variable."""
    return f"i{k}"


@dataclass(frozen=True)
class TensorExpr:
    """A tensor-valued expression: shape, scalar type and body over i0..i{rank-1}."""

    shape: tuple[int, ...]
    sv: ScalarExpr
    value: Value | None = None

    @property
    def rank(self) -> int:
        """Number of dimensions."""
        return len(self.shape)

    @property
    def const(self) -> int | float | bool | None:
        """The compile-time value of a weak scalar constant, else None."""
        return self.sv.const if not self.shape else None

    @staticmethod
    def of(value: Value) -> TensorExpr:
        """The tensor `value` itself."""
        body = Load(value, tuple(Index(idx(k)) for k in range(value.type.rank)))
        return TensorExpr(value.type.shape, ScalarExpr(body, sty(value.dtype)), value)

    @staticmethod
    def scalar(sv: ScalarExpr) -> TensorExpr:
        """A rank-0 expression (a constant or a scalar element expression)."""
        return TensorExpr((), sv)


def broadcast_shape(shapes: list[tuple[int, ...]], loc: Loc, what: str) -> tuple[int, ...]:
    """numpy broadcasting: trailing dimensions align; sizes equal or 1."""
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for d in range(rank):
        sizes = {s[len(s) - rank + d] for s in shapes if len(s) - rank + d >= 0}
        sizes.discard(1)
        if len(sizes) > 1:
            shown = " and ".join("[" + ", ".join(map(str, s)) + "]" for s in shapes)
            raise error(f"cannot broadcast shapes {shown} in {what}", loc)
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def aligned(tv: TensorExpr, shape: tuple[int, ...]) -> ScalarExpr:
    """The body of `tv` as an element of a tensor of the broadcast `shape`."""
    off = len(shape) - tv.rank
    mapping: dict[str, Expr] = {}
    for k, n in enumerate(tv.shape):
        mapping[idx(k)] = Const(0) if n == 1 and shape[k + off] != 1 else Index(idx(k + off))
    if all(isinstance(v, Index) and v.name == k for k, v in mapping.items()):
        return tv.sv
    return ScalarExpr(substitute_indices(tv.sv.expr, mapping), tv.sv.ty)


def elementwise(args: list[TensorExpr], fn: Callable[[list[ScalarExpr]], ScalarExpr], loc: Loc,
                what: str) -> TensorExpr:
    """Apply a scalar rule to broadcast operands."""
    shape = broadcast_shape([a.shape for a in args], loc, what)
    return TensorExpr(shape, fn([aligned(a, shape) for a in args]))


def compute(shape: tuple[int, ...], body: ScalarExpr, dtype_hint: ScalarType | None, loc: Loc,
            name: str | None) -> ComputeOp:
    """A compute op over i0..i{rank-1} (weak bodies take `dtype_hint` or the default)."""
    check_elements(shape, "the tensor", loc)
    if body.ty.dtype is None and dtype_hint is not None:
        body = coerce(body, dtype_hint, loc)
    dtype = default_dtype(body.ty)
    dims = tuple(Axis(idx(k), n) for k, n in enumerate(shape))
    return ComputeOp(TensorType(shape, dtype), dims, body.expr, loc=loc, name=name)


def reshape_body(src: TensorExpr, shape: tuple[int, ...], loc: Loc) -> TensorExpr:
    """Row-major reshape of `src` to `shape` (one dimension may be -1)."""
    if any(n == 0 or n < -1 for n in shape) or list(shape).count(-1) > 1:
        raise error(f"reshape target [{', '.join(map(str, shape))}] is invalid: sizes must be "
                    "positive, with at most one -1", loc)
    total = 1
    for n in src.shape:
        total *= n
    known = 1
    for n in shape:
        if n != -1:
            known *= n
    if -1 in shape:
        if total % known:
            raise error(f"cannot reshape {total} elements to [{', '.join(map(str, shape))}]",
                        loc)
        shape = tuple(total // known if n == -1 else n for n in shape)
    elif known != total:
        raise error(f"cannot reshape [{', '.join(map(str, src.shape))}] ({total} elements) to "
                    f"[{', '.join(map(str, shape))}] ({known} elements)", loc)
    if tuple(shape) == tuple(src.shape):
        return src  # the same shape: the same tensor (no copy, no index arithmetic)
    linear: Expr = Const(0)
    stride = 1
    for k in reversed(range(len(shape))):
        if shape[k] != 1:
            term: Expr = Index(idx(k)) if stride == 1 else Index(idx(k)) * stride
            linear = term if isinstance(linear, Const) else term + linear
        stride *= shape[k]
    indices: list[Expr] = []
    stride = total
    for k, n in enumerate(src.shape):
        stride //= n
        e: Expr = linear
        if stride != 1:
            e = e // stride
        if k > 0 and n != 1:
            e = e % n
        indices.append(Const(0) if n == 1 else e)
    body = src.sv.expr
    mapping = {idx(k): indices[k] for k in range(src.rank)}
    return TensorExpr(shape, ScalarExpr(substitute_indices(body, mapping), src.sv.ty))


def transpose_body(src: TensorExpr, perm: tuple[int, ...], loc: Loc) -> TensorExpr:
    """Output dimension k is input dimension perm[k]."""
    if sorted(perm) != list(range(src.rank)):
        raise error(f"transpose permutation [{', '.join(map(str, perm))}] is not a permutation "
                    f"of the {src.rank} dimensions of the operand", loc)
    mapping: dict[str, Expr] = {idx(p): Index(idx(k)) for k, p in enumerate(perm)}
    shape = tuple(src.shape[p] for p in perm)
    return TensorExpr(shape, ScalarExpr(substitute_indices(src.sv.expr, mapping), src.sv.ty))
