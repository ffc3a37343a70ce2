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
    void        nfc_set_collective(void (*fn)(int64_t id, int64_t phase, void **buffers));
                                                 /* modules with nf.allreduce only */

`nfc_<f>` runs a whole step: its kernels in order (each a `void k(void **buffers)` of
nfc.codegen), then the copies of the plan (nfc.codegen.artifact.plan). `args` has one pointer
per IR argument, `outs` one per result not updated in place; buffers are C-contiguous, 64-byte
alignment is best (not required). `arena` may be NULL: the library then uses an arena of its
own, allocated on the first such call (so concurrent calls of one entry need arenas of their
own, `nfc_<f>_arena_bytes()`).
An `nf.allreduce` op (nfc.passes.data_parallel) is no kernel: the entry calls the function
registered with `nfc_set_collective` with the collective's number in the function's metadata
"collectives", phase 0 (start) and its results then its operands, at the op; and phase 1
(wait) with the same buffers before the first kernel reading a result. With none registered
it copies the operands to the results.
A profiled build (`profile=True`) reads CLOCK_MONOTONIC around every kernel call and stores
the start and end (ns) of kernel k of the latest call at `nfc_<f>_profile()[2k]` and `[2k+1]`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from nfc.blocked import blocked_index_map, is_blocked
from nfc.codegen.artifact.collective import (
    COLLECTIVE_PREFIX,
    NO_LOOPS,
    collective_json,
    collective_waits,
    emit_collective,
)
from nfc.codegen.artifact.initgen import (
    emit_init_loop,
    layout_parts,
    part_view,
)
from nfc.codegen.artifact.kcache import ObjectCache
from nfc.codegen.artifact.kernels import KernelSet
from nfc.codegen.artifact.layouts import check_part_names
from nfc.codegen.artifact.metadata import (
    ABI_VERSION,
    TensorInfo,
    function_json,
    kernel_json,
    model_json,
    persistent_tensors,
)
from nfc.codegen.artifact.plan import FuncPlan, Slot, plan_function
from nfc.codegen.cpu import CpuTarget, host_target
from nfc.codegen.jit import SCHEDULE_ATTR, KernelInfo, new_module
from nfc.codegen.lower import ScheduleError, default_group_schedule, group_of
from nfc.codegen.schedule import GroupSchedule
from nfc.diagnostics import CompileError, error
from nfc.ir import AllReduceOp, ComputeOp, KernelOp, Module, Op, ReturnOp

#: Most bytes of static data (metadata, profile counters) a library may hold: the code
#: addresses it with 32-bit PC-relative offsets, which reach 2 GiB; 1 GiB leaves room for the
#: code and the relocation slack.
STATIC_DATA_LIMIT = 1 << 30
#: LLVM pipeline of the entry module (entries, `nfc_init`, metadata): glue code whose speed does
#: not matter, but whose long blocks of pointer stores cost O3's SLP vectorizer seconds
#: (2.9 s for ResNet-18's entries; 0.1 s with this).
ENTRY_PIPELINE: dict[str, int | bool] = {"speed_level": 2, "loop_vectorization": False,
                                         "slp_vectorization": False, "loop_unrolling": False}


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

    def link(self, jobs: int | None = None) -> bytes:
        """The bytes of the artifact file: object code for every distinct kernel (from the
        object cache, else compiled in `jobs` processes) and the entry module's, linked into
        a shared library and sealed with the metadata (nfc.codegen.artifact.container)."""
        from nfc.codegen.artifact.container import seal
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
            elf = self._link(entry + objs)
        except LinkError:
            if not ks.stats.get("cache_hits"):
                raise
            # a cached object that passed its checksum but that the linker refuses (written
            # by a broken compiler?): compile everything afresh, overwriting the cache
            elf = self._link(entry + ks.objects(jobs, refresh=True))
        finally:
            self.stats.update(ks.stats)
        return seal(elf, self.metadata)

    def write_shared(self, path: str, jobs: int | None = None, *,
                     mode: int | None = None) -> str:
        """Link (`link`) and write the artifact to `path` atomically (a unique temporary
        name, then a rename; `mode`: permission bits, default from the umask); returns the
        absolute path."""
        from nfc.codegen.artifact.container import default_mode
        from nfc.fsutil import atomic_write

        data = self.link(jobs)
        out = os.path.abspath(path)
        atomic_write(out, data, default_mode() if mode is None else mode)
        return out

    def _link(self, objects: list[bytes]) -> bytes:
        from nfc.codegen.native import link_bytes

        t0 = time.perf_counter()
        elf = link_bytes(objects)
        self.stats["link"] = self.stats.get("link", 0.0) + time.perf_counter() - t0
        if self.kernel_set.cache is not None and self.kernel_set.stats.get("cache_misses"):
            self.kernel_set.cache.prune()
        return elf


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
    return replace(info, outputs=tuple(op.results))  # a composite's workspace too


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
    from nfc.codegen.space import check_schedule_attrs

    check_schedule_attrs(funcs, target)  # a bad `nf.schedule` of IR text: located errors
    tensors = persistent_tensors(funcs)
    llmod = new_module(f"nfc_{module.name}", target)
    kset = KernelSet(target, ObjectCache.default())
    plans: dict[str, FuncPlan] = {}
    fmeta: dict[str, Any] = {}
    for f in funcs:
        infos: dict[int, KernelInfo] = {}
        symbols: dict[int, str] = {}
        kmeta = []
        collectives: list[dict[str, Any]] = []
        for n, op in enumerate(f.body.ops):
            if isinstance(op, ReturnOp):
                continue
            if isinstance(op, AllReduceOp):
                # no kernel: the entry calls the registered collective (`emit_collective`)
                infos[n] = KernelInfo(f"allreduce{len(collectives)}", NO_LOOPS,
                                      tuple(op.results), tuple(op.values))
                symbols[n] = f"{COLLECTIVE_PREFIX}{len(collectives)}"
                collectives.append(collective_json(op))
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
            kmeta.append(kernel_json(call.symbol, call.label, f.body.ops[call.op_index]))
        _emit_entry(llmod, plan, profile)
        fmeta[f.name] = function_json(f.name, plan, kmeta, **(
            {"collectives": collectives} if collectives else {}))
    _emit_init(llmod, tensors)
    meta = model_json(module, tensors, fmeta, profile=profile, init_symbol="nfc_init",
                      target={"triple": target.triple, "cpu": target.cpu,
                              "features": sorted(target.enabled)})
    meta.update(extra_metadata or {})
    _check_static_data(meta, plans, profile)
    _emit_info(llmod, meta)
    kset.define_composites(llmod)  # groups compiled stage by stage: glue in this module
    return Artifact(llmod, meta, plans, dict(kset.called), target, kset, split)


