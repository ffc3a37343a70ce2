"""Whole functions of a model for the GPU: every kernel, one translation unit, a static memory
plan and the launches of each step.

    step = build_cuda_step(module)          # after the build pipeline (inline, ..., fuse)
    step.source                             # ONE CUDA C translation unit, every kernel
    step.funcs["train_step"].launches       # Launch(symbol, grid, block, shared, params)
    images = step.compile()                 # NVRTC: {"sm_80": cubin, "sm_90": cubin, "ptx": ...}
    json.dumps(step.to_json())              # everything but the kernels' loop IR

Each compute or group (`nf.kernel`) of a function is lowered with `lower_program` (the GPU
default schedules, or `schedule_for(op)`), its kernels named `<function>_<n>[_<stage>]`. The
memory plan is the CPU's (`nfc.codegen.artifact.plan.plan_function`): a value lives in an
argument's buffer (`Slot("arg", i)`), a result buffer (`Slot("out", j)`) or the function's
arena (`Slot("arena", offset)`), with results updated in place where that is safe and copies
at the end of the step otherwise. A program's temporaries (the global buffers between the
stages of a group) are its *workspace*: one arena block live during the op, each temporary
256-byte aligned at an offset inside it, so a kernel parameter is a slot plus an extra byte
offset. `metadata` has the CPU artifact's format (`nfc.codegen.artifact.metadata`: functions
with args, roles and results; persistent tensors with their initializers), target
`{"kind": "cuda", ...}`, so that `nfc.runtime.cuda_model.CudaModel` offers the loader's API.
Data-parallel collectives (`nf.allreduce`) are refused.

`offload=` (opt-in) moves saved activations to pinned host memory between the forward and the
backward pass (nfc.codegen.cuda.offload): the function's `offload` lists the values with the
launch indices where the runtime copies them out and back; its arena is planned with the
shorter lifetimes. A step with offloaded values is format `OFFLOAD_FORMAT` in JSON (older
readers, which would run it without the copies, refuse it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from nfc.codegen.artifact.plan import Copy, FuncPlan, Slot, plan_function
from nfc.codegen.cuda.lower import GpuKernel, GpuProgram, lower_program
from nfc.codegen.cuda.nvrtc import ARCHS
from nfc.codegen.cuda.offload import Offloaded, OffloadOptions, apply_offload
from nfc.codegen.cuda.render import RenderError, render_kernel, render_kernels
from nfc.codegen.cuda.schedule import GpuScheduleError
from nfc.diagnostics import CompileError, Diagnostic, error
from nfc.ir import AllReduceOp, ComputeOp, KernelOp, Module, Op, ReturnOp, Value

__all__ = ["OFFLOAD_FORMAT", "STEP_FORMAT", "TEMP_ALIGN", "CudaFunc", "CudaStep", "Launch",
           "OffloadOptions", "build_cuda_step"]

#: Version of `CudaStep.to_json()`; `from_json` refuses any other.
STEP_FORMAT = 1
#: The version of a step with offloaded activations (the runtime must make their copies).
OFFLOAD_FORMAT = 2
#: Alignment of a program's temporaries inside its workspace (cudaMalloc's is 256).
TEMP_ALIGN = 256


@dataclass(frozen=True)
class Launch:
    """One kernel launch of a step: per kernel parameter, the slot of its buffer and an extra
    byte offset from that slot (a temporary inside its program's workspace)."""

    symbol: str
    grid: int
    block: int
    shared_bytes: int
    params: tuple[tuple[Slot, int], ...]
    op_index: int
    label: str = ""

    def to_json(self) -> dict[str, Any]:
        """A JSON object."""
        return {"symbol": self.symbol, "grid": self.grid, "block": self.block,
                "shared_bytes": self.shared_bytes, "op_index": self.op_index,
                "label": self.label,
                "params": [[s.kind, s.index, off] for s, off in self.params]}

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> Launch:
        """From `to_json`."""
        return Launch(str(d["symbol"]), int(d["grid"]), int(d["block"]),
                      int(d["shared_bytes"]),
                      tuple((Slot(str(k), int(i)), int(off)) for k, i, off in d["params"]),
                      int(d["op_index"]), str(d.get("label", "")))


@dataclass
class CudaFunc:
    """A function as a sequence of launches, then device-to-device copies (the plan's), on an
    arena of `arena_bytes`. `args` and `results` are the metadata's entries (name, shape,
    dtype, role / inplace, out)."""

    name: str
    launches: list[Launch]
    copies: list[Copy]
    arena_bytes: int
    args: list[dict[str, Any]]
    results: list[dict[str, Any]]
    offload: list[Offloaded] = field(default_factory=list)
    """Values sent to pinned host memory and fetched back (nfc.codegen.cuda.offload)."""
    plan: FuncPlan | None = field(default=None, compare=False, repr=False)
    """The memory plan it was built from (not serialised; None when read from JSON)."""

    def to_json(self) -> dict[str, Any]:
        """A JSON object."""
        return {"name": self.name, "arena_bytes": self.arena_bytes,
                "launches": [x.to_json() for x in self.launches],
                "copies": [[c.src.kind, c.src.index, c.dst.kind, c.dst.index, c.nbytes]
                           for c in self.copies],
                "args": self.args, "results": self.results,
                **({"offload": [o.to_json() for o in self.offload]} if self.offload else {})}

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> CudaFunc:
        """From `to_json`."""
        return CudaFunc(str(d["name"]), [Launch.from_json(x) for x in d["launches"]],
                        [Copy(Slot(str(a), int(b)), Slot(str(c), int(e)), int(n))
                         for a, b, c, e, n in d["copies"]],
                        int(d["arena_bytes"]), [dict(a) for a in d["args"]],
                        [dict(r) for r in d["results"]],
                        [Offloaded.from_json(o) for o in d.get("offload", [])])


@dataclass
class CudaStep:
    """Every function of a model for the GPU (module doc). `kernels` (symbol -> GpuKernel, the
    loop IR the simulator runs) is not serialised."""

    source: str
    funcs: dict[str, CudaFunc]
    metadata: dict[str, Any]
    kernels: dict[str, GpuKernel] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """Everything but `kernels`, as JSON data."""
        fmt = OFFLOAD_FORMAT if any(f.offload for f in self.funcs.values()) else STEP_FORMAT
        return {"format": fmt, "source": self.source, "metadata": self.metadata,
                "funcs": {n: f.to_json() for n, f in self.funcs.items()}}

    @staticmethod
    def from_json(d: Mapping[str, Any], kernels: Mapping[str, GpuKernel] | None = None
                  ) -> CudaStep:
        """From `to_json` (ValueError for another format version)."""
        if d.get("format") not in (STEP_FORMAT, OFFLOAD_FORMAT):
            raise ValueError(f"CUDA step format {d.get('format')!r}; this nfc reads "
                             f"{STEP_FORMAT} and {OFFLOAD_FORMAT}")
        return CudaStep(str(d["source"]), {n: CudaFunc.from_json(f)
                                           for n, f in d["funcs"].items()},
                        dict(d["metadata"]), dict(kernels or {}))

    def compile(self, archs: Sequence[str] = ARCHS, *, ptx: bool = True,
                use_cache: bool = True) -> dict[str, bytes]:
        """The translation unit compiled by NVRTC: a cubin per arch and (with `ptx`) PTX for
        the newest, keyed as `CudaModel` takes them ("sm_80", "sm_90", "ptx"). A GPU between
        the archs runs the cubin of its major version (binary compatible: sm_86 runs sm_80's),
        a newer one the PTX, which its driver compiles."""
        from nfc.codegen.cuda.nvrtc import compile_cuda
        from nfc.codegen.cuda.program import compile_program

        if self.kernels:  # kernels that spill are recompiled with relief, limits checked
            images = {a: compile_program(list(self.kernels.values()), a,
                                         use_cache=use_cache).image for a in archs}
        else:
            images = {a: compile_cuda(self.source, a, use_cache=use_cache).image for a in archs}
        if ptx and archs:
            images["ptx"] = compile_cuda(self.source, max(archs), ptx=True,
                                         use_cache=use_cache).image
        return images


@dataclass(frozen=True)
class _Info:
    """What `plan_function` reads of a kernel (nfc.codegen.jit.KernelInfo's fields)."""

    outputs: tuple[Value, ...]
    inputs: tuple[Value, ...]
    workspace_bytes: int


def _align(n: int, a: int = TEMP_ALIGN) -> int:
    return -(-n // a) * a


def _workspace(program: GpuProgram) -> tuple[dict[str, int], int]:
    """Byte offsets of the program's temporaries in its workspace, and its size."""
    offsets: dict[str, int] = {}
    size = 0
    for t in program.temps:
        offsets[t.name] = size
        size += _align(max(t.nbytes, 1))
    return offsets, size


ScheduleFor = Callable[[Op], Any]


def _lower(fname: str, n: int, op: Op, schedule_for: ScheduleFor | None) -> GpuProgram:
    if isinstance(op, AllReduceOp):
        raise CompileError(error(
            f"@{fname}: nf.allreduce (data-parallel training) is not supported by the CUDA "
            "backend; build without data parallelism for --target cuda", op.loc).diagnostics)
    if not isinstance(op, ComputeOp | KernelOp):
        raise CompileError(error(f"cannot compile {op.opname} for the GPU; run the inline "
                                 "pass first", op.loc).diagnostics)
    sched = schedule_for(op) if schedule_for is not None else None
    try:
        prog = lower_program(op, sched, name=f"{fname}_{n}")
        for k in prog.kernels:
            render_kernel(k)
    except (GpuScheduleError, RenderError) as exc:
        raise CompileError([Diagnostic(
            "error", f"the CUDA backend cannot compile this: {exc}", op.loc)]) from None
    return prog


def _launches(n: int, prog: GpuProgram, slots: Sequence[Slot], ws: Slot | None,
              label: str) -> list[Launch]:
    """The launches of one op's program: parameters by name to their slots."""
    offsets, _ = _workspace(prog)
    where = {b.name: (slot, 0) for b, slot in zip(prog.params, slots, strict=True)}
    for name, off in offsets.items():
        assert ws is not None
        where[name] = (ws, off)
    return [Launch(k.func.name, k.grid, k.block, k.shared_bytes,
                   tuple(where[p.name] for p in k.func.params), n, label)
            for k in prog.kernels]


def build_cuda_step(module: Module, functions: Sequence[str] | None = None,
                    schedule_for: ScheduleFor | None = None,
                    offload: bool | OffloadOptions | None = None) -> CudaStep:
    """The CudaStep of `functions` of `module` (default: every function with a body); see the
    module doc. What the backend cannot compile is a CompileError at its location.
    `offload`: True (the h100/pcie5 plan, `OffloadOptions()`) or options offload saved
    activations of the functions with a backward pass (nfc.codegen.cuda.offload)."""
    from nfc.codegen.artifact.metadata import (
        function_json,
        kernel_json,
        model_json,
        persistent_tensors,
    )

    opts = OffloadOptions() if offload is True else (offload or None)
    funcs = [module.func(n) for n in functions] if functions else [
        f for f in module.funcs if f.body.ops]
    for f in funcs:
        if not f.name.isidentifier():
            raise CompileError(error(f"function name '{f.name}' is not a C identifier",
                                     f.loc).diagnostics)
    tensors = persistent_tensors(funcs)
    kernels: dict[str, GpuKernel] = {}
    cfuncs: dict[str, CudaFunc] = {}
    fmeta: dict[str, Any] = {}
    for f in funcs:
        programs: dict[int, GpuProgram] = {}
        infos: dict[int, _Info] = {}
        for n, op in enumerate(f.body.ops):
            if isinstance(op, ReturnOp):
                continue
            prog = programs[n] = _lower(f.name, len(programs), op, schedule_for)
            outs = tuple(op.results)  # a kernel op's results, not the values its body yields
            ins = tuple(_inputs_of(op))
            infos[n] = _Info(outs, ins, _workspace(prog)[1])
            for k in prog.kernels:
                kernels[k.func.name] = k
        plan = plan_function(f, infos, {n: p.name for n, p in programs.items()})  # type: ignore[arg-type]
        arena_without = plan.memory.peak
        moved: list[Offloaded] = []
        if opts is not None:
            plan, moved = apply_offload(f, plan, opts)
        launches: list[Launch] = []
        first: list[int] = []
        last: list[int] = []
        kmeta = []
        for call in plan.kernels:
            prog = programs[call.op_index]
            n_bufs = len(prog.params)
            ws = call.buffers[n_bufs] if len(call.buffers) > n_bufs else None
            op = f.body.ops[call.op_index]
            new = _launches(call.op_index, prog, call.buffers[:n_bufs], ws, call.label)
            for x in new:  # an update in place: output and input share a buffer
                k = kernels[x.symbol]
                outs_at = set(x.params[:k.func.n_outputs])
                if k.restrict and outs_at & set(x.params[k.func.n_outputs:]):
                    kernels[x.symbol] = replace(k, restrict=False)
            assert call.op_index == len(first)
            first.append(len(launches))
            launches += new
            last.append(len(launches) - 1)
            kmeta += [kernel_json(x.symbol, call.label, op if i == 0 else None)
                      for i, x in enumerate(new)]  # the op's cost on its first kernel
        moved = [o.at_launches(first, last) for o in moved]
        fmeta[f.name] = function_json(f.name, plan, kmeta, **({"offload": {
            "values": len(moved), "bytes": sum(o.nbytes for o in moved),
            "arena_without": arena_without}} if moved else {}))
        cfuncs[f.name] = CudaFunc(f.name, launches, list(plan.copies), plan.memory.peak,
                                  fmeta[f.name]["args"], fmeta[f.name]["results"], moved,
                                  plan)
    source = render_kernels(list(kernels.values()),
                            f"{module.name}: {len(kernels)} kernels of "
                            f"{', '.join(cfuncs)}")
    meta = model_json(module, tensors, fmeta, profile=False, init_symbol=None,
                      target={"kind": "cuda", "archs": list(ARCHS)})
    return CudaStep(source, cfuncs, meta, kernels)


def _inputs_of(op: Op) -> list[Value]:
    """The program's inputs in its parameter order (nfc.codegen.lower.group_of)."""
    from nfc.codegen.lower import group_of

    return group_of(op)[2]  # type: ignore[arg-type]
