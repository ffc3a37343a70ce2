"""Tune every distinct kernel of a model's training step: the engine behind `nfc tune`.

    module  = build_model("mlp.nf", ["batch=64"])          # the build pipeline up to tuning
    with TuningCache(db) as cache:
        report = tune_module(module, cache, options=TuneOptions(trials=64))
    print(report.table())

The kernels of the step (`train_step`, else `forward`) are grouped by their structural key
(nfc.runtime.tuning.kernels), so a kernel that runs several times per step, or that another
model already tuned, is tuned once. They are ranked by their share of the step, measured by a
profiled build of the step with default schedules (or, when that is not possible, estimated
from FLOP and byte counts), and tuned most expensive first, each by the genetic search
(nfc.runtime.tuning.search) with candidates built and timed in a worker process. Every
measurement is committed to the cache at once, and each kernel's search is seeded from the
run's seed and the kernel's key: rerunning the same command replays what was recorded and
continues where it stopped, measuring nothing twice.

Compiling then uses the results: `apply_cached_schedules(module)` (or
`build_artifact(module, schedule_for=schedule_lookup(module, cache))`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nfc.ir import ComputeOp, Module, Op
from nfc.runtime.tuning.category import default_category
from nfc.runtime.tuning.kernels import (
    CacheUse,
    Kernel,
    apply_cached_schedules,
    collect_kernels,
    kernel_key,
    kernel_spec,
    roofline_seconds,
    schedule_lookup,
    schedules_from_cache,
)
from nfc.runtime.tuning.measure import MeasureOptions, Measurer, MeasureSetupError, Task
from nfc.runtime.tuning.model import (
    Measurement,
    Mode,
    Status,
    canonical_json,
    canonical_schedule,
    category_id,
)
from nfc.runtime.tuning.report import KernelReport, Progress, TuneReport, speedup_history
from nfc.runtime.tuning.search import SearchConfig, SearchResult, tune

__all__ = ["BUILDER", "REFERENCE", "CacheUse", "Confirmation", "TuneOptions",
           "apply_cached_schedules", "build_model", "checked_options", "compare_step_times",
           "confirm_best", "estimate_kernel_times", "kernel_key", "kernel_seed", "schedule_lookup",
           "schedules_from_cache", "step_samples", "training_functions", "tune_kernel",
           "tune_module"]

BUILDER = "nfc.runtime.tuning.driver:build_kernel"
"""The builder the measuring worker calls (codegen's, with a lean call path)."""
REFERENCE = "nfc.runtime.tuning.driver:reference_kernel"
"""The default schedule's kernel: what every candidate's outputs must match."""
ORDERS = ("auto", "profile", "cost")
"""How kernels are ranked: a profiled step, the FLOP/byte estimate, or profile-else-cost."""


@dataclass(frozen=True)
class TuneOptions:
    """Options of a tuning run (the `nfc tune` flags)."""

    trials: int | None = 64
    """Candidates per kernel (cache hits included); None for no limit."""
    time_budget: float | None = None
    """Wall-clock seconds for the whole run, shared among kernels by their share."""
    mode: Mode = Mode.FULL
    """full (measure everything), fast (skip naive schedules), heuristic (measure nothing)."""
    reproducible: bool = False
    """Choose only bitwise-reproducible schedules."""
    seed: int = 0
    """Seed of the searches (each kernel's is derived from it and the kernel's key)."""
    population: int = 16
    """Candidates per generation."""
    patience: int = 4
    """Generations without a faster schedule before a kernel's search stops."""
    top: int | None = None
    """Tune only the `top` most expensive kernels."""
    min_share: float = 0.0
    """Skip kernels below this fraction of the step (0..1)."""
    order: str = "auto"
    """`auto`, `profile` or `cost` (see ORDERS)."""
    measure: MeasureOptions = field(default_factory=MeasureOptions)
    """Time limits and timing protocol of the worker."""
    functions: tuple[str, ...] = ()
    """Functions whose kernels are tuned; empty: the training step (see training_functions)."""
    compare_step: bool = False
    """After tuning, time the step built with default and with tuned schedules."""
    step_repeats: int = 20
    """Timed steps per build for `compare_step`."""
    confirm: int = 2
    """Rounds of re-measuring a kernel's winner side by side with the default after its
    search (0: trust the search's single measurements); see `confirm_best`."""
    measurer: Callable[[Task, MeasureOptions], Any] | None = None
    """Makes the measurer of a kernel (a context manager called as `measure(schedule)`,
    with `compare`, and optionally `measure_batch`, which the search then gives a whole
    generation at once: nfc.runtime.tuning.search.BatchMeasurer); None: a local `Measurer`.
    `nfc tune --cluster` measures on dask workers (nfc.runtime.distributed.dask_tune)."""


def build_model(path: str | os.PathLike[str], settings: Sequence[str] = (),
                pipeline: str | None = None, *, im2col: bool = True,
                **pass_manager: Any) -> Module:
    """The module whose kernels `nfc tune` measures: the model file through the build
    pipeline up to `apply-tuning` (nfc.runtime.build.tune_pipeline_for; `pipeline` replaces the
    build pipeline, as `-p`), so these are the kernels that pass then looks up. `settings` are
    `k=v` items; `pass_manager` takes build_module's `verify`, `print_ir_after`, `timings`,
    `model` (the model of a file that defines several)."""
    from nfc.runtime.build import build_module, parse_settings, tune_pipeline_for

    params, opt = parse_settings(settings)
    text = tune_pipeline_for(path, pipeline, im2col=im2col)
    return build_module(path, params, opt, text, **pass_manager)[0]


def training_functions(module: Module) -> list[str]:
    """The functions to tune by default: `train_step` when autodiff made one, else
    `forward`, else every function with a body."""
    for name in ("train_step", "forward"):
        if module.has_func(name):
            return [name]
    return [f.name for f in module.funcs if f.body.ops]


def kernel_seed(seed: int, key: str) -> int:
    """The search seed of one kernel: distinct per kernel, fixed for a run's seed."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{key}".encode()).digest()[:4], "little")


# ---------------------------------------------------------------------------------------------
# what the worker builds


class LeanRun:
    """`run(inputs) -> outputs` of a JIT-compiled kernel with almost no Python in the timed
    path: outputs and workspace are allocated once and the pointer array is rebuilt only when
    the input arrays change (the worker passes the same list every time). The generic call
    path of a `JitKernel` checks every array on every call, tens of microseconds that would
    swamp the small kernels of a training step and drown the differences between schedules.
    The returned arrays are reused by the next call: copy them to keep them."""

    def __init__(self, kernel: Any) -> None:
        import ctypes

        info = kernel.info
        self.kernel = kernel  # owns the machine code
        self.workspace_bytes = int(info.workspace_bytes)
        self.reproducible = True  # static loop chunking, no atomics
        proto = ctypes.CFUNCTYPE(None, ctypes.POINTER(ctypes.c_void_p))
        self._fn = proto(kernel.engine.get_function_address(info.name))
        self._ptr_array = ctypes.c_void_p
        self._outs = [np.empty(v.shape, v.dtype.numpy) for v in info.outputs]
        raw = np.empty(self.workspace_bytes + 64, np.uint8) if self.workspace_bytes else None
        self._ws = None if raw is None else raw[(-raw.ctypes.data) % 64:]
        self._specs = [(tuple(v.shape), v.dtype.numpy) for v in info.inputs]
        self._held: list[Any] = []  # keeps the ids in `_ids` valid
        self._ids: tuple[int, ...] = ()
        self._arrays: list[np.ndarray] = []
        self._buf: Any = None

    def _bind(self, inputs: Sequence[Any]) -> None:
        if len(inputs) != len(self._specs):
            raise ValueError(f"the kernel takes {len(self._specs)} inputs, got {len(inputs)}")
        arrays = []
        for x, (shape, dtype) in zip(inputs, self._specs, strict=True):
            arr = np.ascontiguousarray(x, dtype=dtype)
            if arr.shape != shape:
                raise ValueError(f"input of shape {arr.shape}, the kernel wants {shape}")
            arrays.append(arr)
        ptrs = [a.ctypes.data for a in (*self._outs, *arrays)]
        if self._ws is not None:
            ptrs.append(self._ws.ctypes.data)
        self._held, self._arrays = list(inputs), arrays
        self._ids = tuple(map(id, inputs))
        self._buf = (self._ptr_array * len(ptrs))(*ptrs)

    def __call__(self, inputs: Sequence[Any]) -> list[np.ndarray]:
        if tuple(map(id, inputs)) != self._ids:
            self._bind(inputs)
        self._fn(self._buf)
        return self._outs


def build_kernel(spec: Mapping[str, Any], schedule: Mapping[str, Any] | None) -> LeanRun:
    """The worker's builder: codegen's kernel of `spec` (nfc.codegen.kernel_spec) with
    `schedule`, behind a `LeanRun`."""
    from nfc.codegen.kernel_spec import build

    return LeanRun(build(spec, schedule).kernel)


def reference_kernel(spec: Mapping[str, Any]) -> LeanRun:
    """The default schedule's kernel (what candidates are checked against)."""
    return build_kernel(spec, None)


# ---------------------------------------------------------------------------------------------
# ranking kernels


def _random_feeds(fn: Any, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs of a loaded function: normal floats; integer inputs zero, so that any use of
    them as an index (labels, token ids) stays in bounds."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for spec in fn.inputs:
        if np.dtype(spec.dtype).kind == "f":
            feeds[spec.name] = rng.standard_normal(spec.shape).astype(spec.dtype)
        else:
            feeds[spec.name] = np.zeros(spec.shape, spec.dtype)
    return feeds


def _load_built(module: Module, function: str, schedule_for: Callable[[Op], Any] | None,
                profile: bool, workdir: str) -> tuple[Any, Any]:
    """(artifact, loaded model) of one function, built into `workdir`."""
    from nfc.codegen.artifact import build_artifact
    from nfc.runtime.loader import load

    art = build_artifact(module, functions=[function], schedule_for=schedule_for,
                         profile=profile)
    fd, path = tempfile.mkstemp(suffix=".so", dir=workdir)
    os.close(fd)
    art.write_shared(path)
    model = load(path)
    model.init(0)
    return art, model


def _default_schedules(op: Op) -> Any:
    """A `schedule_for` forcing codegen's default schedule (ignoring `nf.schedule`)."""
    if isinstance(op, ComputeOp):
        from nfc.codegen.space import schedule_space

        return schedule_space(op).default()
    return None


def profile_kernel_times(module: Module, functions: Sequence[str], kernels: Sequence[Kernel],
                         steps: int = 5) -> dict[str, float]:
    """Seconds per call of the functions spent in each kernel (by key), measured on a profiled
    build with default schedules (the profiler's per-kernel clock stamps; the median over
    `steps` calls, so that a descheduled thread in one call does not distort the ranking)."""
    site_key = {site: k.key for k in kernels for site in k.sites}
    out = {k.key: 0.0 for k in kernels}
    with tempfile.TemporaryDirectory(prefix="nfc-tune-") as tmp:
        for fname in functions:
            art, model = _load_built(module, fname, _default_schedules, True, tmp)
            fn = model.functions[fname]
            feeds = _random_feeds(fn)
            fn(**feeds)  # warm-up: page faults, first touch of the arena
            n = len(art.plans[fname].kernels)
            per_step = []
            for _ in range(max(1, steps)):
                fn(**feeds)
                ev = fn.profile_events()[:n]
                per_step.append((ev[:, 1] - ev[:, 0]) * 1e-9)
            secs = np.median(np.array(per_step), axis=0)
            for call, t in zip(art.plans[fname].kernels, secs, strict=True):
                key = site_key.get((fname, call.op_index))
                if key is not None:
                    out[key] += float(t)
    return out


def estimate_kernel_times(module: Module, functions: Sequence[str], kernels: Sequence[Kernel],
                          order: str = "auto") -> tuple[dict[str, float], str]:
    """(seconds per step by key, how): a profile of default schedules (`profile`), or the
    FLOP/byte roofline estimate times the calls per step (`cost`); `auto` tries the profile
    and falls back to the estimate."""
    assert order in ORDERS, order
    if order in ("auto", "profile"):
        try:
            return profile_kernel_times(module, functions, kernels), "profile"
        except Exception:
            if order == "profile":
                raise
    return {k.key: k.count * roofline_seconds(k.op) for k in kernels}, "cost"


# ---------------------------------------------------------------------------------------------
# tuning


def _recorded_time(cache: Any, category: Mapping[str, Any], key: str,
                   schedule: Mapping[str, Any]) -> float | None:
    entry = cache.lookup(category, key, schedule) if cache is not None else None
    return entry.time if entry is not None and entry.status is Status.OK else None


def _no_measure(schedule: dict[str, Any]) -> Any:
    raise AssertionError("heuristic mode measures nothing")


def tune_kernel(k: Kernel, cache: Any, category: Mapping[str, Any], options: TuneOptions, *,
                time_budget: float | None = None,
                progress: Callable[[str, int, float], None] | None = None,
                clock: Callable[[], float] = time.monotonic
                ) -> tuple[SearchResult, Confirmation]:
    """Search one kernel's schedule space (see the module doc), then confirm the winner
    (`confirm_best`); returns the result (schedule and time as the cache now has them) and
    the confirmation (side-by-side times, rejected winners). Raises MeasureSetupError when
    the kernel cannot be measured at all, ValueError when it has no schedule space."""
    from nfc.codegen.kernel_spec import space as space_of

    spec = kernel_spec(k)
    space = space_of(spec)
    config = SearchConfig(population=options.population, trials=options.trials,
                          time_budget=time_budget, patience=options.patience,
                          seed=kernel_seed(options.seed, k.key), mode=options.mode,
                          reproducible=options.reproducible)
    if options.mode is Mode.HEURISTIC:
        return tune(space, _no_measure, cache=cache, category=category, key=k.key,
                    desc=k.desc, config=config), Confirmation()
    task = Task(BUILDER, spec, reference=REFERENCE, seed=0)
    make = options.measurer or Measurer
    with make(task, checked_options(k, options.measure)) as measure:
        res = tune(space, measure, cache=cache, category=category, key=k.key, desc=k.desc,
                   config=config, progress=progress, clock=clock)
        confirmation = Confirmation()
        if options.mode is Mode.FULL and options.confirm > 0 and res.measured:
            confirmation = confirm_best(cache, category, k.key, space.default(), measure,
                                        rounds=options.confirm,
                                        reproducible=options.reproducible, desc=k.desc)
    if confirmation.rejected:
        best = cache.best(category, k.key, reproducible=options.reproducible)
        if best is not None:
            res = dataclasses.replace(res, schedule=dict(best.schedule), time=best.time)
    return res, confirmation


#: Unit roundoff of the dtypes a sum may accumulate in.
_EPS = {"f16": 2.0 ** -11, "bf16": 2.0 ** -8, "f32": 2.0 ** -24, "f64": 2.0 ** -53}


def checked_options(k: Kernel, options: MeasureOptions) -> MeasureOptions:
    """`options` with an absolute tolerance wide enough for a reassociated reduction.

    Schedules block and vectorize reductions, so a candidate sums in another order than
    the default; over R terms of the worker's unit-normal data that moves a result by up to
    about R ulps of the terms' magnitude (1), which a plain relative test misreads as a wrong
    result wherever the sum cancels to a small number. A missing or doubled block of terms
    is still off by whole terms, far beyond this."""
    op = k.op
    if not isinstance(op, ComputeOp) or op.reduce not in ("sum", "prod") or \
            not op.result.dtype.is_float:
        return options
    terms = math.prod(a.extent for a in op.raxes)
    atol = 4.0 * _EPS.get(str(op.result.dtype), 2.0 ** -24) * terms
    return dataclasses.replace(options, atol=max(options.atol, atol))


def _median_measurement(ms: Sequence[Measurement]) -> Measurement:
    ordered = sorted(ms, key=lambda m: m.time if m.time is not None else math.inf)
    return ordered[(len(ordered) - 1) // 2]


@dataclass(frozen=True)
class Confirmation:
    """What `confirm_best` found."""

    rejected: int = 0
    """Search winners that were not faster than the default when re-measured."""
    default_time: float | None = None
    """Median seconds of the default in the side-by-side re-measurement (None: none ran)."""
    best_time: float | None = None
    """Median seconds of the confirmed winner in the same re-measurement."""
    rounds: int = 0
    """Rounds of the re-measurement that produced the two times."""

    @property
    def confirmed(self) -> bool:
        """Whether a winner held against the default, side by side."""
        return self.default_time is not None and self.best_time is not None


def _side_by_side(measure: Callable[[dict[str, Any]], Measurement], a: dict[str, Any],
                  b: dict[str, Any]) -> tuple[Measurement, Measurement]:
    """`a` and `b` measured in one worker with their repeats interleaved (a `Measurer`'s
    `compare`), else one after the other. A crash that fails both is retried apart, so that
    the culprit is known."""
    compare = getattr(measure, "compare", None)
    if compare is not None:
        ma, mb = compare([a, b])
        if ma.status is Status.OK or mb.status is Status.OK:
            return ma, mb
    return measure(dict(a)), measure(dict(b))


def confirm_best(cache: Any, category: Mapping[str, Any], key: str,
                 default: Mapping[str, Any], measure: Callable[[dict[str, Any]], Measurement],
                 *, rounds: int = 2, attempts: int = 3, reproducible: bool = False,
                 desc: str = "") -> Confirmation:
    """Re-measure the cache's best schedule of `key` side by side with the default
    (`rounds` times, each a `Measurer.compare` of the two, whose timed repeats interleave:
    the same process, the same moment); the medians decide. When the best is not faster
    after all (a winner by timing noise, as on a loaded machine), record both medians so
    that the cache stops preferring it, and confirm the next best, up to `attempts` times.
    Returns the medians of the re-measurement that held, which the report shows (the
    search's single measurements are not: one disturbed run of the default once showed a
    4,347x speedup). Nothing is rewritten when the winner holds, so a rerun of the search
    still replays the recorded times exactly."""
    default = canonical_schedule(default)
    rejected = 0
    for _ in range(attempts):
        best = cache.best(category, key, reproducible=reproducible)
        if best is None or canonical_json(best.schedule) == canonical_json(default):
            return Confirmation(rejected)
        dms, bms = [], []
        for _ in range(max(1, rounds)):
            dm, bm = _side_by_side(measure, dict(default), dict(best.schedule))
            dms.append(dm)
            bms.append(bm)
        d_ok = [m for m in dms if m.status is Status.OK]
        b_ok = [m for m in bms if m.status is Status.OK]
        if not d_ok:
            return Confirmation(rejected)  # the default itself fails now: no comparison
        if len(b_ok) < len(bms):  # it failed on a rerun: flaky, never choose it again
            bad = next(m for m in bms if m.status is not Status.OK)
            cache.put_measurement(category, key, best.schedule, bad, naive=best.naive,
                                  desc=desc)
            rejected += 1
            continue
        d_med, b_med = _median_measurement(d_ok), _median_measurement(b_ok)
        d_time = statistics.median(m.time for m in d_ok if m.time is not None)
        b_time = statistics.median(m.time for m in b_ok if m.time is not None)
        if b_time < d_time:
            return Confirmation(rejected, d_time, b_time, len(bms))
        cache.put_measurement(category, key, default, d_med, naive=True, desc=desc)
        cache.put_measurement(category, key, best.schedule, b_med, naive=best.naive, desc=desc)
        rejected += 1
    return Confirmation(rejected)


def _kernel_report(k: Kernel, share: float, res: SearchResult, cache: Any,
                   category: Mapping[str, Any], history: tuple[float, ...], seconds: float,
                   mode: Mode, confirmation: Confirmation | None = None) -> KernelReport:
    from nfc.codegen.kernel_spec import space as space_of

    conf = confirmation or Confirmation()
    default = space_of(kernel_spec(k)).default()
    if conf.confirmed:  # the side-by-side medians: what the report trusts most
        default_time, best = conf.default_time, conf.best_time
    else:
        # the recorded times: a confirmation may have replaced the search's measurement
        default_time = _recorded_time(cache, category, k.key, default)
        if default_time is None:
            default_time = res.default_time
        best = res.time
    speedup = res.speedup
    if default_time is not None and best is not None and best > 0:
        speedup = default_time / best
    status = "heuristic" if mode is Mode.HEURISTIC else "tuned" if res.measured else "cached"
    note = "not in the cache: default schedule" if status == "heuristic" and best is None else ""
    return KernelReport(k.key, k.desc, k.count, share, status, default_time, best, speedup,
                        res.evaluated, res.measured, res.failed, res.stop_reason,
                        dict(res.schedule), note, tuple(k.locs), seconds, history,
                        conf.rejected, conf.confirmed)


def _skip(k: Kernel, share: float, status: str, note: str) -> KernelReport:
    return KernelReport(k.key, k.desc, k.count, share, status, note=note, locs=tuple(k.locs))


def tune_module(module: Module, cache: Any, *, category: Mapping[str, Any] | None = None,
                options: TuneOptions | None = None, progress: Progress | None = None,
                source: str = "", clock: Callable[[], float] = time.monotonic) -> TuneReport:
    """Tune the distinct kernels of `options.functions` (default: the training step) into
    `cache`, most expensive first; returns the report. Ctrl-C stops after the kernel in
    flight is abandoned (its recorded candidates stay) and returns a partial report.
    `clock` (seconds) measures the time budget; a test may pass a fake one."""
    opts = options or TuneOptions()
    category = dict(category) if category is not None else default_category()
    start = clock()
    functions = list(opts.functions) or training_functions(module)
    kernels = collect_kernels(module, functions)
    times, order_used = estimate_kernel_times(module, functions, kernels, opts.order)
    total = sum(times.values()) or 1.0
    kernels.sort(key=lambda k: -times[k.key])
    share = {k.key: times[k.key] / total for k in kernels}
    chosen: list[Kernel] = []
    notes: dict[str, str] = {}
    for k in kernels:
        if not k.tunable:
            notes[k.key] = "fused kernels have no schedule space yet"
        elif share[k.key] < opts.min_share:
            notes[k.key] = f"below --min-share {100 * opts.min_share:g}%"
        elif opts.top is not None and len(chosen) >= opts.top:
            notes[k.key] = f"beyond --top {opts.top}"
        else:
            chosen.append(k)
    progress = progress or Progress(len(chosen), opts.trials, quiet=True)
    progress.begin(len(chosen))
    deadline = None if opts.time_budget is None else start + opts.time_budget
    done: dict[str, KernelReport] = {}
    interrupted = False
    for index, k in enumerate(chosen, 1):
        budget = None
        if deadline is not None:
            left = deadline - clock()
            rest = sum(times[c.key] for c in chosen[index - 1:]) or 1.0
            if left <= 0:
                done[k.key] = _skip(k, share[k.key], "skipped", "time budget spent")
                continue
            budget = left * times[k.key] / rest
        progress.start(index, k.desc, share[k.key])
        trace: list[tuple[int, float]] = []

        def on_trial(kernel: str, trial: int, speedup: float,
                     trace: list[tuple[int, float]] = trace) -> None:
            trace.append((trial, speedup))
            progress.trial(kernel, trial, speedup)
        t0 = time.monotonic()
        try:
            res, confirmation = tune_kernel(k, cache, category, opts, time_budget=budget,
                                            progress=on_trial, clock=clock)
        except KeyboardInterrupt:
            interrupted = True
            done[k.key] = _skip(k, share[k.key], "skipped", "interrupted")
            progress.done(done[k.key])
            break
        except (MeasureSetupError, ValueError) as exc:
            done[k.key] = _skip(k, share[k.key], "error", str(exc).splitlines()[0][:200])
        else:
            done[k.key] = _kernel_report(k, share[k.key], res, cache, category,
                                         speedup_history(trace), time.monotonic() - t0,
                                         opts.mode, confirmation)
        progress.done(done[k.key])
    rows = []
    for k in kernels:
        rep = done.get(k.key)
        if rep is None:
            note = notes.get(k.key, "interrupted" if interrupted else "not reached")
            rep = _skip(k, share[k.key], "skipped", note)
        rows.append(rep)
    step_default = step_tuned = None
    if opts.compare_step and not interrupted:
        lookup = schedule_lookup(module, cache, category, reproducible=opts.reproducible)
        step_default, step_tuned = compare_step_times(module, functions[0], lookup,
                                                      repeats=opts.step_repeats)
    return TuneReport(source or module.name, tuple(functions), str(getattr(cache, "path", "")),
                      category_id(category), str(opts.mode), order_used,
                      clock() - start, tuple(rows), interrupted, step_default, step_tuned)


# ---------------------------------------------------------------------------------------------
# the effect on a whole step


def step_samples(module: Module, function: str, schedule_for: Callable[[Op], Any], *,
                 repeats: int = 20, rounds: int = 5) -> dict[str, list[float]]:
    """Seconds of single calls of `function`, built once with default schedules (`default`)
    and once with `schedule_for` (`tuned`), timed in alternating rounds so that drift of the
    machine affects both alike; both start each round from the same initial parameters."""
    samples: dict[str, list[float]] = {"default": [], "tuned": []}
    with tempfile.TemporaryDirectory(prefix="nfc-tune-") as tmp:
        fns = {}
        for name, fn_for in (("default", _default_schedules), ("tuned", schedule_for)):
            _, model = _load_built(module, function, fn_for, False, tmp)
            fns[name] = (model, model.functions[function])
        for _ in range(rounds):
            for name, (model, fn) in fns.items():
                model.init(0)
                feeds = _random_feeds(fn)
                fn(**feeds)
                for _ in range(max(1, repeats // rounds)):
                    t0 = time.perf_counter()
                    fn(**feeds)
                    samples[name].append(time.perf_counter() - t0)
    return samples


def compare_step_times(module: Module, function: str, schedule_for: Callable[[Op], Any],
                       *, repeats: int = 20, rounds: int = 5) -> tuple[float, float]:
    """(default, tuned) median seconds of one call of `function` (see `step_samples`)."""
    s = step_samples(module, function, schedule_for, repeats=repeats, rounds=rounds)
    return statistics.median(s["default"]), statistics.median(s["tuned"])