def _check_static_data(meta: dict[str, Any], plans: dict[str, FuncPlan], profile: bool) -> None:
    """Refuse static data the code could not address: the entries reach their globals with
    32-bit PC-relative offsets, so the library's data must stay well below 2 GiB. Arenas
    are heap blocks (`_own_arena`) and kernels keep no static arrays, so what remains is the
    metadata string and the profile counters."""
    from nfc.codegen.artifact.container import metadata_bytes

    size = len(metadata_bytes(meta)) + 1
    if profile:
        size += sum(16 * max(1, len(p.kernels)) for p in plans.values())
    if size > STATIC_DATA_LIMIT:
        raise CompileError(error(
            f"the library's static data (metadata and profile counters) would take "
            f"{size:,} bytes, more than the limit of {STATIC_DATA_LIMIT:,}").diagnostics)


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
    fn, b = _exported(llmod, f"nfc_{plan.name}", VOID, [PTR, PTR, PTR])
    args_p, outs_p, arena_p = fn.args
    # the entry block's allocas first: `_own_arena` continues the function in another block
    width = max([len(k.buffers) for k in plan.kernels] + [1])
    bufs = _opaque(b.alloca(ir.ArrayType(PTR, width), name="buffers"))
    ts = _opaque(b.alloca(ir.ArrayType(I64, 2), name="ts")) if profile else None
    base = _own_arena(llmod, fn, b, plan, arena_p)
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

    prof = clock = None
    if profile:
        n = max(1, 2 * len(plan.kernels))
        prof = ir.GlobalVariable(llmod, ir.ArrayType(I64, n), name=f"nfc_prof_{plan.name}")
        prof.initializer = ir.Constant(prof.value_type, None)
        prof.align = 64
        _opaque(prof)
        clock = _declare(llmod, "clock_gettime", I32, [I32, PTR])

    def stamp(k: int) -> None:
        b.call(clock, [ir.Constant(I32, 1), ts])  # CLOCK_MONOTONIC
        sec = b.load(ts, typ=I64)
        nsec = b.load(b.gep(ts, [ir.Constant(I64, 1)], source_etype=I64), typ=I64)
        now = b.add(b.mul(sec, ir.Constant(I64, 1_000_000_000)), nsec)
        b.store(now, b.gep(prof, [ir.Constant(I64, k)], source_etype=I64))

    waits = collective_waits(plan)
    for k, call in enumerate(plan.kernels):
        for cid, coll in waits.pop(k, []):
            emit_collective(llmod, fn, b, coll, cid, 1, bufs, ptr, ())
        if call.symbol.startswith(COLLECTIVE_PREFIX):
            cid = int(call.symbol[len(COLLECTIVE_PREFIX):])
            if profile:
                stamp(2 * k)
            sizes = [r.type.nbytes for r in plan.func.body.ops[call.op_index].results]
            emit_collective(llmod, fn, b, call, cid, 0, bufs, ptr, sizes)
            if profile:
                stamp(2 * k + 1)
            continue
        for m, slot in enumerate(call.buffers):
            b.store(ptr(slot), b.gep(bufs, [ir.Constant(I64, m)], source_etype=PTR))
        kfn = llmod.get_global(call.symbol)
        if profile:
            stamp(2 * k)
        b.call(kfn, [bufs])
        if profile:
            stamp(2 * k + 1)
    for cid, coll in waits.pop(len(plan.kernels), []):
        emit_collective(llmod, fn, b, coll, cid, 1, bufs, ptr, ())
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


