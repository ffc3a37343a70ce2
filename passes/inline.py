"""The `inline` pass: replace every `nf.call` by a copy of the callee's body."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from nfc.diagnostics import error
from nfc.ir import CallOp, Func, Module, Op
from nfc.passmanager import Context, ModulePass
from nfc.rewrite import PatternRewriteWalker, RewritePattern, Rewriter

#: Functions that are entry points even without an `nf.public` attribute.
PUBLIC_NAMES = frozenset({"forward", "train_step", "eval"})


def is_public(func: Func) -> bool:
    """Whether `func` is an entry point: `nf.public = true` or a conventional name."""
    return bool(func.attrs.get("nf.public")) or func.name in PUBLIC_NAMES


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
            PatternRewriteWalker(InlineCall(visit, inlined)).rewrite_func(func)
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


class InlineCall(RewritePattern):
    """Replace a call by copies of its callee's ops (the callee inlined first, by
    `callee_of`); the copies keep their locations, or take the call's."""

    def __init__(self, callee_of: Callable[[CallOp], Func], inlined: set[str]) -> None:
        self.callee_of = callee_of
        self.inlined = inlined

    def match_and_rewrite(self, op: Op, rewriter: Rewriter) -> None:
        if not isinstance(op, CallOp):
            return
        callee = self.callee_of(op)
        vmap = dict(zip(callee.args, op.args, strict=True))
        copies = [inner.clone(vmap) for inner in callee.body.ops[:-1]]
        for new in copies:
            if new.loc is None:
                new.loc = op.loc
        rewriter.replace_op(op, copies, [vmap.get(v, v) for v in callee.ret.values])
        self.inlined.add(callee.name)
