"""`nfc train`: train a model natively, one library call per step.

    nfc train examples/mlp_digits.nf --data digits --epochs 10
    nfc train model.so --data synthetic --epochs 2 --metrics m.jsonl --plot loss.png
    nfc train model.nf --data digits --checkpoint ckpt/ --every 50      # later: --resume
    nfc train model.nf --data mnist1d --profile --trace trace.json --threads 2
    nfc train examples/models/lstm_lm.nf --max-steps 200    # --data auto: text, next chars
    nfc train examples/mlp.nf --workers 2 --batch 64        # data-parallel: 2 MPI ranks
    nfc train examples/mlp.nf --target cuda                 # on an NVIDIA GPU (docs/cuda.md)
    nfc train examples/mlp.nf --target cuda --simulate --batch 4 --max-steps 3   # no GPU

Data sets: digits (scikit-learn), mnist1d (pip install mnist1d), text (Python's docs),
synthetic; `auto` (the default) picks the one that fits the model's inputs: digits for float
features (flat, images, sequences of rows; resized, channels replicated), text for token ids
(next character, or next characters at every position for language models). Batches are
shuffled every epoch with --seed; the last partial batch is dropped. Idle OpenMP threads
sleep (OMP_WAIT_POLICY=passive) unless OMP_WAIT_POLICY or GOMP_SPINCOUNT is set.
Parameters start from the model's initializers with --seed (or from the last checkpoint with
--resume, which continues bit-exactly). --compare-torch also times the same step in PyTorch
eager (MLP models: linear layers with ReLU and softmax cross-entropy) and shows the ratio.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any

from nfc.cli import UsageError
from nfc.cli.pipeline_args import (
    add_build_option_arguments,
    add_build_pipeline_arguments,
    add_model_argument,
    build_flags,
    build_options_given,
    pass_manager_options,
    with_build_options,
)

#: `--epochs` when only `--max-steps` bounds the run: the steps end it first.
UNTIL_MAX_STEPS = 1 << 30


def add_parser(subparsers: Any) -> None:
    """Register `nfc train`."""
    p = subparsers.add_parser("train", help="train a model (native steps)", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file", help="a .nf model, a .nfir module or a compiled .so")
    p.add_argument("--data", default="auto",
                   help="auto, digits, mnist1d, text or synthetic (default: auto, from the "
                   "model's input shapes)")
    p.add_argument("--resize", choices=("bilinear", "nearest"), default="bilinear",
                   help="how images are resized to the model's input (default: bilinear)")
    p.add_argument("--epochs", type=int, default=None,
                   help="passes over the training data (default 1; with --max-steps, as many "
                   "as the steps take)")
    p.add_argument("--batch", type=int, default=None,
                   help="batch size (sets the model parameter `batch` when compiling)")
    p.add_argument("--lr", type=float, default=None, help="learning rate (opt.lr)")
    p.add_argument("--seed", type=int, default=0, help="initialisation and data-order seed")
    p.add_argument("--set", dest="settings", action="append", default=[], metavar="K=V",
                   help="a model parameter, or opt.<name> for the optimizer (repeatable)")
    p.add_argument("--metrics", metavar="FILE.jsonl", help="write metrics as JSON lines")
    p.add_argument("--plot", metavar="FILE.png", help="plot the loss curve")
    p.add_argument("--checkpoint", metavar="DIR", help="save checkpoints in DIR")
    p.add_argument("--every", type=int, default=0, metavar="N",
                   help="checkpoint every N steps (default: every epoch)")
    p.add_argument("--keep", type=int, default=3,
                   help="checkpoints kept (default 3; 0: all)")
    p.add_argument("--resume", action="store_true",
                   help="continue from the newest intact checkpoint in --checkpoint DIR")
    p.add_argument("--overwrite-checkpoints", action="store_true",
                   help="start from scratch even if --checkpoint DIR holds checkpoints "
                        "(they are replaced)")
    p.add_argument("--profile", action="store_true", help="per-kernel time table")
    p.add_argument("--trace", metavar="FILE.json",
                   help="with --profile: Chrome trace path (default nfc-trace.json)")
    p.add_argument("--threads", type=int, default=None,
                   help="threads of parallel loops (default: 1 for steps under 32 MFLOP, "
                   "else every core)")
    p.add_argument("--max-steps", type=int, default=None, help="stop after this many steps")
    p.add_argument("--step-delay", type=float, default=0.0, metavar="SEC",
                   help="sleep after each step (testing interruption, demos)")
    p.add_argument("--no-cache", action="store_true", help="always rebuild the library")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.add_argument("--no-eval", action="store_true",
                   help="skip the test-split evaluation after each epoch (short runs)")
    p.add_argument("--compare-torch", action="store_true",
                   help="time the same step in PyTorch eager, when installed")
    p.add_argument("--mode", choices=("static", "dynamic"), default="static",
                   help="dynamic: start at once on the cached schedules, search better "
                   "kernels in the background and swap verified libraries in between steps "
                   "(docs/dynamic.md)")
    p.add_argument("--explore-threads", type=int, default=1, metavar="N",
                   help="with --mode dynamic: cores for the background search (default 1; "
                   "training is pinned to the others; 0: no search)")
    p.add_argument("--reproducible", action="store_true",
                   help="with --mode dynamic: only bitwise-reproducible schedules")
    p.add_argument("--explore-budget", default=None, metavar="PCT",
                   help="with --mode dynamic: stop the search once it has cost training more "
                   "than its swaps won plus PCT of the run's training time (default 10%%; "
                   "a fraction such as 0.1 also works; none: never stop it)")
    p.add_argument("--explore-trials", type=int, default=None, metavar="N",
                   help="with --mode dynamic: candidates per kernel in the first search "
                   "round (default 24; later rounds double it)")
    p.add_argument("--explore-top", type=int, default=None, metavar="K",
                   help="with --mode dynamic: kernels searched, largest share first "
                   "(default 4)")
    p.add_argument("--plot-steps", metavar="FILE.png",
                   help="plot the step time over the run (swaps marked in dynamic mode)")
    p.add_argument("--target", choices=("cpu", "cuda"), default="cpu",
                   help="cpu (default) or cuda: compile the model for an NVIDIA GPU and train "
                   "there (a CUDA artifact .so trains on the GPU whatever the target)")
    p.add_argument("--simulate", action="store_true",
                   help="with a CUDA model: run every kernel on the kernel simulator instead "
                   "of a GPU (slow: tiny models, a few steps; also NFC_CUDA_SIMULATE=1)")
    g = p.add_argument_group("data-parallel training (under mpiexec; docs/distributed.md)")
    g.add_argument("--workers", type=int, default=None, metavar="N",
                   help="run on N local MPI ranks (mpiexec -n N nfc train ...); --batch is "
                   "per rank")
    g.add_argument("--bucket-kb", type=int, default=25600, metavar="KB",
                   help="gradient bucket size of the all-reduce (default 25600)")
    g.add_argument("--compress", choices=("none", "fp16", "bf16"), default="none",
                   help="send gradients in 16 bits with error feedback (default none)")
    g.add_argument("--bn", choices=("local", "sync"), default="local",
                   help="batch norm per rank (local, default) or synchronised over the global "
                   "batch (sync, as SyncBatchNorm)")
    g.add_argument("--no-overlap", action="store_true",
                   help="run each all-reduce at its op instead of during the rest of the "
                   "backward")
    add_build_option_arguments(p)
    add_model_argument(p)
    add_build_pipeline_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Train and print a summary."""
    from nfc.runtime.build import SettingError, pipeline_for
    from nfc.runtime.checkpoint import CheckpointError
    from nfc.runtime.data import DataError
    from nfc.runtime.distributed import DistributedError, launched_rank
    from nfc.runtime.loader import ArtifactError
    from nfc.runtime.train import TrainConfig, TrainError, train

    if args.epochs is not None and args.epochs < 1:
        raise UsageError("--epochs must be at least 1")
    if args.max_steps is not None and args.max_steps < 1:
        raise UsageError("--max-steps must be at least 1")
    epochs = args.epochs or (UNTIL_MAX_STEPS if args.max_steps else 1)
    flags = build_flags(args)
    pm_options = pass_manager_options(args)
    if build_options_given(args):  # precision / compress-activations / remat join the pipeline
        args.pipeline = _with_build_options(args, flags)
    if args.print_pipeline or args.pipeline is not None:
        from nfc.codegen.artifact.container import is_library_path

        if is_library_path(args.file):
            raise UsageError(f"'{args.file}' is already compiled: no pipeline runs "
                             "(-p and --print-pipeline apply to model files)")
        pipeline = pipeline_for(args.file, args.pipeline, **flags,  # a bad -p fails here
                                target=args.target)
        if args.print_pipeline:
            print(pipeline)
            return 0
    if args.simulate and args.target != "cuda":
        from nfc.codegen.artifact.container import is_library_path

        if not is_library_path(args.file):
            raise UsageError("--simulate applies to --target cuda (or a CUDA artifact)")
    if args.target == "cuda" and (args.workers is not None or args.mode != "static"
                                  or args.profile or args.compare_torch):
        raise UsageError("--workers, --mode dynamic, --profile and --compare-torch are not "
                         "supported with --target cuda yet")
    if args.workers is not None:
        return _launch_workers(args)
    if args.every < 0:
        raise UsageError("--every must be >= 0")
    if args.keep < 0:
        raise UsageError("--keep must be >= 0 (0 keeps every checkpoint)")
    cfg = TrainConfig(
        source=args.file, data=args.data, resize=args.resize, epochs=epochs,
        batch=args.batch, lr=args.lr,
        seed=args.seed, settings=tuple(args.settings), metrics=args.metrics, plot=args.plot,
        checkpoint=args.checkpoint, every=args.every, resume=args.resume,
        overwrite=args.overwrite_checkpoints,
        profile=args.profile, trace=(args.trace or "nfc-trace.json") if args.profile else None,
        threads=args.threads, progress=not args.quiet, step_delay=args.step_delay,
        max_steps=args.max_steps, use_cache=not args.no_cache, keep=args.keep,
        pipeline=args.pipeline, **flags, **pm_options, time_passes=args.time_passes,
        model=args.model,
        evaluate=not args.no_eval, mode=args.mode, dynamic=_dynamic_options(args),
        distributed=_dist_options(args), target=args.target, simulate=args.simulate)
    steps_metrics = None
    if args.plot_steps and not args.metrics:  # the plot reads the step times from metrics
        import tempfile

        fd, steps_metrics = tempfile.mkstemp(prefix="nfc-steps-", suffix=".jsonl")
        os.close(fd)
        cfg.metrics = steps_metrics
    try:
        with _sleeping_omp_threads():
            res = train(cfg)
        if args.plot_steps:
            from nfc.runtime.dynamic.plot import plot_step_times

            plot_step_times(cfg.metrics, args.plot_steps)
    except (TrainError, DataError, ArtifactError, SettingError, CheckpointError,
            DistributedError) as exc:
        raise UsageError(str(exc)) from None
    finally:
        if steps_metrics is not None:
            os.unlink(steps_metrics)
    if launched_rank() > 0:  # data-parallel: rank 0 reports
        return 0
    losses = res.losses
    how = "cached" if res.cached else "built"
    print(f"data: {res.data_note or res.data}")
    print(f"compile: {res.compile_seconds:.2f} s ({how})")
    if losses:
        k = max(1, min(10, len(losses) // 4))
        first, last = sum(losses[:k]) / k, sum(losses[-k:]) / k
        print(f"loss: {first:.4f} (first {k} steps) -> {last:.4f} (last {k} steps)")
    rate = 1.0 / max(res.step_seconds, 1e-12)
    plural = "s" if res.threads > 1 else ""
    print(f"steps: {res.steps} in {res.epochs:.3g} epoch(s); step time "
          f"{res.step_seconds * 1e3:.3f} ms (median, {rate:.0f} steps/s, {res.threads} "
          f"thread{plural})")
    if res.test_accuracy is not None:
        print(f"test accuracy: {res.test_accuracy * 100:.2f}%")
    if res.test_loss is not None:
        print(f"test loss: {res.test_loss:.4f}")
    if res.dynamic is not None:
        for line in res.dynamic.lines():
            print(line)
    if res.profile is not None:
        print(res.profile.table())
        print(f"chrome trace: {cfg.trace}")
    if args.compare_torch:
        _compare_torch(res, res.threads)
    return 0


def _dist_options(args: argparse.Namespace) -> Any:
    from nfc.runtime.distributed import DistOptions

    if args.bucket_kb < 1:
        raise UsageError("--bucket-kb must be at least 1")
    return DistOptions(bucket_kb=args.bucket_kb, compress=args.compress, bn=args.bn,
                       overlap=not args.no_overlap)


def _launch_workers(args: argparse.Namespace) -> int:
    """`--workers N`: this command again under `mpiexec -n N`, without `--workers`."""
    from nfc.runtime.distributed import DistributedError, launch, launched_size

    if args.workers < 1:
        raise UsageError("--workers must be at least 1")
    if launched_size() > 1:
        raise UsageError("--workers launches mpiexec itself; under mpiexec leave it out")
    if "train" not in sys.argv:
        raise UsageError("--workers relaunches this command line: run it as `nfc train ...`")
    argv = list(sys.argv[sys.argv.index("train"):])
    out: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
        elif a == "--workers":
            skip = True
        elif not a.startswith("--workers="):
            out.append(a)
    try:
        return launch(args.workers, out, threads=args.threads)
    except DistributedError as exc:
        raise UsageError(str(exc)) from None


def _dynamic_options(args: argparse.Namespace) -> Any:
    budget = {k: v for k, v in (("trials", args.explore_trials), ("top", args.explore_top))
              if v is not None}
    if args.mode != "dynamic":
        if args.explore_threads != 1 or args.reproducible or budget \
                or args.explore_budget is not None:
            raise UsageError("--explore-threads, --explore-trials, --explore-top, "
                             "--explore-budget and --reproducible apply to --mode dynamic")
        return None
    if args.explore_threads < 0:
        raise UsageError("--explore-threads must be >= 0")
    if any(v < 1 for v in budget.values()):
        raise UsageError("--explore-trials and --explore-top must be >= 1")
    from nfc.runtime.dynamic import DynamicOptions

    if args.explore_budget is not None:
        from nfc.runtime.dynamic.session import parse_budget

        try:
            budget["budget"] = parse_budget(args.explore_budget)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    return DynamicOptions(explore_threads=args.explore_threads, reproducible=args.reproducible,
                          seed=args.seed, **budget)


@contextlib.contextmanager
def _sleeping_omp_threads() -> Iterator[None]:
    """Let idle OpenMP threads sleep rather than spin, unless the user chose
    (`OMP_WAIT_POLICY`, `GOMP_SPINCOUNT`). On a busy machine a spinning thread takes the core
    its team-mate needs: a 2-thread MobileNet step (batch 8) took 2.3 s spinning and 20 ms
    sleeping with the 2 cores shared by ~10 runnable processes, while sleeping costs
    microseconds per parallel region on an idle machine. libgomp reads the variable when it is
    first loaded (with the model library, inside); the environment is restored afterwards so
    that processes started later (and in-process callers) see their own."""
    if "OMP_WAIT_POLICY" in os.environ or "GOMP_SPINCOUNT" in os.environ:
        yield
        return
    os.environ["OMP_WAIT_POLICY"] = "passive"
    try:
        yield
    finally:
        os.environ.pop("OMP_WAIT_POLICY", None)


def _compare_torch(res: Any, threads: int) -> None:
    from nfc.runtime.torch_ref import TorchUnavailable, compare_step

    try:
        cmp = compare_step(res.model, threads=threads)
    except TorchUnavailable as exc:
        print(f"pytorch: {exc}; comparison skipped", file=sys.stderr)
        return
    print(f"pytorch eager step: {cmp.torch_s * 1e3:.3f} ms vs nfc {cmp.nfc_s * 1e3:.3f} ms "
          f"on {cmp.threads} thread(s): nfc is {cmp.torch_s / cmp.nfc_s:.2f}x PyTorch's speed "
          f"(same batch, same initial parameters: loss {cmp.nfc_loss:.6f} vs "
          f"{cmp.torch_loss:.6f})")


def _with_build_options(args: argparse.Namespace, flags: dict[str, bool]) -> str:
    """The build pipeline with the passes --precision, --compress-activations and
    --memory-budget add (nfc.cli.pipeline_args.with_build_options)."""
    from nfc.codegen.artifact.container import is_library_path
    from nfc.runtime.build import pipeline_for

    if is_library_path(args.file):
        raise UsageError(f"'{args.file}' is already compiled: --precision, --memory-budget and "
                         "--compress-activations apply to model files")
    return with_build_options(pipeline_for(args.file, args.pipeline, **flags,
                                           target=args.target), args)
