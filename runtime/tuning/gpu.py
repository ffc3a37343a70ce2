"""GPU schedules through nfc's genetic search: the measurers of `nfc tune --target cuda`.

The search is the CPU tuner's (nfc.runtime.tuning.search.tune); only the space and the
measurer change. `search_space(op)` adapts `nfc.codegen.cuda.space.gpu_space(op)` to the
search (only the parameters that matter for its precisions, so two proposals are two
schedules), and a measurer turns one parameter dict into a `Measurement`:

- `SimMeasurer` (no GPU needed): lowers the candidate (nfc.codegen.cuda.lower), optionally
  compiles it with NVRTC and rejects it by its resources (nvrtc.check_resources), runs it on
  the simulator (nfc.codegen.cuda.sim) and compares every output with the interpreter's
  float64 value within the rigorous error bound of nfc.testing.errbound. A race, an
  out-of-bounds access, divergence, an unwritten output (`SimError`) or a result outside the
  bound marks the candidate failed (`wrong` or `failed`), as a crashing or wrong candidate is
  on the CPU, so it is never chosen. Its time is **a stand-in, not a measurement**:
  `launch_cost`, an analytic model of the launch on an A100 (sm_80) or H100 (sm_90) from
  the loop IR (waves of resident blocks x warp instructions per block, against the time to
  move the kernel's operands once, plus a launch overhead). Stand-in costs must never enter
  the tuning cache: `nfc tune --target cuda --simulate` runs the search without one.
- `DeviceMeasurer` (a GPU): renders and compiles the candidate with NVRTC for the device's
  architecture, rejects it by its resources before running it, runs it once and checks the
  outputs like `SimMeasurer`, then times the kernels with CUDA events (the median over
  rounds of `repeats` back-to-back launches). **It has not run on a GPU yet.** It runs in the
  caller's process: `nfc tune --target cuda` runs it in a worker process instead
  (nfc.runtime.tuning.gpu_worker: a hang is a `timeout`, a fault that breaks the CUDA context
  `failed`, the worker restarted either way).

`cuda_device_category(device)` is the tuning-cache category of a GPU (name, compute
capability, driver and NVRTC versions, the GPU schedule version); `tune_kernels_gpu` runs the
search over every distinct compute of a module (what `nfc tune --target cuda` does), and
`gpu_schedule_for(choices)` turns its choices into the `schedule_for` that
`nfc.codegen.cuda.step.build_cuda_step` takes.
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nfc.ir import Block, ComputeOp, DType, Func, KernelOp, Module, Op, ReturnOp
from nfc.runtime.tuning.model import Measurement, Status

__all__ = ["ARCH_MODELS", "DeviceMeasurer", "GpuKernelResult", "GpuSearchSpace", "SimMeasurer",
           "check_outputs", "cuda_device_category", "gpu_schedule_choices", "gpu_schedule_for",
           "gpu_schedule_lookup",
           "launch_cost", "reference_bounds", "results_json", "results_table",
           "search_space", "tune_gpu_op", "tune_kernels_gpu"]


# ---------------------------------------------------------------------------------------------
# the space as the search sees it


class GpuSearchSpace:
    """`gpu_space(op)` for nfc.runtime.tuning.search: the parameters that some admitted
    precision uses (a GEMM space of one precision has no knobs of the other path), the
    default, validity. With several precisions the irrelevant knobs of a parameter dict
    still vary, so two dicts can name one schedule: measurers memoise by schedule."""

    def __init__(self, op: ComputeOp, precisions: Sequence[str] | None = None) -> None:
        from nfc.codegen.cuda.space import FMA_KEYS, WMMA_KEYS, gpu_space

        self.op = op
        self.space = gpu_space(op, precisions)
        params = dict(self.space.params)
        if self.space.kind == "gemm":
            keys = {"precision"}
            for p in params["precision"]:
                keys.update(FMA_KEYS if p == "fma" else WMMA_KEYS)
            params = {k: v for k, v in params.items() if k in keys}
        self.params: dict[str, tuple[Any, ...]] = params

    @property
    def kind(self) -> str:
        """`elementwise`, `reduce` or `gemm`."""
        return self.space.kind

    def full(self, cfg: Mapping[str, Any]) -> dict[str, Any]:
        """`cfg` completed with the first value of every knob the search does not vary."""
        return {k: v[0] for k, v in self.space.params.items()} | dict(cfg)

    def default(self) -> dict[str, Any]:
        """The default schedule's parameters (the search's seed)."""
        return {k: v for k, v in self.space.default().items() if k in self.params}

    def is_valid(self, cfg: Mapping[str, Any]) -> bool:
        """Whether the parameters give a schedule of this compute."""
        return self.space.is_valid(self.full(cfg))

    def to_schedule(self, cfg: Mapping[str, Any]) -> Any:
        """The GpuSchedule of a parameter dict."""
        return self.space.to_schedule(self.full(cfg))


def search_space(op: ComputeOp, precisions: Sequence[str] | None = None) -> GpuSearchSpace:
    """The search's view of `gpu_space(op, precisions)`."""
    return GpuSearchSpace(op, precisions)


