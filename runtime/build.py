"""From a model file to a loaded artifact: the build behind `nfc compile`, `nfc train`,
`nfc bench`, `nfc tune` and `compile_model`/`load_model`.

    source (.nf)  --frontend (training and evaluation modes)-->  @forward [, @eval]
    source (.nfir) is parsed as it is (already a module of IR functions)
                  --the build pipeline, run by the pass manager-->
                      layout{when=auto},im2col,training-functions,inline,canonicalize,cse,dce,
                      apply-tuning,fuse
                  --nfc.codegen.artifact-->  LLVM  --cc -shared-->  model.so

Everything after the frontend is one pipeline string (`BUILD_PIPELINE`), so the tools see it:
`--print-pipeline` prints the exact string a command will run (`pipeline_for`: the default,
or `-p`, less the passes `--no-layout`, `--no-im2col`, `--no-tuning`, `--no-fuse` remove; a
`.nfir` module skips the passes that build a model's functions), `-p` replaces it,
`--print-ir-after-all` and `--time-passes` watch it, and the verifier runs after every pass.
`nfc tune` runs the part before `apply-tuning` (`tune_pipeline_for`): the kernels it measures
are the ones that pass looks up (and first records the model's layout choice, which
`layout{when=auto}` then reads: nfc.runtime.tuning.layout). Kernels take their tuned
schedules from this machine's tuning cache in `apply-tuning` (nfc.runtime.tuning.apply_pass).

`--set k=v` settings are model parameters (`batch=32`), or optimizer hyperparameters spelled
`opt.<name>` (`opt.lr=0.01`, `opt.name=adam`); nfc.settings parses them. Built libraries are
cached by the hash of the final IR, the target CPU and the build options (`NFC_CACHE_DIR`,
default ~/.cache/nfc), so training the same model again skips LLVM; a cached library is
checked before use and rebuilt when damaged (`build_library`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nfc import __version__
from nfc.fsutil import private_dir, remove_stale_temporaries
from nfc.ir import Module
from nfc.settings import SettingError, apply_optimizer, parse_settings, parse_value

__all__ = [
    "BUILD_PIPELINE", "CLEANUP_PIPELINE", "DEFAULT_PIPELINE", "DEVICE_PARAMS_ENV",
    "FUSE_PIPELINE", "LAYOUT_PIPELINE", "MODEL_PIPELINE", "TARGETS", "Built", "SettingError",
    "apply_tuning", "build_library", "build_module", "check_model_source", "compile_model",
    "device_params_for", "frontend_module", "load_model", "model_module",
    "module_key", "parse_settings", "parse_value", "pipeline_for", "run_pipeline",
    "tune_pipeline_for",
]

#: The passes that make a model's functions from the frontend's `@forward`: convolution
#: windows gathered into columns before autodiff (so the gradients are GEMMs as well), then
#: `@train_step` and `@eval`. Run on `.nf` models only: a `.nfir` module is taken as it is.
MODEL_PIPELINE = "im2col,training-functions"
#: The cleanup every module goes through.
CLEANUP_PIPELINE = "inline,canonicalize,cse,dce"
#: The layout transformation, decided per model (nfc.passes.layout: the choice `nfc tune`
#: recorded for the model on this CPU, else a measured rule); first, since it must see the
#: frontend's `@forward`. Not in a CUDA build's default (the rule is measured on the CPU).
LAYOUT_PIPELINE = "layout{when=auto}"
#: The name older callers use for the cleanup (`run_pipeline`'s default).
DEFAULT_PIPELINE = CLEANUP_PIPELINE
#: Run after the tuned schedules are attached, so computes grouped into kernels keep theirs.
FUSE_PIPELINE = "fuse"
#: The build pipeline of a `.nf` model: what `nfc compile`, `nfc train`, `nfc bench` and the
#: Python API run on the frontend's module (`nfc compile --print-pipeline` prints it).
BUILD_PIPELINE = (f"{LAYOUT_PIPELINE},{MODEL_PIPELINE},{CLEANUP_PIPELINE},apply-tuning,"
                  f"{FUSE_PIPELINE}")
#: The pass each build flag turns off (`--no-layout`, `--no-im2col`, `--no-tuning`,
#: `--no-fuse`).
FLAG_PASSES = {"layout": "layout", "im2col": "im2col", "tuning": "apply-tuning",
               "fuse": "fuse"}
#: The targets a build is for (`--target`).
TARGETS = ("cpu", "cuda")


def _is_ir_file(source: str | Path) -> bool:
    return Path(source).suffix == ".nfir"


def pipeline_for(source: str | Path, pipeline: str | None = None, *, im2col: bool = True,
                 tuning: bool = True, fuse: bool = True, layout: bool = True,
                 target: str = "cpu") -> str:
    """The exact pipeline the build of `source` runs, as a pipeline string: `pipeline` (`-p`)
    or by default `BUILD_PIPELINE` (without `layout` and `MODEL_PIPELINE`'s passes for a
    `.nfir` module; without `layout` for `target="cuda"`, whose choice is not measured, and
    with `im2col=False`, since a blocked convolution gathers columns of its own), less every
    pass a flag turns off (`layout=False` removes `layout`, `im2col=False` `im2col`,
    `tuning=False` `apply-tuning`, `fuse=False` `fuse`). Every pass is looked up and its
    options parsed, so a bad `-p` is a located CompileError before any work; the text is the
    passes' own spelling (options that differ from their defaults)."""
    from nfc.passmanager import build_pipeline, format_pipeline

    if target not in TARGETS:
        raise ValueError(f"unknown target '{target}'")
    drop = {FLAG_PASSES[flag] for flag, on in (("im2col", im2col), ("tuning", tuning),
                                                ("fuse", fuse), ("layout", layout)) if not on}
    if pipeline is None and (_is_ir_file(source) or target != "cpu" or not im2col):
        drop.add(FLAG_PASSES["layout"])
    if pipeline is None and _is_ir_file(source):
        drop.update(MODEL_PIPELINE.split(","))
    text = BUILD_PIPELINE if pipeline is None else pipeline
    return format_pipeline([p for p in build_pipeline(text) if p.name not in drop])


