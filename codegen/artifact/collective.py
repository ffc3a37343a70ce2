"""The `nf.allreduce` ops of an entry (nfc.passes.data_parallel): no kernel, a call of the
collective the runtime registers with `nfc_set_collective` (nfc.runtime.distributed).

At the op the entry calls `hook(id, 0, buffers)` (start) with the op's results then its
operands; before the first kernel reading a result (or before the end-of-step copies) it calls
`hook(id, 1, buffers)` (wait) with the same buffers. With no hook registered, the start copies
each operand to its result and the wait does nothing, so the library also runs alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from nfc.ir import AllReduceOp

#: Symbol of the plan's calls that are `nf.allreduce` ops: the prefix and the collective's
#: number in the function (its entry in the function's metadata "collectives").
COLLECTIVE_PREFIX = "@collective:"
#: The pointer the runtime registers with `nfc_set_collective` (NULL: no collective).
COLLECTIVE_HOOK = "nfc_collective_fn"


class _NoLoops:
    workspace_bytes = 0


NO_LOOPS: Any = _NoLoops()


def collective_json(op: AllReduceOp) -> dict[str, Any]:
    from nfc.codegen.artifact.metadata import tensor_json

    return {"bucket": int(op.attrs.get("nf.bucket", 0)),
            "reduce": str(op.attrs.get("nf.reduce", "mean")),
            "compress": str(op.attrs.get("nf.compress", "none")),
            "what": str(op.attrs.get("nf.collective", "gradients")),
            "tensors": [tensor_json(v.name or f"t{i}", v.type)
                        for i, v in enumerate(op.values)]}


def collective_waits(plan: Any) -> dict[int, list[tuple[int, Any]]]:
    """kernel position -> the collectives to wait for before it: each collective waits
    before the first call reading one of its results (the end of the step when only the
    copies or the return read them)."""
    out: dict[int, list[tuple[int, Any]]] = {}
    for k, call in enumerate(plan.kernels):
        if not call.symbol.startswith(COLLECTIVE_PREFIX):
            continue
        op = plan.func.body.ops[call.op_index]
        mine = {id(r) for r in op.results}
        at = len(plan.kernels)
        for j in range(k + 1, len(plan.kernels)):
            user = plan.func.body.ops[plan.kernels[j].op_index]
            if any(id(v) in mine for v in user.operands):
                at = j
                break
        out.setdefault(at, []).append((int(call.symbol[len(COLLECTIVE_PREFIX):]), call))
    return out


def emit_collective(llmod, fn, b, call, cid: int, phase: int, bufs, ptr,
                     sizes: Sequence[int]) -> None:
    """`hook(cid, phase, buffers)` with the results then the operands of the all-reduce
    (phase 0: start, at the op; 1: wait, before the first reader); without a registered hook
    phase 0 copies each operand to its result and phase 1 does nothing."""
    from llvmlite import ir

    from nfc.codegen.artifact.assemble import _exported, _opaque, _types

    PTR, I8, I32, I64, VOID = _types()
    hook = llmod.globals.get(COLLECTIVE_HOOK)
    if hook is None:
        hook = ir.GlobalVariable(llmod, PTR, name=COLLECTIVE_HOOK)
        hook.initializer = ir.Constant(PTR, None)
        hook.align = 8
        _opaque(hook)
        sfn, sb = _exported(llmod, "nfc_set_collective", VOID, [PTR])
        sb.store(sfn.args[0], hook)  # set before any step runs
        sb.ret_void()
    for m, slot in enumerate(call.buffers):
        b.store(ptr(slot), b.gep(bufs, [ir.Constant(I64, m)], source_etype=PTR))
    fptr = ir.FunctionType(VOID, [I64, I64, PTR]).as_pointer()
    h = b.load_atomic(hook, "acquire", 8, typ=fptr)
    yes, no, done = (fn.append_basic_block(f"coll{cid}_{phase}_{x}")
                     for x in ("call", "none", "done"))
    b.cbranch(b.icmp_unsigned("!=", h, ir.Constant(fptr, None)), yes, no)
    b.position_at_end(yes)
    b.call(h, [ir.Constant(I64, cid), ir.Constant(I64, phase), bufs])
    b.branch(done)
    b.position_at_end(no)
    if phase == 0:
        half = len(call.buffers) // 2
        memcpy = llmod.declare_intrinsic("llvm.memcpy", [PTR, PTR, I64])
        for m in range(half):
            dst = b.load(b.gep(bufs, [ir.Constant(I64, m)], source_etype=PTR), typ=PTR)
            src = b.load(b.gep(bufs, [ir.Constant(I64, half + m)], source_etype=PTR), typ=PTR)
            b.call(memcpy, [dst, src, ir.Constant(I64, sizes[m]),
                            ir.Constant(ir.IntType(1), 0)])
    b.branch(done)
    b.position_at_end(done)
