"""The metadata of an artifact, shared by the CPU library (nfc.codegen.artifact.assemble) and
the CUDA step (nfc.codegen.cuda.step): the persistent tensors, one entry per function (its
arguments, results, arena and kernels) and the model's header. docs/runtime.md describes the
JSON; the loaders (nfc.runtime.loader, nfc.runtime.cuda_load) read it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nfc import __version__
from nfc.codegen.artifact.initgen import GENERATOR, GENERATOR_VERSION
from nfc.codegen.artifact.layouts import state_layouts, tensor_views
from nfc.diagnostics import CompileError, error
from nfc.ir import ComputeOp, Func, KernelOp, Module, Op, TensorType

#: Version of the C ABI and the metadata layout; the loader refuses any other.
ABI_VERSION = 1
#: Roles of arguments that persist across steps (the model's state, held by the runtime).
PERSISTENT_ROLES = ("param", "state", "opt_state")


@dataclass(frozen=True)
class TensorInfo:
    """A persistent tensor of the model: its name, role, type and initialiser."""

    name: str
    role: str
    type: TensorType
    init: str
    trainable: bool
    layout: dict[str, Any] | None = None
    """A parameter laid out by `parallel-fusion{layout=true}` (and its optimizer state): the
    parts it concatenates (`parts`, `axis`, `offsets`, `inits`), each initialised and shown
    by its own name."""


def persistent_tensors(funcs: Sequence[Func]) -> list[TensorInfo]:
    """The params, state and optimizer state of `funcs`, by name, in first-seen order."""
    out: dict[str, TensorInfo] = {}
    for f in funcs:
        for a, attrs in zip(f.args, f.arg_attrs, strict=True):
            role = attrs.get("nf.role")
            if role not in PERSISTENT_ROLES:
                continue
            lay = attrs.get("nf.layout")
            t = TensorInfo(a.name or "", str(role), a.type, str(attrs.get("nf.init", "zeros")),
                           bool(attrs.get("nf.trainable", role == "param")),
                           dict(lay) if isinstance(lay, dict) else None)
            old = out.get(t.name)
            if old is None:
                out[t.name] = t
            elif (old.type, old.role) != (t.type, t.role):
                raise CompileError(error(
                    f"'{t.name}' is {old.role} {old.type} in one function and {t.role} "
                    f"{t.type} in @{f.name}", f.loc).diagnostics)
    return state_layouts(list(out.values()))


def flops_bytes(op: Op) -> tuple[float, int]:
    """The FLOPs and the bytes read and written of a compute or kernel op (nfc.cost)."""
    from nfc.codegen.lower import group_of
    from nfc.cost import compute_cost

    if isinstance(op, ComputeOp):
        c = compute_cost(op)
        return c.flops, c.bytes
    if isinstance(op, KernelOp):
        cops, outs, ins = group_of(op)
        flops = sum(compute_cost(c).flops for c in cops)
        return flops, sum(v.type.nbytes for v in (*outs, *ins))
    return 0.0, 0


def tensor_json(name: str, t: TensorType, **extra: Any) -> dict[str, Any]:
    """A tensor's entry: name, shape, dtype and `extra`."""
    return {"name": name, "shape": list(t.shape), "dtype": str(t.dtype), **extra}


def json_attrs(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """Module attributes that are plain JSON data (optimizer, loss, model name)."""
    out = {}
    for k, v in attrs.items():
        try:
            json.dumps(v)
        except TypeError:
            continue
        out[k] = v
    return out


def kernel_json(symbol: str, label: str, op: Op | None) -> dict[str, Any]:
    """A kernel call's entry; `op` None: a later launch of the same op (its cost is counted
    on the op's first kernel)."""
    flops, nbytes = flops_bytes(op) if op is not None else (0.0, 0)
    return {"symbol": symbol, "label": label, "flops": flops, "bytes": nbytes}


def function_json(fname: str, plan: Any, kernels: list[dict[str, Any]],
                  **extra: Any) -> dict[str, Any]:
    """A function's entry from its memory plan (nfc.codegen.artifact.plan.FuncPlan): the
    native symbol, arguments, results, arena size and kernels, and `extra` fields."""
    return {
        "symbol": f"nfc_{fname}",
        "args": [tensor_json(a.name, a.type, role=a.role) for a in plan.args],
        "results": [tensor_json(r.name, r.type, inplace=r.inplace, out=r.out)
                    for r in plan.results],
        "arena_bytes": plan.memory.peak, "naive_bytes": plan.memory.naive,
        "kernels": kernels, "copies": len(plan.copies), **extra}


def model_json(module: Module, tensors: Sequence[TensorInfo], functions: dict[str, Any], *,
               target: dict[str, Any], profile: bool,
               init_symbol: str | None) -> dict[str, Any]:
    """The whole metadata of an artifact: header, persistent tensors (and their views), the
    initialiser and `functions` (entries of `function_json`)."""
    return {
        "abi_version": ABI_VERSION, "nfc_version": __version__, "model": module.name,
        "target": target,
        "profile": profile,
        "tensors": [tensor_json(t.name, t.type, role=t.role, init=t.init,
                                trainable=t.trainable,
                                **({"layout": t.layout} if t.layout is not None else {}))
                    for t in tensors],
        **({"views": views} if (views := tensor_views(tensors)) else {}),
        "init": {"symbol": init_symbol, "generator": GENERATOR, "version": GENERATOR_VERSION},
        "functions": functions,
        "attributes": json_attrs(module.attrs),
    }