def tune_pipeline_for(source: str | Path, pipeline: str | None = None, *,
                      im2col: bool = True, layout: bool = True, target: str = "cpu") -> str:
    """The pipeline `nfc tune` runs: the build pipeline (`pipeline_for`) up to its first
    `apply-tuning`, so the kernels measured are the ones that pass looks up (all of it when it
    has no `apply-tuning`)."""
    from nfc.passmanager import build_pipeline, format_pipeline

    passes = build_pipeline(pipeline_for(source, pipeline, im2col=im2col, layout=layout,
                                         target=target))
    names = [p.name for p in passes]
    if FLAG_PASSES["tuning"] in names:
        passes = passes[:names.index(FLAG_PASSES["tuning"])]
    return format_pipeline(passes)


def frontend_module(path: str | Path, params: Mapping[str, Any] | None = None,
                    optimizer: Mapping[str, Any] | None = None, *,
                    model: str | None = None) -> Module:
    """The frontend's module of a `.nf` model (`@forward` in training mode, and `@eval`
    compiled with `training` false when the forward draws random numbers or updates state),
    or the parsed module of a `.nfir` file; the `opt.<name>` settings applied to its
    optimizer. `model` names the model of a file that holds several. The build pipeline
    starts from here."""
    p = Path(path)
    if _is_ir_file(p):
        from nfc.irparser import parse_module

        module = parse_module(p.read_text(encoding="utf-8"), str(p))
        apply_optimizer(module, optimizer or {})
        return module
    from nfc.frontend import compile_file
    from nfc.passes.autodiff.train import eval_from_forward, needs_separate_eval

    module = compile_file(p, params=dict(params or {}), training=True, require_model=True,
                          model=model)
    apply_optimizer(module, optimizer or {})
    if module.has_func("forward") and needs_separate_eval(module.func("forward")):
        ev = compile_file(p, params=dict(params or {}), training=False, model=model)
        module.funcs.append(eval_from_forward(ev.func("forward")))
    return module


def model_module(path: str | Path, params: Mapping[str, Any] | None = None,
                 optimizer: Mapping[str, Any] | None = None, *, im2col: bool = True,
                 model: str | None = None) -> Module:
    """The module of a `.nf` model with @forward, @eval and (when it minimizes a loss)
    @train_step: the frontend, then `MODEL_PIPELINE` (without `im2col` when `im2col` is
    False); or the parsed module of a `.nfir` file."""
    module = frontend_module(path, params, optimizer, model=model)
    if not _is_ir_file(path):
        run_pipeline(module, MODEL_PIPELINE if im2col else "training-functions")
    return module


def backend_module(path: str | Path, params: Mapping[str, Any] | None = None) -> Module:
    """The module a backend compiles, as `nfc compile` builds it without tuned schedules: the
    model pipeline (im2col, @train_step and @eval), the cleanup, then `fuse` (the CUDA
    coverage checks, nfc.codegen.cuda.coverage)."""
    module = model_module(path, params or {}, {})
    run_pipeline(module, DEFAULT_PIPELINE)
    run_pipeline(module, FUSE_PIPELINE)
    return module


