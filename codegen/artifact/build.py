"""The artifact builder: every function of a module as one native entry in one LLVM module.

Exported C ABI (ABI_VERSION 1; every symbol starts with `nfc_`):

    int32_t     nfc_abi_version(void);
    const char *nfc_metadata(void);              /* JSON, see docs/runtime.md */
    void        nfc_set_num_threads(int32_t n);  /* libgomp team size of parallel loops */
    int32_t     nfc_get_num_threads(void);
    void        nfc_init(void **tensors, int64_t seed);  /* metadata "tensors" order */
    void        nfc_<f>(void **args, void **outs, void *arena);
    int64_t     nfc_<f>_arena_bytes(void);
    int64_t    *nfc_<f>_profile(void);           /* profiled builds only */

`nfc_<f>` runs a whole step: its kernels in order (each a `void k(void **buffers)` of
nfc.codegen), then the copies of the plan (nfc.codegen.artifact.plan). `args` has one pointer
per IR argument, `outs` one per result not updated in place; buffers are C-contiguous, 64-byte
alignment is best (not required). `arena` may be NULL: the library then uses a static arena of
its own (so concurrent calls of one entry need arenas of their own, `nfc_<f>_arena_bytes()`).
A profiled build (`profile=True`) reads CLOCK_MONOTONIC around every kernel call and stores
the start and end (ns) of kernel k of the latest call at `nfc_<f>_profile()[2k]` and `[2k+1]`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from nfc import __version__
from nfc.codegen.artifact.initgen import GENERATOR, GENERATOR_VERSION, emit_init_loop
from nfc.codegen.artifact.kcache import ObjectCache
from nfc.codegen.artifact.kernels import KernelSet
from nfc.codegen.artifact.plan import FuncPlan, Slot, plan_function
from nfc.codegen.cpu import CpuTarget, host_target
from nfc.codegen.jit import SCHEDULE_ATTR, KernelInfo, new_module
from nfc.codegen.lower import ScheduleError, default_group_schedule, group_of
from nfc.codegen.schedule import GroupSchedule
from nfc.diagnostics import CompileError, error
from nfc.ir import ComputeOp, Func, KernelOp, Module, Op, ReturnOp, TensorType

#: Version of the C ABI and the metadata layout; the loader refuses any other.
ABI_VERSION = 1
#: Roles of arguments that persist across steps (the model's state, held by the runtime).
PERSISTENT_ROLES = ("param", "state", "opt_state")
#: LLVM pipeline of the entry module (entries, `nfc_init`, metadata): glue code whose speed does
#: not matter, but whose long blocks of pointer stores cost O3's SLP vectorizer seconds
#: (2.9 s for ResNet-18's entries; 0.1 s with this).
ENTRY_PIPELINE: dict[str, int | bool] = {"speed_level": 2, "loop_vectorization": False,
                                         "slp_vectorization": False, "loop_unrolling": False}


@dataclass(frozen=True)
class TensorInfo:
    """A persistent tensor of the model (parameter, state or optimizer state)."""

    name: str
    role: str
    type: TensorType
    init: str
    trainable: bool


@dataclass
class Artifact:
    """A built (not yet linked) artifact: the LLVM module and what describes it."""

    llvm_module: Any
    """The module of the entries, `nfc_init` and the metadata."""
    metadata: dict[str, Any]
    plans: dict[str, FuncPlan]
    kernels: dict[str, KernelInfo]
    """The distinct kernels the entries call, by symbol (each compiled once and called with
    different buffers; a multi-stage group is a composite of stage kernels, see
    nfc.codegen.artifact.kernels)."""
    target: CpuTarget
    kernel_set: KernelSet
    jobs: int | None = None
    """Processes compiling kernels in `write_shared` (None: `default_jobs()`)."""
    stats: dict[str, Any] = field(default_factory=dict)
    """What the build did: distinct kernels, cache hits and misses, CPU seconds by phase."""

    @property
    def kernel_modules(self) -> list[Any]:
        """One fresh LLVM module per distinct kernel (emitted on demand)."""
        return [self.kernel_set.module(sym) for sym in self.kernel_set.entries]

    @property
    def modules(self) -> list[Any]:
        """Every LLVM module of the library."""
        return [self.llvm_module, *self.kernel_modules]

    def llvm_ir(self, optimized: bool = True) -> str:
        """The LLVM IR text of every module (after LLVM's optimisation pipeline unless
        `optimized` is False)."""
        from nfc.codegen.jit import optimize

        return "\n".join(
            str(optimize(m, self.target, options=ENTRY_PIPELINE if m is self.llvm_module
                         else None)) if optimized else str(m) for m in self.modules)

    def loops_text(self) -> str:
        """The loop IR of every kernel (`nfc compile --emit=loops`)."""
        from nfc.codegen.loops import print_loops

        return "\n".join(f"// {sym}\n{print_loops(k.loops)}" for sym, k in self.kernels.items())

    def write_shared(self, path: str, jobs: int | None = None) -> str:
        """Object code for every distinct kernel (from the object cache, else compiled in
        `jobs` processes), the entry module's, and the shared library `path` (atomic)."""
        from nfc.codegen.artifact.parallel import compile_text, default_jobs
        from nfc.codegen.native import LinkError

        jobs = jobs or self.jobs or default_jobs()
        entry: list[bytes] = []

        def compile_entry() -> None:
            t0 = time.process_time()
            text = str(self.llvm_module)
            self.stats["emit"] = self.stats.get("emit", 0.0) + time.process_time() - t0
            obj, times = compile_text(text, self.target, ENTRY_PIPELINE)
            for k, v in times.items():
                self.stats[k] = self.stats.get(k, 0.0) + v
            entry.append(obj)

        ks = self.kernel_set
        objs = ks.objects(jobs, before=[compile_entry])
        try:
            return self._link(entry + objs, path)
        except LinkError:
            if not ks.stats.get("cache_hits"):
                raise
            # a damaged cached object: compile everything afresh (overwriting the cache)
            return self._link(entry + ks.objects(jobs, refresh=True), path)
        finally:
            self.stats.update(ks.stats)

    def _link(self, objects: list[bytes | str], path: str) -> str:
        from nfc.codegen.native import link_shared

        t0 = time.perf_counter()
        out = link_shared(objects, path)
        self.stats["link"] = self.stats.get("link", 0.0) + time.perf_counter() - t0
        if self.kernel_set.cache is not None and self.kernel_set.stats.get("cache_misses"):
            self.kernel_set.cache.prune()
        return out


