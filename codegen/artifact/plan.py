"""Where every tensor of a step lives, and what the entry function does, in order.

A function of the IR becomes one native entry `void nfc_<f>(void **args, void **outs,
void *arena)`. Its tensors live in one of three places (a `Slot`):

- `arg i`: the caller's buffer of argument `i` (inputs, parameters, optimizer state);
- `out j`: the caller's buffer of the j-th result that is not updated in place;
- `arena off`: the step's scratch arena at byte offset `off` (static memory plan,
  nfc.passes.memplan), intermediate values and the kernels' workspaces.

A result marked in place (`nf.inplace = {"<result>": "<arg>"}`) is written straight into the
argument's buffer when that is safe: its op is the last to read the argument and reads it only
elementwise at the element it writes (the optimizer's `p - lr * g`). Otherwise it is computed
in the arena and copied at the end of the step. Results that are arguments, or that appear
twice, are copies too; a copy whose source buffer is itself overwritten by another copy goes
through a staging buffer first, so the order of the copies never matters.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from nfc.codegen.jit import KernelInfo
from nfc.diagnostics import CompileError, error
from nfc.ir import (
    CallOp,
    ComputeOp,
    Func,
    Index,
    KernelOp,
    Load,
    Op,
    ReturnOp,
    TensorType,
    Value,
    loads,
)
from nfc.passes.memplan import (
    LiveBuffer,
    MemoryPlan,
    MemoryReport,
    last_uses,
    memory_report,
    op_positions,
    plan_offsets,
)


@dataclass(frozen=True)
class Slot:
    """A buffer location: `kind` is "arg", "out" or "arena"; `index` the argument number, the
    output number or the byte offset in the arena."""

    kind: str
    index: int


@dataclass(frozen=True)
class ArgInfo:
    """An argument of an entry function."""

    name: str
    role: str
    type: TensorType
    attrs: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class ResultInfo:
    """A result: `inplace` names the argument it updates, else `out` is its output slot."""

    name: str
    type: TensorType
    inplace: str | None
    out: int | None


@dataclass(frozen=True)
class KernelCall:
    """One kernel call of an entry: `buffers` in the kernel's order (outputs, inputs, then the
    workspace when it has one)."""

    symbol: str
    op_index: int
    buffers: tuple[Slot, ...]
    label: str


@dataclass(frozen=True)
class Copy:
    """`nbytes` bytes from `src` to `dst`, after every kernel of the step."""

    src: Slot
    dst: Slot
    nbytes: int


@dataclass
class FuncPlan:
    """Everything the entry function of `func` needs."""

    name: str
    func: Func
    args: list[ArgInfo]
    results: list[ResultInfo]
    kernels: list[KernelCall]
    copies: list[Copy]
    memory: MemoryPlan
    where: dict[int, Slot]
    buffers: list[LiveBuffer] = field(default_factory=list)
    """The arena's live buffers (values, kernel workspaces, staging), as planned."""

    def memory_report(self) -> MemoryReport:
        """Peak memory of one call (nfc.passes.memplan.MemoryReport) from this very plan."""
        return memory_report(self.func, self.buffers, self.memory,
                             inplace=[n for n, r in enumerate(self.func.ret.values)
                                      if self.results[n].inplace is not None])

    @property
    def n_outputs(self) -> int:
        """Entries of the `outs` array."""
        return sum(1 for r in self.results if r.out is not None)


def result_names(func: Func) -> list[str]:
    """`nf.results` of `func`, or `out0`, `out1`, ... when absent or malformed."""
    names = func.attrs.get("nf.results")
    n = len(func.ret.values)
    if isinstance(names, list) and len(names) == n and all(isinstance(x, str) for x in names):
        return list(names)
    return [f"out{i}" for i in range(n)]


def _is_identity_load(ld: Load, op: ComputeOp) -> bool:
    return (len(ld.indices) == len(op.dims)
            and all(isinstance(e, Index) and e.name == d.name
                    for e, d in zip(ld.indices, op.dims, strict=True)))


