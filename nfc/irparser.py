"""The parser of the textual IR: the inverse of nfc.printer.

    module = parse_module(text, "model.nfir")      # raises CompileError with located diagnostics
    assert print_module(module) == text            # for any text the printer produced

The grammar is grammar/nfir.lark (LALR). The IR is built directly in the parser's reduce
callbacks (nfc.irbuild), so there is no parse tree and nothing recurses over the input: deep
nesting is refused with a diagnostic at a fixed depth instead of overflowing Python's stack.

Value names `%x` become the values' name hints, so printing a parsed module gives back the
printed names. A file may also hold bare `nf.func`s without a module; they go into a module
named after the file.
"""

from __future__ import annotations

import difflib
import re
import threading
from collections.abc import Mapping
from functools import cache
from importlib.resources import files
from pathlib import Path

from lark import Lark, Token
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from nfc.diagnostics import SOURCES, CompileError, Diagnostic
from nfc.ir import Expr, Loc, Module, Value
from nfc.irbuild import Builder, Limits

__all__ = ["LIMITS", "parse_expr", "parse_module", "strip_comments"]

#: The bounds every parse enforces (input size, nesting depths); see nfc.irbuild.Limits.
LIMITS = Limits()

_SCAN = re.compile(r'"(?:[^"\\\n]|\\.)*"?|[()]|//')


def strip_comments(text: str) -> str:
    """`text` with every `// ...` comment blanked out, lines and columns unchanged.

    `//` is also floor division, so it starts a comment only outside parentheses (expressions
    only occur inside the parentheses of `nf.compute`) and outside string literals.
    """
    pieces: list[str] = []
    depth = 0
    pos = last = 0
    while (m := _SCAN.search(text, pos)) is not None:
        tok = m.group()
        if tok == "(":
            depth += 1
        elif tok == ")":
            depth = max(0, depth - 1)
        elif tok == "//" and depth == 0:
            end = text.find("\n", m.start())
            end = len(text) if end < 0 else end
            pieces += [text[last:m.start()], " " * (end - m.start())]
            last = pos = end
            continue
        pos = m.end()
    if not pieces:
        return text
    pieces.append(text[last:])
    return "".join(pieces)


# ---------------------------------------------------------------------------------------------
# the Lark parser is built once with one Builder as its transformer (Lark binds the callbacks
# at construction); the lock makes the shared builder safe to use from several threads

_BUILDER = Builder()
_LOCK = threading.Lock()


@cache
def _parser() -> Lark:
    grammar = (files("nfc.grammar") / "nfir.lark").read_text(encoding="utf-8")
    return Lark(grammar, parser="lalr", lexer="contextual", start=["start", "expr_start"],
                transformer=_BUILDER, maybe_placeholders=True, cache=True)


def _module_name(filename: str) -> str:
    stem = Path(filename.strip("<>")).stem
    return re.sub(r"[^A-Za-z0-9_.$-]", "_", stem) or "module"


def _run(text: str, filename: str, start: str, module_name: str,
         values: Mapping[str, Value] | None = None) -> object:
    """Parse, collecting semantic errors; raise every diagnostic found."""
    SOURCES.add(filename, text)
    if len(text) > LIMITS.max_chars:
        raise CompileError([Diagnostic(
            "error", f"input is too large ({len(text)} characters; the limit is "
            f"{LIMITS.max_chars})", Loc(filename, 1, 1))])
    parser = _parser()
    with _LOCK:
        _BUILDER.begin(filename, LIMITS, module_name)
        for name, v in (values or {}).items():
            _BUILDER.define(name, v, None)
        result = None
        diagnostics = _BUILDER.diags.diagnostics
        try:
            # a lone expression has no comments, and its `//` is always floor division
            source = strip_comments(text) if start == "start" else text
            result = parser.parse(source, start=start)
        except UnexpectedInput as exc:
            _BUILDER.flush_undefined()  # uses seen before the syntax error are reported too
            diagnostics.append(_syntax_error(exc, text, filename))
        finally:
            _BUILDER.begin("<input>", LIMITS, "module")  # drop references to this parse's IR
    if diagnostics:
        raise CompileError(diagnostics)
    return result


