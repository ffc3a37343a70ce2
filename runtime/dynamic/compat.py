"""May a candidate library replace the running one? Only if a step of it reads and writes
exactly the same buffers: the same persistent tensors, and for every function the same
arguments and results (names, roles, shapes, dtypes, in-place targets, output slots), the
same ABI and model. Kernels, their schedules and the arena size may differ (the arena belongs
to each library's own `Function`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_ARG_KEYS = ("name", "role", "shape", "dtype")
_RESULT_KEYS = ("name", "shape", "dtype", "inplace", "out")
_TENSOR_KEYS = ("name", "role", "shape", "dtype")


def _rows(items: Any, keys: tuple[str, ...]) -> list[tuple[Any, ...]]:
    return [tuple(repr(d.get(k)) for k in keys) for d in items]


def incompatibility(current: Mapping[str, Any], candidate: Mapping[str, Any], *,
                    ignore_profile: bool = False) -> str | None:
    """Why `candidate`'s metadata cannot replace `current`'s, or None when it can
    (`ignore_profile`: a profiled build may stand in for a plain one, swap.py's twins)."""
    keys = ("abi_version", "model") if ignore_profile else ("abi_version", "model", "profile")
    for key in keys:
        if current.get(key) != candidate.get(key):
            return f"{key} differs ({current.get(key)!r} vs {candidate.get(key)!r})"
    if current.get("attributes") != candidate.get("attributes"):
        return "model attributes (optimizer, loss) differ"
    if _rows(current["tensors"], _TENSOR_KEYS) != _rows(candidate["tensors"], _TENSOR_KEYS):
        return "persistent tensors differ"
    fa, fb = current["functions"], candidate["functions"]
    if set(fa) != set(fb):
        return f"functions differ ({sorted(fa)} vs {sorted(fb)})"
    for name in fa:
        a, b = fa[name], fb[name]
        if _rows(a["args"], _ARG_KEYS) != _rows(b["args"], _ARG_KEYS):
            return f"arguments of {name} differ"
        if _rows(a["results"], _RESULT_KEYS) != _rows(b["results"], _RESULT_KEYS):
            return f"results of {name} differ"
        if current.get("profile") and len(a["kernels"]) != len(b["kernels"]):
            return f"kernels of profiled {name} differ"
    return None
