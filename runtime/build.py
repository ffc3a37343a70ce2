"""From a model file to a loaded artifact: the pipeline behind `nfc compile` and `nfc train`.

    source (.nf)  --frontend (training and evaluation modes)-->  @forward, @eval
                  --autodiff-->                                   + @train_step
    source (.nfir) is taken as it is (already a module of IR functions)
                  --DEFAULT_PIPELINE (inline, canonicalize, cse, dce)-->
                  --tuned schedules (nf.schedule), then FUSE_PIPELINE (fuse)-->
                  --nfc.codegen.artifact-->  LLVM  --cc -shared-->  model.so

Kernels take their tuned schedules from the tuning cache when `nfc tune` measured them on
this machine (nfc.runtime.tuning: `apply_cached_schedules`; `tuning=False` skips it).

`--set k=v` settings are model parameters (`batch=32`), or optimizer hyperparameters spelled
`opt.<name>` (`opt.lr=0.01`, `opt.name=adam`). Built libraries are cached by the hash of the
final IR, the target CPU and the build options (`NFC_CACHE_DIR`, default ~/.cache/nfc), so
training the same model again skips LLVM; a cached library is checked before use and rebuilt
when damaged (`build_library`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nfc import __version__
from nfc.fsutil import private_dir, remove_stale_temporaries
from nfc.ir import Module
from nfc.verifier import verify

DEFAULT_PIPELINE = "inline,canonicalize,cse,dce"
#: Run after the tuned schedules are attached (so computes grouped into kernels keep theirs);
#: `--no-fuse` skips it.
FUSE_PIPELINE = "fuse"


class SettingError(ValueError):
    """A malformed `--set` item."""


def parse_value(text: str) -> int | float | bool | str:
    """`true`/`false`, an int, a float, else the text itself."""
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text.strip()


def parse_settings(items: Sequence[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(model parameters, optimizer overrides) from `k=v` strings (see the module doc)."""
    params: dict[str, Any] = {}
    opt: dict[str, Any] = {}
    for item in items:
        key, sep, val = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise SettingError(f"--set expects key=value, got '{item}'")
        value = parse_value(val)
        if key.startswith("opt."):
            opt[key[4:]] = value
        else:
            if isinstance(value, str):
                raise SettingError(f"model parameter '{key}' must be a number or a bool, "
                                   f"got '{val}'")
            params[key] = value
    return params, opt


def _apply_optimizer(module: Module, overrides: Mapping[str, Any]) -> None:
    if not overrides:
        return
    cur = module.attrs.get("nf.optimizer")
    new = dict(cur) if isinstance(cur, dict) else {"name": "sgd"}
    if "name" in overrides and overrides["name"] != new.get("name"):
        new = {"name": overrides["name"]}  # another optimizer: its own defaults
    for k, v in overrides.items():
        new[k] = float(v) if isinstance(v, int) and not isinstance(v, bool) else v
    module.attrs["nf.optimizer"] = new


def model_module(path: str | Path, params: Mapping[str, Any] | None = None,
                 optimizer: Mapping[str, Any] | None = None, *, im2col: bool = True) -> Module:
    """The module of a `.nf` model with @forward, @eval and (when it minimizes a loss)
    @train_step; or the parsed module of a `.nfir` file. `im2col`: gather convolution windows
    into columns before autodiff (nfc.passes.im2col), so convolutions and their gradients run
    as GEMMs."""
    p = Path(path)
    if p.suffix == ".nfir":
        from nfc.irparser import parse_module

        module = parse_module(p.read_text(encoding="utf-8"), str(p))
        _apply_optimizer(module, optimizer or {})
        return module
    from nfc.frontend import compile_file
    from nfc.passes.autodiff.train import (
        add_training_functions,
        eval_from_forward,
        needs_separate_eval,
    )

    module = compile_file(p, params=dict(params or {}), training=True, require_model=True)
    _apply_optimizer(module, optimizer or {})
    if not module.has_func("forward"):
        return module
    if needs_separate_eval(module.func("forward")):
        ev = compile_file(p, params=dict(params or {}), training=False)
        module.funcs.append(eval_from_forward(ev.func("forward")))
    if im2col:  # before autodiff: the gradients of a convolution become GEMMs as well
        from nfc.passes.im2col import im2col_func

        for func in module.funcs:
            im2col_func(func)
    if module.attrs.get("nf.loss") is not None and module.attrs.get("nf.optimizer") is not None:
        add_training_functions(module)
    elif not module.has_func("eval"):
        module.funcs.append(eval_from_forward(module.func("forward")))
    return module


def run_pipeline(module: Module, pipeline: str = DEFAULT_PIPELINE) -> Module:
    """Run the pass pipeline (text, `a,b{k=v}`) on `module` in place."""
    if not pipeline.strip():
        return module
    from nfc.passmanager import PassManager, build_pipeline

    PassManager(build_pipeline(pipeline), verify=False).run(module)
    verify(module)
    return module


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
    key = module_key(module, profile=profile, target_key=target.key(), functions=functions)
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
    """Give kernels their tuned schedules from this machine's tuning cache (as `nf.schedule`
    attributes); returns a one-line summary."""
    from nfc.runtime.tuning.kernels import apply_cached_schedules

    return apply_cached_schedules(module).message()


def compile_model(source: str | Path, output: str | None = None, *,
                  settings: Sequence[str] = (), pipeline: str = DEFAULT_PIPELINE,
                  profile: bool = False, use_cache: bool = True, tuning: bool = True,
                  fuse: bool = True, im2col: bool = True) -> Built:
    """Front end, im2col (unless False), autodiff, pipeline, tuned schedules, fusion (unless
    `fuse` is False) and artifact for the model file `source`."""
    check_model_source(source)
    params, opt = parse_settings(settings)
    module = model_module(source, params, opt, im2col=im2col)
    run_pipeline(module, pipeline)
    note = apply_tuning(module) if tuning else ""
    if fuse:
        run_pipeline(module, FUSE_PIPELINE)
    built = build_library(module, output, profile=profile, use_cache=use_cache)
    built.tuning = note
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
               use_cache: bool = True, pipeline: str = DEFAULT_PIPELINE, tuning: bool = True,
               log: Any = None, fuse: bool = True, im2col: bool = True):  # -> Model
    """A loaded model from a `.so` (settings must be empty) or a model file (compiled;
    `log(line)` hears which tuned schedules were used)."""
    from nfc.codegen.artifact.container import is_library_path
    from nfc.runtime.loader import load

    src = str(source)
    if is_library_path(src):  # by name or by content: never parse a library as .nf
        if settings:
            raise SettingError("--set applies when compiling; a .so is already compiled")
        return load(src)
    built = compile_model(src, settings=settings, pipeline=pipeline, profile=profile,
                          use_cache=use_cache, tuning=tuning, fuse=fuse, im2col=im2col)
    if log is not None and built.tuning:
        log(f"nfc: {built.tuning}")
    return load(built.path)