ScheduleFn = Callable[[Op], Any]


def _stage_schedules(op: Op, target: CpuTarget) -> GroupSchedule | None:
    """For an `nf.kernel` without a schedule of its own, the default group schedule with
    the `nf.schedule` its computes carry (tuned before the fuse pass grouped them); None when
    none has one."""
    from nfc.codegen.jit import schedule_to_object

    if not isinstance(op, KernelOp):
        return None
    cops, outs, _ = group_of(op)
    if not any(SCHEDULE_ATTR in c.attrs for c in cops):
        return None
    gs = default_group_schedule(cops, outs)
    return GroupSchedule(inline=gs.inline, stages=tuple(
        schedule_to_object(c, c.attrs[SCHEDULE_ATTR], target) if SCHEDULE_ATTR in c.attrs
        else None for n, c in enumerate(cops) if n not in gs.inline))


def _kernel_info(info: KernelInfo, op: Op) -> KernelInfo:
    """`info` with a kernel op's results as outputs: codegen names the values its body
    yields, the function's other ops read the op's results."""
    if not isinstance(op, KernelOp):
        return info
    return KernelInfo(info.name, info.loops, tuple(op.results), info.inputs)


def persistent_tensors(funcs: Sequence[Func]) -> list[TensorInfo]:
    """The params, state and optimizer state of `funcs`, by name, in first-seen order."""
    out: dict[str, TensorInfo] = {}
    for f in funcs:
        for a, attrs in zip(f.args, f.arg_attrs, strict=True):
            role = attrs.get("nf.role")
            if role not in PERSISTENT_ROLES:
                continue
            t = TensorInfo(a.name or "", str(role), a.type, str(attrs.get("nf.init", "zeros")),
                           bool(attrs.get("nf.trainable", role == "param")))
            old = out.get(t.name)
            if old is None:
                out[t.name] = t
            elif (old.type, old.role) != (t.type, t.role):
                raise CompileError(error(
                    f"'{t.name}' is {old.role} {old.type} in one function and {t.role} "
                    f"{t.type} in @{f.name}", f.loc).diagnostics)
    return list(out.values())


