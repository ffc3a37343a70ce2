"""The frontend: .nf source -> nf IR.

    module = compile_file("examples/mlp.nf", params={"batch": 32})
    module = compile_source(text, "mlp.nf", training=False)
    module = compile_op("nfc/std/nn.nf", "linear", [TensorType((4, 8), DType.F32), ...])

A model becomes `nf.func @forward` (docs/ir.md lists its roles and attributes); op
calls are inlined into `nf.compute` ops located in the op's own file. Every user mistake is a
CompileError carrying all independent diagnostics of the file.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from nfc.diagnostics import CompileError, Diagnostic
from nfc.frontend import ast
from nfc.frontend.check import check_op
from nfc.frontend.context import Ctx, Env, Fatal, Poisoned, TensorInfo
from nfc.frontend.elaborate import Elaborator, Frame
from nfc.frontend.imports import Loader, ModuleScope, suggest
from nfc.frontend.limits import MAX_SOURCE_BYTES
from nfc.frontend.model import ModelState, model_params
from nfc.frontend.uncalled import check_uncalled, referenced_ops
from nfc.ir import Block, Func, Loc, Module, ReturnOp, TensorType, Value

__all__ = ["choose_model", "compile_file", "compile_source", "compile_op"]

Params = Mapping[str, int | float | bool]


@contextmanager
def _stack_room() -> Iterator[None]:
    # Expressions may nest MAX_NESTING deep and each level takes a few Python frames.
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, 10_000))
    try:
        yield
    finally:
        sys.setrecursionlimit(old)


def _module_name(filename: str) -> str:
    stem = Path(filename).stem or "module"
    return re.sub(r"[^A-Za-z0-9_]", "_", stem)


def _read(path: str | Path) -> str:
    p = Path(path)
    try:
        if p.stat().st_size > MAX_SOURCE_BYTES:
            raise CompileError([Diagnostic("error", f"source file is larger than "
                                           f"{MAX_SOURCE_BYTES} bytes", Loc(str(path), 1, 1))])
        return p.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise CompileError([Diagnostic("error", f"cannot read '{path}': {exc.strerror}")]) \
            from None


def compile_file(path: str | Path, *, params: Params | None = None, training: bool = True,
                 search_paths: Sequence[str] | None = None, model: str | None = None,
                 require_model: bool = False) -> Module:
    """Compile a .nf file (see compile_source)."""
    return compile_source(_read(path), str(path), params=params, training=training,
                          search_paths=search_paths, model=model, require_model=require_model)


def compile_source(text: str, filename: str, *, params: Params | None = None,
                   training: bool = True, search_paths: Sequence[str] | None = None,
                   model: str | None = None, require_model: bool = False) -> Module:
    """Compile .nf source text; `filename` locates diagnostics and relative imports.

    A file with a model yields a module with `@forward` (the model named `model` when the file
    has several); `params` override the model's parameters; `training` is the value of the
    builtin `training`. A file without a model yields a module without functions, or, with
    `require_model` (what `nfc compile` asks for), the error "nothing to compile".

    Every op of the file is checked: the ops the model calls (directly or through other ops)
    at their calls, the others at sample sizes (nfc.frontend.uncalled).
    """
    with _stack_room():
        loader = Loader(list(search_paths or []))
        root = loader.load_root(text, filename)
        per_op = {id(op): check_op(op, root) for op in root.ops.values()}
        diags = list(loader.diagnostics) + [d for ds in per_op.values() for d in ds]
        # the uncalled ops are checked only when the file and its imports are sound, and
        # only those without definition errors (which would only repeat)
        checkable = [op for op in root.ops.values() if not per_op[id(op)]] \
            if not loader.diagnostics and not root.incomplete else []
        models = root.program.models
        seen: dict[str, ast.ModelDef] = {}
        for m in models:
            if m.name in seen:
                diags.append(Diagnostic("error", f"model '{m.name}' is defined twice", m.loc))
            seen.setdefault(m.name, m)
        if not models:
            diags += check_uncalled(root, checkable, training)
            if require_model:
                what = ("no model (`nfc opt` checks a file of ops)" if root.ops
                        else "no model and no op")
                diags.append(Diagnostic("error", f"nothing to compile: '{filename}' defines "
                                        f"{what}", Loc(filename, 1, 1)))
            if diags:
                raise CompileError(_dedupe(diags))
            return Module(_module_name(filename))
        choice = _choose(models, seen, model, filename)
        if isinstance(choice, Diagnostic):
            raise CompileError([*diags, choice])
        chosen = choice
        module = _elaborate_model(chosen, root, dict(params or {}), training, diags)
        called = referenced_ops(root, chosen.body)
        diags += check_uncalled(root, [op for op in checkable if id(op) not in called],
                                training)
        if diags:
            raise CompileError(_dedupe(diags))
        assert module is not None
        return module


def _choose(models: Sequence[ast.ModelDef], seen: Mapping[str, ast.ModelDef],
            model: str | None, filename: str) -> ast.ModelDef | Diagnostic:
    """The model `model` names (the only one when None), or the error that says why none is
    chosen: no model of that name, or several models and no name."""
    if model is not None:
        if model not in seen:
            return Diagnostic("error", f"no model named '{model}' in {filename}"
                              f"{suggest(model, list(seen))}", models[0].loc)
        return seen[model]
    if len(seen) > 1:
        return Diagnostic("error", f"{filename} has several models ({', '.join(seen)}); "
                          "choose one with --model NAME (model= from Python)", models[1].loc)
    return models[0]


def choose_model(path: str | Path, model: str | None = None) -> str:
    """The name of the model `compile_file(path, model=model, require_model=True)` compiles,
    found by parsing only (nothing is elaborated): what a command that compiles later, in
    another process (`nfc bench`), checks first. Its errors are the compiler's: the file's
    syntax errors, "nothing to compile", "no model named ...", "has several models ...".
    """
    filename = str(path)
    text = _read(path)
    with _stack_room():
        loader = Loader([])
        root = loader.load_root(text, filename)
    if loader.diagnostics:
        raise CompileError(loader.diagnostics)
    models = root.program.models
    if not models:
        what = "no model (`nfc opt` checks a file of ops)" if root.ops else "no model and no op"
        raise CompileError([Diagnostic("error", f"nothing to compile: '{filename}' defines "
                                       f"{what}", Loc(filename, 1, 1))])
    seen: dict[str, ast.ModelDef] = {}
    for m in models:
        seen.setdefault(m.name, m)
    choice = _choose(models, seen, model, filename)
    if isinstance(choice, Diagnostic):
        raise CompileError([choice])
    return choice.name


def _dedupe(diags: list[Diagnostic]) -> list[Diagnostic]:
    seen: set[tuple[str, Loc | None]] = set()
    out = []
    for d in diags:
        if (d.message, d.loc) not in seen:
            seen.add((d.message, d.loc))
            out.append(d)
    return out


def _elaborate_model(m: ast.ModelDef, root: ModuleScope, params: dict[str, int | float | bool],
                     training: bool, diags: list[Diagnostic]) -> Module | None:
    """The module of model `m`; None after errors, which are added to `diags`."""
    try:
        ctx = Ctx(training)
        state = ModelState(m)
    except CompileError as err:  # a budget set to a bad value
        diags += err.diagnostics
        return None
    el = Elaborator(ctx, Env(root, training), Frame(model=state))
    module = None
    try:
        model_params(m, el, params)
        el.block(m.body)
        if not ctx.diagnostics and not root.incomplete:
            func, attrs = state.func(el)
            module = Module(m.name, [func], attrs=attrs)
    except Fatal as f:
        ctx.report(f.err, with_calls=False)
    except CompileError as err:
        ctx.report(err, with_calls=False)
    except Poisoned:
        pass
    diags += ctx.diagnostics
    return module


def _literal(value: int | float | bool | Sequence[int], loc: Loc) -> ast.Expr:
    if isinstance(value, bool):
        return ast.Bool(loc, value)
    if isinstance(value, int | float):
        return ast.Num(loc, value)
    return ast.ListExpr(loc, tuple(ast.Num(loc, int(v)) for v in value))


def compile_op(path_or_text: str | Path, op_name: str, arg_types: Sequence[TensorType],
               params: Params | None = None, *, training: bool = True,
               search_paths: Sequence[str] | None = None) -> Module:
    """A module with one function `@<op_name>` computing the op on arguments of `arg_types`.

    `path_or_text` is a .nf file (a Path, or a string naming an existing file) or source text;
    `params` gives the op's compile-time arguments. The function's arguments are named after
    the op's parameters (role "input"); `nf.results` names its outputs.
    """
    is_path = isinstance(path_or_text, Path) or (
        "\n" not in path_or_text and len(path_or_text) < 4096 and Path(path_or_text).is_file())
    text = _read(path_or_text) if is_path else str(path_or_text)
    filename = str(path_or_text) if is_path else f"<{op_name}>"
    with _stack_room():
        loader = Loader(list(search_paths or []))
        root = loader.load_root(text, filename)
        if loader.diagnostics:
            raise CompileError(loader.diagnostics)
        found = root.lookup_op(op_name, Loc(filename, 1, 1))
        if found is None:
            raise CompileError([Diagnostic("error", f"no op named '{op_name}' in {filename}"
                                           f"{suggest(op_name, root.op_names())}")])
        op = found[0]
        if len(arg_types) != len(op.params):
            raise CompileError([Diagnostic("error", f"op '{op_name}' takes {len(op.params)} "
                                           f"arguments but {len(arg_types)} types were given",
                                           op.loc)])
        ctx = Ctx(training)
        env = Env(root, training)
        args = [Value(t, p.name) for t, p in zip(arg_types, op.params, strict=True)]
        for i, (v, p) in enumerate(zip(args, op.params, strict=True)):
            env.vars[f"__arg{i}"] = TensorInfo.local(v, p.name, p.loc)
        targs = tuple(ast.TArg(op.loc, k, _literal(v, op.loc)) for k, v in (params or {}).items())
        call = ast.Call(op.loc, op_name, op.loc, targs,
                        tuple(ast.Name(op.loc, f"__arg{i}") for i in range(len(args))))
        results: list[TensorInfo] = []
        try:
            results = Elaborator(ctx, env, Frame()).call_op(call)
        except Fatal as f:
            ctx.report(f.err, with_calls=False)
        except CompileError as err:
            ctx.report(err, with_calls=False)
        except Poisoned:
            pass
        if ctx.diagnostics or not results:
            raise CompileError(ctx.diagnostics or [Diagnostic("error", "op failed", op.loc)])
        names = [p.name or "result" for p in op.outputs]
        for op_ in ctx.ops:
            op_.attrs.pop("nf.callsite", None)
        body = Block([*ctx.ops, ReturnOp([r.value for r in results], loc=op.loc)])
        func = Func(op_name, args, body, arg_attrs=[{"nf.role": "input"} for _ in args],
                    attrs={"nf.results": names}, loc=op.loc)
        return Module(_module_name(filename), [func])
