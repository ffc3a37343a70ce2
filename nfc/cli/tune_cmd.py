"""`nfc tune`: measure schedules for every distinct kernel of a model's training step and keep
the best in the tuning cache, which `nfc compile` and `nfc train` then use.

    nfc tune model.nf --trials 64                    # per kernel (default 64)
    nfc tune model.nf --time 600                     # 10 minutes for the whole model
    nfc tune model.nf --set batch=32 --db team.sqlite --report tune.json --plot tune.png
    nfc tune model.nf --mode fast                    # never measure the naive default
    nfc tune model.nf --mode heuristic               # measure nothing: show what is cached
    nfc tune models.nf --model small                 # one model of a file that defines several
    nfc tune model.nf --cluster tcp://HOST:8786      # measure on dask workers (docs/distributed.md)
    nfc tune model.nf --target cuda                  # GPU schedules timed on a GPU (docs/cuda.md)
    nfc tune model.nf --target cuda --simulate       # the search on the simulator; no cache
    nfc tune model.nf --layout only                  # only the layout choice (off, block 8, 16)

Kernels are tuned most expensive first (by a profiled step with default schedules, else by
FLOP/byte counts); identical kernels (one layer in two models, the steps of an unrolled RNN)
are tuned once. Every measurement is committed at once: stopping (Ctrl-C, even kill -9) loses
at most the candidate in flight, and rerunning the same command continues where it stopped
without measuring anything twice. See docs/tuning-cache.md.

First (`--layout search`, the default, for a `.nf` model with a convolution whose build
pipeline has `layout{when=auto}`), the layout choice: the train step built with the `layout`
pass off and with each block this CPU can use (8; 16 with AVX-512), timed alternating; every
median is recorded and the fastest is what `layout{when=auto}` then uses for this model on
this machine (nfc.runtime.tuning.layout), so the kernels tuned next are the chosen layout's.

The kernels are those of the build pipeline up to `apply-tuning`, the pass that later gives
them their schedules (`--print-pipeline` shows it; `-p` and `--no-im2col` change it as they
change `nfc compile`'s, and must match the build that is to use the results).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from nfc.cli import UsageError
from nfc.cli.pipeline_args import (
    add_build_pipeline_arguments,
    add_model_argument,
    pass_manager_options,
)


def add_parser(subparsers: Any) -> None:
    """Register `nfc tune`."""
    p = subparsers.add_parser("tune", help="auto-tune the kernels of a model into the cache",
                              description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file", help="a .nf model or a .nfir module")
    p.add_argument("--trials", type=int, default=None, metavar="N",
                   help="candidates per kernel, cache hits included (default 64; with --time "
                   "only: no limit)")
    p.add_argument("--time", type=float, default=None, metavar="SECONDS",
                   help="wall-clock budget of the whole run, shared by the kernels' shares")
    p.add_argument("--db", metavar="PATH", help="tuning cache file (default: $NFC_CACHE_DIR/"
                   "tuning.sqlite or ~/.cache/nfc/tuning.sqlite)")
    p.add_argument("--mode", choices=("full", "fast", "heuristic"), default="full",
                   help="full: measure every candidate; fast: skip naive schedules; "
                   "heuristic: measure nothing (default full)")
    p.add_argument("--reproducible", action="store_true",
                   help="choose only schedules with bitwise-reproducible results")
    p.add_argument("--seed", type=int, default=0, help="search seed (default 0)")
    p.add_argument("--set", dest="settings", action="append", default=[], metavar="K=V",
                   help="a model parameter, or opt.<name> for the optimizer (repeatable)")
    p.add_argument("--function", dest="functions", action="append", default=[],
                   metavar="NAME", help="tune this function's kernels (repeatable; default "
                   "train_step, else forward)")
    p.add_argument("--top", type=int, default=None, metavar="N",
                   help="tune only the N most expensive kernels")
    p.add_argument("--min-share", type=float, default=0.0, metavar="PCT",
                   help="skip kernels below PCT percent of the step (default 0)")
    p.add_argument("--order", choices=("auto", "profile", "cost"), default="auto",
                   help="rank kernels by a profiled step, by FLOP/byte counts, or profile "
                   "else counts (default auto)")
    p.add_argument("--population", type=int, default=16, help="candidates per generation")
    p.add_argument("--patience", type=int, default=4,
                   help="generations without improvement before a kernel stops (default 4)")
    p.add_argument("--timeout", type=float, default=10.0, metavar="SEC",
                   help="seconds a candidate may run before it counts as hung (default 10)")
    p.add_argument("--confirm", type=int, default=2, metavar="N",
                   help="re-measure each kernel's winner side by side with the default (N "
                   "rounds, repeats interleaved), report those medians and set the winner "
                   "aside if it loses (timing noise); 0 trusts the search (default 2)")
    p.add_argument("--compare-step", action="store_true",
                   help="afterwards, time the whole step with default and tuned schedules")
    p.add_argument("--report", metavar="OUT.json", help="write the report as JSON")
    p.add_argument("--plot", metavar="TUNE.png",
                   help="plot best speedup so far against trials (needs matplotlib)")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.add_argument("--cluster", metavar="ADDR",
                   help="measure candidates on the workers of the dask scheduler at ADDR "
                   "(tcp://HOST:PORT) whose machine category is this machine's; the search "
                   "and the cache stay here (pip install 'nfc[distributed]')")
    p.add_argument("--target", choices=("cpu", "cuda"), default="cpu",
                   help="cpu (default) or cuda: search GPU schedules (CUDA events on the GPU; "
                   "the tuning-cache category names the GPU, its compute capability, driver "
                   "and NVRTC versions)")
    p.add_argument("--simulate", action="store_true",
                   help="with --target cuda: run the search on the kernel simulator (every "
                   "candidate checked against the interpreter) with stand-in costs from a "
                   "model of the launch, and store nothing in the tuning cache (also "
                   "NFC_CUDA_SIMULATE=1)")
    p.add_argument("--arch", choices=("sm_80", "sm_90"), default=None,
                   help="with --target cuda --simulate: the GPU the stand-in cost models "
                   "(default sm_80), and compile every candidate with NVRTC for it, rejecting "
                   "those over its register, shared-memory or spill limits")
    p.add_argument("--layout", choices=("search", "skip", "only"), default="search",
                   help="search: first measure the model's train step with the layout pass "
                   "off and with each block, and record the fastest for layout{when=auto} "
                   "(default); skip: keep the recorded choice or the rule; only: the layout "
                   "choice and nothing else")
    add_model_argument(p)
    add_build_pipeline_arguments(p, flags=("layout", "im2col"))
    p.set_defaults(func=run)


@contextlib.contextmanager
def _measurer(args: argparse.Namespace) -> Iterator[Any]:
    """`--cluster`: the measurer factory of the dask cluster (None without the flag)."""
    if not args.cluster:
        yield None
        return
    from nfc.runtime.distributed.dask_tune import ClusterError, cluster_measurer

    log = None if args.quiet else (lambda s: print(s, file=sys.stderr))
    try:
        with cluster_measurer(args.cluster, log=log) as make:
            yield make
    except ClusterError as exc:
        raise UsageError(str(exc)) from None


def run(args: argparse.Namespace) -> int:
    """Tune, print the report; exit 130 when interrupted (the results so far are kept)."""
    from nfc.passmanager import Timings
    from nfc.runtime.build import SettingError, tune_pipeline_for
    from nfc.runtime.tuning.cache import TuningCache
    from nfc.runtime.tuning.driver import TuneOptions, build_model, tune_module
    from nfc.runtime.tuning.measure import MeasureOptions
    from nfc.runtime.tuning.model import CacheError, Mode
    from nfc.runtime.tuning.report import PlotUnavailable, Progress, check_plotting, write_plot

    src = Path(args.file)
    if not src.exists():
        raise UsageError(f"no such file: '{src}'")
    for flag, value in (("--trials", args.trials), ("--population", args.population),
                        ("--patience", args.patience), ("--top", args.top)):
        if value is not None and value < 1:
            raise UsageError(f"{flag} must be at least 1")
    if args.target == "cuda":
        return _run_cuda(args, src)
    if args.simulate or args.arch:
        raise UsageError(f"{'--simulate' if args.simulate else '--arch'} applies to --target "
                         "cuda")
    if args.confirm < 0:
        raise UsageError("--confirm must be 0 or more")
    if args.time is not None and args.time <= 0:
        raise UsageError("--time must be positive")
    if not 0 <= args.min_share < 100:
        raise UsageError("--min-share is a percentage in [0, 100)")
    if args.plot:
        try:
            check_plotting()  # before the long run, not after it
        except PlotUnavailable as exc:
            raise UsageError(str(exc)) from None
    trials = args.trials if args.trials is not None else (None if args.time else 64)
    options = TuneOptions(
        trials=trials, time_budget=args.time, mode=Mode(args.mode),
        reproducible=args.reproducible, seed=args.seed, population=args.population,
        patience=args.patience, top=args.top, min_share=args.min_share / 100,
        order=args.order, measure=MeasureOptions(timeout=args.timeout),
        functions=tuple(args.functions), compare_step=args.compare_step,
        confirm=args.confirm)
    pipeline = tune_pipeline_for(src, args.pipeline, im2col=not args.no_im2col,
                                 layout=not args.no_layout)
    if args.db:
        pipeline = _with_db(pipeline, args.db)
    pm_options = pass_manager_options(args)
    if args.print_pipeline:
        print(pipeline)
        return 0
    if args.layout != "skip" and args.mode != "heuristic":
        code = _tune_layout(args, src, pipeline)
        if code is not None:
            return code
    timings = Timings()
    try:
        module = build_model(src, args.settings, pipeline, im2col=not args.no_im2col,
                             timings=timings, model=args.model, **pm_options)
    except SettingError as exc:
        raise UsageError(str(exc)) from None
    if args.time_passes:
        print(timings.report(), file=sys.stderr)
    missing = [f for f in args.functions if not module.has_func(f)]
    if missing:
        have = ", ".join(f.name for f in module.funcs)
        raise UsageError(f"no function {', '.join(missing)} in the module (has: {have})")
    try:
        cache = TuningCache(args.db) if args.db else TuningCache()
    except CacheError as exc:
        raise UsageError(str(exc)) from None
    with cache, _measurer(args) as make:
        if make is not None:
            options = dataclasses.replace(options, measurer=make)
        progress = Progress(0, trials, quiet=args.quiet)
        try:
            report = tune_module(module, cache, options=options, progress=progress,
                                 source=str(src))
        except CacheError as exc:  # damage met while tuning: what is recorded stays
            raise UsageError(str(exc)) from None
    print(report.table())
    if args.report:
        report.write_json(args.report)
        print(f"report: {args.report}", file=sys.stderr)
    if args.plot:
        write_plot(report, args.plot)
        print(f"plot: {args.plot}", file=sys.stderr)
    return 130 if report.interrupted else 0


def _with_db(pipeline: str, db: str) -> str:
    """`pipeline` with its `layout` pass reading the layout choice from the cache `db`."""
    from nfc.passmanager import build_pipeline, format_pipeline

    return format_pipeline([dataclasses.replace(p, db=db) if p.name == "layout" else p
                            for p in build_pipeline(pipeline)])


def _tune_layout(args: argparse.Namespace, src: Path, pipeline: str) -> int | None:
    """`--layout search|only`: measure and record the model's layout choice when the
    pipeline decides it (`layout{when=auto}`) and the model has a convolution; an exit code
    with `only`, else None (go on with the kernels)."""
    from nfc.passes.layout import conv_census
    from nfc.passmanager import build_pipeline
    from nfc.runtime.build import SettingError, frontend_module, pipeline_for
    from nfc.runtime.tuning.layout import tune_layout
    from nfc.runtime.tuning.model import CacheError
    from nfc.settings import parse_settings

    auto = any(p.name == "layout" and p.when == "auto" for p in build_pipeline(pipeline))
    why = ""
    if not auto:
        why = "the pipeline does not decide the layout (no layout{when=auto})"
    else:
        try:
            params, opt = parse_settings(list(args.settings))
            if not conv_census(frontend_module(src, params, opt, model=args.model)):
                why = "no convolution"
        except SettingError as exc:
            raise UsageError(str(exc)) from None
    if why:
        if args.layout == "only":
            raise UsageError(f"--layout only: nothing to choose: {why}")
        return None
    build = pipeline_for(src, args.pipeline, im2col=not args.no_im2col)
    try:
        won, medians = tune_layout(src, args.settings, model=args.model, pipeline=build,
                                   db=args.db)
    except CacheError as exc:
        raise UsageError(str(exc)) from None
    if not args.quiet:
        print("layout: " + ", ".join(f"{c} {t * 1e3:.3f} ms" for c, t in medians.items())
              + f" per train step; recorded: {won}", file=sys.stderr)
    return 0 if args.layout == "only" else None


def _run_cuda(args: argparse.Namespace, src: Path) -> int:
    """`--target cuda`: the genetic search over each compute's GPU schedule space, on the GPU
    (timed with CUDA events, recorded in the tuning cache under the GPU's category) or, with
    `--simulate`, on the simulator (stand-in costs, nothing recorded)."""
    import os

    from nfc.codegen.cuda.driver import CudaDriverError, NoDriverError
    from nfc.codegen.cuda.nvrtc import CudaToolchainError
    from nfc.runtime.build import SettingError, tune_pipeline_for
    from nfc.runtime.tuning.driver import build_model, training_functions
    from nfc.runtime.tuning.model import CacheError
    from nfc.runtime.tuning.search import SearchConfig

    simulate = args.simulate or os.environ.get("NFC_CUDA_SIMULATE", "") == "1"
    unsupported = [flag for flag, given in (
        ("--cluster", args.cluster), ("--compare-step", args.compare_step),
        ("--plot", args.plot), ("--mode", args.mode != "full"), ("--time", args.time),
        ("--top", args.top), ("--min-share", args.min_share),
        ("--reproducible", args.reproducible)) if given]
    if unsupported:
        raise UsageError(f"{', '.join(unsupported)}: not supported with --target cuda yet")
    pipeline = tune_pipeline_for(src, args.pipeline, im2col=not args.no_im2col,
                                 layout=not args.no_layout, target="cuda")
    if args.print_pipeline:
        print(pipeline)
        return 0
    device = None
    if not simulate:
        from nfc.codegen.cuda.driver import Device

        try:
            device = Device()
        except (NoDriverError, CudaToolchainError, CudaDriverError) as exc:
            raise UsageError(f"{exc}; --simulate (or NFC_CUDA_SIMULATE=1) runs the search on "
                             "the kernel simulator instead") from None
    try:
        module = build_model(src, args.settings, pipeline, im2col=not args.no_im2col,
                             model=args.model, **pass_manager_options(args))
    except SettingError as exc:
        raise UsageError(str(exc)) from None
    missing = [f for f in args.functions if not module.has_func(f)]
    if missing:
        have = ", ".join(f.name for f in module.funcs)
        raise UsageError(f"no function {', '.join(missing)} in the module (has: {have})")
    functions = list(args.functions) or training_functions(module)
    config = SearchConfig(population=args.population, trials=args.trials or 64,
                          patience=args.patience, seed=args.seed)
    log = (lambda s: None) if args.quiet else (lambda s: print(f"  {s}", file=sys.stderr))
    from nfc.runtime.tuning import gpu

    if args.arch and not simulate:
        raise UsageError("--arch applies to --simulate (on a GPU, the GPU's own is used)")
    if simulate:
        if args.arch:
            from nfc.codegen.cuda.nvrtc import nvrtc_version

            try:
                nvrtc_version()
            except CudaToolchainError as exc:
                raise UsageError(f"--arch compiles every candidate: {exc}") from None
        arch = args.arch or "sm_80"
        results = gpu.tune_kernels_gpu(
            module, functions,
            lambda op, space: gpu.SimMeasurer(op, space, arch=arch, nvrtc_arch=args.arch),
            config=config, progress=log)
        print(gpu.results_table(results, simulated=True))
        checked = f"; resources checked by NVRTC for {args.arch}" if args.arch else ""
        print(f"simulated ({arch}{checked}): {gpu.SimMeasurer.COST_NOTE}; nothing was "
              "written to the tuning cache", file=sys.stderr)
    else:
        from nfc.runtime.tuning.cache import TuningCache

        try:
            cache = TuningCache(args.db) if args.db else TuningCache()
        except CacheError as exc:
            raise UsageError(str(exc)) from None
        category = gpu.cuda_device_category(device)
        from nfc.runtime.tuning.gpu_worker import GpuWorker, WorkerDeviceMeasurer, worker_options
        from nfc.runtime.tuning.measure import MeasureSetupError

        options = worker_options(device)
        device.close()  # candidates run in a worker process, which owns the GPU's context
        with cache, GpuWorker(options) as worker:
            try:
                results = gpu.tune_kernels_gpu(
                    module, functions,
                    lambda op, space: WorkerDeviceMeasurer(op, worker, space),
                    config=config, cache=cache, category=category, progress=log)
            except (CacheError, MeasureSetupError) as exc:
                raise UsageError(str(exc)) from None
        print(gpu.results_table(results, simulated=False))
        print(f"cache: {getattr(cache, 'path', '')} ({category['device']}, "
              f"sm {category['compute_capability']})", file=sys.stderr)
    if args.report:
        from nfc.fsutil import atomic_write

        atomic_write(args.report, gpu.results_json(results, simulated=simulate).encode())
        print(f"report: {args.report}", file=sys.stderr)
    return 0
