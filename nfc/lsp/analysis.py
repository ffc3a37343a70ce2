"""What the language server knows about one .nf document, independent of the protocol.

`analyze(text, path)` runs the frontend exactly as `nfc opt` does (every model of the file is
elaborated; a file of ops has its ops checked at sample sizes) and keeps:

- the diagnostics, as the compiler reports them;
- the program and its import scope (for go-to-definition and completion);
- every tensor binding the elaborator made in this file, with its concrete type: declarations,
  statements of models and the statements and parameters of ops at each of their calls. Hover
  looks them up.

Bindings are recorded by watching the frontend's environments (`Env.vars`) while it runs,
so no frontend code needs to know about the server. Positions here are 1-based line and column
like `nfc.ir.Loc`; the server converts them to the protocol's 0-based ones.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nfc.diagnostics import SOURCES, CompileError, Diagnostic
from nfc.frontend import ast
from nfc.frontend.imports import Loader, ModuleScope, parse_file_cached, std_dir
from nfc.ir import Loc

__all__ = ["Analysis", "Binding", "OpInfo", "analyze", "binding_at", "op_info", "std_ops",
           "visible_ops", "word_at"]

_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_LOCK = threading.Lock()

#: Words completed besides op names.
KEYWORDS = ("import", "op", "model", "if", "else", "for", "in", "with", "and", "or", "not",
            "true", "false", "sum", "prod", "max", "min", "input", "param", "state", "random",
            "update", "output", "minimize", "training", "inf", "nan")
INTRINSICS = ("exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "erf", "softplus", "log1p",
              "expm1", "atan2", "isfinite", "abs", "pow", "reshape", "transpose", "zeros",
              "full", "zeros_like", "stop_gradient")


@dataclass
class Binding:
    """A name bound to a tensor at `loc` (a declaration, a statement's target, a parameter),
    with the concrete types it took (one per call of an op, usually one)."""

    name: str
    loc: Loc
    types: list[str] = field(default_factory=list)
    declared: str = ""
    """The declaration with its variables' values, `f32[B, C, H, W] with H = 30`."""


@dataclass
class OpInfo:
    """An op definition: where it is, its signature as written and its doc comment."""

    name: str
    file: str
    line: int
    col: int
    signature: str
    doc: str


@dataclass
class Analysis:
    """The result of analysing one document."""

    path: str
    text: str
    diagnostics: list[Diagnostic] = field(default_factory=list)
    program: ast.Program | None = None
    scope: ModuleScope | None = None
    bindings: list[Binding] = field(default_factory=list)


# ---------------------------------------------------------------------------------------------
# recording the elaborator's bindings


class _Vars(dict):  # type: ignore[type-arg]
    """An `Env.vars` that reports every tensor binding to `sink`."""

    def __init__(self, sink: Any) -> None:
        super().__init__()
        self.sink = sink

    def __setitem__(self, key: str, value: Any) -> None:
        super().__setitem__(key, value)
        self.sink(key, value)

    def update(self, *args: Any, **kw: Any) -> None:  # type: ignore[override]
        for k, v in dict(*args, **kw).items():
            self[k] = v


@contextmanager
def _recording(file: str, out: dict[tuple[str, int, int], Binding]) -> Iterator[None]:
    """Record the tensor bindings located in `file` while the frontend runs. Ops checked at
    sample sizes (nfc.frontend.uncalled) are not recorded: their sizes are made up."""
    import nfc.frontend as fe
    from nfc.frontend import context
    from nfc.frontend.shapes import format_tensor_type

    active = [True]

    def sink(name: str, value: Any) -> None:
        if not active[0] or not isinstance(value, context.TensorInfo):
            return
        loc = value.decl_loc
        if loc is None or loc.file != file or name.startswith("__"):
            return
        b = out.setdefault((name, loc.line, loc.col), Binding(name, loc))
        t = format_tensor_type(value.value.type)
        if t not in b.types:
            b.types.append(t)
        if not b.declared and value.decl_text and value.decl_text != t:
            b.declared = value.decl_text

    original_init = context.Env.__init__
    original_uncalled = fe.check_uncalled

    def init(self: Any, *args: Any, **kw: Any) -> None:
        original_init(self, *args, **kw)
        self.vars = _Vars(sink)

    def uncalled(*args: Any, **kw: Any) -> Any:
        active[0] = False
        try:
            return original_uncalled(*args, **kw)
        finally:
            active[0] = True

    context.Env.__init__ = init  # type: ignore[method-assign]
    fe.check_uncalled = uncalled  # type: ignore[assignment]
    try:
        yield
    finally:
        context.Env.__init__ = original_init  # type: ignore[method-assign]
        fe.check_uncalled = original_uncalled


# ---------------------------------------------------------------------------------------------
# analysis


def analyze(text: str, path: str) -> Analysis:
    """Compile `text` (the unsaved contents of the file `path`) and record what it found."""
    from nfc.frontend import compile_source
    from nfc.frontend.parser import parse

    result = Analysis(path, text)
    try:
        result.program = parse(text, path)
    except CompileError as err:
        result.diagnostics = list(err.diagnostics)
        return result
    found: dict[tuple[str, int, int], Binding] = {}
    models = [m.name for m in result.program.models] or [None]
    seen: set[tuple[str, Loc | None]] = set()
    with _LOCK, _recording(path, found):
        for name in dict.fromkeys(models):
            try:
                compile_source(text, path, model=name)
            except CompileError as err:
                for d in err.diagnostics:
                    if (d.message, d.loc) not in seen:
                        seen.add((d.message, d.loc))
                        result.diagnostics.append(d)
            except Exception as exc:  # noqa: BLE001 - the server must survive a frontend bug
                result.diagnostics.append(Diagnostic(
                    "error", f"internal error in nfc: {type(exc).__name__}: {exc}",
                    Loc(path, 1, 1)))
        try:
            result.scope = Loader([]).load_root(text, path)
        except CompileError:
            result.scope = None
    result.bindings = sorted(found.values(), key=lambda b: (b.loc.line, b.loc.col))
    return result


def word_at(text: str, line: int, col: int) -> tuple[str, int, int] | None:
    """The name at 1-based (line, col), with its start and end columns (end exclusive)."""
    lines = text.split("\n")
    if not 1 <= line <= len(lines):
        return None
    src = lines[line - 1]
    for m in _WORD.finditer(src):
        if m.start() + 1 <= col <= m.end() + 1 and not src[:m.start()].count("#"):
            if col == m.end() + 1 and m.end() < len(src) and _WORD.match(src, m.end()):
                continue
            return m.group(), m.start() + 1, m.end() + 1
    return None


def _def_spans(program: ast.Program, nlines: int) -> list[tuple[int, int, ast.Node]]:
    """(first line, last line, node) of every op and model, in order."""
    defs: list[ast.Node] = sorted([*program.ops, *program.models],
                                  key=lambda d: (d.loc.line, d.loc.col))
    spans = []
    for i, d in enumerate(defs):
        end = defs[i + 1].loc.line - 1 if i + 1 < len(defs) else nlines
        spans.append((d.loc.line, end, d))
    return spans


def enclosing(an: Analysis, line: int) -> ast.Node | None:
    """The op or model whose text holds `line`."""
    if an.program is None:
        return None
    for first, last, node in _def_spans(an.program, an.text.count("\n") + 1):
        if first <= line <= last:
            return node
    return None


def binding_at(an: Analysis, name: str, line: int, col: int) -> Binding | None:
    """The binding of `name` visible at (line, col): the latest one before it in the same op
    or model (or the one defined right there)."""
    node = enclosing(an, line)
    best = None
    for b in an.bindings:
        if b.name != name or (b.loc.line, b.loc.col) > (line, col):
            continue
        if node is not None and enclosing(an, b.loc.line) is not node:
            continue
        best = b
    if best is None and isinstance(node, ast.OpDef):
        for p in (*node.params, *node.outputs):
            if p.name == name:
                return Binding(name, p.loc, [], _type_text(p.type))
    return best


def _type_text(t: ast.TypeExpr) -> str:
    text = SOURCES.line(t.loc.file, t.loc.line)
    if text is not None and t.loc.end_col is not None:
        return text[t.loc.col - 1:t.loc.end_col - 1]
    return t.dtype + "[...]"


# ---------------------------------------------------------------------------------------------
# ops: signatures, definitions, the standard library


def op_info(op: ast.OpDef) -> OpInfo:
    """The signature (from `op` to the body's `{`, on one line) and doc comment of `op`."""
    from nfc.format import _lex

    text = SOURCES.files.get(op.loc.file, "")
    lines = text.split("\n")
    start = sum(len(x) + 1 for x in lines[:op.loc.line - 1]) + op.loc.col - 1
    sig = f"op {op.name}"
    depth = 0
    try:
        for tok in _lex(text[start:]):
            if tok.type in ("LPAR", "LSQB"):
                depth += 1
            elif tok.type in ("RPAR", "RED_RPAR", "RSQB"):
                depth -= 1
            elif tok.type == "LBRACE" and depth == 0:
                sig = " ".join(text[start:start + (tok.start_pos or 0)].split())
                break
    except Exception:  # noqa: BLE001 - a signature is a nicety
        pass
    sig = sig.replace("( ", "(").replace(" )", ")").replace("[ ", "[").replace(" ]", "]")
    doc: list[str] = []
    i = op.loc.line - 2
    while i >= 0 and lines[i].lstrip().startswith("#"):
        doc.insert(0, lines[i].lstrip()[1:].strip())
        i -= 1
    while doc and set(doc[0]) <= {"-", ""}:
        doc.pop(0)
    col = op.loc.col
    name_line = lines[op.loc.line - 1] if op.loc.line <= len(lines) else ""
    m = re.search(rf"\b{re.escape(op.name)}\b", name_line[op.loc.col - 1:])
    if m:
        col = op.loc.col + m.start()
    return OpInfo(op.name, op.loc.file, op.loc.line, col, sig, "\n".join(doc))


_STD: dict[str, OpInfo] | None = None


def std_ops() -> dict[str, OpInfo]:
    """Every op of the standard library (std.nn)."""
    global _STD
    if _STD is None:
        program = parse_file_cached(std_dir() / "nn.nf")
        _STD = {op.name: op_info(op) for op in program.ops}
    return _STD


def visible_ops(an: Analysis) -> dict[str, list[ast.OpDef]]:
    """The ops visible in the document: its own and those of its imports."""
    out: dict[str, list[ast.OpDef]] = {}
    if an.scope is not None:
        for name, op in an.scope.ops.items():
            out[name] = [op]
        for name, entries in an.scope.imported.items():
            if name not in out:
                out[name] = [o for o, _ in entries]
    elif an.program is not None:
        for op in an.program.ops:
            out.setdefault(op.name, [op])
    return out


def file_path(name: str) -> Path:
    """The absolute path of a file named as the frontend names it (relative to the cwd)."""
    p = Path(name)
    return (p if p.is_absolute() else Path.cwd() / p).resolve()