def _flops_bytes(op: Op) -> tuple[float, int]:
    from nfc.cost import compute_cost

    if isinstance(op, ComputeOp):
        c = compute_cost(op)
        return c.flops, c.bytes
    if isinstance(op, KernelOp):
        cops, outs, ins = group_of(op)
        flops = sum(compute_cost(c).flops for c in cops)
        return flops, sum(v.type.nbytes for v in (*outs, *ins))
    return 0.0, 0


def _tensor_json(name: str, t: TensorType, **extra: Any) -> dict[str, Any]:
    return {"name": name, "shape": list(t.shape), "dtype": str(t.dtype), **extra}


def build_artifact(module: Module, *, functions: Sequence[str] | None = None,
                   schedule_for: ScheduleFn | None = None, target: CpuTarget | None = None,
                   profile: bool = False, extra_metadata: dict[str, Any] | None = None,
                   split: int | None = None) -> Artifact:
    """Compile `functions` of `module` (default: all) into one artifact (see the module doc).

    The module must be verified and inlined. `schedule_for(op)` may return a schedule for a
    kernel (None: the op's `nf.schedule` attribute, else codegen's default).
    """

    from llvmlite import ir

    target = target or host_target()
    funcs = [module.func(n) for n in functions] if functions else [
        f for f in module.funcs if f.body.ops]
    for f in funcs:
        if not f.name.isidentifier():
            raise CompileError(error(f"function name '{f.name}' is not a C identifier",
                                     f.loc).diagnostics)
    tensors = persistent_tensors(funcs)
    llmod = new_module(f"nfc_{module.name}", target)
    kset = KernelSet(target, ObjectCache.default())
    plans: dict[str, FuncPlan] = {}
    fmeta: dict[str, Any] = {}
    for f in funcs:
        infos: dict[int, KernelInfo] = {}
        symbols: dict[int, str] = {}
        kmeta = []
        for n, op in enumerate(f.body.ops):
            if isinstance(op, ReturnOp):
                continue
            if not isinstance(op, ComputeOp | KernelOp):
                raise CompileError(error(f"cannot compile {op.opname} into an artifact; run "
                                         "the inline pass first", op.loc).diagnostics)
            sched = schedule_for(op) if schedule_for else None
            if sched is None:
                sched = op.attrs.get("nf.schedule")
            if sched is None:
                sched = _stage_schedules(op, target)
            # structurally identical kernels (same computation, types and schedule) share one
            # function; each call passes its own buffers
            try:
                sym, info = kset.add(op, sched)
            except ScheduleError:
                if not isinstance(sched, GroupSchedule):
                    raise
                # a stage schedule tuned before fusion that no longer fits the stage
                # (its producers were inlined): the default schedules instead
                sym, info = kset.add(op, None)
            if llmod.globals.get(sym) is None:  # defined in its own object of the library
                _declare(llmod, sym, ir.VoidType(), [ir.PointerType()])
            infos[n], symbols[n] = _kernel_info(info, op), sym
        plan = plan_function(f, infos, symbols)
        plans[f.name] = plan
        for call in plan.kernels:
            flops, nbytes = _flops_bytes(f.body.ops[call.op_index])
            kmeta.append({"symbol": call.symbol, "label": call.label, "flops": flops,
                          "bytes": nbytes})
        _emit_entry(llmod, plan, profile)
        fmeta[f.name] = {
            "symbol": f"nfc_{f.name}",
            "args": [_tensor_json(a.name, a.type, role=a.role) for a in plan.args],
            "results": [_tensor_json(r.name, r.type, inplace=r.inplace, out=r.out)
                        for r in plan.results],
            "arena_bytes": plan.memory.peak, "naive_bytes": plan.memory.naive,
            "kernels": kmeta, "copies": len(plan.copies),
        }
    _emit_init(llmod, tensors)
    feats = sorted(x[1:] for x in target.features.split(",") if x.startswith("+"))
    meta: dict[str, Any] = {
        "abi_version": ABI_VERSION, "nfc_version": __version__, "model": module.name,
        "target": {"triple": target.triple, "cpu": target.cpu, "features": feats},
        "profile": profile,
        "tensors": [_tensor_json(t.name, t.type, role=t.role, init=t.init,
                                 trainable=t.trainable) for t in tensors],
        "init": {"symbol": "nfc_init", "generator": GENERATOR, "version": GENERATOR_VERSION},
        "functions": fmeta,
        "attributes": _json_attrs(module.attrs),
    }
    meta.update(extra_metadata or {})
    _emit_info(llmod, meta)
    kset.define_composites(llmod)  # groups compiled stage by stage: glue in this module
    return Artifact(llmod, meta, plans, dict(kset.called), target, kset, split)


