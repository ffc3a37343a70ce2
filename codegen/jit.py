"""Compiling kernels: into an LLVM module (for the artifact builder) or JIT (tests, tuning).

`emit_kernel(module, name, op, schedule)` adds `void name(ptr buffers)` to an llvmlite module;
`optimize(module)` parses and runs LLVM's O3 pipeline for the host; `compile_kernel(op)` does
both and loads the code with MCJIT, returning a `JitKernel` callable on numpy arrays.
Parallel loops call `nfc_parallel`, nfc's thread pool (nfc.codegen.llvm.threadpool), compiled
once per process into its own MCJIT engine whose functions are registered for the kernels
(`_pool`); with `NFC_THREADS_BACKEND=gomp` it hands regions to libgomp's `GOMP_parallel`.
libgomp is loaded into the process once (`load_library_permanently`), with idle threads that
sleep rather than spin (`_libgomp`); its `omp_set_num_threads` (`set_num_threads`) sets the
team size of both backends.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from nfc.codegen.cpu import CpuTarget, _init_llvm, host_target, target_machine
from nfc.codegen.loops import LoopFunc
from nfc.codegen.lower import group_of, lower
from nfc.codegen.schedule import GroupSchedule, Schedule
from nfc.ir import ComputeOp, DType, KernelOp, Value

#: Op attribute holding a schedule dict (`Schedule.to_dict()` or space parameters); used when
#: no schedule is passed explicitly.
SCHEDULE_ATTR = "nf.schedule"


@dataclass(frozen=True)
class KernelInfo:
    """What a caller of an emitted kernel must know: its buffers in call order."""

    name: str
    loops: LoopFunc
    outputs: tuple[Value, ...]
    inputs: tuple[Value, ...]

    @property
    def workspace_bytes(self) -> int:
        """Bytes of scratch memory passed as the last buffer (0: no workspace entry)."""
        return self.loops.workspace_bytes

    @property
    def n_buffers(self) -> int:
        """Entries of the `buffers` array: outputs, inputs, and the workspace if any."""
        return len(self.outputs) + len(self.inputs) + (1 if self.workspace_bytes else 0)


def new_module(name: str = "nfc", target: CpuTarget | None = None):  # -> ir.Module
    """An empty llvmlite module with the target's triple and data layout."""
    from llvmlite import ir

    tm = target_machine(target)
    m = ir.Module(name=name)
    m.triple = tm.triple
    m.data_layout = str(tm.target_data)
    return m


def emit_kernel(module: Any, name: str, op: ComputeOp | KernelOp | Sequence[ComputeOp],
                schedule: Schedule | GroupSchedule | dict | None = None, *,
                target: CpuTarget | None = None) -> KernelInfo:
    """Add `void name(ptr buffers)` computing `op` to the llvmlite `module`.

    `buffers[n]` points at the n-th output, then the inputs (`KernelInfo.inputs` order),
    then the workspace when `workspace_bytes > 0`; arrays are C-contiguous of the IR dtype
    (i1 as one byte per element). Outputs must not overlap inputs unless elementwise in place.
    """
    info = lower_kernel(op, schedule, name=name, target=target)
    emit_lowered(module, info, target=target)
    return info


def resolve_schedule(op: ComputeOp | KernelOp | Sequence[ComputeOp],
                     schedule: Schedule | GroupSchedule | dict | None,
                     target: CpuTarget | None = None) -> Schedule | GroupSchedule | None:
    """The schedule object a kernel is lowered with: `schedule`, else the op's `nf.schedule`
    attribute; dicts converted; None means the default schedule."""
    if schedule is None and not isinstance(op, Sequence) and SCHEDULE_ATTR in op.attrs:
        schedule = op.attrs[SCHEDULE_ATTR]  # a schedule recorded in the IR (tuned, replayed)
    if isinstance(schedule, dict):
        schedule = schedule_to_object(op, schedule, target)
    return schedule


def lower_kernel(op: ComputeOp | KernelOp | Sequence[ComputeOp],
                 schedule: Schedule | GroupSchedule | dict | None = None, *,
                 name: str = "kernel", target: CpuTarget | None = None) -> KernelInfo:
    """The loop IR and buffer layout of a kernel, without emitting LLVM IR (`emit_lowered`
    does that later, or never when the object code is cached)."""
    default = None
    if target is not None:  # stages without a schedule get the target's default, not the host's
        from nfc.codegen.space import default_schedule

        def default(o: ComputeOp) -> Schedule:
            return default_schedule(o, target)
    loops = lower(op, resolve_schedule(op, schedule, target), name=name, default=default)
    _, outs, ins = group_of(op)
    return KernelInfo(name, loops, tuple(outs), tuple(ins))