def parse_module(text: str, filename: str = "<input>") -> Module:
    """Parse a module (or bare functions, wrapped in a module named after `filename`).

    Raises CompileError with every diagnostic found: syntax errors (the first one stops the
    parse), undefined and redefined values, type mismatches between uses and declarations,
    unknown intrinsics and element types, and inputs beyond LIMITS.
    """
    result = _run(text, filename, "start", _module_name(filename))
    assert isinstance(result, Module)
    return result


def parse_expr(text: str, values: Mapping[str, Value] | None = None,
               filename: str = "<expr>") -> Expr:
    """Parse one scalar expression; `%name` loads resolve through `values` (name -> Value)."""
    result = _run(text, filename, "expr_start", "expr", values)
    assert isinstance(result, Expr)
    return result


# ---------------------------------------------------------------------------------------------
# syntax errors

_TERMINAL_NAMES = {
    "VALUE": "a value (%name)", "SYMBOL": "a symbol (@name)", "TENSOR": "a tensor type",
    "NAME": "an identifier", "KEY": "an attribute key", "INT": "an integer",
    "NUMBER": "a number", "STRING": "a string", "CMP": "a comparison", "REDUCE":
    "a reduction kind (sum, max, min, prod)", "MUL": "'*', '/', '//' or '%'", "$END":
    "end of input", "LOC": "'loc('",
}
_MAX_EXPECTED = 14


def _describe_terminal(name: str) -> str:
    if name in _TERMINAL_NAMES:
        return _TERMINAL_NAMES[name]
    term = _parser().get_terminal(name)
    if term.pattern.type == "str":
        return f"'{term.pattern.value}'"
    return name.lower()


def _expected(names: set[str] | frozenset[str] | None) -> str:
    descs = sorted({_describe_terminal(n) for n in (names or ())},
                   key=lambda d: (not d.startswith("'"), d))
    if not descs:
        return ""
    if len(descs) > _MAX_EXPECTED:
        descs = descs[:_MAX_EXPECTED] + ["..."]
    if len(descs) == 1:
        return descs[0]
    return "one of " + ", ".join(descs)


def _found(text: str) -> str:
    shown = text if len(text) <= 40 else text[:37] + "..."
    return repr(shown) if "'" in shown else f"'{shown}'"


def _syntax_error(exc: UnexpectedInput, text: str, filename: str) -> Diagnostic:
    line, col = getattr(exc, "line", 1), getattr(exc, "column", 1)
    if isinstance(exc, UnexpectedToken):
        tok: Token = exc.token
        if tok.type == "$END":
            lines = text.split("\n")
            line, col = len(lines), len(lines[-1]) + 1
            found, end = "end of input", None
        else:
            found = _found(str(tok))
            end = (col + len(tok)) if "\n" not in str(tok) else None
        msg = f"expected {_expected(exc.accepts or exc.expected)}, found {found}"
        notes = _hints(tok, exc.accepts or exc.expected or set(), filename)
        return Diagnostic("error", msg, Loc(filename, line, col, end), notes)
    if isinstance(exc, UnexpectedCharacters):
        char = text[exc.pos_in_stream] if exc.pos_in_stream < len(text) else ""
        exp = _expected(exc.allowed)
        msg = f"unexpected character {_found(char)}" + (f"; expected {exp}" if exp else "")
        return Diagnostic("error", msg, Loc(filename, line, col))
    assert isinstance(exc, UnexpectedEOF)
    lines = text.split("\n")
    return Diagnostic("error", f"unexpected end of input; expected {_expected(set(exc.expected))}",
                      Loc(filename, len(lines), len(lines[-1]) + 1))


def _hints(tok: Token, accepts: set[str] | frozenset[str], filename: str) -> tuple[Diagnostic, ...]:
    """Notes for the common slips: a misspelt op name or keyword."""
    if tok.type in ("$END",) or not str(tok).strip():
        return ()
    words = [t for t in ("nf.module", "nf.func", "nf.compute", "nf.call", "nf.kernel",
                         "nf.return", "nf.yield", "attributes")
             if any(_describe_terminal(a) == f"'{t}'" for a in accepts)]
    close = difflib.get_close_matches(str(tok), words, n=1, cutoff=0.7)
    if close:
        return (Diagnostic("note", f"did you mean '{close[0]}'?",
                           Loc(filename, tok.line or 1, tok.column or 1)),)
    return ()