def _json_attrs(attrs: dict[str, Any]) -> dict[str, Any]:
    """Module attributes that are plain JSON data (optimizer, loss, model name)."""
    out = {}
    for k, v in attrs.items():
        try:
            json.dumps(v)
        except TypeError:
            continue
        out[k] = v
    return out


# ---------------------------------------------------------------------------------------------
# LLVM emission

def _types():
    from llvmlite import ir

    return ir.PointerType(), ir.IntType(8), ir.IntType(32), ir.IntType(64), ir.VoidType()


def _opaque(v):
    """`v` typed as an opaque `ptr`: llvmlite still types allocas and globals as typed
    pointers, which LLVM's opaque-pointer IR and the codegen emitter do not use."""
    from llvmlite import ir

    v.type = ir.PointerType()
    return v


def _declare(llmod, name: str, ret, args):
    """The external function `name`, declared once per module."""
    from llvmlite import ir

    fn = llmod.globals.get(name)
    return fn if fn is not None else ir.Function(llmod, ir.FunctionType(ret, args), name=name)


def _exported(llmod, name: str, ret, args):
    from llvmlite import ir

    fn = ir.Function(llmod, ir.FunctionType(ret, args), name=name)
    fn.attributes.add("nounwind")
    return fn, ir.IRBuilder(fn.append_basic_block("entry"))


