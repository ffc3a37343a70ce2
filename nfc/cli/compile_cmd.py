"""`nfc compile`: a model into a self-contained shared library (or its IR, loops, LLVM).

    nfc compile model.nf -o model.so                 # forward, eval, train_step, init
    nfc compile model.nf -o model.so --set batch=32 --set opt.lr=0.01
    nfc compile model.nf --emit=ir                   # the IR handed to codegen
    nfc compile model.nf --db team.sqlite            # tuned schedules from this cache file
    nfc compile model.nf --emit=loops                # every kernel's loop nest
    nfc compile model.nf --emit=llvm -o model.ll     # LLVM IR after O3
    nfc compile model.nf -o model.so --profile       # kernel timing for `nfc train --profile`
    nfc compile model.so --emit=header -o model.h    # the C header of a built library
    nfc compile model.nf --target cuda --emit=cuda   # CUDA C of every kernel (docs/cuda.md)
    nfc compile model.nf --target cuda -o model.so   # a CUDA artifact: cubins, PTX, the step
    nfc compile model.nf --target cuda --simulate    # one training step on the kernel simulator
    nfc compile model.nf --print-pipeline            # the pipeline run after the frontend
    nfc compile model.nf -p 'im2col,training-functions,inline,cse' --print-ir-after-all

After the frontend, the module goes through one pass pipeline (docs/runtime.md, "Pipeline"):
by default `im2col,training-functions,inline,canonicalize,cse,dce,apply-tuning,fuse`, whose
`--no-im2col`, `--no-tuning`, `--no-fuse` remove a pass; `-p` replaces it and `--pass NAME`
appends one (as in `nfc opt`). `--emit=ir` prints the IR codegen gets, tuned schedules
included; `--db PATH` reads them from that tuning cache file (as `nfc tune --db`).
`--set` takes model parameters (`batch=32`) and optimizer hyperparameters as `opt.<name>`.
The library exports a C ABI (docs/runtime.md); load it with `nfc.load("model.so")` or link it
from C (examples/c_driver).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from nfc.cli import UsageError
from nfc.cli.pipeline_args import (
    add_build_option_arguments,
    add_build_pipeline_arguments,
    add_model_argument,
    build_flags,
    pass_manager_options,
    with_build_options,
)

EMITS = ("so", "ir", "loops", "llvm", "header", "cuda", "cuda-loops")


def add_parser(subparsers: Any) -> None:
    """Register `nfc compile`."""
    p = subparsers.add_parser("compile", help="compile a model into a shared library",
                              description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file", help="a .nf model or a .nfir module")
    p.add_argument("-o", "--output", help="output path (default: <model>.so; for --emit "
                   "other than so: standard output)")
    p.add_argument("--emit", choices=EMITS, default="so", help="what to write (default: so)")
    p.add_argument("--target", choices=("cpu", "cuda"), default="cpu",
                   help="cpu (default) or cuda: a CUDA artifact (NVRTC cubins for sm_80 and "
                   "sm_90, PTX, the step's launches; nfc.load opens it on a GPU), or "
                   "--emit=cuda|cuda-loops")
    p.add_argument("--simulate", action="store_true",
                   help="with --target cuda: run one training step (else forward) of the "
                   "compiled model on the kernel simulator and print the loss (writes the "
                   "artifact only with -o)")
    p.add_argument("--set", dest="settings", action="append", default=[], metavar="K=V",
                   help="a model parameter, or opt.<name> for the optimizer (repeatable)")
    p.add_argument("--function", dest="functions", action="append", default=[],
                   metavar="NAME", help="compile only this function (repeatable)")
    p.add_argument("--profile", action="store_true",
                   help="time every kernel call (for nfc train --profile)")
    p.add_argument("--pass", dest="passes", action="append", default=[], metavar="NAME",
                   help="append a pass (with options: 'name{k=v}') to the pipeline; repeatable")
    p.add_argument("--db", metavar="PATH",
                   help="tuning cache file the apply-tuning pass reads (default: "
                        "$NFC_CACHE_DIR/tuning.sqlite, as nfc tune --db)")
    add_build_option_arguments(p)
    add_model_argument(p)
    add_build_pipeline_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Compile and write the requested output."""
    from nfc.codegen.artifact.container import is_library_path
    from nfc.passmanager import Timings
    from nfc.runtime.build import (
        SettingError,
        build_module,
        check_model_source,
        parse_settings,
    )
    from nfc.runtime.loader import ArtifactError

    src = Path(args.file)
    if not src.exists():
        raise UsageError(f"no such file: '{src}'")
    if is_library_path(src):
        from nfc.codegen.artifact.header import c_header
        from nfc.runtime.loader import read_metadata

        try:  # from the checked metadata: the library is not loaded
            meta = read_metadata(src)
        except ArtifactError as exc:
            raise UsageError(str(exc)) from None
        if args.emit != "header":
            raise UsageError("a .so is already compiled; it only gives --emit=header")
        if meta["target"].get("kind") == "cuda":
            raise UsageError(f"'{src}' is a CUDA artifact: it has no C ABI to give a header "
                             "for (open it with nfc.load)")
        return _write(args.output, c_header(meta))
    try:
        check_model_source(src)
        params, opt = parse_settings(args.settings)
    except (SettingError, ArtifactError) as exc:
        raise UsageError(str(exc)) from None
    pipeline = _pipeline(args, src)
    pm_options = pass_manager_options(args)
    if args.print_pipeline:
        print(pipeline)
        return 0
    timings = Timings()
    module, ctx = build_module(src, params, opt, pipeline, timings=timings, model=args.model,
                               **pm_options)
    if args.functions:
        missing = [f for f in args.functions if not module.has_func(f)]
        if missing:
            have = ", ".join(f.name for f in module.funcs)
            raise UsageError(f"no function {', '.join(missing)} in the module (has: {have})")
    funcs = args.functions or None
    notes = [ctx.remarks.get("apply-tuning", ""),  # and the fusion reward's device parameters
             *(f"fuse: {r}" for r in [ctx.remarks.get("fuse", "")] if r),
             *(f"layout: {r}" for r in [ctx.remarks.get("layout", "")] if r)]
    code = _emit(args, src, module, funcs, "\n  ".join(n for n in notes if n), timings)
    if args.time_passes:
        print(timings.report(), file=sys.stderr)
    return code


