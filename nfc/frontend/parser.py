"""Parse .nf text into the AST (nfc.frontend.ast) with Lark's LALR parser.

The tree is built by callbacks run while parsing (Lark's inline transformer), so no step
recurses over the tree; expression depth is measured as nodes are built and refused past
MAX_NESTING (continuing a chain of operators of one level, `a + b - c`, adds no depth).
Syntax errors become located diagnostics with readable token names.
"""

from __future__ import annotations

import difflib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lark import Lark, Token, Transformer
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken

from nfc.diagnostics import SOURCES, CompileError, Diagnostic
from nfc.frontend import ast
from nfc.frontend.limits import MAX_INT_DIGITS, MAX_NESTING, check_nesting, check_size
from nfc.ir import Loc

_REDOPS = {"SUM": "sum", "PROD": "prod", "MAX": "max", "MIN": "min"}
_BODY_START = {"NAME", "INT", "FLOAT", "LPAR", "TRUE", "FALSE", "NOT", *_REDOPS}
_EXPR_START = {"NAME", "INT", "FLOAT", "LPAR", "MINUS", "NOT", "TRUE", "FALSE", "ELLIPSIS",
               *_REDOPS}
_OPERATORS = {"PLUS", "MINUS", "STAR", "SLASH", "DSLASH", "PERCENT", "LT", "LE", "GT", "GE",
              "EQEQ", "NE", "AND", "OR"}
DECL_KINDS = ("input", "param", "state", "random")
#: Words that may end a declaration: `param w: ... = init frozen`, `input x: ... grad`.
DECL_FLAGS = ("frozen", "grad")
_CLOSING = {"RPAR", "RSQB", "RBRACE", "RED_RPAR", "COMMA", "GT"}


class _Abort(Exception):
    """Stops the parse at once (a limit was exceeded)."""

    def __init__(self, diag: Diagnostic) -> None:
        super().__init__(diag.message)
        self.diag = diag


class _PostLex:
    """Turns some `)` into RED_RPAR, some `<` into TPL_LT and some `if` into STMT_IF.

    See the comment at the top of grammar/nf.lark for the rules.
    """

    always_accept: tuple[str, ...] = ()

    def __init__(self) -> None:
        self.after_reduction: set[int] = set()
        self.minus_after_reduction: set[tuple[int, int]] = set()

    def process(self, stream: Iterator[Token]) -> Iterator[Token]:
        """Rewrite the token stream (one or two tokens of lookahead)."""
        self.after_reduction = set()
        self.minus_after_reduction = set()
        buf: list[Token] = []
        it = iter(stream)

        def peek(k: int) -> Token | None:
            while len(buf) <= k:
                nxt = next(it, None)
                if nxt is None:
                    return None
                buf.append(nxt)
            return buf[k]

        parens: list[str | None] = []  # for each open '(' or '[': the reduction op before it
        prev: Token | None = None
        decl_line = -1  # the line of the last declaration's start (`param w: ...`)
        while True:
            tok = peek(0)
            if tok is None:
                return
            buf.pop(0)
            t = tok.type
            if t in ("LPAR", "LSQB"):
                parens.append(prev.type if t == "LPAR" and prev is not None
                              and prev.type in _REDOPS else None)
            elif t in ("RPAR", "RSQB"):
                kind = parens.pop() if parens else None
                if t == "RPAR" and kind is not None:
                    nxt = peek(0)
                    is_body = nxt is not None and nxt.line == tok.end_line and (
                        nxt.type in _BODY_START or (kind in ("SUM", "PROD")
                                                    and nxt.type == "MINUS"))
                    if kind in ("SUM", "PROD") or is_body:
                        tok = Token.new_borrow_pos("RED_RPAR", tok.value, tok)
                        if nxt is not None:
                            self.after_reduction.add(nxt.start_pos or 0)
                            if nxt.type == "MINUS":
                                self.minus_after_reduction.add((nxt.line, nxt.column))
            elif t == "LT" and prev is not None and prev.type == "NAME":
                a, b = peek(0), peek(1)
                if a is not None and (a.type == "LSQB" or (
                        a.type == "NAME" and b is not None and b.type == "EQ")):
                    tok = Token.new_borrow_pos("TPL_LT", tok.value, tok)
            elif t == "NAME" and tok.value in DECL_KINDS and not parens:
                a, b = peek(0), peek(1)
                if a is not None and a.type == "NAME" and b is not None and b.type == "COLON":
                    decl_line = tok.line
            elif t == "NAME" and tok.value in DECL_FLAGS and not parens and prev is not None \
                    and prev.end_line == tok.line == decl_line:
                nxt = peek(0)
                if nxt is None or nxt.line != tok.end_line or nxt.type == "RBRACE":
                    tok = Token.new_borrow_pos("DECL_FLAG", tok.value, tok)
            elif t == "IF" and (prev is None or prev.type in ("LBRACE", "RBRACE", "ELSE") or (
                    not parens and tok.line != prev.end_line)):
                tok = Token.new_borrow_pos("STMT_IF", tok.value, tok)
            prev = tok
            yield tok