def run_pipeline(module: Module, pipeline: str = DEFAULT_PIPELINE, *,
                 verify: bool = True) -> Module:
    """Run the pass pipeline (text, `a,b{k=v}`) on `module` in place, verifying after every
    pass (unless `verify` is False: then once at the end)."""
    if not pipeline.strip():
        return module
    from nfc.passmanager import PassManager, build_pipeline
    from nfc.verifier import verify as verify_module

    PassManager(build_pipeline(pipeline), verify=verify).run(module)
    if not verify:
        verify_module(module)
    return module


def build_module(source: str | Path, params: Mapping[str, Any] | None = None,
                 optimizer: Mapping[str, Any] | None = None, pipeline: str | None = None, *,
                 verify: bool = True, print_ir_after: bool | Collection[str] = (),
                 timings: Any = None, stream: Any = None,
                 model: str | None = None) -> tuple[Module, Any]:
    """The module of the model file `source` through the build pipeline, and the pass
    manager's Context (`ctx.remarks["apply-tuning"]`: the tuned schedules used).

    `pipeline` is the exact text to run (from `pipeline_for`; None: its default for the
    source). The pipeline is checked before the frontend runs; the pass manager verifies the
    module after every pass (unless `verify` is False), prints the IR after the passes
    `print_ir_after` names (True: all) to `stream` (stderr), and adds the frontend's and each
    pass's time to `timings` (a nfc.passmanager.Timings) when given. A pipeline with passes
    that trade memory (`remat`, `compress-activations`) also builds the module without them
    and schedules every float sum as that build does (nfc.runtime.sum_orders; summary in
    `ctx.remarks["sum-orders"]`), so the options do not change the rounding."""
    from nfc.passmanager import Context, PassManager, Timings, build_pipeline

    passes = build_pipeline(pipeline_for(source) if pipeline is None else pipeline)
    timings = timings if timings is not None else Timings()
    t0 = time.perf_counter()
    module = frontend_module(source, params, optimizer, model=model)
    timings.add("parse" if _is_ir_file(source) else "frontend", time.perf_counter() - t0)
    ctx = Context(verify=verify, params=dict(params or {}))
    trading = [n for n, p in enumerate(passes) if getattr(p, "uses_memory_model", False)]
    if trading:  # remat & co. measure their choices on the artifact the rest would build
        from nfc.codegen.artifact.plan import artifact_memory_model

        ctx.memory_model = artifact_memory_model(passes[trading[0] + 1:], module.name,
                                                 module.attrs, context=ctx)
    ctx.device_params = device_params_for(passes)

    def run(part: Sequence[Any]) -> None:
        pm = PassManager(part, verify=verify, print_ir_after=print_ir_after, stream=stream)
        pm.timings = timings
        pm.run(module, ctx)

    if not trading:
        run(passes)
        return module, ctx
    # memory options change where values live, not how a float sum adds: the option's sums
    # are scheduled as in the build without them (nfc.runtime.sum_orders)
    from nfc.codegen.cpu import host_target
    from nfc.runtime.sum_orders import force_orders, reference_orders, run_reference

    run(passes[:trading[0]])
    t0 = time.perf_counter()
    ref, tracker, ref_tracker = run_reference(module, passes[trading[0]:], ctx)
    timings.add("sum-orders (reference build)", time.perf_counter() - t0)
    run(passes[trading[0]:])
    t0 = time.perf_counter()
    target = host_target()
    report = force_orders(module, tracker, reference_orders(ref, ref_tracker, target), target)
    ctx.remarks["sum-orders"] = report.message()
    timings.add("sum-orders", time.perf_counter() - t0)
    return module, ctx


#: Environment variable choosing the fusion reward's device parameters of a build:
#: `measured` (the default: this machine's, measured at first use and kept in the tuning
#: cache) or `builtin` (the constants of nfc.passes.fusion.device). `--device-params` sets it.
DEVICE_PARAMS_ENV = "NFC_DEVICE_PARAMS"


