"""Micro-benchmarks of the device parameters the fusion reward needs (`DeviceParams`).

Each benchmark is an ordinary nfc kernel compiled by this backend and timed natively: a
driver function generated next to it calls it `n` times in a loop, so Python and ctypes
overheads stay out of the numbers. One thread unless said (the reward prices one core).

| parameter | kernel | value |
|---|---|---|
| `bandwidth_gbs` | `c[i] = a[i] + b[i]` over 3 x 32 MiB | bytes moved / time |
| `peak_gflops` | 512 x 512 x 512 f32 GEMM, default schedule | 2·M·N·K / time |
| `elementwise_gflops` | `sigmoid(x)·tanh(x) + exp(x)`, 16 Ki elements | nfc.cost FLOPs / time |
| `launch_us` | a one-element kernel, called back to back | time per call |
| `region_us` | a 64-element kernel on threads minus the same kernel serial | time per call |
| (`parallel_min_work`) | 4 x `region_us` over the time of one unit of `parallel_work` | units |
| `cache_kib` | not timed: the L2 size the OS reports (`sysconf`) | |

`measure()` returns the `DeviceParams`; `nfc.runtime.device_params` caches the raw timings in the
tuning cache, keyed by the CPU category, so they are measured once per machine.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from nfc.codegen.cpu import target_machine
from nfc.codegen.jit import _pool, emit_kernel, get_num_threads, new_module, optimize
from nfc.codegen.schedule import Schedule
from nfc.ir import Axis, ComputeOp, Const, DType, Index, Load, TensorType, Value
from nfc.passes.fusion.device import DEFAULT_DEVICE, DeviceParams

#: Version of the benchmark definitions; part of the tuning-cache key of their timings.
BENCH_VERSION = "nfc-devbench-1"


@dataclass(frozen=True)
class Timing:
    """One benchmark: what it measures (`spec`, JSON-able) and the best time of one unit."""

    name: str
    spec: dict[str, Any]
    seconds: float


def _vec(n: int, name: str) -> Value:
    return Value(TensorType((n,), DType.F32), name)


def _timed(op: ComputeOp, schedule: Schedule | None, inputs: list[np.ndarray],
           calls: int, repeats: int = 5, clock: Callable[[], float] = time.perf_counter
           ) -> float:
    """Best seconds per call of `op` compiled with `schedule`, `calls` calls per timing.
    `clock=time.thread_time` counts only this thread's CPU time: robust to other load on
    the machine, meaningful for kernels that run on this thread alone."""
    import llvmlite.binding as llvm
    from llvmlite import ir

    _pool()  # libgomp and nfc's thread pool, which the kernel's parallel loops call
    module = new_module("devbench")
    info = emit_kernel(module, "k", op, schedule)
    kfn = module.get_global("k")
    kfn.attributes.add("noinline")  # the call itself is what `launch` measures
    ptr = ir.PointerType()
    i64 = ir.IntType(64)
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [ptr, i64]), name="bench")
    entry, loop, done = (fn.append_basic_block(x) for x in ("entry", "loop", "done"))
    b = ir.IRBuilder(entry)
    b.branch(loop)
    b = ir.IRBuilder(loop)
    i = b.phi(i64)
    i.add_incoming(ir.Constant(i64, 0), entry)
    b.call(kfn, [fn.args[0]])
    nxt = b.add(i, ir.Constant(i64, 1))
    i.add_incoming(nxt, loop)
    b.cbranch(b.icmp_unsigned("<", nxt, fn.args[1]), loop, done)
    ir.IRBuilder(done).ret_void()
    ref = optimize(module)
    engine = llvm.create_mcjit_compiler(ref, target_machine())
    engine.finalize_object()
    bench = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64)(
        engine.get_function_address("bench"))
    outs = [np.empty(v.shape, v.dtype.numpy) for v in info.outputs]
    arrays = outs + inputs
    ws = np.empty(info.workspace_bytes + 64, np.uint8) if info.workspace_bytes else None
    ptrs = [a.ctypes.data for a in arrays]
    if ws is not None:
        ptrs.append(ws.ctypes.data + (-ws.ctypes.data) % 64)
    buf = (ctypes.c_void_p * len(ptrs))(*ptrs)
    bench(ctypes.addressof(buf), 1)
    best = float("inf")
    for _ in range(repeats):
        t = clock()
        bench(ctypes.addressof(buf), calls)
        best = min(best, (clock() - t) / calls)
    del engine
    return best


def _with_threads(n: int, fn: Callable[[], float]) -> float:
    from nfc.codegen.jit import set_num_threads

    old = get_num_threads()
    set_num_threads(n)
    try:
        return fn()
    finally:
        set_num_threads(old)


def bench_bandwidth(elements: int = 8 << 20) -> Timing:
    """`c = a + b` on one thread; the unit moves 3 x `elements` x 4 bytes."""
    a, b = _vec(elements, "a"), _vec(elements, "b")
    op = ComputeOp(TensorType((elements,), DType.F32), (Axis("i", elements),),
                   Load(a, (Index("i"),)) + Load(b, (Index("i"),)))
    rng = np.random.default_rng(0)
    ins = [rng.random(elements, np.float32), rng.random(elements, np.float32)]
    t = _with_threads(1, lambda: _timed(op, None, ins, calls=3, clock=time.thread_time))
    return Timing("stream", {"elements": elements, "bytes": 3 * elements * 4}, t)


def bench_gemm(n: int = 512) -> Timing:
    """An n x n x n f32 GEMM with the default (micro-kernel) schedule on one thread."""
    x = Value(TensorType((n, n), DType.F32), "x")
    w = Value(TensorType((n, n), DType.F32), "w")
    op = ComputeOp(TensorType((n, n), DType.F32), (Axis("i", n), Axis("j", n)),
                   Load(x, (Index("i"), Index("k"))) * Load(w, (Index("k"), Index("j"))),
                   reduce="sum", raxes=(Axis("k", n),))
    rng = np.random.default_rng(0)
    ins = [rng.random((n, n), np.float32), rng.random((n, n), np.float32)]
    t = _with_threads(1, lambda: _timed(op, None, ins, calls=3, clock=time.thread_time))
    return Timing("gemm", {"n": n, "flops": 2 * n ** 3}, t)


def bench_elementwise(elements: int = 1 << 14) -> Timing:
    """Transcendental-heavy elementwise code, in cache, on one thread (FLOPs by nfc.cost:
    5 per element)."""
    from nfc.cost import compute_cost
    from nfc.ir import Call

    a = _vec(elements, "a")
    x = Load(a, (Index("i"),))
    body = Call("sigmoid", (x,)) * Call("tanh", (x,)) + Call("exp", (x,))
    op = ComputeOp(TensorType((elements,), DType.F32), (Axis("i", elements),), body)
    ins = [np.random.default_rng(0).random(elements, np.float32)]
    t = _with_threads(1, lambda: _timed(op, None, ins, calls=200, clock=time.thread_time))
    return Timing("elementwise", {"elements": elements, "flops": compute_cost(op).flops}, t)


def _tiny(n: int) -> tuple[ComputeOp, list[np.ndarray]]:
    a = _vec(n, "a")
    op = ComputeOp(TensorType((n,), DType.F32), (Axis("i", n),),
                   Load(a, (Index("i"),)) * Const(2.0))
    return op, [np.ones(n, np.float32)]


def bench_launch() -> Timing:
    """A one-element kernel called back to back: the cost of a kernel call."""
    op, ins = _tiny(1)
    t = _with_threads(1, lambda: _timed(op, Schedule(), ins, calls=200_000,
                                        clock=time.thread_time))
    return Timing("launch", {"elements": 1}, t)


@contextlib.contextmanager
def always_parallel() -> Iterator[None]:
    """Emit every parallel loop as a parallel region, however little work it has and however
    late its team-mates come (nfc.codegen.llvm.parallel's serial path below
    `PARALLEL_MIN_WORK` and its back-off off): for measuring regions."""
    from nfc.codegen.llvm import parallel

    old = parallel.PARALLEL_MIN_WORK, parallel.BACKOFF
    parallel.PARALLEL_MIN_WORK, parallel.BACKOFF = 0, False
    try:
        yield
    finally:
        parallel.PARALLEL_MIN_WORK, parallel.BACKOFF = old


def bench_region(threads: int | None = None, calls: int = 20_000) -> Timing:
    """A 64-element kernel run on threads, minus the same kernel serial: the cost of starting
    and joining a parallel region (`threads`: all cores when None), with libgomp's idle
    threads sleeping as nfc has them (nfc.codegen.jit._libgomp)."""
    op, ins = _tiny(64)
    n = threads or max(2, os.cpu_count() or 2)
    with always_parallel():
        par = _with_threads(n, lambda: _timed(op, Schedule(parallel=("i",)), ins, calls=calls))
    ser = _with_threads(1, lambda: _timed(op, Schedule(), ins, calls=calls))
    return Timing("region", {"elements": 64, "threads": n}, max(0.0, par - ser))


def bench_work_unit(elements: int = 1 << 14) -> Timing:
    """Seconds per unit of `parallel_work` (nfc.codegen.llvm.parallel's work estimate): the default
    (vectorized, serial) code of a transcendental-heavy elementwise kernel in cache on one
    thread, its time over its estimated work."""
    from nfc.codegen.cpu import host_target
    from nfc.codegen.jit import lower_kernel
    from nfc.codegen.llvm.parallel import parallel_work
    from nfc.ir import Call

    a = _vec(elements, "a")
    x = Load(a, (Index("i"),))
    op = ComputeOp(TensorType((elements,), DType.F32), (Axis("i", elements),),
                   Call("sigmoid", (x,)) * Call("tanh", (x,)) + x)
    work = parallel_work(lower_kernel(op).loops.body, {}, host_target().lanes(DType.F32))
    ins = [np.random.default_rng(0).random(elements, np.float32)]
    t = _with_threads(1, lambda: _timed(op, None, ins, calls=200, clock=time.thread_time))
    return Timing("work_unit", {"elements": elements, "work": work}, t / max(work, 1))


def parallel_min_work(threads: int = 2, margin: float = 4.0) -> tuple[int, Timing, Timing]:
    """The work below which a parallel loop should run serially on this machine: `margin`
    times the region start-up cost (`bench_region`) in work units (`bench_work_unit`).
    Two threads halve a loop's time T at best while the region costs R, so they pay from
    T = 2R; the margin covers uneven chunks, cache effects and a loaded machine. Returns
    (threshold, region timing, unit timing); nfc.codegen.llvm.parallel.PARALLEL_MIN_WORK is
    this number measured once (docs/performance.md, "Threads")."""
    region = bench_region(threads)
    unit = bench_work_unit()
    return int(margin * region.seconds / unit.seconds), region, unit


def l2_kib() -> int:
    """The L2 cache of one core in KiB as the OS reports it (the default when unknown)."""
    try:
        size = os.sysconf("SC_LEVEL2_CACHE_SIZE")
    except (ValueError, OSError):
        size = 0
    return size // 1024 if size and size > 0 else DEFAULT_DEVICE.cache_kib


BENCHMARKS: dict[str, Callable[[], Timing]] = {
    "stream": bench_bandwidth, "gemm": bench_gemm, "elementwise": bench_elementwise,
    "launch": bench_launch,
    "region": bench_region,
}


def params_from(timings: dict[str, Timing], cache_kib: int | None = None) -> DeviceParams:
    """The device parameters the timings give (defaults for missing ones)."""
    d = DEFAULT_DEVICE
    st, gm, ew = timings.get("stream"), timings.get("gemm"), timings.get("elementwise")
    la, rg = timings.get("launch"), timings.get("region")
    return DeviceParams(
        bandwidth_gbs=round(st.spec["bytes"] / st.seconds / 1e9, 2) if st else d.bandwidth_gbs,
        peak_gflops=round(gm.spec["flops"] / gm.seconds / 1e9, 1) if gm else d.peak_gflops,
        elementwise_gflops=(round(ew.spec["flops"] / ew.seconds / 1e9, 2) if ew
                            else d.elementwise_gflops),
        launch_us=round(la.seconds * 1e6, 4) if la else d.launch_us,
        region_us=round(rg.seconds * 1e6, 3) if rg else d.region_us,
        cache_kib=cache_kib if cache_kib is not None else l2_kib(),
        parallel_work=d.parallel_work, parallel_min_work=_parallel_min_work(),
        vector_lanes=_lanes())


def _parallel_min_work() -> int:
    """The emitter's threshold (nfc.codegen.llvm.parallel), the reward's mirror of it."""
    from nfc.codegen.llvm import parallel

    return int(getattr(parallel, "PARALLEL_MIN_WORK", DEFAULT_DEVICE.parallel_min_work))


def _lanes() -> int:
    """f32 lanes of this machine's vectors."""
    from nfc.codegen.cpu import host_target

    return int(host_target().lanes(DType.F32))


def measure(names: tuple[str, ...] = tuple(BENCHMARKS)) -> tuple[DeviceParams, dict[str, Timing]]:
    """Run the benchmarks `names`; (parameters, raw timings)."""
    timings = {n: BENCHMARKS[n]() for n in names}
    return params_from(timings), timings