def _start(x: Any) -> tuple[int, int]:
    if isinstance(x, Token):
        return x.line or 1, x.column or 1
    return x.loc.line, x.loc.col


def _end(x: Any) -> tuple[int, int | None]:
    if isinstance(x, Token):
        return x.end_line or 1, x.end_column
    return x.loc.line, x.loc.end_col


class _Build(Transformer):
    """Callbacks building AST nodes; `file` is set before each parse (under the lock)."""

    def __init__(self, post: _PostLex) -> None:
        super().__init__()
        self.file = "<input>"
        self.errors: list[Diagnostic] = []
        self.post = post

    # helpers
    def loc(self, first: Any, last: Any | None = None) -> Loc:
        line, col = _start(first)
        end_line, end_col = _end(last if last is not None else first)
        return Loc(self.file, line, col, end_col if end_line == line else None)

    def tloc(self, tok: Token) -> Loc:
        return self.loc(tok)

    def err(self, message: str, loc: Loc) -> None:
        self.errors.append(Diagnostic("error", message, loc))

    def expr(self, cls: type, kids: list[Any], subexprs: tuple[ast.Expr, ...], *args: Any,
             **kw: Any) -> ast.Expr:
        depth = 1 + max((e.depth for e in subexprs), default=0)  # type: ignore[attr-defined]
        loc = self.loc(kids[0], kids[-1])
        if depth > MAX_NESTING:
            raise _Abort(Diagnostic("error", f"expression nested more than {MAX_NESTING} deep",
                                    loc))
        return cls(loc, *args, depth=depth, **kw)

    @staticmethod
    def nodes(kids: list[Any]) -> list[Any]:
        return [k for k in kids if k is not None and not isinstance(k, Token)]

    # top level
    def start(self, kids: list[Any]) -> ast.Program:
        items = self.nodes(kids)
        loc = Loc(self.file, 1, 1)
        return ast.Program(loc, self.file,
                           tuple(i for i in items if isinstance(i, ast.Import)),
                           tuple(i for i in items if isinstance(i, ast.OpDef)),
                           tuple(i for i in items if isinstance(i, ast.ModelDef)))

    def import_stmt(self, kids: list[Any]) -> ast.Import:
        names = tuple(str(k) for k in kids if isinstance(k, Token) and k.type == "NAME")
        return ast.Import(self.loc(kids[0], kids[-1]), names)

    def op_def(self, kids: list[Any]) -> ast.OpDef:
        name = kids[1]
        cparams: tuple[ast.CParam, ...] = ()
        params: list[ast.Param] = []
        outputs: tuple[ast.Param, ...] = ()
        body: tuple[ast.Stmt, ...] = ()
        for k in kids[2:]:
            if isinstance(k, _Ret):
                outputs = tuple(k.items)
            elif isinstance(k, _CParams):
                cparams = tuple(k.items)
            elif isinstance(k, ast.Param):
                params.append(k)
            elif isinstance(k, _Block):
                body = k.stmts
        return ast.OpDef(self.loc(kids[0], name), str(name), cparams, tuple(params), outputs,
                         body)

    def cparams(self, kids: list[Any]) -> _CParams:
        return _CParams(self.nodes(kids))

    def cparam(self, kids: list[Any]) -> ast.CParam:
        kind = kids[2]
        if str(kind) not in ("int", "float", "bool", "ints"):
            sugg = difflib.get_close_matches(str(kind), ["int", "float", "bool", "ints"], 1)
            hint = f"; did you mean '{sugg[0]}'?" if sugg else " (int, float, bool or ints)"
            self.err(f"unknown kind of compile-time parameter '{kind}'{hint}", self.tloc(kind))
        default = kids[4] if len(kids) > 4 else None
        return ast.CParam(self.loc(kids[0], kids[-1] if kids[-1] is not None else kind),
                          str(kids[0]), str(kind), default)

    def ret(self, kids: list[Any]) -> _Ret:
        nodes = self.nodes(kids)
        if len(nodes) == 1 and isinstance(nodes[0], ast.TypeExpr):
            t = nodes[0]
            return _Ret([ast.Param(t.loc, "", t)])
        return _Ret(nodes)

    def param(self, kids: list[Any]) -> ast.Param:
        return ast.Param(self.loc(kids[0], kids[2]), str(kids[0]), kids[2])

    def type(self, kids: list[Any]) -> ast.TypeExpr:
        return ast.TypeExpr(self.loc(kids[0], kids[-1]), str(kids[0]), self.tloc(kids[0]),
                            tuple(self.nodes(kids[1:])))

    def model_def(self, kids: list[Any]) -> ast.ModelDef:
        params = [k for k in kids if isinstance(k, ast.ModelParam)]
        block = next(k for k in kids if isinstance(k, _Block))
        return ast.ModelDef(self.loc(kids[0], kids[1]), str(kids[1]), tuple(params),
                            block.stmts)

    def mparam(self, kids: list[Any]) -> ast.ModelParam:
        return ast.ModelParam(self.loc(kids[0], kids[-1]), str(kids[0]), kids[2])

    # statements
    def block(self, kids: list[Any]) -> _Block:
        return _Block(tuple(self.nodes(kids)))

    def target(self, tok: Token) -> ast.Target:
        return ast.Target(self.tloc(tok), str(tok))

    def assign(self, kids: list[Any]) -> ast.Assign:
        return ast.Assign(self.loc(kids[0], kids[-1]), (self.target(kids[0]),), kids[2])

    def multi(self, kids: list[Any]) -> ast.Assign:
        targets = tuple(self.target(k) for k in kids[:-2] if k.type == "NAME")
        return ast.Assign(self.loc(kids[0], kids[-1]), targets, kids[-1])

    def comp(self, kids: list[Any]) -> ast.Comprehension:
        idx = tuple(k for k in kids if isinstance(k, ast.LhsIndex))
        return ast.Comprehension(self.loc(kids[0], kids[-1]), self.target(kids[0]), idx,
                                 kids[-1])

    def lhs_idx(self, kids: list[Any]) -> ast.LhsIndex:
        if len(kids) == 1:  # a name, or `...`
            return ast.LhsIndex(self.tloc(kids[0]), str(kids[0]))
        return ast.LhsIndex(self.loc(kids[0], kids[-1]), str(kids[0]), kids[2], kids[4])

    def _kind(self, tok: Token, allowed: tuple[str, ...], what: str) -> None:
        if str(tok) not in allowed:
            sugg = difflib.get_close_matches(str(tok), allowed, 1)
            hint = f"; did you mean '{sugg[0]}'?" if sugg else ""
            self.err(f"unknown {what} '{tok}'{hint}", self.tloc(tok))

    def decl(self, kids: list[Any]) -> ast.Decl:
        self._kind(kids[0], DECL_KINDS, "declaration")
        flags = [k for k in kids[4:] if isinstance(k, Token) and k.type == "DECL_FLAG"]
        rest = kids[:len(kids) - len(flags)]
        init = rest[5] if len(rest) > 5 else None
        last = kids[-1] if kids[-1] is not None else kids[3]
        return ast.Decl(self.loc(kids[0], last), str(kids[0]), self.tloc(kids[0]),
                        self.target(kids[1]), kids[3], init,
                        tuple((str(f), self.tloc(f)) for f in flags))

    def update(self, kids: list[Any]) -> ast.Update:
        self._kind(kids[0], ("update",), "statement")
        return ast.Update(self.loc(kids[0], kids[-1]), self.target(kids[1]), kids[3])

    def output(self, kids: list[Any]) -> ast.Output:
        self._kind(kids[0], ("output",), "statement")
        names = tuple(self.target(k) for k in kids[1:] if k.type == "NAME")
        return ast.Output(self.loc(kids[0], kids[-1]), names)

    def minimize(self, kids: list[Any]) -> ast.Minimize:
        self._kind(kids[0], ("minimize",), "statement")
        kwargs = tuple(k for k in kids if isinstance(k, ast.KwArg))
        return ast.Minimize(self.loc(kids[0], kids[-1]), self.target(kids[1]), str(kids[3]),
                            self.tloc(kids[3]), kwargs)

    def kwarg(self, kids: list[Any]) -> ast.KwArg:
        return ast.KwArg(self.loc(kids[0], kids[-1]), str(kids[0]), kids[2])

    def if_stmt(self, kids: list[Any]) -> ast.If:
        orelse: tuple[ast.Stmt, ...] = ()
        if len(kids) > 3 and kids[4] is not None:
            orelse = kids[4].stmts if isinstance(kids[4], _Block) else (kids[4],)
        return ast.If(self.loc(kids[0], kids[1]), kids[1], kids[2].stmts, orelse)

    def for_stmt(self, kids: list[Any]) -> ast.For:
        return ast.For(self.loc(kids[0], kids[5]), str(kids[1]), kids[3], kids[5],
                       kids[6].stmts)

    # expressions
    def number(self, kids: list[Any]) -> ast.Num:
        tok = kids[0]
        text = str(tok)
        value: int | float
        if tok.type == "INT":
            if len(text.lstrip("0")) > MAX_INT_DIGITS:
                self.err(f"integer literal with more than {MAX_INT_DIGITS} digits",
                         self.tloc(tok))
                value = 0
            else:
                value = int(text)
        else:
            value = float(text)
            if value in (float("inf"), float("-inf")):
                self.err(f"float literal '{text}' is too large", self.tloc(tok))
                value = 0.0
        return ast.Num(self.tloc(tok), value)

    def ellipsis(self, kids: list[Any]) -> ast.EllipsisExpr:
        return ast.EllipsisExpr(self.tloc(kids[0]))

    def boolean(self, kids: list[Any]) -> ast.Bool:
        return ast.Bool(self.tloc(kids[0]), kids[0].type == "TRUE")

    def name(self, kids: list[Any]) -> ast.Name:
        return ast.Name(self.tloc(kids[0]), str(kids[0]))

    def paren(self, kids: list[Any]) -> ast.Expr:
        return kids[1]

    def subscript(self, kids: list[Any]) -> ast.Expr:
        idx = tuple(self.nodes(kids[1:]))
        return self.expr(ast.Subscript, kids, idx, str(kids[0]), self.tloc(kids[0]), idx)

    def call(self, kids: list[Any]) -> ast.Expr:
        fn = kids[0]
        targs = tuple(k for k in kids if isinstance(k, ast.TArg))
        args_node = next((k for k in kids if isinstance(k, _Args)), None)
        args = tuple(args_node.items) if args_node else ()
        return self.expr(ast.Call, kids, args, str(fn), self.tloc(fn), targs, args)

    def args(self, kids: list[Any]) -> _Args:
        return _Args(self.nodes(kids))

    def range_arg(self, kids: list[Any]) -> ast.Expr:
        return self.expr(ast.RangeArg, kids, (kids[2], kids[4]), str(kids[0]), kids[2], kids[4])

    def targ(self, kids: list[Any]) -> ast.TArg:
        if len(kids) == 1:
            return ast.TArg(kids[0].loc, None, kids[0])
        return ast.TArg(self.loc(kids[0], kids[-1]), str(kids[0]), kids[2])

    def clist(self, kids: list[Any]) -> ast.Expr:
        items = tuple(self.nodes(kids))
        return self.expr(ast.ListExpr, kids, items, items)

    def reduction(self, kids: list[Any]) -> ast.Expr:
        indices: list[ast.RedIndex] = []
        for a in kids[2].items:
            if isinstance(a, ast.Name):
                indices.append(ast.RedIndex(a.loc, a.id))
            elif isinstance(a, ast.RangeArg):
                indices.append(ast.RedIndex(a.loc, a.name, a.lo, a.hi))
            else:
                self.err(f"an index of '{kids[0]}' must be a name or `k in lo..hi`", a.loc)
        body = kids[4]
        if (body.loc.line, body.loc.col) in self.post.minus_after_reduction:
            op = str(kids[0])
            self.err(f"the body of a reduction cannot start with '-': write `{op}(k) (-x[k])` "
                     f"or `-({op}(k) x[k])`", body.loc)
        return self.expr(ast.Reduce, kids, (body,), str(kids[0]), tuple(indices), body)

    def binop(self, kids: list[Any]) -> ast.Expr:
        return self.link(ast.BinOp, kids)

    def boolop(self, kids: list[Any]) -> ast.Expr:
        return self.link(ast.BoolOp, kids)

    def link(self, cls: type, kids: list[Any]) -> ast.Expr:
        """`a op b`; when `a` is a chain of operators of op's level (`a = x + y` for op `-`),
        this continues the chain and adds no depth: `x + y - z` is as deep as `x + y`."""
        a, op, b = kids[0], str(kids[1]), kids[2]
        if isinstance(a, cls) and ast.same_level(a.op, op):  # type: ignore[attr-defined]
            depth = max(a.depth, b.depth + 1)
            if depth > MAX_NESTING:
                raise _Abort(Diagnostic("error", f"expression nested more than {MAX_NESTING} "
                                        "deep", self.loc(kids[0], kids[-1])))
            return cls(self.loc(kids[0], kids[-1]), op, a, b, depth=depth)
        return self.expr(cls, kids, (a, b), op, a, b)

    def unary(self, kids: list[Any]) -> ast.Expr:
        op = "neg" if kids[0].type == "MINUS" else "not"
        return self.expr(ast.Unary, kids, (kids[1],), op, kids[1])

    def compare(self, kids: list[Any]) -> ast.Expr:
        operands = tuple(kids[0::2])
        ops = tuple(str(k) for k in kids[1::2])
        return self.expr(ast.Compare, kids, operands, ops, operands)

    def ifexp(self, kids: list[Any]) -> ast.Expr:
        return self.expr(ast.IfExp, kids, (kids[2], kids[0], kids[4]), kids[2], kids[0],
                         kids[4])