def _pipeline(args: argparse.Namespace, src: Path) -> str:
    """The build pipeline (`-p` or the default, less the `--no-*` passes), then the `--pass`
    passes; `--db` given to its `apply-tuning`."""
    import dataclasses

    from nfc.passmanager import build_pipeline, format_pipeline
    from nfc.runtime.build import FLAG_PASSES, pipeline_for

    pipeline = ",".join(p for p in [pipeline_for(src, args.pipeline, **build_flags(args),
                                                 target=args.target),
                                     *args.passes] if p)
    pipeline = with_build_options(pipeline, args)
    if args.db is None:
        return pipeline
    passes = build_pipeline(pipeline)
    tuning = FLAG_PASSES["tuning"]
    if not any(p.name == tuning for p in passes):
        raise UsageError(f"--db: the pipeline has no {tuning} pass to read it "
                         f"({pipeline or 'empty'})")
    return format_pipeline([dataclasses.replace(p, db=args.db)
                            if p.name in (tuning, "layout") else p for p in passes])


def _emit(args: argparse.Namespace, src: Path, module: Any, funcs: list[str] | None, note: str,
          timings: Any) -> int:
    """Write what `--emit` asks for, from the module the pipeline made."""
    import time

    from nfc.runtime.build import build_library

    t0 = time.perf_counter()
    if args.emit == "ir":
        from nfc.printer import print_module

        return _write(args.output, print_module(module))
    if args.target == "cuda" or args.emit in ("cuda", "cuda-loops"):
        from nfc.codegen.cuda.program import CUDA_EMITS, emit_text

        if args.emit == "so" and args.target == "cuda":
            return _compile_cuda(args, src, module, funcs)
        if args.emit not in CUDA_EMITS:
            raise UsageError("--target cuda writes a CUDA artifact (-o model.so), "
                             "--emit=cuda or --emit=cuda-loops")
        if args.simulate:
            raise UsageError("--simulate runs the compiled model: leave out --emit")
        return _write(args.output, emit_text(module, funcs, args.emit))
    if args.simulate:
        raise UsageError("--simulate applies to --target cuda")
    if args.emit in ("loops", "llvm", "header"):
        from nfc.codegen.artifact import build_artifact
        from nfc.codegen.artifact.header import c_header

        art = build_artifact(module, functions=funcs, profile=args.profile)
        text = {"loops": art.loops_text, "llvm": art.llvm_ir,
                "header": lambda: c_header(art.metadata)}[args.emit]()
        timings.add("codegen", time.perf_counter() - t0)
        return _write(args.output, text)
    out = args.output or str(src.with_suffix(".so"))
    _check_writable(out)
    built = build_library(module, out, profile=args.profile, use_cache=False, functions=funcs)
    timings.add("codegen", time.perf_counter() - t0)
    meta = built.artifact.metadata
    print(f"wrote {out}", file=sys.stderr)
    if note:
        print(f"  {note}", file=sys.stderr)
    for name, fm in meta["functions"].items():
        print(f"  {name}: {len(fm['kernels'])} kernels, arena {fm['arena_bytes']:,} bytes "
              f"(without reuse {fm['naive_bytes']:,}), {fm['copies']} copies", file=sys.stderr)
        plan = built.artifact.plans.get(name) if built.artifact is not None else None
        if plan is not None:
            print(f"    memory: {plan.memory_report().summary()}", file=sys.stderr)
    n_tensors = sum(1 for _ in meta["tensors"])
    print(f"  init: {n_tensors} tensors, seeded ({meta['init']['generator'].split(':')[0]})",
          file=sys.stderr)
    return 0


