"""Copying functions and removing dead computes, for passes that build new functions."""

from __future__ import annotations

import copy

from nfc.ir import Block, CallOp, ComputeOp, Func, KernelOp, Op, ReturnOp, Value, YieldOp


def clone_op(op: Op, vmap: dict[Value, Value]) -> Op:
    """A copy of `op` reading `vmap[v]` for every mapped operand; new results are mapped."""
    if isinstance(op, ComputeOp):
        new: Op = ComputeOp(op.result.type, op.dims, op.body, reduce=op.reduce, raxes=op.raxes,
                            loc=op.loc, attrs=copy.deepcopy(op.attrs), name=op.result.name)
    elif isinstance(op, CallOp):
        new = CallOp(op.callee, list(op.args), [r.type for r in op.results], loc=op.loc,
                     attrs=copy.deepcopy(op.attrs), names=[r.name for r in op.results])
    elif isinstance(op, KernelOp):
        body = Block([])
        for inner in op.body.ops:
            body.ops.append(clone_op(inner, vmap))
        new = KernelOp(body, loc=op.loc, attrs=copy.deepcopy(op.attrs),
                       names=[r.name for r in op.results])
        for a, b in zip(op.results, new.results, strict=True):
            vmap[a] = b
        return new
    elif isinstance(op, YieldOp):
        new = YieldOp(list(op.values), loc=op.loc)
    elif isinstance(op, ReturnOp):
        new = ReturnOp(list(op.values), loc=op.loc)
    else:
        raise TypeError(f"cannot clone {op!r}")
    new.replace_uses(vmap)
    for a, b in zip(op.results, new.results, strict=True):
        vmap[a] = b
    return new


def clone_func(func: Func, name: str) -> Func:
    """A deep copy of `func` under a new name (fresh values, same names and attributes)."""
    vmap: dict[Value, Value] = {}
    args = []
    for a in func.args:
        b = Value(a.type, a.name)
        vmap[a] = b
        args.append(b)
    body = Block([clone_op(op, vmap) for op in func.body.ops])
    return Func(name, args, body, arg_attrs=copy.deepcopy(func.arg_attrs),
                attrs=copy.deepcopy(func.attrs), loc=func.loc)


def remove_dead(func: Func) -> None:
    """Drop top-level computes whose results nothing reads (calls and kernels stay)."""
    while True:
        used = {id(v) for op in func.walk() for v in op.operands}
        keep = [op for op in func.body.ops
                if not isinstance(op, ComputeOp) or id(op.result) in used]
        if len(keep) == len(func.body.ops):
            return
        func.body.ops = keep
