"""Passes, the pass registry, pipeline strings and the pass manager (xDSL style).

A pass is a frozen dataclass with a ClassVar `name`, option fields (int, float, bool or str,
each documented by a docstring under it) and `apply(ctx, module)`, which rewrites the module in
place:

    @dataclass(frozen=True)
    class Unroll(ModulePass):
        '''Unroll small reductions into sums.'''

        name: ClassVar[str] = "unroll"
        max_extent: int = 4
        '''Largest reduction extent unrolled.'''

        def apply(self, ctx: Context, module: Module) -> None: ...

Passes are found only through the `nfc.passes` entry-point group (the project's own passes are
registered exactly like a plugin's) and loaded when used; `--load-plugin module:Class` adds an
unregistered one. A pipeline is spelled `inline,cse,unroll{max-extent=8}`.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import importlib
import importlib.metadata
import importlib.util
import inspect
import json
import sys
import textwrap
import time
import typing
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib.metadata import EntryPoint
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar, TextIO

from nfc.diagnostics import CompileError, Diagnostic, DiagnosticEngine, note
from nfc.ir import Loc, Module
from nfc.pipeline import PIPELINE_FILE, PassSpec, parse_pipeline, parse_pipeline_specs
from nfc.printer import print_module
from nfc.verifier import verify as verify_module

__all__ = [
    "PIPELINE_FILE", "REGISTRY", "Context", "ModulePass", "PassManager", "PassOption",
    "PassRegistry", "PassSpec", "Timings", "available_passes", "build_pipeline",
    "format_pipeline", "get_pass", "load_plugin", "parse_pipeline", "parse_pipeline_specs",
]

#: The option types a pass may declare.
OPTION_TYPES: tuple[type, ...] = (int, float, bool, str)
_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


@dataclass
class Context:
    """What a pass sees besides the module: where to report problems, and run options."""

    diagnostics: DiagnosticEngine = field(default_factory=DiagnosticEngine)
    """Errors and warnings reported by passes; an error stops the pipeline after the pass."""
    verify: bool = True
    """Whether the pass manager verifies the module after each pass."""
    params: dict[str, int | float | bool] = field(default_factory=dict)
    """Model parameters given on the command line (`--set batch=32`)."""
    remarks: dict[str, str] = field(default_factory=dict)
    """One-line summaries passes leave for the driver to show, by pass name (`apply-tuning`
    says which tuned schedules it used); not diagnostics, and they never stop a pipeline."""
    memory_model: Any = None
    """`Callable[[Func], MemoryReport]` or None: the memory a function would need once built
    (the rest of the pipeline and code generation, kernel workspaces included), for passes
    that trade memory (`remat`); the build (nfc.runtime.build) sets it."""
    device_params: Any = None
    """`nfc.passes.fusion.device.DeviceParams` or None: this machine's measured device
    parameters for passes that price on the device (`fuse`); the build (nfc.runtime.build)
    sets it unless the built-in constants were asked for (`--device-params builtin`)."""

    def error(self, message: str, loc: Loc | None = None, *notes: Diagnostic) -> None:
        """Report a user-facing error; the pipeline stops once the pass returns."""
        self.diagnostics.error(message, loc, *notes)

    def warning(self, message: str, loc: Loc | None = None, *notes: Diagnostic) -> None:
        """Report a warning; the pipeline goes on."""
        self.diagnostics.diagnostics.append(Diagnostic("warning", message, loc, tuple(notes)))


@dataclass(frozen=True)
class PassOption:
    """One option of a pass: a dataclass field of type int, float, bool or str."""

    name: str
    type: type
    default: Any
    """The default value, or dataclasses.MISSING for a required option."""
    doc: str

    @property
    def required(self) -> bool:
        """True when the option has no default."""
        return self.default is dataclasses.MISSING

    def parse(self, text: str) -> Any:
        """The value spelled `text`; raises ValueError with a readable reason."""
        if self.type is bool:
            low = text.strip().lower()
            if low in _TRUE or low in _FALSE:
                return low in _TRUE
            raise ValueError(f"expects true or false, got '{text}'")
        if self.type is int:
            try:
                return int(text, 0) if text.strip().lower().startswith(("0x", "0o", "0b")) \
                    else int(text)
            except ValueError:
                raise ValueError(f"expects an integer, got '{text}'") from None
        if self.type is float:
            try:
                return float(text)
            except ValueError:
                raise ValueError(f"expects a number, got '{text}'") from None
        return text


@dataclass(frozen=True)
class ModulePass:
    """Base of passes: a frozen dataclass whose fields are the pass's options."""

    name: ClassVar[str] = ""

    def apply(self, ctx: Context, module: Module) -> None:
        """Rewrite `module` in place; report user-facing problems through `ctx`."""
        raise NotImplementedError(f"pass '{self.name}' does not implement apply")

    def option_problem(self) -> tuple[str, str] | None:
        """(option field, message) when an option's value is out of its range (a pass with
        such constraints overrides this), else None: `from_options` reports it at the
        option when the pipeline is read."""
        return None

    @classmethod
    def options(cls) -> tuple[PassOption, ...]:
        """The options of this pass, in declaration order."""
        return _options(cls)

    @classmethod
    def summary(cls) -> str:
        """The first paragraph of the pass's docstring, on one line."""
        doc = inspect.getdoc(cls) if cls.__doc__ else None
        return " ".join((doc or "").split("\n\n")[0].split())

    @classmethod
    def from_options(cls, options: Mapping[str, str], *, at: Loc | None = None,
                     option_locs: Mapping[str, Loc] | None = None) -> ModulePass:
        """An instance with options given as strings (`max-width` and `max_width` both name
        the field `max_width`); raises CompileError located at `at` or the option."""
        known = {o.name: o for o in cls.options()}
        values: dict[str, Any] = {}
        for raw, text in options.items():
            key = raw.replace("-", "_")
            where = (option_locs or {}).get(raw, at)
            opt = known.get(key)
            if opt is None:
                names = [k.replace("_", "-") for k in known]
                close = difflib.get_close_matches(raw.replace("_", "-"), names, n=1)
                hint = (f"; did you mean '{close[0]}'?" if close else
                        f"; its options are {', '.join(names)}" if names else
                        "; it has no options")
                raise CompileError([Diagnostic(
                    "error", f"pass '{cls.name}' has no option '{raw}'{hint}", where)])
            try:
                values[key] = opt.parse(text)
            except ValueError as exc:
                raise CompileError([Diagnostic(
                    "error", f"option '{raw}' of pass '{cls.name}' {exc}", where)]) from None
        missing = [o.name for o in known.values() if o.required and o.name not in values]
        if missing:
            raise CompileError([Diagnostic(
                "error", f"pass '{cls.name}' requires option '{missing[0].replace('_', '-')}'",
                at)])
        p = cls(**values)
        bad = p.option_problem()
        if bad is not None:
            field_name, message = bad
            where = next((loc for raw, loc in (option_locs or {}).items()
                          if raw.replace("-", "_") == field_name), at)
            raise CompileError([Diagnostic("error", message, where)])
        return p

    def pipeline_text(self) -> str:
        """This pass as a pipeline entry, options that differ from their defaults included."""
        opts = []
        for o in self.options():
            v = getattr(self, o.name)
            if o.required or v != o.default:
                text = ("true" if v else "false") if isinstance(v, bool) else str(v)
                if not text or any(c in text for c in ",{}\"") or any(
                        c.isspace() or not c.isprintable() for c in text):
                    text = json.dumps(text, ensure_ascii=False)
                opts.append(f"{o.name.replace('_', '-')}={text}")
        return self.name + ("{" + ",".join(opts) + "}" if opts else "")


