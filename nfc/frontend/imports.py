"""Imports: finding, parsing (with a cache) and scoping .nf modules.

`import std.nn` reads nfc/std/nn.nf; `import a.b` reads a/b.nf next to the importing file,
then in each search path. An import makes the imported file's ops visible unqualified in the
importing file (not transitively). Cycles are refused with the chain of imports.
"""

from __future__ import annotations

import difflib
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

from nfc.diagnostics import CompileError, Diagnostic, error, note
from nfc.frontend import ast
from nfc.frontend.parser import parse
from nfc.frontend.shapes import DTYPES
from nfc.ir import Loc

#: Names an op may not take: casts and builtins. (An op may share an intrinsic's name, like the
#: stdlib's `tanh`; calls then mean the intrinsic, which works on every rank.)
RESERVED = {*DTYPES, "reshape", "transpose", "zeros", "full", "zeros_like", "stop_gradient",
            "training", "inf", "nan"}


def std_dir() -> Path:
    """The folder of the standard library (nfc/std)."""
    import nfc

    return Path(nfc.__file__).parent / "std"


@dataclass
class ModuleScope:
    """A parsed file with the ops it sees: its own and those of the files it imports."""

    file: str
    program: ast.Program
    ops: dict[str, ast.OpDef] = field(default_factory=dict)
    imported: dict[str, list[tuple[ast.OpDef, ModuleScope]]] = field(default_factory=dict)
    incomplete: bool = False
    """True when an import failed: unknown names are then not reported again."""

    def lookup_op(self, name: str, loc: Loc) -> tuple[ast.OpDef, ModuleScope] | None:
        """The op `name` visible here; an own op shadows imported ones."""
        if name in self.ops:
            return self.ops[name], self
        found = self.imported.get(name, [])
        if len(found) > 1:
            raise error(f"op '{name}' is ambiguous: it is defined in "
                        f"{' and '.join(s.file for _, s in found)}", loc,
                        *(note("defined here", o.loc) for o, _ in found))
        return found[0] if found else None

    def op_names(self) -> list[str]:
        """Every op name visible here (for suggestions)."""
        return [*self.ops, *self.imported]


_CACHE: dict[str, tuple[int, int, ast.Program]] = {}
_CACHE_LOCK = threading.Lock()


def _display(path: Path) -> str:
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return str(path)
    return rel if not rel.startswith("..") else str(path)


def parse_file_cached(path: Path) -> ast.Program:
    """Parse a file, reusing the tree while its size and modification time are unchanged."""
    st = path.stat()
    key = str(path)
    with _CACHE_LOCK:
        hit = _CACHE.get(key)
    if hit is not None and hit[0] == st.st_mtime_ns and hit[1] == st.st_size:
        from nfc.diagnostics import SOURCES

        if hit[2].file not in SOURCES.files:
            SOURCES.add(hit[2].file, path.read_text(encoding="utf-8", errors="replace"))
        return hit[2]
    text = path.read_text(encoding="utf-8", errors="replace")
    program = parse(text, _display(path))
    with _CACHE_LOCK:
        _CACHE[key] = (st.st_mtime_ns, st.st_size, program)
    return program


_TEXTS: dict[tuple[str, str], ast.Program] = {}
#: Most root sources whose trees are kept, and the longest kept (compile_op and tests compile
#: the same library again and again; parsing it costs far more than elaborating one op).
_TEXTS_KEPT, _TEXT_MAX = 8, 1 << 20


def parse_text_cached(text: str, filename: str) -> ast.Program:
    """Parse source text, reusing the tree of an identical text with the same file name."""
    key = (filename, text)
    with _CACHE_LOCK:
        hit = _TEXTS.get(key)
    if hit is not None:
        from nfc.diagnostics import SOURCES

        SOURCES.add(filename, text)
        return hit
    program = parse(text, filename)
    if len(text) <= _TEXT_MAX:
        with _CACHE_LOCK:
            while len(_TEXTS) >= _TEXTS_KEPT:
                _TEXTS.pop(next(iter(_TEXTS)))
            _TEXTS[key] = program
    return program


class Loader:
    """Loads a root file and everything it imports, collecting diagnostics."""

    def __init__(self, search_paths: list[str] | None = None) -> None:
        self.search_paths = [Path(p) for p in (search_paths or [])]
        self.modules: dict[str, ModuleScope] = {}
        self.stack: list[str] = []
        self.diagnostics: list[Diagnostic] = []

    def load_root(self, text: str, filename: str) -> ModuleScope:
        """Parse `text` and its imports; syntax errors of the root raise at once."""
        program = parse_text_cached(text, filename)
        base = Path(filename).resolve().parent if Path(filename).parent.is_dir() else Path.cwd()
        key = str(Path(filename).resolve())
        self.stack.append(key)
        scope = self._scope(program, base)
        self.stack.pop()
        return scope

    def resolve(self, imp: ast.Import, base: Path) -> Path:
        """The file an import names, or a diagnostic listing where it looked."""
        parts = list(imp.path)
        if parts[0] == "std" and len(parts) > 1:
            candidates = [std_dir().joinpath(*parts[1:]).with_suffix(".nf")]
        else:
            rel = Path(*parts).with_suffix(".nf")
            candidates = [base / rel] + [p / rel for p in self.search_paths]
        for c in candidates:
            if c.is_file():
                return c.resolve()
        looked = ", ".join(str(c) for c in candidates)
        raise error(f"cannot find module '{'.'.join(parts)}' (looked for {looked})", imp.loc)

    def _scope(self, program: ast.Program, base: Path) -> ModuleScope:
        scope = ModuleScope(program.file, program)
        for op in program.ops:
            if op.name in RESERVED:
                self.diagnostics.append(Diagnostic(
                    "error", f"op '{op.name}' would hide the builtin of the same name", op.loc))
            elif op.name in scope.ops:
                first = scope.ops[op.name]
                self.diagnostics.append(Diagnostic(
                    "error", f"op '{op.name}' is defined twice", op.loc,
                    (note("first defined here", first.loc),)))
            else:
                scope.ops[op.name] = op
        for imp in program.imports:
            try:
                sub = self.load(imp, base)
            except CompileError as err:
                self.diagnostics += err.diagnostics
                scope.incomplete = True
                continue
            if sub.incomplete:
                scope.incomplete = True
            for name, op in sub.ops.items():
                entries = scope.imported.setdefault(name, [])
                if all(o is not op for o, _ in entries):
                    entries.append((op, sub))
        return scope

    def load(self, imp: ast.Import, base: Path) -> ModuleScope:
        """The scope of an imported module (loaded once per compilation)."""
        path = self.resolve(imp, base)
        key = str(path)
        if key in self.stack:
            chain = [Path(p).name for p in self.stack[self.stack.index(key):]] + [path.name]
            raise error(f"import cycle: {' -> '.join(chain)}", imp.loc)
        if key in self.modules:
            return self.modules[key]
        try:
            program = parse_file_cached(path)
        except OSError as exc:
            raise error(f"cannot read module '{'.'.join(imp.path)}': {exc.strerror}",
                        imp.loc) from None
        self.stack.append(key)
        try:
            scope = self._scope(program, path.parent)
        finally:
            self.stack.pop()
        self.modules[key] = scope
        return scope


def suggest(name: str, candidates: list[str]) -> str:
    """`; did you mean 'x'?` or nothing."""
    found = difflib.get_close_matches(name, candidates, 1)
    return f"; did you mean '{found[0]}'?" if found else ""
