"""`nfc compile`: a model into a self-contained shared library (or its IR, loops, LLVM).

    nfc compile model.nf -o model.so                 # forward, eval, train_step, init
    nfc compile model.nf -o model.so --set batch=32 --set opt.lr=0.01
    nfc compile model.nf --emit=ir                   # the IR handed to codegen
    nfc compile model.nf --emit=loops                # every kernel's loop nest
    nfc compile model.nf --emit=llvm -o model.ll     # LLVM IR after O3
    nfc compile model.nf -o model.so --profile       # kernel timing for `nfc train --profile`
    nfc compile model.so --emit=header -o model.h    # the C header of a built library

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

EMITS = ("so", "ir", "loops", "llvm", "header")


def add_parser(subparsers: Any) -> None:
    """Register `nfc compile`."""
    p = subparsers.add_parser("compile", help="compile a model into a shared library",
                              description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file", help="a .nf model or a .nfir module")
    p.add_argument("-o", "--output", help="output path (default: <model>.so; for --emit "
                   "other than so: standard output)")
    p.add_argument("--emit", choices=EMITS, default="so", help="what to write (default: so)")
    p.add_argument("--set", dest="settings", action="append", default=[], metavar="K=V",
                   help="a model parameter, or opt.<name> for the optimizer (repeatable)")
    p.add_argument("-p", "--pipeline", default=None,
                   help="passes run before codegen (default: inline,canonicalize,cse,dce)")
    p.add_argument("--function", dest="functions", action="append", default=[],
                   metavar="NAME", help="compile only this function (repeatable)")
    p.add_argument("--profile", action="store_true",
                   help="time every kernel call (for nfc train --profile)")
    p.add_argument("--no-tuning", action="store_true",
                   help="ignore tuned schedules of the tuning cache (nfc tune)")
    p.add_argument("--no-fuse", action="store_true",
                   help="one kernel per compute: skip the fuse pass (run after -p and the "
                        "tuned schedules)")
    p.add_argument("--no-im2col", action="store_true",
                   help="keep convolutions as loop nests: skip the im2col pass, which gathers "
                        "their windows into columns before autodiff (less memory)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Compile and write the requested output."""
    from nfc.codegen.artifact.container import is_library_path
    from nfc.runtime.build import (
        DEFAULT_PIPELINE,
        FUSE_PIPELINE,
        SettingError,
        apply_tuning,
        build_library,
        check_model_source,
        model_module,
        parse_settings,
        run_pipeline,
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
        return _write(args.output, c_header(meta))
    try:
        check_model_source(src)
        params, opt = parse_settings(args.settings)
    except (SettingError, ArtifactError) as exc:
        raise UsageError(str(exc)) from None
    module = model_module(src, params, opt, im2col=not args.no_im2col)
    run_pipeline(module, DEFAULT_PIPELINE if args.pipeline is None else args.pipeline)
    if args.functions:
        missing = [f for f in args.functions if not module.has_func(f)]
        if missing:
            have = ", ".join(f.name for f in module.funcs)
            raise UsageError(f"no function {', '.join(missing)} in the module (has: {have})")
    funcs = args.functions or None
    note = "" if args.no_tuning or args.emit == "ir" else apply_tuning(module)
    if not args.no_fuse:
        run_pipeline(module, FUSE_PIPELINE)
    if args.emit == "ir":
        from nfc.printer import print_module

        return _write(args.output, print_module(module))
    if args.emit in ("loops", "llvm", "header"):
        from nfc.codegen.artifact import build_artifact
        from nfc.codegen.artifact.header import c_header

        art = build_artifact(module, functions=funcs, profile=args.profile)
        text = {"loops": art.loops_text, "llvm": art.llvm_ir,
                "header": lambda: c_header(art.metadata)}[args.emit]()
        return _write(args.output, text)
    out = args.output or str(src.with_suffix(".so"))
    _check_writable(out)
    built = build_library(module, out, profile=args.profile, use_cache=False, functions=funcs)
    meta = built.artifact.metadata
    print(f"wrote {out}", file=sys.stderr)
    if note:
        print(f"  {note}", file=sys.stderr)
    for name, fm in meta["functions"].items():
        print(f"  {name}: {len(fm['kernels'])} kernels, arena {fm['arena_bytes']:,} bytes "
              f"(without reuse {fm['naive_bytes']:,}), {fm['copies']} copies", file=sys.stderr)
    n_tensors = sum(1 for _ in meta["tensors"])
    print(f"  init: {n_tensors} tensors, seeded ({meta['init']['generator'].split(':')[0]})",
          file=sys.stderr)
    return 0


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