# ---------------------------------------------------------------------------------------------
# the stand-in cost


@dataclass(frozen=True)
class ArchModel:
    """What `launch_cost` assumes of a GPU (public figures of the A100-SXM4 and H100-SXM5)."""

    sms: int
    clock_hz: float
    bandwidth: float
    """Bytes per second of device memory."""
    smem_per_sm: int
    threads_per_sm: int = 2048
    blocks_per_sm: int = 32
    schedulers: int = 4
    """Warp instructions issued per cycle per SM."""
    launch_s: float = 3e-6


ARCH_MODELS: dict[str, ArchModel] = {
    "sm_80": ArchModel(108, 1.41e9, 1.9e12, 164 * 1024),
    "sm_90": ArchModel(132, 1.755e9, 3.35e12, 228 * 1024),
}

#: Warp instructions charged per WMMA statement (one m16n16k16 `mma_sync` is two HMMA
#: instructions on sm_80; loads, stores and fills a few shared-memory instructions each).
_FRAG_COST = {"FragMma": 2, "FragLoad": 4, "FragStore": 8, "FragFill": 1}


def _const_extent(e: Any) -> int:
    """A loop's trip count: its constant extent (the lowering emits only those; anything
    else counts once)."""
    from nfc.ir import Const

    return max(0, int(e.value)) if isinstance(e, Const) else 1


def _expr_loads(e: Any) -> int:
    """Memory loads in an expression (register scalars are free)."""
    from nfc.codegen.loops import BufLoad, Scope

    return sum(1 for x in e.walk() if isinstance(x, BufLoad)
               and x.buffer.scope not in (Scope.REGISTER, Scope.FRAGMENT))


def thread_instructions(stmt: Any) -> float:
    """A static count of the instructions one thread executes in a kernel body: every store,
    shuffle and barrier 1 plus its loads, WMMA statements per `_FRAG_COST` (per thread, since
    a warp issues them once for its 32 lanes: the count is of warp instructions too), loops
    times their trip count; block and thread loops count once (SPMD), both branches of an
    `if` are charged (divergence)."""
    from nfc.codegen.cuda.gpuir import WarpShuffle
    from nfc.codegen.loops import Allocate, Barrier, For, If, Seq, Store

    if isinstance(stmt, Seq):
        return sum(thread_instructions(s) for s in stmt.body)
    if isinstance(stmt, For):
        body = thread_instructions(stmt.body)
        return body if stmt.kind.is_gpu else _const_extent(stmt.extent) * body
    if isinstance(stmt, If):
        return 1 + _expr_loads(stmt.cond) + thread_instructions(stmt.then) + (
            0 if stmt.orelse is None else thread_instructions(stmt.orelse))
    if isinstance(stmt, Allocate):
        return thread_instructions(stmt.body)
    if isinstance(stmt, Store):
        return 1 + _expr_loads(stmt.value) + sum(_expr_loads(i) for i in stmt.indices)
    if isinstance(stmt, WarpShuffle):
        return 2 + _expr_loads(stmt.value)
    if isinstance(stmt, Barrier):
        return 1
    return float(_FRAG_COST.get(type(stmt).__name__, 1))