def emit_lowered(module: Any, info: KernelInfo, *, name: str | None = None,
                 target: CpuTarget | None = None) -> Any:
    """Add `void name(ptr buffers)` (default: `info.name`) for a lowered kernel to `module`;
    returns the llvmlite function."""
    from nfc.codegen.llvm.emitter import emit_function

    return emit_function(module, info.loops, name or info.name, target or host_target())


def schedule_to_object(op: Any, d: dict, target: CpuTarget | None = None
                       ) -> Schedule | GroupSchedule:
    """A schedule from its dict: either a `Schedule.to_dict()` form (has `version`) or a
    schedule-space parameter dict of a single compute."""
    from nfc.codegen.schedule import schedule_from_dict
    from nfc.codegen.space import schedule_space

    if "version" in d or "kind" in d:
        return schedule_from_dict(d)
    if not isinstance(op, ComputeOp):
        raise ValueError("space parameters apply to a single compute")
    return schedule_space(op, target).to_schedule(d)


#: LLVM's optimisation pipeline for kernels: O3 with the loop and SLP vectorizers, but without
#: LLVM's own loop unrolling. Schedules already unroll what pays (micro-kernels, register
#: tiles); LLVM unrolling the remaining serial loops made objects 16% bigger and optimisation
#: plus code generation ~30% slower for no measured speed (benchmarks/compile_time.py,
#: matmul.py, mlp_step.py). `NFC_LLVM_PIPELINE="speed_level=3,loop_unrolling=1"` overrides.
PIPELINE: dict[str, int | bool] = {"speed_level": 3, "loop_vectorization": True,
                                   "slp_vectorization": True, "loop_unrolling": False}


def pipeline_options() -> dict[str, int | bool]:
    """The pipeline options in use (`PIPELINE` with `NFC_LLVM_PIPELINE` applied)."""
    opts = dict(PIPELINE)
    for item in os.environ.get("NFC_LLVM_PIPELINE", "").split(","):
        k, sep, v = item.partition("=")
        if sep and k.strip() in ("speed_level", "loop_vectorization", "slp_vectorization",
                                 "loop_unrolling", "loop_interleaving"):
            opts[k.strip()] = int(v) if k.strip() == "speed_level" else v.strip() in ("1", "true")
    return opts


def optimize(module: Any, target: CpuTarget | None = None, *,
             options: dict[str, int | bool] | None = None):  # -> llvm.ModuleRef
    """Parse, verify and optimise an llvmlite module (or LLVM IR text) with `options`
    (default: `pipeline_options()`)."""
    import llvmlite.binding as llvm

    _init_llvm()
    tm = target_machine(target)
    ref = llvm.parse_assembly(str(module))
    ref.verify()
    opts = pipeline_options() if options is None else options
    pto = llvm.create_pipeline_tuning_options(speed_level=int(opts["speed_level"]))
    for k, v in opts.items():
        if k != "speed_level":
            setattr(pto, k, bool(v))
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(ref, pb)
    return ref


#: The wait policy nfc gives libgomp's idle threads unless the user chose one (see `_libgomp`).
WAIT_POLICY = "passive"
#: How libgomp's wait policy was decided in this process (`openmp_wait_policy`).
_policy: list[str] = []


def _libgomp_loaded() -> bool:
    """Whether some libgomp (`libgomp.so.1`, PyTorch's bundled copy too) is mapped already."""
    try:
        with open("/proc/self/maps") as fh:
            return any(os.path.basename(line.split()[-1]).startswith("libgomp")
                       for line in fh if "/" in line)
    except OSError:  # pragma: no cover - not Linux
        return False


