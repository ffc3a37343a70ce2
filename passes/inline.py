"""The `inline` pass: replace every `nf.call` by a copy of the callee's body."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from nfc.diagnostics import error
from nfc.ir import Block, CallOp, Func, KernelOp, Module, Op, ReturnOp, Value
from nfc.passmanager import Context, ModulePass

#: Functions that are entry points even without an `nf.public` attribute.
PUBLIC_NAMES = frozenset({"forward", "train_step", "eval"})


def is_public(func: Func) -> bool:
    """Whether `func` is an entry point: `nf.public = true` or a conventional name."""
    return bool(func.attrs.get("nf.public")) or func.name in PUBLIC_NAMES


def clone_op(op: Op, vmap: dict[Value, Value]) -> Op:
    """A copy of `op` reading `vmap[v]` for every mapped `v`, with fresh results (recorded in
    `vmap`); nested kernel bodies are copied too. Locations and attributes are kept."""
    if isinstance(op, KernelOp):
        body = Block([clone_op(inner, vmap) for inner in op.body.ops])
        new: Op = KernelOp(body, loc=op.loc, attrs=dict(op.attrs),
                           names=[r.name for r in op.results])
    elif isinstance(op, ReturnOp):  # and YieldOp
        new = type(op)([vmap.get(v, v) for v in op.values], loc=op.loc)
    else:
        # computes and calls hold only immutable data besides their results: a shallow copy
        # with fresh results, then rewired, is a deep copy
        new = copy.copy(op)
        new.attrs = dict(op.attrs)
        new.results = [Value(r.type, r.name, new, r.index) for r in op.results]
        new.replace_uses(vmap)
    for old, fresh in zip(op.results, new.results, strict=True):
        vmap[old] = fresh
    return new


def clone_block(block: Block, vmap: dict[Value, Value]) -> Block:
    """A copy of every op of `block` (see `clone_op`)."""
    return Block([clone_op(op, vmap) for op in block.ops])


@dataclass(frozen=True)
class Inline(ModulePass):
    """Replace each `nf.call` by a copy of the callee's body, then drop the callees no longer
    called (unless public: `nf.public = true`, or named forward, train_step or eval).

    Before:  nf.func @dense(%x: tensor<4x8xf32>, %w: tensor<8x2xf32>) -> (tensor<4x2xf32>) {
               %y = nf.compute [i: 4, j: 2] sum [k: 8] (%x[i, k] * %w[k, j]) : ...
               nf.return %y : tensor<4x2xf32>
             }
             nf.func @forward(%a: ..., %w: ...) -> (...) {
               %h = nf.call @dense(%a, %w) : (...) -> (tensor<4x2xf32>)
               %r = nf.compute [i: 4, j: 2] (max(%h[i, j], 0.0)) : tensor<4x2xf32>
    After:   nf.func @forward(%a: ..., %w: ...) -> (...) {
               %y = nf.compute [i: 4, j: 2] sum [k: 8] (%a[i, k] * %w[k, j]) : ...
               %r = nf.compute [i: 4, j: 2] (max(%y[i, j], 0.0)) : tensor<4x2xf32>
             (@dense is gone)

    Callees are inlined into each other first, so nested calls disappear too. The copies keep
    the callee's locations (they point at the op's definition), or take the call's when the
    callee's op has none. Recursion through calls is reported as an error.
    """

    name: ClassVar[str] = "inline"

    keep_funcs: bool = False
    """Keep functions whose calls were all inlined (by default only public ones stay)."""

    def apply(self, ctx: Context, module: Module) -> None:
        """Inline every call of every function of `module`."""
        funcs = {f.name: f for f in module.funcs}
        state: dict[str, str] = {}  # name -> "active" while being processed, "done" after
        inlined: set[str] = set()

        def process(func: Func) -> None:
            state[func.name] = "active"
            mapping: dict[Value, Value] = {}  # call result -> the value that replaces it
            _inline_block(func.body, visit, inlined, mapping)
            if mapping:
                func.replace_all_uses(mapping)
            state[func.name] = "done"

        def visit(call: CallOp) -> Func:
            callee = funcs.get(call.callee)
            if callee is None:
                raise error(f"call of unknown function '@{call.callee}'", call.loc)
            if state.get(callee.name) == "active":
                raise error(f"cannot inline the recursive call of '@{callee.name}'", call.loc)
            if state.get(callee.name) is None:
                process(callee)
            return callee

        for func in module.funcs:
            if func.name not in state:
                process(func)
        if not self.keep_funcs:
            module.funcs = [f for f in module.funcs if f.name not in inlined or is_public(f)]


def _inline_block(block: Block, callee_of: Callable[[CallOp], Func], inlined: set[str],
                  mapping: dict[Value, Value]) -> None:
    ops: list[Op] = []
    for op in block.ops:
        for region in op.regions():
            _inline_block(region, callee_of, inlined, mapping)
        if not isinstance(op, CallOp):
            ops.append(op)
            continue
        callee = callee_of(op)
        # the copies read the call's arguments, already resolved through earlier inlining
        vmap = {p: mapping.get(a, a) for p, a in zip(callee.args, op.args, strict=True)}
        for inner in callee.body.ops[:-1]:
            new = clone_op(inner, vmap)
            if new.loc is None:
                new.loc = op.loc
            ops.append(new)
        for r, v in zip(op.results, callee.ret.values, strict=True):
            mapping[r] = vmap.get(v, v)
        inlined.add(callee.name)
    block.ops = ops