def kernel_cost(kernel: Any, arch: str = "sm_80") -> float:
    """Stand-in seconds of one launch of a GpuKernel (see the module doc): the warp
    instructions of the resident blocks of each wave over the SM's issue rate, or the time
    to move the kernel's global buffers once, whichever is larger, plus a launch overhead."""
    a = ARCH_MODELS[arch]
    threads = max(1, kernel.block)
    warps = -(-threads // 32)
    smem = kernel.shared_bytes
    resident = max(1, min(a.threads_per_sm // threads, a.blocks_per_sm,
                          a.smem_per_sm // smem if smem else a.blocks_per_sm))
    waves = -(-kernel.grid // (a.sms * resident))
    per_sm = min(resident, -(-kernel.grid // a.sms))  # blocks an SM holds in a full wave
    cycles = waves * per_sm * warps * thread_instructions(kernel.func.body) / a.schedulers
    nbytes = sum(b.nbytes for b in kernel.func.params)
    return max(cycles / a.clock_hz, nbytes / a.bandwidth) + a.launch_s


def launch_cost(program: Any, arch: str = "sm_80") -> float:
    """Stand-in seconds of a GpuProgram: the sum of its kernels' `kernel_cost`. Deterministic
    and cheap; it ranks schedules by a model, it is not a time."""
    return sum(kernel_cost(k, arch) for k in program.kernels)


# ---------------------------------------------------------------------------------------------
# checking a candidate's outputs


def _group_func(op: ComputeOp | KernelOp) -> Func:
    from nfc.codegen.lower import group_of

    ops, outs, ins = group_of(op)
    body = [op] if isinstance(op, ComputeOp | KernelOp) else list(ops)
    rets = list(op.results) if isinstance(op, KernelOp) else list(outs)
    return Func("candidate", list(ins), Block([*body, ReturnOp(rets)]))


def random_inputs(op: ComputeOp | KernelOp, seed: int = 0) -> list[np.ndarray]:
    """Inputs of a compute: standard normal floats, booleans at random, integers zero (an
    integer input may be an index: zero is always in bounds)."""
    from nfc.codegen.lower import group_of

    rng = np.random.default_rng(seed)
    out = []
    for v in group_of(op)[2]:
        if v.dtype is DType.I1:
            out.append(rng.random(v.shape) < 0.5)
        elif v.dtype.is_float:
            x = rng.standard_normal(v.shape).astype(np.float32)
            out.append(x.astype(v.dtype.numpy) if v.dtype is not DType.BF16 else x)
        else:
            out.append(np.zeros(v.shape, v.dtype.numpy))
    return out


#: Unit roundoff of the lossy Tensor Core input precisions (inputs are rounded to them).
_LOSSY_UNIT = {"f16": 2.0 ** -11, "bf16": 2.0 ** -8, "tf32": 2.0 ** -11}
_OWN_UNIT = {DType.F16: 2.0 ** -11, DType.BF16: 2.0 ** -8}


def reference_bounds(op: ComputeOp | KernelOp, inputs: Sequence[np.ndarray],
                     precision: str = "fma") -> list[tuple[np.ndarray, np.ndarray]]:
    """(value, error bound) of each output in float64 (nfc.testing.errbound.run_bounded):
    every correct evaluation in the compute's own types lies within the bound. A Tensor Core
    `precision` that rounds the inputs below their own type (f32 through f16, tf32 or bf16)
    widens it: each float input is then known only to within that rounding."""
    from nfc.testing.errbound import run_bounded

    func = _group_func(op)
    errors: dict[str, Any] = {}
    unit = _LOSSY_UNIT.get(precision)
    if unit is not None:
        for a, x in zip(func.args, inputs, strict=True):
            if a.dtype.is_float and unit > _OWN_UNIT.get(a.dtype, 0.0):
                errors[a.name] = unit * np.abs(np.asarray(x, np.float64))
    return run_bounded(func, list(inputs), errors=errors)


def check_outputs(got: Sequence[np.ndarray], bounds: Sequence[tuple[np.ndarray, np.ndarray]]
                  ) -> str:
    """Why `got` is not a correct result (empty: it is): an element outside its bound
    (nfc.testing.errbound.bound_violations, slack included), named."""
    from nfc.testing.errbound import bound_violations

    for n, (g, (value, err)) in enumerate(zip(got, bounds, strict=True)):
        bad, _ = bound_violations(np.asarray(g), value, err)
        if bad.any():
            i = np.unravel_index(int(np.argmax(bad)), bad.shape)
            return (f"output {n}: {int(bad.sum())} of {bad.size} elements outside the error "
                    f"bound, the first at {tuple(int(j) for j in i)}: got "
                    f"{np.asarray(g)[i]!r}, reference {value[i]!r} +- {err[i]:.3g}")
    return ""


# ---------------------------------------------------------------------------------------------
# measurers


def _schedule_key(schedule: Any) -> str:
    import json

    return json.dumps(schedule.to_dict(), sort_keys=True)


class SimMeasurer:
    """The simulator's measurer (see the module doc). `lower` and `simulate` default to the
    backend's; a test may pass broken ones. `nvrtc_arch` also compiles each candidate with
    NVRTC for that architecture and fails it when it breaks the target's limits.
    `results` keeps every distinct schedule measured, in order."""

    #: The stand-in for a time: say so wherever costs are shown.
    COST_NOTE = ("stand-in costs from an analytic model of the launch (not measured: nothing "
                 "here ran on a GPU)")

    def __init__(self, op: ComputeOp | KernelOp, space: GpuSearchSpace | None = None, *,
                 arch: str = "sm_80", seed: int = 0, nvrtc_arch: str | None = None,
                 lower: Callable[..., Any] | None = None,
                 simulate: Callable[..., Any] | None = None,
                 order: str = "natural") -> None:
        from nfc.codegen.cuda.lower import lower_program
        from nfc.codegen.cuda.sim import simulate as sim

        assert arch in ARCH_MODELS, arch
        self.op = op
        self.space = space if space is not None else search_space(op)  # type: ignore[arg-type]
        self.arch = arch
        self.nvrtc_arch = nvrtc_arch
        self.lower = lower or lower_program
        self.simulate = simulate or sim
        self.order = order
        self.inputs = random_inputs(op, seed)
        self._bounds: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
        self.results: dict[str, tuple[Any, Measurement]] = {}

    def bounds(self, precision: str) -> list[tuple[np.ndarray, np.ndarray]]:
        """The reference (and its bound) for a path of `precision` (computed once)."""
        if precision not in self._bounds:
            self._bounds[precision] = reference_bounds(self.op, self.inputs, precision)
        return self._bounds[precision]

    def measure_schedule(self, schedule: Any) -> Measurement:
        """Lower, (compile,) simulate, check and cost one GpuSchedule."""
        from nfc.codegen.cuda.schedule import GpuScheduleError
        from nfc.codegen.cuda.sim import SimError

        key = _schedule_key(schedule)
        if key in self.results:
            return self.results[key][1]
        try:
            prog = self.lower(self.op, schedule)
            if self.nvrtc_arch is not None:
                problem = compile_problem(prog, self.nvrtc_arch)
                if problem:
                    m = Measurement(Status.FAILED, error=problem)
                    self.results[key] = (schedule, m)
                    return m
            got = self.simulate(prog, self.inputs, order=self.order)
        except SimError as exc:
            m = Measurement(Status.FAILED, error=f"{type(exc).__name__}: {exc}")
        except (GpuScheduleError, ValueError, AssertionError) as exc:
            m = Measurement(Status.FAILED, error=f"cannot lower: {exc}")
        else:
            why = check_outputs(got, self.bounds(getattr(schedule, "precision", "fma")))
            m = (Measurement(Status.WRONG, error=why) if why else
                 Measurement(Status.OK, time=launch_cost(prog, self.arch)))
        self.results[key] = (schedule, m)
        return m

    def __call__(self, cfg: dict[str, Any]) -> Measurement:
        return self.measure_schedule(self.space.to_schedule(cfg))

    def __enter__(self) -> SimMeasurer:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def compile_problem(program: Any, arch: str) -> str:
    """Why NVRTC's build of `program` for `arch` cannot launch (empty: it can): a compile
    error, or the resources ptxas reports breaking the target's limits."""
    from nfc.codegen.cuda.nvrtc import NvrtcError, ResourceError
    from nfc.codegen.cuda.program import compile_program

    try:
        compile_program(program, arch)
    except ResourceError as exc:
        return f"resources: {exc}"
    except NvrtcError as exc:
        return f"NVRTC: {str(exc).splitlines()[0]}"
    return ""


class DeviceMeasurer:
    """The GPU's measurer (see the module doc): NVRTC for `device.arch` (a resource check
    before any launch), one checked run, then CUDA-event timing of `rounds` x `repeats`
    launches of the program's kernels; the time is the median round's seconds per run.
    `device` is a `nfc.codegen.cuda.driver.Device` (any driver it wraps, the simulator's
    FakeDriver included), in this process: a hanging kernel hangs the caller and a fault
    breaks the context for every later candidate (nfc.runtime.tuning.gpu_worker isolates it).
    NOT RUN ON A GPU YET."""

    def __init__(self, op: ComputeOp | KernelOp, device: Any,
                 space: GpuSearchSpace | None = None, *, seed: int = 0, repeats: int = 20,
                 rounds: int = 5, warmup: int = 3) -> None:
        self.op = op
        self.device = device
        self.space = space if space is not None else search_space(op)  # type: ignore[arg-type]
        self.repeats, self.rounds, self.warmup = max(1, repeats), max(1, rounds), warmup
        self.inputs = random_inputs(op, seed)
        self.sim = SimMeasurer(op, self.space, seed=seed)  # for the reference bounds
        self.results: dict[str, tuple[Any, Measurement]] = {}

    def measure_schedule(self, schedule: Any) -> Measurement:
        """Compile, check resources, run once and check, time."""
        key = _schedule_key(schedule)
        if key in self.results:
            return self.results[key][1]
        built = self.build(schedule)
        m = built if isinstance(built, Measurement) else self.run(schedule, *built)
        self.results[key] = (schedule, m)
        return m

    def build(self, schedule: Any) -> tuple[Any, Any] | Measurement:
        """(program, compiled module) of a schedule, or the failed Measurement of one that
        cannot be lowered, compiled or launched (its resources): nothing runs yet."""
        from nfc.codegen.cuda.lower import lower_program
        from nfc.codegen.cuda.nvrtc import NvrtcError, ResourceError
        from nfc.codegen.cuda.program import compile_program
        from nfc.codegen.cuda.schedule import GpuScheduleError

        try:
            prog = lower_program(self.op, schedule)
            return prog, compile_program(prog, compile_arch(self.device.arch))
        except ResourceError as exc:
            return Measurement(Status.FAILED, error=f"resources: {exc}")
        except (NvrtcError, GpuScheduleError, ValueError) as exc:
            return Measurement(Status.FAILED, error=f"{type(exc).__name__}: {exc}")

    def run(self, schedule: Any, prog: Any, compiled: Any) -> Measurement:
        """Run a built schedule once, check its outputs, time it."""
        from nfc.codegen.cuda.driver import CudaDriverError

        try:
            got, seconds = self._run_timed(prog, compiled)
        except (CudaDriverError, ValueError) as exc:
            return Measurement(Status.FAILED, error=f"{type(exc).__name__}: {exc}")
        why = check_outputs(got, self.sim.bounds(getattr(schedule, "precision", "fma")))
        return Measurement(Status.WRONG, error=why) if why else Measurement(
            Status.OK, time=seconds, spread=None)

    def _run_timed(self, prog: Any, compiled: Any) -> tuple[list[np.ndarray], float]:
        from nfc.codegen.cuda.driver import from_device_layout, host_buffer, to_device_layout

        dev = self.device
        known = getattr(dev.d, "kernels", None)
        if isinstance(known, dict):  # a simulator behind the driver API (FakeDriver)
            known.update({k.func.name: k for k in prog.kernels})
        module = dev.load(compiled)
        ptrs: dict[str, int] = {}
        try:
            for b in (*prog.params, *prog.temps):
                ptrs[b.name] = dev.alloc(b.nbytes)
            ins = prog.params[prog.n_outputs:]
            for b, x in zip(ins, self.inputs, strict=True):
                dev.upload(ptrs[b.name], to_device_layout(x, b))
            launches = [(dev.function(module, k.func.name), k.grid, k.block,
                         [ptrs[b.name] for b in k.func.params]) for k in prog.kernels]

            def run_once() -> None:
                for fn, grid, block, args in launches:
                    dev.launch(fn, grid, block, args)
            run_once()
            dev.synchronize()
            outs = []
            for b in prog.params[:prog.n_outputs]:
                host = host_buffer(b)
                dev.download(host, ptrs[b.name])
                outs.append(from_device_layout(host, b))
            for _ in range(self.warmup):
                run_once()
            per_round = []
            for _ in range(self.rounds):
                ms = _event_ms(dev, lambda: [run_once() for _ in range(self.repeats)])
                per_round.append(ms * 1e-3 / self.repeats)
            return outs, statistics.median(per_round)
        finally:
            from nfc.codegen.cuda.driver import CudaDriverError

            for p in ptrs.values():
                with contextlib.suppress(CudaDriverError):  # after a fault every call fails:
                    dev.free(p)  # the launch's error is the one to report

    def __call__(self, cfg: dict[str, Any]) -> Measurement:
        return self.measure_schedule(self.space.to_schedule(cfg))

    def __enter__(self) -> DeviceMeasurer:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def compile_arch(arch: str) -> str:
    """The architecture NVRTC compiles for to run on a device of `arch`: itself when nfc
    knows its limits (nvrtc.ARCHS), else the newest known one of the same major version
    with a lower minor (cubins run on later minor versions: sm_80 code on an sm_86 or sm_89
    GPU); ValueError when there is none."""
    from nfc.codegen.cuda.nvrtc import ARCHS

    if arch in ARCHS:
        return arch
    num = int(arch.removeprefix("sm_"))
    same = [a for a in ARCHS if int(a[3:]) // 10 == num // 10 and int(a[3:]) <= num]
    if not same:
        raise ValueError(f"no known CUDA architecture for a {arch} GPU (nfc compiles for "
                         f"{', '.join(ARCHS)})")
    return max(same, key=lambda a: int(a[3:]))


def _event_ms(dev: Any, work: Callable[[], Any]) -> float:
    """Milliseconds between two CUDA events recorded around `work` on the default stream:
    the device's `event`/`record`/`elapsed_ms` when it has them (nfc.codegen.cuda.driver),
    else the driver calls directly."""
    if all(hasattr(dev, n) for n in ("event", "record", "elapsed_ms", "destroy_event")):
        start, end = dev.event(), dev.event()
        try:
            dev.record(start, 0)
            work()
            dev.record(end, 0)
            return float(dev.elapsed_ms(start, end))
        finally:
            dev.destroy_event(start)
            dev.destroy_event(end)
    from nfc.codegen.cuda.driver import _check

    d = dev.d
    start = _check(d, d.cuEventCreate(0), "cuEventCreate")
    end = _check(d, d.cuEventCreate(0), "cuEventCreate")
    try:
        _check(d, d.cuEventRecord(start, 0), "cuEventRecord")
        work()
        _check(d, d.cuEventRecord(end, 0), "cuEventRecord")
        _check(d, d.cuEventSynchronize(end), "cuEventSynchronize")
        return float(_check(d, d.cuEventElapsedTime(start, end), "cuEventElapsedTime"))
    finally:
        d.cuEventDestroy(start)
        d.cuEventDestroy(end)


# ---------------------------------------------------------------------------------------------
# the category of a GPU


def cuda_device_category(device: Any) -> dict[str, Any]:
    """The tuning-cache category of the GPU behind `device` (nfc.codegen.cuda.driver.Device):
    its name, compute capability, the driver's CUDA version, the NVRTC version and the GPU
    schedule version (nfc.runtime.tuning.category.cuda_category)."""
    from nfc.codegen.cuda.driver import _check
    from nfc.codegen.cuda.nvrtc import nvrtc_version
    from nfc.codegen.cuda.schedule import GPU_SCHEDULE_VERSION
    from nfc.runtime.tuning.category import cuda_category

    arch = str(device.arch)
    cc = (int(arch[3:-1]), int(arch[-1]))
    try:
        v = int(_check(device.d, device.d.cuDriverGetVersion(), "cuDriverGetVersion"))
        driver = f"{v // 1000}.{v % 1000 // 10}"
    except Exception:  # noqa: BLE001 - a driver without the query (a fake one)
        driver = "unknown"
    major, minor = nvrtc_version()
    return cuda_category(device=str(device.name), compute_capability=cc, driver_version=driver,
                         runtime_version=f"nvrtc {major}.{minor}",
                         schedule_space=GPU_SCHEDULE_VERSION)


# ---------------------------------------------------------------------------------------------
# tuning


def tune_gpu_op(op: ComputeOp, measure: Callable[[dict[str, Any]], Measurement], *,
                space: GpuSearchSpace | None = None, config: Any = None, cache: Any = None,
                category: Mapping[str, Any] | None = None, key: str = "",
                desc: str = "") -> Any:
    """The genetic search (nfc.runtime.tuning.search.tune) over `op`'s GPU space; returns
    its SearchResult (parameters of the search space: `space.to_schedule` gives the
    GpuSchedule)."""
    from nfc.runtime.tuning.search import tune

    sp = space if space is not None else getattr(measure, "space", None) or search_space(op)
    return tune(sp, measure, cache=cache, category=category, key=key, desc=desc,
                config=config)


@dataclass
class GpuKernelResult:
    """The search of one distinct compute of a module."""

    key: str
    desc: str
    count: int
    schedule: Any
    """The chosen GpuSchedule (the default when nothing better ran correctly)."""
    default: Any
    cost: float | None
    default_cost: float | None
    evaluated: int
    failed: int
    errors: list[str] = field(default_factory=list)
    """The first few reasons candidates failed."""
    note: str = ""


def tune_kernels_gpu(module: Module, functions: Sequence[str], make_measurer: Callable[..., Any],
                     *, config: Any = None, cache: Any = None,
                     category: Mapping[str, Any] | None = None,
                     progress: Callable[[str], None] | None = None) -> list[GpuKernelResult]:
    """Search every distinct single compute of `functions` (nfc.runtime.tuning.kernels
    keys: one search per kernel key, on its canonical compute) with a measurer from
    `make_measurer(op, space)`; with a `cache` (a real measurer's), under `category`."""
    from nfc.codegen.cuda.space import classify
    from nfc.runtime.tuning.driver import kernel_seed
    from nfc.runtime.tuning.kernels import canonical_compute, collect_kernels
    from nfc.runtime.tuning.search import SearchConfig

    cfg = config or SearchConfig()
    out = []
    for k in collect_kernels(module, functions):
        if not isinstance(k.op, ComputeOp):
            out.append(GpuKernelResult(k.key, k.desc, k.count, None, None, None, None, 0, 0,
                                       note="fused kernels are not searched"))
            continue
        op = canonical_compute(k.op)
        try:
            classify(op)
            space = search_space(op)
        except Exception as exc:  # noqa: BLE001 - a compute the backend has no space for
            out.append(GpuKernelResult(k.key, k.desc, k.count, None, None, None, None, 0, 0,
                                       note=f"no GPU space: {exc}"))
            continue
        if progress is not None:
            progress(k.desc)
        measure = make_measurer(op, space)
        import dataclasses

        res = tune_gpu_op(op, measure, space=space, cache=cache, category=category,
                          key=k.key, desc=k.desc,
                          config=dataclasses.replace(cfg, seed=kernel_seed(cfg.seed, k.key)))
        errors = [m.error for _, m in getattr(measure, "results", {}).values()
                  if m.status is not Status.OK][:3]
        out.append(GpuKernelResult(k.key, k.desc, k.count, space.to_schedule(res.schedule),
                                   space.to_schedule(space.default()), res.time,
                                   res.default_time, res.evaluated, res.failed, errors))
    return out


def _schedule_text(s: Any) -> str:
    from nfc.codegen.cuda.space import to_params

    return "-" if s is None else " ".join(f"{k}={v}" for k, v in to_params(s).items())


def results_table(results: Sequence[GpuKernelResult], *, simulated: bool) -> str:
    """The report of `tune_kernels_gpu` as text: per kernel the default's and the chosen
    schedule's cost (stand-in costs when `simulated`, else measured times), candidates
    evaluated and failed, the chosen schedule."""
    what = "model us" if simulated else "time us"
    head = (f"{'kernel':40} {'calls':>5} {'default ' + what:>16} {'chosen ' + what:>15} "
            f"{'x':>6} {'tried':>5} {'failed':>6}  schedule")
    lines = [head, "-" * len(head)]

    def us(t: float | None) -> str:
        return "-" if t is None else f"{t * 1e6:.2f}"
    for r in results:
        if r.schedule is None:
            lines.append(f"{r.desc[:40]:40} {r.count:>5} {'':>16} {'':>15} {'':>6} {'':>5} "
                         f"{'':>6}  ({r.note})")
            continue
        x = (f"{r.default_cost / r.cost:.2f}" if r.cost and r.default_cost else "-")
        lines.append(f"{r.desc[:40]:40} {r.count:>5} {us(r.default_cost):>16} "
                     f"{us(r.cost):>15} {x:>6} {r.evaluated:>5} {r.failed:>6}  "
                     f"{r.schedule.kind}: {_schedule_text(r.schedule)}")
        for e in r.errors:
            lines.append(f"{'':48}failed: {e.splitlines()[0][:110]}")
    return "\n".join(lines)


def results_json(results: Sequence[GpuKernelResult], *, simulated: bool) -> str:
    """The report as JSON: `schedules` maps each kernel key to its chosen GpuSchedule
    (`gpu_schedule_for` takes it), `simulated` says whether the costs are stand-ins."""
    import json

    return json.dumps({
        "simulated": simulated,
        "costs": "stand-in (analytic model)" if simulated else "measured seconds",
        "schedules": {r.key: r.schedule.to_dict() for r in results if r.schedule is not None},
        "kernels": [{"key": r.key, "desc": r.desc, "calls": r.count,
                     "schedule": None if r.schedule is None else r.schedule.to_dict(),
                     "default": None if r.default is None else r.default.to_dict(),
                     "cost": r.cost, "default_cost": r.default_cost,
                     "evaluated": r.evaluated, "failed": r.failed, "errors": r.errors,
                     "note": r.note} for r in results],
    }, indent=1, sort_keys=True)


def gpu_schedule_choices(module: Module, cache: Any, category: Mapping[str, Any],
                         functions: Sequence[str] | None = None) -> dict[str, Any]:
    """{kernel key: GpuSchedule} of every single compute of `functions` (default: all), and
    every stage of their groups as the CUDA lowering splits them, with a record in the
    tuning cache under the GPU's `category` (what `nfc tune --target cuda` recorded): the
    fastest ok one; a record that fits no schedule is skipped."""
    from nfc.codegen.lower import group_stages
    from nfc.runtime.tuning.kernels import canonical_compute, collect_kernels, kernel_key

    choices: dict[str, Any] = {}
    for k in collect_kernels(module, functions):
        computes: list[ComputeOp] = []
        if isinstance(k.op, ComputeOp):
            computes = [k.op]
        else:
            try:
                computes = [st for st, _ in group_stages(k.op, None)]
            except Exception:  # noqa: BLE001 - a group the lowering splits otherwise
                continue
        for c in computes:
            key = kernel_key(c)
            if key in choices:
                continue
            try:
                entry = cache.best(category, key)
                if entry is not None:
                    choices[key] = search_space(canonical_compute(c)).to_schedule(
                        entry.schedule)
            except Exception:  # noqa: BLE001 - a damaged cache or a record that fits
                continue  # no schedule: the default
    return choices


def gpu_schedule_lookup(module: Module, cache: Any, category: Mapping[str, Any],
                        functions: Sequence[str] | None = None) -> Callable[[Op], Any]:
    """`gpu_schedule_for(gpu_schedule_choices(...))`: build_cuda_step's `schedule_for` from
    the tuning cache."""
    return gpu_schedule_for(gpu_schedule_choices(module, cache, category, functions))


def gpu_schedule_for(choices: Mapping[str, Any]) -> Callable[[Op], Any]:
    """A `schedule_for(op)` for build_cuda_step from {kernel key: GpuSchedule or its dict}:
    for a single compute, the choice of its key; for a group (`nf.kernel`), a list with the
    choice of each stage's key (the stages the CUDA lowering makes: elementwise producers
    inlined, so a GEMM stage is the compute the tuner saw) and None (the default) for the
    rest. A choice is used only when valid in the compute's own space."""
    from nfc.codegen.cuda.schedule import gpu_schedule_from_dict
    from nfc.codegen.cuda.space import gpu_space, to_params
    from nfc.runtime.tuning.kernels import kernel_key

    table = {k: (gpu_schedule_from_dict(s) if isinstance(s, Mapping) else s)
             for k, s in choices.items() if s is not None}

    def one(op: ComputeOp) -> Any:
        try:
            s = table.get(kernel_key(op))
            if s is None:
                return None
            space = gpu_space(op, (s.precision,) if hasattr(s, "precision") else None)
            params = {k: v[0] for k, v in space.params.items()} | to_params(s)
            return s if space.is_valid(params) and space.to_schedule(params) == s else None
        except Exception:  # noqa: BLE001 - a record that does not fit: the default
            return None

    def schedule_for(op: Op) -> Any:
        if isinstance(op, ComputeOp):
            return one(op)
        if isinstance(op, KernelOp) and table:
            from nfc.codegen.lower import group_stages

            try:
                stages = [one(st) for st, _ in group_stages(op, None)]
            except Exception:  # noqa: BLE001 - a group the lowering splits otherwise
                return None
            return stages if any(s is not None for s in stages) else None
        return None
    return schedule_for