@functools.cache
def _libgomp() -> ctypes.CDLL:
    """libgomp, loaded once with idle threads that sleep.

    libgomp reads `OMP_WAIT_POLICY` and `GOMP_SPINCOUNT` once, when it is loaded, and by
    default lets an idle thread spin 300,000 times at every barrier and between regions. On a
    machine whose cores are shared (another process, or a busy neighbour core) the spinning
    thread takes the core its team-mate needs: a 16-step LLTM took 740 ms per step on 2
    threads against 0.9 ms on 1 (issue 15). So unless the user set either variable, it is set
    to `WAIT_POLICY` ("passive": sleep at once) while libgomp is loaded and initialises, and
    restored afterwards (processes started later see their own environment). Every path that
    runs nfc's native code loads libgomp through here first: the JIT (`compile_kernel`), the
    artifact loader (nfc.runtime.loader.load, so `nfc run`, `nfc train`, `nfc bench` and
    nfc.torch ops), and nfc.torch before it imports PyTorch (which brings its own copy of
    `libgomp.so.1`, of the same name: whichever is loaded first serves both). A libgomp
    already in the process keeps its policy (`openmp_wait_policy` says so); the serial path
    of small parallel loops (nfc.codegen.llvm.emitter) limits what spinning can cost there."""
    import llvmlite.binding as llvm

    _init_llvm()
    name = ctypes.util.find_library("gomp") or "libgomp.so.1"
    user = [k for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT") if k in os.environ]
    if user:
        _policy.append(", ".join(f"{k}={os.environ[k]} (user)" for k in user))
    elif _libgomp_loaded():
        _policy.append("libgomp's own (it was loaded before nfc)")
    else:
        os.environ["OMP_WAIT_POLICY"] = WAIT_POLICY
        _policy.append(f"OMP_WAIT_POLICY={WAIT_POLICY} (nfc)")
    try:
        llvm.load_library_permanently(name)
        lib = ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
    finally:
        if not user and _policy[-1].endswith("(nfc)"):
            os.environ.pop("OMP_WAIT_POLICY", None)
    return lib


#: The MCJIT engine holding nfc's thread pool in this process (kept alive here).
_pool_engine: list[Any] = []
_pool_lock = threading.Lock()


def _pool() -> dict[str, int]:
    """nfc's thread pool (nfc.codegen.llvm.threadpool) compiled once per process into its own
    MCJIT engine, its functions registered (`llvm.add_symbol`) so that JIT-compiled kernels
    resolve `nfc_parallel`; returns their addresses. It loads libgomp first (`_libgomp`).
    Every path that JIT-compiles kernels calls this (compile_kernel, compile_kernels,
    devbench); loading a library does not (each library links its own pool)."""
    import llvmlite.binding as llvm

    from nfc.codegen.llvm.threadpool import EXPORTS, runtime_ir

    if _pool_engine:
        return _pool_engine[1]
    _libgomp()
    with _pool_lock:  # one engine per process, even when two threads get here at once
        if not _pool_engine:
            tm = target_machine()
            ref = optimize(str(new_module("nfc_threads")) + runtime_ir(tm.triple, hidden=False))
            engine = llvm.create_mcjit_compiler(ref, tm)
            engine.finalize_object()
            addrs = {name: engine.get_function_address(name) for name in EXPORTS}
            for name, addr in addrs.items():
                llvm.add_symbol(name, addr)
            _pool_engine[:] = [engine, addrs]
    return _pool_engine[1]


def thread_pool_stats() -> dict[str, int]:
    """Counters of this process's JIT thread pool (not of loaded libraries, which have their
    own): `regions` run on the pool, chunks run by the `caller` and by `helpers`, `joins` of
    helpers, `late` wake-ups (a helper found the region closed or full), workers `started`."""
    out = (ctypes.c_int64 * 6)()
    ctypes.CFUNCTYPE(None, ctypes.c_void_p)(_pool()["nfc_par_stats"])(ctypes.addressof(out))
    return dict(zip(("regions", "caller", "helpers", "joins", "late", "started"), out,
                    strict=True))


def hold_thread_pool(on: bool) -> None:
    """Test hook: while on, the JIT pool's workers that wake up wait before joining a region
    (so its caller runs it alone); off releases them."""
    ctypes.CFUNCTYPE(None, ctypes.c_int32)(_pool()["nfc_par_hold"])(1 if on else 0)


def load_openmp() -> None:
    """Load libgomp with nfc's wait policy now (before a library that needs it is loaded)."""
    _libgomp()


def openmp_wait_policy() -> str:
    """How the wait policy of libgomp's idle threads was decided in this process (it loads
    libgomp if it is not loaded yet)."""
    _libgomp()
    return _policy[-1]


def set_num_threads(n: int) -> None:
    """Threads used by parallel loops (libgomp's `omp_set_num_threads`)."""
    _libgomp().omp_set_num_threads(int(n))


def get_num_threads() -> int:
    """Threads parallel loops use (`omp_get_max_threads`)."""
    return int(_libgomp().omp_get_max_threads())


_KernelFn = ctypes.CFUNCTYPE(None, ctypes.POINTER(ctypes.c_void_p))


class JitKernel:
    """A compiled kernel callable on numpy arrays: `kernel(*inputs) -> output(s)`."""

    def __init__(self, info: KernelInfo, engine: Any, address: int, ir_text: str) -> None:
        self.info = info
        self.engine = engine  # keeps the code alive
        self.ir_text = ir_text
        self._fn = _KernelFn(address)
        self._workspace = _aligned_empty(info.workspace_bytes)

    @property
    def loops(self) -> LoopFunc:
        """The loop IR that was compiled."""
        return self.info.loops

    def run(self, outputs: Sequence[np.ndarray], inputs: Sequence[np.ndarray]) -> None:
        """Compute into preallocated `outputs` (C-contiguous, right dtype and shape)."""
        arrays = list(outputs) + list(inputs)
        for arr, v in zip(arrays, [*self.info.outputs, *self.info.inputs], strict=True):
            assert arr.flags.c_contiguous and arr.shape == v.shape, (arr.shape, v.shape)
            assert arr.dtype == memory_dtype(v.dtype), (arr.dtype, v.dtype)
        ptrs = [a.ctypes.data for a in arrays]
        if self._workspace is not None:
            ptrs.append(self._workspace.ctypes.data)
        buf = (ctypes.c_void_p * max(1, len(ptrs)))(*ptrs)
        self._fn(buf)

    def __call__(self, *inputs: np.ndarray) -> Any:
        ins = [np.asarray(x, dtype=memory_dtype(v.dtype), order="C")
               for x, v in zip(inputs, self.info.inputs, strict=True)]
        outs = [np.empty(v.shape, memory_dtype(v.dtype)) for v in self.info.outputs]
        self.run(outs, ins)
        return outs[0] if len(outs) == 1 else tuple(outs)


def memory_dtype(dt: DType) -> np.dtype:
    """The numpy dtype of a kernel's arrays of `dt`: as `DType.numpy`, except bf16, which
    kernels store in 2 bytes: `ml_dtypes.bfloat16` (float32 inputs are rounded to it)."""
    if dt is DType.BF16:
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return dt.numpy


def _aligned_empty(nbytes: int) -> np.ndarray | None:
    if nbytes <= 0:
        return None
    raw = np.empty(nbytes + 64, np.uint8)
    start = (-raw.ctypes.data) % 64
    return raw[start:start + nbytes]


def compile_kernel(op: ComputeOp | KernelOp | Sequence[ComputeOp],
                   schedule: Schedule | GroupSchedule | dict | None = None, *,
                   target: CpuTarget | None = None, name: str = "kernel") -> JitKernel:
    """JIT-compile a compute or a group with a schedule (the default when None)."""
    import llvmlite.binding as llvm

    _pool()
    module = new_module(name, target)
    info = emit_kernel(module, name, op, schedule, target=target)
    text = str(module)
    if os.environ.get("NFC_DEBUG_DIR"):
        _dump(name, text, info)
    ref = optimize(module, target)
    engine = llvm.create_mcjit_compiler(ref, target_machine(target))
    engine.finalize_object()
    return JitKernel(info, engine, engine.get_function_address(name), text)


def _dump(name: str, text: str, info: KernelInfo) -> None:
    from nfc.codegen.loops import print_loops

    d = os.environ["NFC_DEBUG_DIR"]
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, f"{name}.ll"), "w") as f:
        f.write(text)
    with open(os.path.join(d, f"{name}.loops"), "w") as f:
        f.write(print_loops(info.loops))


def compile_kernels(ops: Sequence[ComputeOp | KernelOp], *, target: CpuTarget | None = None,
                    prefix: str = "k") -> list[JitKernel]:
    """JIT-compile several ops (default schedules, or their `nf.schedule` attributes) in one
    LLVM module: one optimisation and code generation run for all of them."""
    import llvmlite.binding as llvm

    _pool()
    module = new_module(prefix, target)
    infos = [emit_kernel(module, f"{prefix}{n}", op, None, target=target)
             for n, op in enumerate(ops)]
    text = str(module)
    ref = optimize(module, target)
    engine = llvm.create_mcjit_compiler(ref, target_machine(target))
    engine.finalize_object()
    return [JitKernel(info, engine, engine.get_function_address(info.name), text)
            for info in infos]
