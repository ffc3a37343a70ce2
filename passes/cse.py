"""The `cse` pass: merge computes and calls that compute the same thing."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import ClassVar

from nfc.ir import Block, CallOp, ComputeOp, Func, Index, Module, Op, substitute_indices
from nfc.passmanager import Context, ModulePass
from nfc.printer import format_attr_dict
from nfc.rewrite import PatternRewriteWalker, RewritePattern, Rewriter
from nfc.simplify import simplify, structural_key

#: Attributes that only describe where an op came from, like its location: not compared.
INFO_ATTRS = frozenset({"nf.callsite"})


def _attrs_key(op: Op) -> str:
    return format_attr_dict({k: v for k, v in op.attrs.items() if k not in INFO_ATTRS})


def compute_key(op: ComputeOp) -> Hashable:
    """A key equal for computes with the same result type, extents, reduction and body up to
    a renaming of their axes (renamed positionally, then brought to canonical form) and the
    order of the arguments of commutative operators."""
    names = {a.name: Index(f"_{n:03d}") for n, a in enumerate(op.all_axes)}
    body = substitute_indices(op.body, names)
    ranges = {names[a.name].name: (0, a.extent - 1) for a in op.all_axes}
    return ("compute", op.result.type, tuple(a.extent for a in op.dims), op.reduce,
            tuple(a.extent for a in op.raxes),
            structural_key(simplify(body, ranges), commutative=True), _attrs_key(op))


def op_key(op: Op) -> Hashable | None:
    """The CSE key of `op`, None for ops that are never merged (kernels, returns)."""
    if isinstance(op, ComputeOp):
        return compute_key(op)
    if isinstance(op, CallOp):
        # functions are pure: the same callee on the same arguments gives the same results
        return ("call", op.callee, tuple(id(a) for a in op.args),
                tuple(r.type for r in op.results), _attrs_key(op))
    return None


@dataclass(frozen=True)
class CSE(ModulePass):
    """Merge structurally identical computes and calls: later ones are replaced by the first.

    Before:  %a = nf.compute [i: 4, j: 8] (exp(%x[i, j]) + 1.0) : tensor<4x8xf32>
             %b = nf.compute [p: 4, q: 8] (exp(%x[p, q]) + 1.0) : tensor<4x8xf32>
             %c = nf.compute [i: 4, j: 8] (%a[i, j] * %b[i, j]) : tensor<4x8xf32>
    After:   %a = nf.compute [i: 4, j: 8] (exp(%x[i, j]) + 1.0) : tensor<4x8xf32>
             %c = nf.compute [i: 4, j: 8] (%a[i, j] * %a[i, j]) : tensor<4x8xf32>

    Two computes match when their result types, dims extents, reduction kind and axes
    extents and attributes are equal and their bodies are equal once axes are renamed by
    position and both are simplified to canonical form (so `%x[j + i]` matches `%x[i + j]`),
    with the arguments of commutative operators in either order (`a * b` matches `b * a`).
    Locations (and `nf.callsite`, which says which op call a compute came from) are not
    compared; the first op's are kept. Calls match on callee, arguments and attributes. Each
    block is processed on its own: an op inside a kernel is never replaced by one outside it,
    or the kernel would gain an input.
    """

    name: ClassVar[str] = "cse"

    def apply(self, ctx: Context, module: Module) -> None:
        """Merge duplicates in every function of `module`."""
        for func in module.funcs:
            cse_func(func)


class MergeDuplicates(RewritePattern):
    """Replace an op by the first op of its block with the same key (`op_key`)."""

    def __init__(self) -> None:
        self.seen: dict[Block, dict[Hashable, Op]] = {}

    def match_and_rewrite(self, op: Op, rewriter: Rewriter) -> None:
        key = op_key(op)
        if key is None or op.parent is None:
            return
        first = self.seen.setdefault(op.parent, {}).setdefault(key, op)
        if first is not op:
            rewriter.replace_op(op, [], first.results)


def cse_func(func: Func) -> None:
    """Run CSE on one function."""
    PatternRewriteWalker(MergeDuplicates()).rewrite_func(func)