def inplace_ok(func: Func, value: Value, arg: Value, pos: Mapping[int, int],
               reads: Mapping[int, frozenset[int]] | None = None) -> bool:
    """Whether `value` may be computed straight into `arg`'s buffer (see the module doc).
    `reads` (id(op) -> ids of its operands, from `op_reads`) saves recomputing operands."""
    if value.type != arg.type or value.owner is None or any(v is arg for v in func.ret.values):
        return False
    p = pos[id(value)]
    ops = func.body.ops
    for op in ops[p + 1:-1]:
        if id(arg) in (reads[id(op)] if reads is not None else op_reads([op])[id(op)]):
            return False
    op = ops[p]
    if not any(v is arg for v in op.operands):
        return True
    if isinstance(op, KernelOp):
        # the kernel's stages run in body order and computes it yields or reduces are never
        # inlined into later stages: safe when every other compute reading `arg` is such a
        # stage before the one yielding `value`
        body = op.body.ops[:-1]
        inner = op.body.ops[-1].operands[value.index].owner
        yielded = {id(v) for v in op.body.ops[-1].operands}
        at = body.index(inner)
        for n, c in enumerate(body):
            if c is inner or not any(v is arg for v in c.operands):
                continue
            if n > at or not isinstance(c, ComputeOp) or (
                    c.reduce is None and id(c.result) not in yielded):
                return False
        op, value = inner, inner.results[0]
    if not isinstance(op, ComputeOp) or op.reduce is not None or op.result is not value:
        return False
    return all(_is_identity_load(ld, op) for ld in loads(op.body) if ld.tensor is arg)


def op_reads(ops: Sequence[Op]) -> dict[int, frozenset[int]]:
    """id(op) -> the ids of the values each op reads (`Op.operands` walks a kernel's body,
    which made `inplace_ok` quadratic in big models)."""
    return {id(op): frozenset(id(v) for v in op.operands) for op in ops}


def describe_op(n: int, op: Op) -> str:
    """A short label for profiles: `12 %h1 [n: 64, j: 128] sum [k: 64] (backward) mlp.nf:9:3`."""
    names = ", ".join(f"%{r.name}" if r.name else "%?" for r in op.results)
    text = f"{n} {names}"
    if isinstance(op, ComputeOp):
        text += " [" + ", ".join(str(a) for a in op.dims) + "]"
        if op.reduce:
            text += f" {op.reduce} [" + ", ".join(str(a) for a in op.raxes) + "]"
    elif isinstance(op, KernelOp):
        text += " kernel"
    phase = op.attrs.get("nf.phase")
    if phase:
        text += f" ({phase})"
    if op.loc is not None:
        text += f" {op.loc}"
    return text


def _place_results(func: Func, names: Sequence[str], inplace: Mapping[int, str],
                   where: dict[int, Slot], pending: list[tuple[Value, Slot]]
                   ) -> list[ResultInfo]:
    """Where each result of `func` goes: an output slot, or the argument it updates in place.
    A value not yet placed is computed right there (`where`); otherwise (an argument, a value
    returned twice, an in-place update that is not safe) it is copied at the end
    (`pending`)."""
    ops = func.body.ops
    arg_index = {a.name: i for i, a in enumerate(func.args)}
    pos = op_positions(func)
    reads: dict[int, frozenset[int]] | None = None
    results: list[ResultInfo] = []
    n_out = 0
    targets: set[str] = set()
    for r, v in enumerate(func.ret.values):
        target = inplace.get(r)
        if target is not None:
            if target not in arg_index or target in targets:
                raise CompileError(error(f"@{func.name}: result {r} is in place on '{target}', "
                                         "which is not a distinct argument", func.loc).diagnostics)
            targets.add(target)
            arg = func.args[arg_index[target]]
            if arg.type != v.type:
                raise CompileError(error(f"@{func.name}: in-place result {r} has type {v.type} "
                                         f"but '{target}' has {arg.type}", func.loc).diagnostics)
            dst = Slot("arg", arg_index[target])
            if reads is None:
                reads = op_reads(ops)
            if id(v) not in where and inplace_ok(func, v, arg, pos, reads):
                where[id(v)] = dst
            else:
                pending.append((v, dst))
            results.append(ResultInfo(names[r], v.type, target, None))
        else:
            dst = Slot("out", n_out)
            if id(v) not in where:
                where[id(v)] = dst
            else:
                pending.append((v, dst))
            results.append(ResultInfo(names[r], v.type, None, n_out))
            n_out += 1
    return results


