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
training the same model again skips LLVM.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nfc import __version__
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

    module = compile_file(p, params=dict(params or {}), training=True)
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
    in the cache when None)."""
    from nfc.codegen.cpu import host_target

    target = host_target()
    key = module_key(module, profile=profile, target_key=target.key(), functions=functions)
    cached = _cache_dir() / f"{key}.so"
    if use_cache and cached.exists():
        if output is None:
            return Built(str(cached), module, cached=True)
        tmp = output + ".tmp"
        shutil.copyfile(cached, tmp)
        os.replace(tmp, output)
        return Built(output, module, cached=True)
    from nfc.codegen.artifact import build_artifact

    art = build_artifact(module, functions=functions, target=target, profile=profile)
    dest = output or str(cached)
    if output is None:
        cached.parent.mkdir(parents=True, exist_ok=True)
    art.write_shared(dest)
    if use_cache and output is not None:
        try:
            cached.parent.mkdir(parents=True, exist_ok=True)
            tmp = str(cached) + f".{os.getpid()}.tmp"
            shutil.copyfile(output, tmp)
            os.replace(tmp, cached)
        except OSError:
            pass  # the cache is an optimisation only
    return Built(dest, module, art)


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
    params, opt = parse_settings(settings)
    module = model_module(source, params, opt, im2col=im2col)
    run_pipeline(module, pipeline)
    note = apply_tuning(module) if tuning else ""
    if fuse:
        run_pipeline(module, FUSE_PIPELINE)
    built = build_library(module, output, profile=profile, use_cache=use_cache)
    built.tuning = note
    return built


def load_model(source: str | Path, *, settings: Sequence[str] = (), profile: bool = False,
               use_cache: bool = True, pipeline: str = DEFAULT_PIPELINE, tuning: bool = True,
               log: Any = None, fuse: bool = True, im2col: bool = True):  # -> Model
    """A loaded model from a `.so` (settings must be empty) or a model file (compiled;
    `log(line)` hears which tuned schedules were used)."""
    from nfc.runtime.loader import load

    src = str(source)
    if src.endswith(".so"):
        if settings:
            raise SettingError("--set applies when compiling; a .so is already compiled")
        return load(src)
    built = compile_model(src, settings=settings, pipeline=pipeline, profile=profile,
                          use_cache=use_cache, tuning=tuning, fuse=fuse, im2col=im2col)
    if log is not None and built.tuning:
        log(f"nfc: {built.tuning}")
    return load(built.path)