def _own_arena(llmod, fn, b, plan: FuncPlan, arena_p):
    """The arena base of an entry: `arena_p`, or when it is NULL the entry's own arena,
    allocated on the first such call (`aligned_alloc`, published with a compare-and-swap so
    that racing first calls agree; the loser frees its block) and kept for the process's
    life. A heap block rather than a static array: a static arena lives in .bss, which the
    code reaches with 32-bit PC-relative offsets, so arenas past 2 GiB in all failed to link.
    Leaves `b` in the block that continues the entry and returns the base pointer."""
    from llvmlite import ir

    PTR, I8, I32, I64, VOID = _types()
    g = ir.GlobalVariable(llmod, PTR, name=f"nfc_arena_ptr_{plan.name}")
    g.linkage = "internal"
    g.initializer = ir.Constant(PTR, None)
    g.align = 8
    nbytes = max(-(-plan.memory.peak // 64) * 64, 64)
    null = ir.Constant(PTR, None)
    start = b.block
    own, alloc, fail, publish, lost, body = (fn.append_basic_block(n) for n in (
        "own_arena", "alloc", "alloc_failed", "publish", "lost_race", "body"))
    b.cbranch(b.icmp_unsigned("==", arena_p, null), own, body)
    b.position_at_end(own)
    cur = b.load_atomic(g, "acquire", 8, typ=PTR)
    b.cbranch(b.icmp_unsigned("!=", cur, null), body, alloc)
    b.position_at_end(alloc)
    mem = b.call(_declare(llmod, "aligned_alloc", PTR, [I64, I64]),
                 [ir.Constant(I64, 64), ir.Constant(I64, nbytes)])
    b.cbranch(b.icmp_unsigned("!=", mem, null), publish, fail)
    b.position_at_end(fail)
    text = (f"nfc: cannot allocate the {nbytes} byte arena of nfc_{plan.name}; pass an arena "
            "of nfc_" f"{plan.name}_arena_bytes() bytes\n").encode()
    msg = ir.GlobalVariable(llmod, ir.ArrayType(I8, len(text)),
                            name=f"nfc_arena_msg_{plan.name}")
    msg.initializer = ir.Constant(msg.value_type, bytearray(text))
    msg.global_constant = True
    msg.linkage = "internal"
    b.call(_declare(llmod, "write", I64, [I32, PTR, I64]),
           [ir.Constant(I32, 2), _opaque(msg), ir.Constant(I64, len(text))])
    b.call(_declare(llmod, "abort", VOID, []), [])
    b.unreachable()
    b.position_at_end(publish)
    pair = b.cmpxchg(g, null, mem, "acq_rel", "acquire")
    old, won = b.extract_value(pair, 0), b.extract_value(pair, 1)
    b.cbranch(won, body, lost)
    b.position_at_end(lost)
    b.call(_declare(llmod, "free", VOID, [PTR]), [mem])
    b.branch(body)
    b.position_at_end(body)
    base = b.phi(PTR, name="arena")
    base.add_incoming(arena_p, start)
    base.add_incoming(cur, own)
    base.add_incoming(mem, publish)
    base.add_incoming(old, lost)
    return base


def _emit_init(llmod, tensors: Sequence[TensorInfo]) -> None:
    from llvmlite import ir

    PTR, I8, I32, I64, VOID = _types()
    fn, b = _exported(llmod, "nfc_init", VOID, [PTR, I64])
    table, seed = fn.args
    check_part_names(tensors)
    for k, t in enumerate(tensors):
        p = b.load(b.gep(table, [ir.Constant(I64, k)], source_etype=PTR), typ=PTR)
        try:
            if t.layout is None:
                emit_init_loop(b, llmod, p, t.name, t.init, t.type.shape, t.type.dtype, seed)
                continue
            if is_blocked(t.layout):  # the layout pass: the logical tensor drawn, stored blocked
                lay = t.layout
                emit_init_loop(b, llmod, p, t.name, t.init, tuple(lay["shape"]), t.type.dtype,
                               seed, perm=blocked_index_map(lay))
                continue
            axis = int(t.layout["axis"])
            for name, init, shape, off, size in layout_parts(t.type.shape, t.layout):
                emit_init_loop(b, llmod, p, name, init, shape, t.type.dtype, seed,
                               view=part_view(t.type.shape, axis, off, size))
        except (ValueError, KeyError, TypeError) as exc:
            raise CompileError(error(f"'{t.name}': {exc}").diagnostics) from None
    b.ret_void()


def _emit_info(llmod, meta: dict[str, Any]) -> None:
    from llvmlite import ir

    PTR, I8, I32, I64, VOID = _types()
    from nfc.codegen.artifact.container import metadata_bytes

    data = metadata_bytes(meta) + b"\0"
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
