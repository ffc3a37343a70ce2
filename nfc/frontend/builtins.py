"""Builtin tensor-level functions: language constructs, not ops.

- `reshape<[d0, d1, ...]>(x)`: row-major; one dimension may be -1.
- `transpose<[p0, p1, ...]>(x)`: output dimension k is input dimension p_k.
- `zeros<[d0, d1, ...]>` and `full<[d0, d1, ...], v>`: a tensor of that shape holding 0.0 or
  the compile-time value `v`; the constant is weakly typed (like a literal), so it takes the
  dtype of what it meets and is f32 (i32 for an integer `v`) when bound to a name alone.
- `zeros_like(x)`: zeros of the shape and dtype of `x`.
- `stop_gradient(x)`: the value of `x`, through which autodiff passes no gradient (a copy
  compute carrying `nf.stop_gradient = true`).
The parentheses of `zeros<[...]>()` and `full<[...], v>()` are optional.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nfc.diagnostics import error
from nfc.frontend import ast, scalars
from nfc.frontend.limits import check_elements
from nfc.frontend.scalars import ScalarExpr
from nfc.frontend.shapes import CTValue, eval_ct, format_ct
from nfc.frontend.tensors import TensorExpr, compute, reshape_body, transpose_body
from nfc.ir import Const

if TYPE_CHECKING:
    from nfc.frontend.emit_ir import Lowering

BUILTINS = ("reshape", "transpose", "zeros", "full", "zeros_like", "stop_gradient")

#: Compile-time parameters of each builtin, in order (they may be given by position).
_PARAMS = {"reshape": ("shape",), "transpose": ("perm",), "zeros": ("shape",),
           "full": ("shape", "value"), "zeros_like": (), "stop_gradient": ()}


def _targs(low: Lowering, e: ast.Call) -> dict[str, CTValue]:
    names = _PARAMS[e.fn]
    usage = {"reshape": "reshape<[d0, d1, ...]>(x)", "transpose": "transpose<[p0, ...]>(x)",
             "zeros": "zeros<[d0, d1, ...]>", "full": "full<[d0, d1, ...], value>",
             "zeros_like": "zeros_like(x)", "stop_gradient": "stop_gradient(x)"}[e.fn]
    out: dict[str, CTValue] = {}
    for k, ta in enumerate(e.targs):
        name = ta.name if ta.name is not None else names[k] if k < len(names) else None
        if name not in names or name in out:
            raise error(f"'{e.fn}' takes {len(names) or 'no'} compile-time argument"
                        f"{'s' * (len(names) != 1)}: `{usage}`", ta.loc)
        out[name] = eval_ct(ta.value, low.ct_lookup)
    missing = [n for n in names if n not in out]
    if missing:
        raise error(f"'{e.fn}' needs its {missing[0]}: `{usage}`", e.loc)
    if "shape" in out or "perm" in out:
        value = out.get("shape", out.get("perm"))
        where = e.targs[0].loc
        if not isinstance(value, tuple):
            raise error(f"'{e.fn}' needs a list `[...]`, found {format_ct(value)}", where)
    return out


def builtin(low: Lowering, e: ast.Call) -> TensorExpr:
    """The tensor-level value of a builtin call."""
    targs = _targs(low, e)
    if e.fn in ("zeros", "full"):
        low.arity(e, 0)
        shape = targs["shape"]
        assert isinstance(shape, tuple)
        check_elements(shape, f"'{e.fn}'", e.loc)
        value = targs.get("value", 0.0)
        if isinstance(value, tuple):
            raise error(f"the value of 'full' must be a number or a boolean, found "
                        f"{format_ct(value)}", e.targs[-1].loc)
        return TensorExpr(shape, scalars.const(value))
    low.arity(e, 1)
    src = low.tv(e.args[0])
    if e.fn == "stop_gradient":
        return stop_gradient(low, src, e.loc)
    if e.fn == "zeros_like":
        ty = src.sv.ty
        zero: int | float | bool = {"int": 0, "float": 0.0, "bool": False}[ty.kind]
        # an untyped literal in the IR: the strong type lives in the ScalarExpr (prints as `0.0`)
        return TensorExpr(src.shape, ScalarExpr(Const(zero), ty))
    value = targs["shape"] if e.fn == "reshape" else targs["perm"]
    assert isinstance(value, tuple)
    if e.fn == "reshape":
        return reshape_body(src, value, e.loc)
    return transpose_body(src, value, e.loc)


def stop_gradient(low: Lowering, src: TensorExpr, loc: ast.Loc) -> TensorExpr:
    """A copy of `src` marked `nf.stop_gradient = true`: a compute of its own, so the mark
    cannot be lost by fusing the expression into its consumer."""
    if src.sv.ty.dtype is None:  # a weak constant has no gradient anyway
        return src
    op = compute(src.shape, src.sv, None, loc, None)
    op.attrs["nf.stop_gradient"] = True
    low.ctx.emit(op)
    low.ctx.check_bounds(op)
    return TensorExpr.of(op.result)