class _CParams:
    def __init__(self, items: list[Any]) -> None:
        self.items = items


class _Ret:
    def __init__(self, items: list[Any]) -> None:
        self.items = items


class _Args:
    def __init__(self, items: list[Any]) -> None:
        self.items = items


class _Block:
    def __init__(self, stmts: tuple[Any, ...]) -> None:
        self.stmts = stmts


# ---------------------------------------------------------------------------------------------
# the parser object (built once) and error translation

_LOCK = threading.Lock()
_PARSER: tuple[Lark, _Build, _PostLex] | None = None


def grammar_path() -> Path:
    """The path of grammar/nf.lark."""
    import nfc.grammar

    return Path(nfc.grammar.__file__).parent / "nf.lark"


def _parser() -> tuple[Lark, _Build, _PostLex]:
    global _PARSER
    if _PARSER is None:
        post = _PostLex()
        build = _Build(post)
        lark = Lark(grammar_path().read_text(), parser="lalr", lexer="basic",
                    keep_all_tokens=True, transformer=build, postlex=post,
                    maybe_placeholders=True)
        _PARSER = (lark, build, post)
    return _PARSER


_DISPLAY = {"NAME": "a name", "INT": "a number", "FLOAT": "a number", "$END": "end of file",
            "RED_RPAR": "')'", "TPL_LT": "'<'", "STMT_IF": "'if'"}


