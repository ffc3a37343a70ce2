"""The `cse` pass: merge computes and calls that compute the same thing."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import ClassVar

from nfc.ir import Block, CallOp, ComputeOp, Func, Index, Module, Op, Value, substitute_indices
from nfc.passmanager import Context, ModulePass
from nfc.printer import format_attr_dict
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


def _cse_block(block: Block, mapping: dict[Value, Value]) -> None:
    seen: dict[Hashable, Op] = {}
    ops = []
    for op in block.ops:
        if mapping:
            op.replace_uses(mapping)  # earlier merges may make this op a duplicate too
        for region in op.regions():
            _cse_block(region, mapping)
        key = op_key(op)
        first = seen.get(key) if key is not None else None
        if first is not None:
            mapping.update(zip(op.results, first.results, strict=True))
            continue
        if key is not None:
            seen[key] = op
        ops.append(op)
    block.ops = ops


def cse_func(func: Func) -> None:
    """Run CSE on one function."""
    mapping: dict[Value, Value] = {}
    _cse_block(func.body, mapping)
    if mapping:
        func.replace_all_uses(mapping)
