"""The codegen side of auto-tuning: kernels described as JSON, built in worker processes.

The tuner (nfc.runtime.tuning) measures candidates in worker processes that rebuild a kernel
from data. A *kernel spec* is JSON:

    {"ir": "<module text (nfc.printer)>", "func": "k", "op": 0,
     "inputs": [{"shape": [64, 32], "dtype": "float32"}, ...]}

`func` names a function whose body holds the kernel; `op` is the position (in the body) of
the compute or `nf.kernel` op to build (default: the first one). `inputs` describes the
kernel's inputs in `KernelInfo.inputs` order, as the worker needs them to generate data.

- `build(spec, schedule) -> run` (import path `"nfc.codegen.kernel_spec:build"`): compile with a
  schedule (a schedule-space parameter dict, or a `Schedule.to_dict()`), return
  `run(inputs) -> outputs` on numpy arrays. `run.workspace_bytes` is set.
- `reference(spec) -> run` (`"nfc.codegen.kernel_spec:reference"`): the default schedule's kernel.
- `space(spec)`: the kernel's `ScheduleSpace` (`params`, `default`, `is_valid`).
- `kernel_spec(op)`: the spec of an op taken from a function.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from nfc.ir import Block, ComputeOp, Func, KernelOp, ReturnOp, Value

RunFn = Callable[[list[np.ndarray]], Any]


def kernel_spec(op: ComputeOp | KernelOp, name: str = "k") -> dict[str, Any]:
    """A JSON spec of `op` (with its inputs as function arguments)."""
    from nfc.codegen.lower import group_of
    from nfc.printer import print_func

    _, outs, ins = group_of(op)
    rets = list(op.results) if isinstance(op, KernelOp) else list(outs)
    # a copy of the op reading fresh arguments: the op itself stays in its function
    vmap = {v: Value(v.type, v.name) for v in ins}
    body = Block([op.clone(vmap), ReturnOp([vmap[v] for v in rets])])
    func = Func(name, [vmap[v] for v in ins], body)
    return {"ir": print_func(func, locs=False), "func": name, "op": 0,
            "inputs": [{"shape": list(v.shape), "dtype": str(v.dtype.numpy)} for v in ins]}


def load_op(spec: Mapping[str, Any]) -> ComputeOp | KernelOp:
    """The op a spec describes (parsed from its IR text)."""
    from nfc.irparser import parse_module

    module = parse_module(spec["ir"], "<kernel spec>")
    func = module.func(spec["func"]) if spec.get("func") else module.funcs[0]
    ops = [o for o in func.body.ops if isinstance(o, ComputeOp | KernelOp)]
    op = ops[int(spec.get("op", 0))]
    return op


def space(spec: Mapping[str, Any]) -> Any:
    """The schedule space of a spec's kernel (a single compute)."""
    from nfc.codegen.space import schedule_space

    op = load_op(spec)
    if not isinstance(op, ComputeOp):
        raise ValueError("only single computes have a schedule space so far")
    return schedule_space(op)


def build(spec: Mapping[str, Any], schedule: Mapping[str, Any] | None) -> RunFn:
    """Compile the spec's kernel with `schedule`; the returned `run(inputs)` returns outputs."""
    from nfc.codegen.jit import compile_kernel

    op = load_op(spec)
    kernel = compile_kernel(op, dict(schedule) if schedule else None)

    def run(inputs: list[np.ndarray]) -> Any:
        return kernel(*inputs)

    run.workspace_bytes = kernel.info.workspace_bytes  # type: ignore[attr-defined]
    run.reproducible = True  # type: ignore[attr-defined]  # static chunking, no atomics
    run.kernel = kernel  # type: ignore[attr-defined]
    return run


def reference(spec: Mapping[str, Any]) -> RunFn:
    """The kernel with its default schedule (what tuned candidates must agree with)."""
    return build(spec, None)