def _display(lark: Lark, name: str) -> str:
    if name in _DISPLAY:
        return _DISPLAY[name]
    try:
        term = lark.get_terminal(name)
    except KeyError:
        return name.lower()
    if term.pattern.type == "str":
        return f"'{term.pattern.value}'"
    return name.lower()


def _expected(lark: Lark, names: set[str]) -> str:
    names = set(names)
    parts: list[str] = []
    if len(names & _EXPR_START) >= 4:
        names -= _EXPR_START
        parts.append("an expression")
    if len(names & _OPERATORS) >= 4:
        names -= _OPERATORS
        parts.append("an operator")
    parts += sorted({_display(lark, n) for n in names})
    if len(parts) > 10:
        parts = parts[:10] + ["..."]
    if not parts:
        return ""
    if len(parts) == 1:
        return f", expected {parts[0]}"
    return ", expected one of " + ", ".join(parts)


def _token_text(tok: Token) -> str:
    if tok.type == "$END":
        return "end of file"
    text = str(tok)
    if len(text) > 30:
        text = text[:27] + "..."
    if tok.type == "NAME":
        return f"name '{text}'"
    if tok.type in ("INT", "FLOAT"):
        return f"number {text}"
    return f"'{text}'"


def _syntax_diag(e: UnexpectedInput, lark: Lark, post: _PostLex, file: str,
                 text: str) -> Diagnostic:
    if isinstance(e, UnexpectedCharacters):
        ch = text[e.pos_in_stream] if 0 <= e.pos_in_stream < len(text) else "?"
        shown = ch if ch.isprintable() else repr(ch)[1:-1]
        return Diagnostic("error", f"unexpected character '{shown}'",
                          Loc(file, e.line, e.column, e.column + 1))
    if isinstance(e, UnexpectedToken):
        tok = e.token
        if tok.type == "$END":
            lines = text.split("\n")
            loc = Loc(file, len(lines), len(lines[-1]) + 1)
        else:
            loc = Loc(file, tok.line or 1, tok.column or 1,
                      tok.end_column if tok.end_line == tok.line else None)
        if tok.type == "MINUS" and (tok.start_pos or 0) in post.after_reduction:
            return Diagnostic("error", "the body of a reduction cannot start with '-': write "
                              "`sum(k) (-x[k])` or `-(sum(k) x[k])`", loc)
        msg = f"unexpected {_token_text(tok)}{_expected(lark, set(e.expected))}"
        return Diagnostic("error", msg, loc)
    return Diagnostic("error", f"syntax error: {e}", Loc(file, getattr(e, "line", 1) or 1,
                                                         getattr(e, "column", 1) or 1))