def plan_function(func: Func, infos: Mapping[int, KernelInfo],
                  symbols: Mapping[int, str]) -> FuncPlan:
    """The plan of `func`, whose op `n` is the kernel `symbols[n]` with layout `infos[n]`."""
    ops = func.body.ops
    if not ops or not isinstance(ops[-1], ReturnOp):
        raise CompileError(error(f"@{func.name} does not end with nf.return", func.loc).diagnostics)
    for op in ops[:-1]:
        if isinstance(op, CallOp):
            raise CompileError(error(f"@{func.name} still calls @{op.callee}; run the inline "
                                     "pass before building an artifact", op.loc).diagnostics)
    names = result_names(func)
    inplace = {int(k): str(v) for k, v in (func.attrs.get("nf.inplace") or {}).items()}
    args = [ArgInfo(a.name or f"arg{i}", str(attrs.get("nf.role", "input")), a.type, dict(attrs))
            for i, (a, attrs) in enumerate(zip(func.args, func.arg_attrs, strict=True))]
    where: dict[int, Slot] = {id(a): Slot("arg", i) for i, a in enumerate(func.args)}
    pending: list[tuple[Value, Slot]] = []
    results = _place_results(func, names, inplace, where, pending)

    end = len(ops) - 1  # the return's position: copies happen there
    last = last_uses(func)
    buffers: list[LiveBuffer] = []
    for n, op in enumerate(ops[:-1]):
        for v in op.results:
            if id(v) not in where:
                end_v = max(n, last.get(id(v), n))
                buffers.append(LiveBuffer(("v", id(v)), v.type.nbytes, n, end_v))
        if infos[n].workspace_bytes:
            buffers.append(LiveBuffer(("ws", n), infos[n].workspace_bytes, n, n))
    # a copy source that another copy overwrites is staged first (both at the end)
    dsts = {dst for _, dst in pending}
    staged: dict[int, Value] = {}
    for v, _dst in pending:
        src = where.get(id(v))
        if src is not None and src in dsts and id(v) not in staged:
            buffers.append(LiveBuffer(("stage", id(v)), v.type.nbytes, end, end + 1))
            staged[id(v)] = v
    memory = plan_offsets(buffers)
    for b in buffers:
        if b.key[0] == "v":
            where[b.key[1]] = Slot("arena", memory.offsets[b.key])
    copies: list[Copy] = []
    stage_slot: dict[int, Slot] = {}
    for key, v in staged.items():
        stage_slot[key] = Slot("arena", memory.offsets[("stage", key)])
        copies.append(Copy(where[key], stage_slot[key], v.type.nbytes))
    for v, dst in pending:
        src = stage_slot.get(id(v), where[id(v)])
        if src != dst:
            copies.append(Copy(src, dst, v.type.nbytes))

    kernels: list[KernelCall] = []
    for n, op in enumerate(ops[:-1]):
        info = infos[n]
        slots = [where[id(v)] for v in (*info.outputs, *info.inputs)]
        if info.workspace_bytes:
            slots.append(Slot("arena", memory.offsets[("ws", n)]))
        kernels.append(KernelCall(symbols[n], n, tuple(slots), describe_op(n, op)))
    return FuncPlan(func.name, func, args, results, kernels, copies, memory, where, buffers)


def artifact_memory_model(after: Sequence[Any], module_name: str = "model",
                          module_attrs: Mapping[str, Any] | None = None,
                          target: Any = None, context: Any = None) -> Any:
    """A memory model for passes that trade memory (`Context.memory_model`, used by `remat`):
    `model(func)` runs the passes `after` (the rest of the build pipeline: tuning, fusion;
    not the other passes that use a memory model) on
    `func` alone, plans its artifact entry (kernels lowered to loop IR for their workspace
    sizes, nothing compiled) and returns that plan's MemoryReport. `func` is changed (the
    caller gives a copy). The passes run under a copy of `context` (the build's: its model
    parameters and device parameters, so that `fuse` groups as in the build)."""
    import copy

    # other memory-trading passes measure with this same model: they do not run inside it
    after = [p for p in after if not getattr(p, "uses_memory_model", False)]

    def model(func: Func) -> MemoryReport:
        from nfc.codegen.artifact.assemble import build_artifact
        from nfc.ir import Module
        from nfc.passmanager import Context, PassManager

        module = Module(module_name, [func], attrs=copy.deepcopy(dict(module_attrs or {})))
        if after:
            import dataclasses

            from nfc.diagnostics import DiagnosticEngine

            ctx = (Context(verify=False) if context is None else dataclasses.replace(
                context, diagnostics=DiagnosticEngine(), remarks={}, memory_model=None,
                verify=False))
            PassManager(list(after), verify=False).run(module, ctx)
        art = build_artifact(module, functions=[func.name], target=target)
        return art.plans[func.name].memory_report()

    return model