def _compile_cuda(args: argparse.Namespace, src: Path, module: Any,
                  funcs: list[str] | None) -> int:
    """`--target cuda`: the CUDA artifact (-o), and with `--simulate` one step of it on the
    simulator."""
    from nfc.codegen.cuda.nvrtc import CudaToolchainError, NvrtcError
    from nfc.runtime.cuda_load import cuda_artifact

    if args.profile:
        raise UsageError("--profile is not supported with --target cuda yet")
    out = args.output or (None if args.simulate else str(src.with_suffix(".so")))
    if out is not None:
        _check_writable(out)
    from nfc.runtime.cuda_load import tuned_gpu_schedules

    choices, note = ({}, "GPU schedules: defaults (--no-tuning)") if args.no_tuning else \
        tuned_gpu_schedules(module, args.db)
    try:
        art = cuda_artifact(module, functions=funcs, schedules=choices,
                            compile=out is not None)
    except (CudaToolchainError, NvrtcError) as exc:
        raise UsageError(str(exc)) from None
    if out is not None:
        art.write(out)
        sizes = ", ".join(f"{k} {len(v):,} bytes" for k, v in sorted(art.payload.images.items()))
        print(f"wrote {out} (CUDA: {len(art.step.kernels)} kernels; {sizes})", file=sys.stderr)
        print(f"  {note}", file=sys.stderr)
        for name, fm in art.metadata["functions"].items():
            print(f"  {name}: {len(fm['kernels'])} launches, arena {fm['arena_bytes']:,} "
                  f"bytes (without reuse {fm['naive_bytes']:,})", file=sys.stderr)
    if args.simulate:
        _simulate_one_step(art.step)
    return 0


def _simulate_one_step(step: Any) -> None:
    """One call of train_step (else forward) on the kernel simulator with seeded random
    inputs (integer inputs zero: in range as labels and indices); prints the loss."""
    import time

    import numpy as np

    from nfc.runtime.cuda_load import open_step

    model = open_step(step, simulate=True)
    try:
        name = next((f for f in ("train_step", "forward") if f in model.functions), None)
        if name is None:
            raise UsageError("--simulate: the model has no train_step or forward")
        model.init(0)
        fn = model.functions[name]
        rng = np.random.default_rng(0)
        feeds = {a.name: (rng.standard_normal(a.shape).astype(a.dtype)
                          if np.dtype(a.dtype).kind == "f" else np.zeros(a.shape, a.dtype))
                 for a in fn.inputs}
        t0 = time.perf_counter()
        res = fn(**feeds)
        secs = time.perf_counter() - t0
    finally:
        model.close()
    shown = ", ".join(f"{k} {float(v):.6f}" for k, v in res.items() if np.ndim(v) == 0)
    print(f"simulated {name} (seed 0, random inputs): {shown or 'no scalar results'} "
          f"({len(fn.meta['kernels'])} launches, {secs:.2f} s on the simulator)")


def _write(path: str | None, text: str) -> int:
    """Text to standard output, or to `path` atomically (a unique temporary name, then a
    rename: concurrent writers never mix their outputs)."""
    if path in (None, "-"):
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
    else:
        from nfc.codegen.artifact.container import default_mode
        from nfc.fsutil import atomic_write

        _check_writable(path)
        atomic_write(path, text.encode("utf-8"), default_mode(executable=False))
    return 0


def _check_writable(path: str) -> None:
    """A usage error, before any work, when `path` cannot be written (the file is created
    beside it under a temporary name, then renamed)."""
    p = Path(path)
    parent = p.parent if str(p.parent) else Path(".")
    if p.is_dir():
        raise UsageError(f"cannot write '{path}': it is a directory")
    if not parent.is_dir():
        raise UsageError(f"cannot write '{path}': no such directory '{parent}'")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"cannot write '{path}': directory '{parent}' is not writable")