def device_params_for(passes: Sequence[Any]) -> Any:
    """The measured `DeviceParams` the build gives its `fuse` passes (`Context.device_params`),
    or None: when no pass would read them (no `fuse{params=auto|measured}`), when
    `$NFC_DEVICE_PARAMS` is `builtin`, or when measuring fails (the pass then says it used
    its built-in constants). Measured at first use on this machine and kept in the tuning
    cache under the device category (nfc.runtime.device_params), so later builds only look
    them up."""
    choice = os.environ.get(DEVICE_PARAMS_ENV, "measured").strip() or "measured"
    if choice not in ("measured", "builtin"):
        from nfc.diagnostics import error

        raise error(f"${DEVICE_PARAMS_ENV}: '{choice}' is neither 'measured' nor 'builtin'")
    wanted = any(p.name == "fuse" and getattr(p, "params", "") in ("auto", "measured")
                 for p in passes)
    if not wanted or choice == "builtin":
        return None
    from nfc.runtime.device_params import device_params

    try:
        return device_params()
    except Exception as exc:  # noqa: BLE001 - a build never fails for want of a measurement
        print(f"nfc: warning: measuring the device parameters failed ({exc}); fusing with "
              "the built-in constants", file=sys.stderr)
        return None


def _cache_dir() -> Path:
    base = os.environ.get("NFC_CACHE_DIR") or os.path.join(Path.home(), ".cache", "nfc")
    return Path(base) / "artifacts"


_FINGERPRINT: list[str] = []


def _builder_fingerprint() -> str:
    """A hash of the code generator's sources, so a library built by an older code generator
    (same version number, different code) is never reused from the cache."""
    if not _FINGERPRINT:
        import nfc.codegen

        h = hashlib.sha256()
        roots = [Path(nfc.codegen.__file__).resolve().parent,
                 Path(__file__).resolve().parent.parent / "passes"]
        for root in roots:
            for f in sorted(root.rglob("*.py")):
                h.update(f.read_bytes())
        _FINGERPRINT.append(h.hexdigest())
    return _FINGERPRINT[0]


def module_key(module: Module, *, profile: bool, target_key: str,
               functions: Sequence[str] | None = None) -> str:
    """A hash naming the library built from `module` with these options (`functions`: the
    entries built, None for all)."""
    from nfc.printer import print_module

    h = hashlib.sha256()
    for part in (__version__, _builder_fingerprint(), target_key, str(profile),
                 "*" if functions is None else ",".join(sorted(functions)),
                 print_module(module, locs=True)):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


@dataclass
class Built:
    """A compiled model: the library path, the module and (when built now) the artifact."""

    path: str
    module: Module
    artifact: Any = None
    cached: bool = False
    tuning: str = ""
    """One line on the tuned schedules used (empty when the cache was not consulted)."""
    pipeline: str = ""
    """The pipeline that built the module (set by `compile_model`)."""
    layout: str = ""
    """The `layout` pass's one-line summary (its decision), empty without the pass."""


def build_library(module: Module, output: str | None = None, *, profile: bool = False,
                  use_cache: bool = True, functions: Sequence[str] | None = None) -> Built:
    """Compile `module` (already through the pipeline) into a shared library at `output` (or
    in the cache when None).

    Cached libraries are checked (trailer and SHA-256, nfc.codegen.artifact.container) before
    they are used; a damaged one is reported on stderr, deleted and built again. The cache
    directory is private (0700) and its files 0600; every write is atomic (a unique temporary
    name, then a rename), so concurrent builds of one model never see half a library."""
    from nfc.codegen.cpu import host_target
    from nfc.fsutil import atomic_write

    target = host_target()
    from nfc.codegen.artifact.kcache import target_text

    # the code generator's switches (`NFC_STRIDED_LOADS=0`, `NFC_HFUSE=0`) decide code too
    key = module_key(module, profile=profile, target_key=target_text(target),
                     functions=functions)
    cached = _cache_dir() / f"{key}.so"
    if use_cache:
        with contextlib.suppress(OSError):  # also closes a directory an older nfc left open
            private_dir(cached.parent)
        data = _cached_library(cached)
        if data is not None:
            if output is None:
                return Built(str(cached), module, cached=True)
            atomic_write(output, data, _output_mode())
            return Built(output, module, cached=True)
    from nfc.codegen.artifact import build_artifact

    art = build_artifact(module, functions=functions, target=target, profile=profile)
    data = art.link()
    if output is not None:
        atomic_write(output, data, _output_mode())
    if use_cache or output is None:
        try:
            private_dir(cached.parent)
            atomic_write(cached, data, 0o600)
            remove_stale_temporaries(cached.parent)  # left by killed builds
        except OSError:
            if output is None:
                raise
            # with an output of its own, the cache is an optimisation only
    return Built(output or str(cached), module, art)


def _output_mode() -> int:
    from nfc.codegen.artifact.container import default_mode

    return default_mode()


