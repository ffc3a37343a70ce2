"""The operator table: every scalar operator and intrinsic of the IR, one row each.

A row (`Op`, in `nfc.ops.table`) holds everything the compiler knows about one operator, and
every layer reads it instead of spelling the operator out again:

- `operands`, `result`: the typing rule, an operand class on the one dtype lattice
  (`nfc.ops.lattice`): verifier, interpreter, simplifier, cost model, frontend, backends;
- `numpy`: the interpreter, and constant folding (`fold`);
- `scalar`: the frontend's compile-time constants;
- `grad`: autodiff (`nfc.passes.autodiff.exprgrad`);
- `flops`: the cost model (`nfc.cost`);
- `commutes`: the simplifier's patterns;
- `lower` (a hook per backend) and `expand`: backends, for rows their own renderer table
  (`nfc.codegen.llvm.render`, keyed by row name) does not cover.

Rows are found with `find(expr)` or `get(name)`; plugin packages add intrinsics through the
`nfc.intrinsics` entry-point group (`nfc.ops.registry`). docs/operators.md shows how to add one.
"""

from __future__ import annotations

from nfc.ops.infer import Typer, fold, fold_cast, kind_of
from nfc.ops.lattice import (
    WEAK_FLOAT,
    WEAK_INT,
    Kind,
    TypeClash,
    Weak,
    check,
    check_strict,
    const_kind,
    is_float,
    is_weak,
    join,
    promote,
    resolve,
)
from nfc.ops.registry import (
    BUILTIN,
    ENTRY_POINT_GROUP,
    Intrinsics,
    find,
    get,
    intrinsic_names,
    key,
    load_entry_points,
    load_plugin,
    plugin_fingerprint,
    register,
    unregister,
)
from nfc.ops.table import ROWS, Grad, Op, chain, zero

__all__ = [
    "BUILTIN", "ENTRY_POINT_GROUP", "ROWS", "WEAK_FLOAT", "WEAK_INT", "Grad", "Intrinsics",
    "Kind", "Op", "TypeClash", "Typer", "Weak", "chain", "check", "check_strict", "const_kind",
    "find", "fold", "fold_cast", "get", "intrinsic_names", "is_float", "is_weak", "join",
    "key", "kind_of", "load_entry_points", "load_plugin", "plugin_fingerprint", "promote",
    "register", "resolve", "unregister", "zero",
]
