"""`nfc fmt`: the canonical layout of .nf source, in the manner of gofmt.

The formatter keeps every line break the author wrote (newlines are significant in a few places
of the grammar: the body of `max(j)` must start on the line of its `)`, a statement-level `if`
starts its line) and every comment, and canonicalises the rest:

- statements are indented by two spaces per enclosing `{ }`; lines that continue a statement
  keep their indentation relative to the statement's first line (at least two spaces more),
  or, when they were aligned with a token inside an open bracket (an argument, or an
  operand of `if`, `else`, `and`, `or`) that formatting moved, stay aligned with that token;
- between tokens of a line: one space around binary operators, `=`, `->` and keywords, one
  after `,` and `:`, none inside brackets, before `,` or `:`, after a unary `-`, between a
  name and its `(`, `[` or `<...>`, around `..` and in `std.nn`;
- the name of a declaration starts 7 columns after its kind word (`input  x`, `param  w`,
  `random u`), so that the names of a model's declarations line up;
- a comment after code keeps its distance from the code, at least two spaces (so comments
  aligned after canonical code stay aligned); a comment line is indented like the code around
  it: by its block when outside brackets, like a continuation line inside them;
- trailing whitespace goes, tabs become spaces, runs of blank lines become one, blank lines at
  the start and the end of the file go, and the file ends with one newline.

The result is checked before it is returned: it must lex to the same tokens (after the
post-lexer, which decides what newlines mean), so formatting never changes the program.

    from nfc.format import format_source
    new_text = format_source(text, "model.nf")      # CompileError on a syntax error
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from lark import Lark, Token

from nfc.frontend import ast
from nfc.frontend.parser import _PostLex, grammar_path, parse

__all__ = ["format_source", "FormatError", "INDENT"]

#: Spaces per block level.
INDENT = 2
#: Declared names start this many columns after their kind word, so that the names of
#: `input`, `param`, `state` and `random` declarations line up.
_DECL_WIDTH = len("random ")

_OPEN = {"LPAR": "RPAR", "LSQB": "RSQB", "LBRACE": "RBRACE"}
_CLOSE = {"RPAR", "RED_RPAR", "RSQB", "RBRACE"}
_BINARY = {"PLUS", "MINUS", "STAR", "SLASH", "DSLASH", "PERCENT", "LT", "LE", "GT", "GE",
           "EQEQ", "NE", "AND", "OR", "EQ", "ARROW"}
#: Continuation lines may be aligned with a token inside brackets that follows one of these
#: (or the bracket itself): the start of an argument, an operand of `if`, `else`, `and`, `or`.
_ALIGN_AFTER = {"COMMA", "IF", "ELSE", "AND", "OR"}
#: After these a `-` is unary.
_UNARY_AFTER = {*_BINARY, "LPAR", "LSQB", "LBRACE", "COMMA", "COLON", "DOTDOT", "TPL_LT",
                "RED_RPAR", "IF", "STMT_IF", "ELSE", "IN", "NOT", "WITH"}


class FormatError(Exception):
    """The formatted text would not be the same program (a bug in the formatter)."""


_LEXER: Lark | None = None
_LOCK = threading.Lock()


def _lex(text: str) -> list[Token]:
    """The tokens of `text` after the post-lexer (RED_RPAR, TPL_LT, STMT_IF decided)."""
    global _LEXER
    with _LOCK:
        if _LEXER is None:
            _LEXER = Lark(grammar_path().read_text(), parser="lalr", lexer="basic",
                          postlex=_PostLex(), keep_all_tokens=True)
        return list(_LEXER.lex(text))


def _statement_starts(program: ast.Program) -> tuple[set[tuple[int, int]], set[tuple[int, int]]]:
    """(line, column) of the first token of every import, op, model and statement; and of the
    kind word of every declaration (`input`, `param`, ...)."""
    starts: set[tuple[int, int]] = set()
    kinds: set[tuple[int, int]] = set()

    def stmts(body: tuple[ast.Stmt, ...]) -> None:
        for s in body:
            starts.add((s.loc.line, s.loc.col))
            if isinstance(s, ast.Decl):
                kinds.add((s.kind_loc.line, s.kind_loc.col))
            if isinstance(s, ast.If):
                stmts(s.then)
                stmts(s.orelse)
            elif isinstance(s, ast.For):
                stmts(s.body)

    for imp in program.imports:
        starts.add((imp.loc.line, imp.loc.col))
    for op in program.ops:
        starts.add((op.loc.line, op.loc.col))
        stmts(op.body)
    for m in program.models:
        starts.add((m.loc.line, m.loc.col))
        stmts(m.body)
    return starts, kinds


@dataclass
class _Open:
    """An open bracket: its kind, and the columns (0-based, before and after formatting) of
    the tokens directly inside it so far, which continuation lines may be aligned with."""

    kind: str
    token: Token
    cols: list[tuple[int, int]] = field(default_factory=list)


def _space(prev: Token | None, prev2: Token | None, tok: Token, *, angle_open: bool,
           angle_close: bool, after_angle_close: bool) -> bool:
    """Whether one space separates `prev` and `tok` on a line. `angle_open`: `prev` opens a
    `<...>` of compile-time parameters or arguments; `angle_close`: `tok` closes one;
    `after_angle_close`: `prev` closed one."""
    if prev is None:
        return False
    p, t = prev.type, tok.type
    if t in ("COMMA", "COLON", "RPAR", "RED_RPAR", "RSQB", "DOT", "DOTDOT"):
        return False
    if p in ("DOT", "DOTDOT", "LPAR", "LSQB") or angle_open:
        return False
    if t == "RBRACE" or p == "LBRACE":
        return not (p == "LBRACE" and t == "RBRACE")
    if t == "TPL_LT" or (t == "LT" and prev2 is not None and prev2.type == "OP"):
        return False  # `conv2d<stride = 2>`, `op f<p: int>`
    if angle_close:
        return False
    if p == "MINUS" and (prev2 is None or prev2.type in _UNARY_AFTER):
        return False  # unary minus
    if t in ("LPAR", "LSQB"):
        # a call, a subscript, a type: no space after the name (or `max`, or the `>` closing
        # compile-time arguments); a parenthesised expression elsewhere gets one
        return not (p in ("NAME", "SUM", "PROD", "MAX", "MIN") or after_angle_close)
    return True


def format_source(text: str, file: str = "<input>") -> str:
    """The canonical layout of `text`; CompileError (located) when it does not parse."""
    program = parse(text, file)
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    starts, kinds = _statement_starts(program)
    tokens = _lex(text)
    by_line: dict[int, list[Token]] = {}
    for tok in tokens:
        by_line.setdefault(tok.line or 1, []).append(tok)

    out: list[str] = []
    stack: list[_Open] = []  # open brackets and braces
    depth = 0  # open braces
    angles: list[int] = []  # len(stack) at each open `<...>`
    angle_opens: set[int] = set()  # id() of the tokens that opened one
    prev: Token | None = None
    prev2: Token | None = None
    after_angle_close = False
    stmt_old = stmt_new = 0  # indentation of the current statement's first line, before/after
    blank = False

    def continuation(old_indent: int) -> int:
        # relative to the statement's first line, unless the line was aligned with a token
        # inside an open bracket that has moved: then with that token where it is now
        rel = max(old_indent + stmt_new - stmt_old, stmt_new + INDENT)
        if any(new == rel for o in stack for _, new in o.cols):
            return rel
        for o in reversed(stack):
            for old, new in reversed(o.cols):
                if old == old_indent:
                    return new
        return rel

    for ln, raw in enumerate(text.split("\n"), start=1):
        toks = by_line.get(ln, [])
        hash_at = raw.find("#")
        comment = raw[hash_at:].rstrip() if hash_at >= 0 else None
        if not toks and comment is None:
            blank = bool(out)
            continue
        if blank:
            out.append("")
            blank = False
        old_indent = len(raw) - len(raw.lstrip(" \t\f"))
        paren_depth = sum(o.kind != "LBRACE" for o in stack)
        if not toks:  # a comment line
            indent = depth * INDENT if paren_depth == 0 else continuation(old_indent)
            out.append(" " * indent + comment)  # type: ignore[operator]
            continue
        first = toks[0]
        if (first.line, first.column) in starts or (paren_depth == 0 and (
                first.type in ("RBRACE", "LBRACE") or (
                    first.type == "ELSE" and prev is not None and prev.type == "RBRACE"))):
            closing = next((i for i, t in enumerate(toks) if t.type != "RBRACE"), len(toks))
            indent = max(0, depth - closing) * INDENT
            stmt_old, stmt_new = old_indent, indent
        else:
            indent = continuation(old_indent)
        line = " " * indent
        for i, tok in enumerate(toks):
            t = tok.type
            angle_close = t == "GT" and bool(angles) and angles[-1] == len(stack)
            if i > 0 and prev is not None and (prev.line, prev.column) in kinds:
                line += " " * max(1, _DECL_WIDTH - len(str(prev)))
            elif i > 0 and _space(prev, prev2, tok, angle_open=id(prev) in angle_opens,
                                  angle_close=angle_close, after_angle_close=after_angle_close):
                line += " "
            if stack and stack[-1].kind != "LBRACE" and t not in _CLOSE and (
                    prev is None or prev.type in _ALIGN_AFTER or prev is stack[-1].token):
                stack[-1].cols.append(((tok.column or 1) - 1, len(line)))
            line += str(tok)
            if t in _OPEN:
                stack.append(_Open(t, tok))
                depth += t == "LBRACE"
            elif t in _CLOSE:
                if stack:
                    stack.pop()
                if t == "RBRACE":
                    depth = max(0, depth - 1)
            elif t == "TPL_LT" or (t == "LT" and prev2 is not None and prev2.type == "OP"):
                angles.append(len(stack))
                angle_opens.add(id(tok))
            elif angle_close:
                angles.pop()
            after_angle_close = angle_close
            prev2, prev = prev, tok
        if comment is not None:
            gap = hash_at - len(raw[:hash_at].rstrip())
            line += " " * max(gap, 2) + comment
        out.append(line.rstrip())
    result = "\n".join(out) + "\n" if out else ""
    _verify(tokens, result, file)
    return result


def _verify(tokens: list[Token], result: str, file: str) -> None:
    """Refuse a result that does not lex to the same tokens."""
    try:
        again = _lex(result)
    except Exception as exc:  # noqa: BLE001 - any failure here is a formatter bug
        raise FormatError(f"{file}: the formatted text does not lex: {exc}") from None
    a = [(t.type, str(t)) for t in tokens]
    b = [(t.type, str(t)) for t in again]
    if a != b:
        at = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                  min(len(a), len(b)))
        raise FormatError(f"{file}: formatting would change the program near token {at} "
                          f"({a[at:at + 3]} -> {b[at:at + 3]})")