@cache
def _options(cls: type[ModulePass]) -> tuple[PassOption, ...]:
    hints = typing.get_type_hints(cls)
    docs = _field_docs(cls)
    out = []
    for f in dataclasses.fields(cls):
        t = hints.get(f.name, f.type)
        if t not in OPTION_TYPES:
            raise TypeError(f"option '{f.name}' of pass '{cls.name}' has type {t!r}; pass "
                            "options are int, float, bool or str")
        default = f.default
        if default is dataclasses.MISSING and f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        out.append(PassOption(f.name, t, default, docs.get(f.name, "")))
    return tuple(out)


def _field_docs(cls: type) -> dict[str, str]:
    """The docstrings written under the fields of `cls` and its bases (read from source)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):
            continue
        tree = ast.parse(source)
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for stmt, nxt in zip(body, body[1:], strict=False):
            if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                    and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                    and isinstance(nxt.value.value, str)):
                docs[stmt.target.id] = " ".join(inspect.cleandoc(nxt.value.value).split())
    return docs


# ---------------------------------------------------------------------------------------------
# pipeline strings


def build_pipeline(text: str, registry: PassRegistry | None = None) -> list[ModulePass]:
    """The pass instances a pipeline string describes (names looked up in `registry`, by
    default the entry-point registry); every error is located in the string."""
    reg = registry or REGISTRY
    return [reg.get(s.name, s.loc).from_options(s.options, at=s.loc, option_locs=s.option_locs)
            for s in parse_pipeline_specs(text)]


def format_pipeline(passes: Iterable[ModulePass]) -> str:
    """The pipeline string of pass instances (`build_pipeline`'s inverse, each pass spelled by
    `pipeline_text`): what `--print-pipeline` prints."""
    return ",".join(p.pipeline_text() for p in passes)


# ---------------------------------------------------------------------------------------------
# the registry

#: The entry-point group passes register in.
ENTRY_POINT_GROUP = "nfc.passes"


def _fail(message: str, loc: Loc | None = None, *notes: Diagnostic) -> CompileError:
    return CompileError([Diagnostic("error", message, loc, tuple(notes))])


def _describe(ep: EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    return f"{ep.value} (from {dist.name})" if dist is not None else ep.value


class PassRegistry:
    """Pass names -> pass classes, fed by the `nfc.passes` entry points (loaded lazily) and by
    plugins loaded explicitly. A name that two entry points register (two packages) is an
    error naming both, raised when that name is used: a broken plugin package does not stop
    pipelines that do not use its name. A `--load-plugin` class taking a registered name is
    refused at once."""

    def __init__(self, entry_points: Iterable[EntryPoint] | None = None) -> None:
        self._given = None if entry_points is None else list(entry_points)
        self._eps: dict[str, EntryPoint] | None = None
        self._loaded: dict[str, type[ModulePass]] = {}
        self._sources: dict[str, str] = {}
        self._ambiguous: dict[str, str] = {}  # pass name -> the error naming both sources

    def entry_points(self) -> dict[str, EntryPoint]:
        """Registered entry points by pass name (nothing is imported)."""
        if self._eps is None:
            eps = self._given
            if eps is None:
                eps = list(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))
            found: dict[str, EntryPoint] = {}
            for ep in eps:
                prev = found.get(ep.name)
                if prev is not None and prev.value != ep.value:
                    first, second = sorted([_describe(prev), _describe(ep)])
                    self._ambiguous.setdefault(
                        ep.name, f"pass '{ep.name}' is registered twice: by {first} and by "
                                 f"{second}")
                found.setdefault(ep.name, ep)
            self._eps = found
        return self._eps

    def names(self) -> list[str]:
        """Every known pass name, sorted."""
        return sorted({*self.entry_points(), *self._loaded})

    def source(self, name: str) -> str:
        """Where the pass `name` comes from, for messages."""
        if name in self._sources:
            return self._sources[name]
        return _describe(self.entry_points()[name])

    def get(self, name: str, loc: Loc | None = None) -> type[ModulePass]:
        """The pass class named `name`, importing its module on first use."""
        cls = self._loaded.get(name)
        if cls is not None:
            return cls
        ep = self.entry_points().get(name)
        if name in self._ambiguous:
            raise _fail(self._ambiguous[name] + "; uninstall one of them", loc)
        if ep is None:
            names = self.names()
            close = difflib.get_close_matches(name, names, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise _fail(f"unknown pass '{name}'{hint}", loc, note(
                "known passes: " + (", ".join(names) if names else "(none registered)")))
        try:
            obj = ep.load()
        except Exception as exc:  # noqa: BLE001 - a broken plugin is the user's to fix
            raise _fail(f"cannot load pass '{name}' from {_describe(ep)}: "
                        f"{type(exc).__name__}: {exc}", loc) from None
        self._check(obj, _describe(ep), name)
        self._loaded[name] = obj
        self._sources[name] = _describe(ep)
        return obj

    def _check(self, obj: object, source: str, name: str | None) -> None:
        if not (isinstance(obj, type) and issubclass(obj, ModulePass)
                and dataclasses.is_dataclass(obj)):
            raise _fail(f"{source} is not a ModulePass dataclass")
        if not obj.name:
            raise _fail(f"pass class {source} has no name (set `name: ClassVar[str]`)")
        if name is not None and obj.name != name:
            raise _fail(f"entry point '{name}' loads {source}, whose name is '{obj.name}'")
        _options(obj)  # reject unsupported option types now, not mid-pipeline

    def register(self, cls: type[ModulePass], source: str) -> None:
        """Add a pass class that no entry point names (a `--load-plugin` one)."""
        self._check(cls, source, None)
        ep = self.entry_points().get(cls.name)
        prev = self._loaded.get(cls.name)
        if prev is cls:
            return
        if prev is not None or (ep is not None and ep.value != f"{cls.__module__}:"
                                f"{cls.__qualname__}"):
            other = self._sources.get(cls.name) or _describe(ep)  # type: ignore[arg-type]
            raise _fail(f"pass '{cls.name}' is registered twice: by {other} and by {source}")
        self._loaded[cls.name] = cls
        self._sources[cls.name] = source

    def load_plugin(self, spec: str) -> list[type[ModulePass]]:
        """Load `module:Class` (or every pass of `module`); `module` may be a .py path."""
        mod_name, _, cls_name = spec.partition(":")
        try:
            if mod_name.endswith(".py"):
                mod = _import_path(Path(mod_name))
            else:
                mod = importlib.import_module(mod_name)
        except Exception as exc:  # noqa: BLE001 - reported as a user error
            raise _fail(f"cannot load plugin '{spec}': {type(exc).__name__}: {exc}") from None
        if cls_name:
            obj = getattr(mod, cls_name, None)
            if obj is None:
                raise _fail(f"cannot load plugin '{spec}': module '{mod_name}' has no "
                            f"attribute '{cls_name}'")
            classes = [obj]
        else:
            classes = [c for c in vars(mod).values() if isinstance(c, type)
                       and issubclass(c, ModulePass) and c is not ModulePass
                       and c.__module__ == mod.__name__]
            if not classes:
                raise _fail(f"plugin module '{mod_name}' defines no ModulePass")
        for c in classes:
            self.register(c, f"--load-plugin {spec}")
        return classes


def _import_path(path: Path) -> ModuleType:
    """Import a .py file (once: a second load of the same file returns the same module)."""
    # a package's __init__.py is imported under the package's name
    base = path.parent.name if path.stem == "__init__" else path.stem
    stem, n = base, 0
    while (existing := sys.modules.get(stem)) is not None:
        if Path(getattr(existing, "__file__", None) or "").resolve() == path.resolve():
            return existing
        n += 1  # never shadow an unrelated module of the same name
        stem = f"_nfc_plugin_{base}_{n}"
    ispec = importlib.util.spec_from_file_location(stem, path)
    if ispec is None or ispec.loader is None:
        raise ImportError(f"cannot import '{path}'")
    mod = importlib.util.module_from_spec(ispec)
    sys.modules[stem] = mod  # dataclasses and get_type_hints look the module up by name
    try:
        ispec.loader.exec_module(mod)
    except BaseException:
        del sys.modules[stem]
        raise
    return mod


#: The process-wide registry the CLI uses.
REGISTRY = PassRegistry()


def available_passes() -> dict[str, EntryPoint]:
    """Entry points of the `nfc.passes` group by name (nothing is imported)."""
    return REGISTRY.entry_points()


def get_pass(name: str) -> type[ModulePass]:
    """The pass class registered as `name` (CompileError listing known passes if none)."""
    return REGISTRY.get(name)


def load_plugin(spec: str) -> list[type[ModulePass]]:
    """Load and register the passes of `module:Class` (see PassRegistry.load_plugin)."""
    return REGISTRY.load_plugin(spec)


# ---------------------------------------------------------------------------------------------
# running passes


class Timings:
    """Wall time per named phase (accumulated), printed as a table by --time-passes."""

    def __init__(self) -> None:
        self.rows: dict[str, float] = {}

    def add(self, name: str, seconds: float) -> None:
        """Add `seconds` to the phase `name` (phases keep their first-seen order)."""
        self.rows[name] = self.rows.get(name, 0.0) + seconds

    def report(self) -> str:
        """An MLIR-style timing table."""
        total = sum(self.rows.values())
        bar = "===" + "-" * 73 + "==="
        lines = [bar, "Pass execution timing report".center(79), bar,
                 f"  Total Execution Time: {total:.4f} seconds", "",
                 "  ----Wall Time----  ----Name----"]
        for name, t in [*self.rows.items(), ("Total", total)]:
            pct = 100.0 * t / total if total > 0 else 0.0
            lines.append(f"  {t:8.4f} ({pct:5.1f}%)  {name}")
        return "\n".join(lines)


class PassManager:
    """Runs passes in order, verifying the module after each one (and before the first).

    `print_ir_after` is True for every pass or a collection of pass names; the IR goes to
    `stream` (stderr by default), so stdout keeps only the final IR. `time_passes` prints the
    timing table there at the end of `run` (the table is also in `timings`).
    """

    def __init__(self, passes: Sequence[ModulePass], verify: bool = True, *,
                 print_ir_after: bool | Collection[str] = (), time_passes: bool = False,
                 locs: bool = True, stream: TextIO | None = None) -> None:
        self.passes = list(passes)
        self.verify = verify
        self.print_ir_after = print_ir_after
        self.time_passes = time_passes
        self.locs = locs
        self.stream = stream
        self.timings = Timings()

    def _verify(self, module: Module, ctx: Context, after: str | None) -> None:
        t0 = time.perf_counter()
        try:
            verify_module(module)
        except CompileError as err:
            diags = list(err.diagnostics)
            if after is not None:
                d = diags[0]
                diags[0] = Diagnostic(d.severity, d.message, d.loc, (*d.notes, note(
                    f"the IR is invalid after pass '{after}'; this is a bug in that pass")))
            raise CompileError([*ctx.diagnostics.diagnostics, *diags]) from None
        finally:
            self.timings.add("(verify)", time.perf_counter() - t0)

    def run(self, module: Module, ctx: Context | None = None) -> Module:
        """Apply every pass to `module` in place; returns it. Raises CompileError carrying the
        context's diagnostics when a pass reports an error or verification fails."""
        ctx = ctx or Context(verify=self.verify)
        stream = self.stream or sys.stderr
        if self.verify:
            self._verify(module, ctx, None)
        for p in self.passes:
            t0 = time.perf_counter()
            try:
                p.apply(ctx, module)
            except CompileError as err:
                raise CompileError([*ctx.diagnostics.diagnostics, *err.diagnostics]) from None
            except Exception as exc:
                exc.add_note(f"while running pass '{p.name}'")
                raise
            finally:
                self.timings.add(p.name, time.perf_counter() - t0)
            if ctx.diagnostics.error_count:
                raise CompileError(list(ctx.diagnostics.diagnostics))
            if self.verify:
                self._verify(module, ctx, p.name)
            if self.print_ir_after is True or (
                    not isinstance(self.print_ir_after, bool) and p.name in self.print_ir_after):
                print(f"// -----// IR Dump After {p.name} //----- //", file=stream)
                print(print_module(module, locs=self.locs), file=stream, end="", flush=True)
        if self.time_passes:
            print(self.timings.report(), file=stream)
        return module