def _emit_entry(llmod, plan: FuncPlan, profile: bool) -> None:
    from llvmlite import ir

    PTR, I8, I32, I64, VOID = _types()
    arena_g = ir.GlobalVariable(llmod, ir.ArrayType(I8, max(plan.memory.peak, 64)),
                                name=f"nfc_arena_{plan.name}")
    arena_g.linkage = "internal"
    arena_g.initializer = ir.Constant(arena_g.value_type, None)
    arena_g.align = 64
    fn, b = _exported(llmod, f"nfc_{plan.name}", VOID, [PTR, PTR, PTR])
    args_p, outs_p, arena_p = fn.args
    static = _opaque(arena_g)
    base = b.select(b.icmp_unsigned("==", arena_p, ir.Constant(PTR, None)), static, arena_p)
    cache: dict[Slot, Any] = {}

    def ptr(slot: Slot):
        if slot not in cache:
            if slot.kind == "arena":
                cache[slot] = b.gep(base, [ir.Constant(I64, slot.index)], source_etype=I8)
            else:
                table = args_p if slot.kind == "arg" else outs_p
                cache[slot] = b.load(b.gep(table, [ir.Constant(I64, slot.index)],
                                           source_etype=PTR), typ=PTR)
        return cache[slot]

    width = max([len(k.buffers) for k in plan.kernels] + [1])
    bufs = _opaque(b.alloca(ir.ArrayType(PTR, width), name="buffers"))
    prof = ts = clock = None
    if profile:
        n = max(1, 2 * len(plan.kernels))
        prof = ir.GlobalVariable(llmod, ir.ArrayType(I64, n), name=f"nfc_prof_{plan.name}")
        prof.initializer = ir.Constant(prof.value_type, None)
        prof.align = 64
        ts = _opaque(b.alloca(ir.ArrayType(I64, 2), name="ts"))
        _opaque(prof)
        clock = _declare(llmod, "clock_gettime", I32, [I32, PTR])

    def stamp(k: int) -> None:
        b.call(clock, [ir.Constant(I32, 1), ts])  # CLOCK_MONOTONIC
        sec = b.load(ts, typ=I64)
        nsec = b.load(b.gep(ts, [ir.Constant(I64, 1)], source_etype=I64), typ=I64)
        now = b.add(b.mul(sec, ir.Constant(I64, 1_000_000_000)), nsec)
        b.store(now, b.gep(prof, [ir.Constant(I64, k)], source_etype=I64))

    for k, call in enumerate(plan.kernels):
        for m, slot in enumerate(call.buffers):
            b.store(ptr(slot), b.gep(bufs, [ir.Constant(I64, m)], source_etype=PTR))
        kfn = llmod.get_global(call.symbol)
        if profile:
            stamp(2 * k)
        b.call(kfn, [bufs])
        if profile:
            stamp(2 * k + 1)
    for c in plan.copies:
        memcpy = llmod.declare_intrinsic("llvm.memcpy", [PTR, PTR, I64])
        b.call(memcpy, [ptr(c.dst), ptr(c.src), ir.Constant(I64, c.nbytes),
                        ir.Constant(ir.IntType(1), 0)])
    b.ret_void()

    _, b2 = _exported(llmod, f"nfc_{plan.name}_arena_bytes", I64, [])
    b2.ret(ir.Constant(I64, plan.memory.peak))
    if profile:
        _, b3 = _exported(llmod, f"nfc_{plan.name}_profile", PTR, [])
        b3.ret(prof)


def _emit_init(llmod, tensors: Sequence[TensorInfo]) -> None:
    from llvmlite import ir

    PTR, I8, I32, I64, VOID = _types()
    fn, b = _exported(llmod, "nfc_init", VOID, [PTR, I64])
    table, seed = fn.args
    for k, t in enumerate(tensors):
        p = b.load(b.gep(table, [ir.Constant(I64, k)], source_etype=PTR), typ=PTR)
        try:
            emit_init_loop(b, llmod, p, t.name, t.init, t.type.shape, t.type.dtype, seed)
        except ValueError as exc:
            raise CompileError(error(f"'{t.name}': {exc}").diagnostics) from None
    b.ret_void()


def _emit_info(llmod, meta: dict[str, Any]) -> None:
    from llvmlite import ir

    PTR, I8, I32, I64, VOID = _types()
    data = json.dumps(meta, sort_keys=True).encode() + b"\0"
    g = ir.GlobalVariable(llmod, ir.ArrayType(I8, len(data)), name="nfc_metadata_json")
    g.initializer = ir.Constant(g.value_type, bytearray(data))
    g.global_constant = True
    g.linkage = "internal"
    _, b = _exported(llmod, "nfc_metadata", PTR, [])
    b.ret(_opaque(g))
    _, b = _exported(llmod, "nfc_abi_version", I32, [])
    b.ret(ir.Constant(I32, ABI_VERSION))
    omp_set = _declare(llmod, "omp_set_num_threads", VOID, [I32])
    omp_get = _declare(llmod, "omp_get_max_threads", I32, [])
    fn, b = _exported(llmod, "nfc_set_num_threads", VOID, [I32])
    b.call(omp_set, [fn.args[0]])
    b.ret_void()
    _, b = _exported(llmod, "nfc_get_num_threads", I32, [])
    b.ret(b.call(omp_get, []))