def _cached_library(path: Path) -> bytes | None:
    """The checked bytes of a cached library, or None: missing, or damaged (then reported
    and deleted, so that it is built again)."""
    from nfc.codegen.artifact.container import ArtifactFileError, read_artifact

    try:
        return read_artifact(path).data
    except FileNotFoundError:
        return None
    except (ArtifactFileError, OSError) as exc:
        print(f"nfc: warning: cached library unusable: {exc}; building it again",
              file=sys.stderr)
        with contextlib.suppress(OSError):
            path.unlink()
        return None


def apply_tuning(module: Module) -> str:
    """Run the `apply-tuning` pass alone: kernels take their tuned schedules from this
    machine's tuning cache (as `nf.schedule` attributes); returns its one-line summary."""
    from nfc.passmanager import Context, PassManager, build_pipeline

    ctx = Context()
    PassManager(build_pipeline(FLAG_PASSES["tuning"])).run(module, ctx)
    return ctx.remarks.get(FLAG_PASSES["tuning"], "")


def compile_model(source: str | Path, output: str | None = None, *,
                  settings: Sequence[str] = (), pipeline: str | None = None,
                  profile: bool = False, use_cache: bool = True, tuning: bool = True,
                  fuse: bool = True, im2col: bool = True, layout: bool = True,
                  verify: bool = True, print_ir_after: bool | Collection[str] = (),
                  time_passes: bool = False, model: str | None = None) -> Built:
    """The frontend, the build pipeline and the artifact for the model file `source`.

    The pipeline is `pipeline_for(source, pipeline, im2col=, tuning=, fuse=, layout=)`: the
    default
    build pipeline, or `pipeline` (the whole of it, as `-p`), less the passes the flags turn
    off. `verify`, `print_ir_after` are the pass manager's; `time_passes` prints the time of
    the frontend, each pass and codegen to stderr at the end. `model` chooses among the
    models of the file."""
    from nfc.passmanager import Timings

    check_model_source(source)
    params, opt = parse_settings(settings)
    text = pipeline_for(source, pipeline, im2col=im2col, tuning=tuning, fuse=fuse,
                        layout=layout)
    timings = Timings()
    module, ctx = build_module(source, params, opt, text, verify=verify,
                               print_ir_after=print_ir_after, timings=timings, model=model)
    t0 = time.perf_counter()
    built = build_library(module, output, profile=profile, use_cache=use_cache)
    timings.add("codegen" + (" (cached)" if built.cached else ""), time.perf_counter() - t0)
    built.tuning = ctx.remarks.get(FLAG_PASSES["tuning"], "")
    built.layout = ctx.remarks.get(FLAG_PASSES["layout"], "")
    built.pipeline = text
    if time_passes:
        print(timings.report(), file=sys.stderr)
    return built


def check_model_source(source: str | Path) -> None:
    """Raise ArtifactError when `source` is a library or other binary data rather than a
    model file, before the frontend would read it as `.nf` text (`nfc train libm.so.6`)."""
    from nfc.codegen.artifact.container import ArtifactFileError, file_kind, read_artifact
    from nfc.runtime.loader import ArtifactError

    try:
        kind = file_kind(source)
    except OSError:
        return  # the frontend reports a missing or unreadable file
    if kind == "binary":
        raise ArtifactError(f"'{source}' is neither an nfc artifact nor a model file "
                            "(binary data)")
    if kind in ("artifact", "elf"):
        try:
            read_artifact(source)
        except (ArtifactFileError, OSError) as exc:
            raise ArtifactError(str(exc)) from None
        raise ArtifactError(f"'{source}' is a compiled nfc artifact, not a model file; "
                            "name it *.so to use it here")


def load_model(source: str | Path, *, settings: Sequence[str] = (), profile: bool = False,
               use_cache: bool = True, pipeline: str | None = None, tuning: bool = True,
               log: Any = None, fuse: bool = True, im2col: bool = True,
               layout: bool = True, model: str | None = None):  # -> Model
    """A loaded model from a `.so` (settings must be empty) or a model file (compiled by
    `compile_model` with these options; `log(line)` hears which tuned schedules were
    used)."""
    from nfc.codegen.artifact.container import is_library_path
    from nfc.runtime.loader import load

    src = str(source)
    if is_library_path(src):  # by name or by content: never parse a library as .nf
        if settings:
            raise SettingError("--set applies when compiling; a .so is already compiled")
        return load(src)
    built = compile_model(src, settings=settings, pipeline=pipeline, profile=profile,
                          use_cache=use_cache, tuning=tuning, fuse=fuse, im2col=im2col,
                          layout=layout, model=model)
    if log is not None and built.tuning:
        log(f"nfc: {built.tuning}")
    return load(built.path)
