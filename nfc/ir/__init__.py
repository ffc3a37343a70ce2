"""The nf IR: types, scalar expressions, tensor-level ops, functions and modules.

The IR is single-level in the NeoFlow sense: tensor values are SSA, and the body of an
`nf.compute` is one scalar expression tree. Every tensor in the IR has a static shape; symbolic
shapes of the surface language are resolved by the frontend.

Expressions are immutable (frozen dataclasses, structural equality); ops, values, blocks,
functions and modules are mutable objects with identity, which passes rewrite in place.

The package holds, in dependency order: `types` (dtypes, tensor types, source locations),
`values` (SSA values with use lists), `expr` (scalar expressions), `ops` (tensor-level ops) and
`block` (blocks, functions, modules). Import the names from `nfc.ir` itself.
"""

from nfc.ir.block import Block, Func, Module
from nfc.ir.expr import (
    BINARY_PRECEDENCE,
    COMPARISONS,
    INTRINSICS,
    LOGICAL,
    REDUCTIONS,
    Binary,
    Call,
    Cast,
    Const,
    Expr,
    Index,
    Load,
    Select,
    Unary,
    index_names,
    lift,
    loads,
    substitute_indices,
    substitute_values,
)
from nfc.ir.ops import (
    AllReduceOp,
    Axis,
    CallOp,
    ComputeOp,
    KernelOp,
    Op,
    ReturnOp,
    TerminatorOp,
    YieldOp,
)
from nfc.ir.types import MAX_ELEMENTS, DType, Loc, TensorType
from nfc.ir.values import Value

__all__ = [
    "BINARY_PRECEDENCE", "COMPARISONS", "INTRINSICS", "LOGICAL", "MAX_ELEMENTS", "REDUCTIONS",
    "AllReduceOp", "Axis", "Binary", "Block", "Call", "CallOp", "Cast", "ComputeOp", "Const",
    "DType", "Expr",
    "Func", "Index", "KernelOp", "Load", "Loc", "Module", "Op", "ReturnOp", "Select",
    "TensorType", "TerminatorOp", "Unary", "Value", "YieldOp", "index_names", "lift", "loads",
    "substitute_indices", "substitute_values",
]