#: Most syntax errors reported for one file (each one costs a parse).
MAX_SYNTAX_ERRORS = 10


def _blank_line(text: str, line: int) -> str | None:
    """`text` with line `line` replaced by spaces, or None when that line's brackets do not
    balance (blanking it would only produce follow-on errors)."""
    lines = text.split("\n")
    if not 1 <= line <= len(lines):
        return None
    s = lines[line - 1].split("#", 1)[0]
    if any(s.count(a) != s.count(b) for a, b in ("()", "[]", "{}")):
        return None
    lines[line - 1] = " " * len(lines[line - 1])
    return "\n".join(lines)


def parse(text: str, file: str) -> ast.Program:
    """Parse `text` (registered with nfc.diagnostics.SOURCES) or raise CompileError.

    After a syntax error the parse is retried with the offending line blanked, so that the
    independent errors of later statements are reported too (up to MAX_SYNTAX_ERRORS).
    """
    SOURCES.add(file, text)
    check_size(text, file)
    check_nesting(text, file)
    lark, build, post = _parser()
    diags: list[Diagnostic] = []
    current: str | None = text
    last_line = 0
    program = None
    with _LOCK:
        build.file = file
        while current is not None and len(diags) < MAX_SYNTAX_ERRORS:
            build.errors = []
            try:
                program = lark.parse(current)
            except _Abort as a:
                diags.append(a.diag)
                break
            except UnexpectedInput as e:
                d = _syntax_diag(e, lark, post, file, current)
                diags += [x for x in build.errors if x.loc and x.loc.line < d.loc.line]
                if d.loc is None or d.loc.line <= last_line:
                    break
                diags.append(d)
                last_line = d.loc.line
                # at the end of the file, or inside an unclosed bracket, the next errors
                # would follow from this one
                stop = isinstance(e, UnexpectedToken) and (
                    e.token.type == "$END" or set(e.expected) <= _CLOSING)
                current = None if stop else _blank_line(current, last_line)
                continue
            diags += build.errors
            break
    if diags:
        seen: set[tuple[str, Loc | None]] = set()
        unique = []
        for d in diags:
            if (d.message, d.loc) not in seen:
                seen.add((d.message, d.loc))
                unique.append(d)
        raise CompileError(unique)
    assert isinstance(program, ast.Program)
    return program
