"""Builds IR objects from the reduce callbacks of the textual-IR parser (nfc.irparser).

Lark calls one method per grammar rule, children first, in text order; each method returns the
object for its rule. Semantic errors (undefined or redefined values, type mismatches, unknown
intrinsics) are collected in `diags` and parsing goes on with a placeholder, so one run reports
all of them. Limits on nesting raise at once: they protect the rest of the compiler, whose
expression walks recurse.
"""

from __future__ import annotations

import difflib
import json
import math
from dataclasses import dataclass
from typing import Any

from lark import Token

from nfc.diagnostics import CompileError, Diagnostic, DiagnosticEngine, note
from nfc.ir import (
    INTRINSICS,
    AllReduceOp,
    Axis,
    Binary,
    Block,
    Call,
    CallOp,
    Cast,
    ComputeOp,
    Const,
    DType,
    Expr,
    Func,
    Index,
    KernelOp,
    Load,
    Loc,
    Module,
    Op,
    ReturnOp,
    Select,
    TensorType,
    Unary,
    Value,
    YieldOp,
)

_DTYPES = [d.value for d in DType]
_MAX_DIGITS = 4000  # Python refuses to convert longer integer strings


@dataclass(frozen=True)
class Limits:
    """Bounds on the input; beyond them the parser reports an error instead of going on."""

    max_chars: int = 64 << 20
    """Longest input, in characters."""
    max_expr_depth: int = 256
    """Deepest scalar expression tree (passes and the printer recurse over expressions)."""
    max_attr_depth: int = 64
    """Deepest nesting of attribute lists and dicts."""
    max_kernel_depth: int = 32
    """Deepest nesting of nf.kernel regions."""


class _X:
    """An expression under construction: the Expr plus what the parent rules need to know."""

    __slots__ = ("expr", "depth", "line", "col", "lit", "num")

    def __init__(self, expr: Expr, depth: int, line: int, col: int, *, lit: bool = False,
                 num: bool = False) -> None:
        self.expr = expr
        self.depth = depth
        self.line = line
        self.col = col
        self.lit = lit  # a bare unsigned number: a leading minus folds into it
        self.num = num  # a number, possibly negated: `f32(...)` of it is a typed constant


class _Types(list):
    """A parenthesised list of tensor types, with the token of each."""


class _Results(list):
    """The `%a, %b` tokens to the left of `=`."""


@dataclass
class _FuncHead:
    name: str
    loc: Loc
    args: list[tuple[Value, dict[str, Any]]]
    results: _Types | None = None
    attrs: dict[str, Any] | None = None
    src_loc: Loc | None = None


@dataclass
class _KernelHead:
    names: _Results | None
    attrs: dict[str, Any] | None
    loc: Loc


class Builder:
    """The state of one parse: scopes of value names, functions seen, diagnostics.

    The methods named after grammar rules (`module`, `func`, `compute_op`, `binary`, ...) are
    the Lark callbacks: each gets the rule's children and returns the rule's object.
    """

    def __init__(self) -> None:
        self.begin("<input>", Limits(), "module")

    def begin(self, filename: str, limits: Limits, module_name: str) -> None:
        """Start a new parse of `filename` (forgetting everything about the previous one)."""
        self.filename = filename
        self.limits = limits
        self.module_name = module_name
        self.diags = DiagnosticEngine()
        self.scopes: list[dict[str, Value]] = [{}]
        self.def_locs: dict[str, Loc] = {}        # every name defined in the current function
        self.closed: dict[str, Loc] = {}          # names defined in kernels already closed
        self.undefined: list[tuple[str, Loc]] = []
        self.placeholders: set[int] = set()       # ids of values standing in for errors
        self.op_locs: dict[int, Loc] = {}         # id(op) -> where its keyword is
        self.written_types: dict[int, list[TensorType] | None] = {}  # id(return) -> types
        self.funcs: dict[str, Loc] = {}
        self.attr_depth: dict[int, int] = {}
        self.kernel_depth = 0
        self.types: dict[str, TensorType] = {}

    # ---- helpers ------------------------------------------------------------------------------

    def loc(self, tok: Token) -> Loc:
        """The location of a token, spanning it when it is on one line."""
        line, col = tok.line or 1, tok.column or 1
        return Loc(self.filename, line, col, col + len(tok) if "\n" not in str(tok) else None)

    def error(self, message: str, loc: Loc, *notes: Diagnostic) -> None:
        """Record an error; parsing goes on."""
        self.diags.error(message, loc, *notes)

    def fatal(self, message: str, loc: Loc) -> CompileError:
        """An error that stops the parse (raise it), with the errors recorded so far."""
        return CompileError([*self.diags.diagnostics, Diagnostic("error", message, loc)])

    def placeholder(self, t: TensorType) -> Value:
        """A value standing in for one that could not be resolved."""
        v = Value(t)
        self.placeholders.add(id(v))
        return v

    def define(self, name: str, v: Value, loc: Loc | None) -> None:
        """Bind `%name` in the innermost scope; a name may be defined once per function."""
        if name in self.def_locs:
            prev = self.def_locs[name]
            self.error(f"redefinition of value '%{name}'", loc or prev,
                       note("previous definition here", prev))
            return
        if loc is not None:
            self.def_locs[name] = loc
        self.scopes[-1][name] = v

    def lookup(self, tok: Token) -> Value:
        """The value `%name` names; an error (and a placeholder) when there is none."""
        name = str(tok)[1:]
        for scope in reversed(self.scopes):
            v = scope.get(name)
            if v is not None:
                return v
        self.undefined.append((name, self.loc(tok)))
        return self.placeholder(TensorType((), DType.F32))

    def tensor_type(self, tok: Token) -> TensorType:
        """The type spelled by a TENSOR token, e.g. `tensor<4x8xf32>` or `tensor<i1>`."""
        text = str(tok)
        t = self.types.get(text)
        if t is not None:
            return t
        parts = text[len("tensor<"):-1].split("x")
        *dims, dtype = parts
        offset = len(text) - 1 - len(dtype)
        t = TensorType((1,), DType.F32)
        if not all(d.isdigit() and len(d) <= 18 for d in dims):
            self.error(f"malformed tensor type '{text}'; expected 'tensor<' dims 'x' dtype '>' "
                       "like 'tensor<4x8xf32>'", self.loc(tok))
        elif dtype not in _DTYPES:
            at = Loc(self.filename, tok.line or 1, (tok.column or 1) + offset,
                     (tok.column or 1) + offset + max(1, len(dtype)))
            close = difflib.get_close_matches(dtype, _DTYPES, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            self.error(f"unknown element type '{dtype}' (expected one of {', '.join(_DTYPES)})"
                       f"{hint}", at)
        else:
            t = TensorType(tuple(int(d) for d in dims), DType(dtype))
            self.types[text] = t
        return t

    def integer(self, tok: Token) -> int:
        """An INT token's value, refusing absurdly long ones."""
        if len(tok) > 18:
            self.error(f"integer '{_short(tok)}' is too large", self.loc(tok))
            return 1
        return int(tok)

    def _check_types(self, what: str, values: list[Value], toks: list[Token],
                     declared: list[TensorType], at: Loc, names: list[Token]) -> None:
        if len(values) != len(declared):
            self.error(f"{what} has {len(values)} value{_s(len(values))} but "
                       f"{len(declared)} type{_s(len(declared))}", at)
            return
        for v, name, t, tt in zip(values, names, declared, toks, strict=True):
            if id(v) not in self.placeholders and v.type != t:
                self.error(f"type mismatch: '{name}' has type {v.type} but {what} declares "
                           f"{t}", self.loc(tt), *self._def_note(str(name)[1:]))

    def _def_note(self, name: str) -> tuple[Diagnostic, ...]:
        loc = self.def_locs.get(name)
        return (note(f"'%{name}' defined here", loc),) if loc else ()

    # ---- top level ----------------------------------------------------------------------------

    def start(self, ch: list) -> Module:
        return ch[0]

    def bare_funcs(self, ch: list) -> Module:
        return Module(self.module_name, ch)

    def expr_start(self, ch: list) -> Expr:
        self.flush_undefined()
        return ch[0].expr

    def module(self, ch: list) -> Module:
        attrs = next((c for c in ch[2:4] if isinstance(c, dict)), None)
        return Module(str(ch[1])[1:], [f for f in ch[4:] if isinstance(f, Func)], attrs=attrs)

    def func_begin(self, ch: list) -> _FuncHead:
        name, loc = str(ch[1])[1:], self.loc(ch[1])
        if name in self.funcs:
            self.error(f"redefinition of function '@{name}'", loc,
                       note("previous definition here", self.funcs[name]))
        else:
            self.funcs[name] = loc
        return _FuncHead(name, loc, [])

    def arg(self, ch: list) -> tuple[Value, dict[str, Any]]:
        tok = ch[0]
        v = Value(self.tensor_type(ch[1]), str(tok)[1:])
        self.define(v.name, v, self.loc(tok))
        return v, ch[2] or {}

    def paren_types(self, ch: list) -> _Types:
        return _Types((self.tensor_type(t), t) for t in ch if t is not None)

    def bare_type(self, ch: list) -> _Types:
        return self.paren_types(ch)

    def type_list(self, ch: list) -> _Types:
        return self.paren_types(ch)

    def func_head(self, ch: list) -> _FuncHead:
        head: _FuncHead = ch[0]
        head.args = [c for c in ch[1:] if isinstance(c, tuple)]
        head.results = next(c for c in ch if isinstance(c, _Types))
        head.attrs = next((c for c in ch if isinstance(c, dict)), None)
        head.src_loc = next((c for c in ch if isinstance(c, Loc)), None)
        return head

    def func(self, ch: list) -> Func:
        head: _FuncHead = ch[0]
        ops: list[Op] = ch[1:]
        self._check_block(ops, ReturnOp, "function", head.loc)
        declared = head.results or _Types()
        if ops and type(ops[-1]) is ReturnOp:
            # compare with the types the return spells out (a wrong value type is reported
            # at the value itself)
            ret = ops[-1]
            got = self.written_types[id(ret)]
            if got is not None and got != [t for t, _ in declared]:
                want = ", ".join(str(t) for t, _ in declared)
                self.error(f"type mismatch: function '@{head.name}' declares results "
                           f"({want}) but nf.return gives ({', '.join(map(str, got))})",
                           self.op_locs[id(ret)], note("results declared here", self.loc(
                               declared[0][1]) if declared else head.loc))
        elif not ops and declared:
            self.error(f"function '@{head.name}' declares results but has no body", head.loc)
        f = Func(head.name, [v for v, _ in head.args], Block(ops),
                 arg_attrs=[a for _, a in head.args], attrs=head.attrs, loc=head.src_loc)
        self.flush_undefined()
        self.scopes = [{}]
        self.def_locs = {}
        self.closed = {}
        return f

    def _check_block(self, ops: list[Op], term: type, what: str, at: Loc) -> None:
        """A block ends with its terminator (nf.return or nf.yield) and has no other."""
        want = "nf.return" if term is ReturnOp else "nf.yield"
        for op in ops[:-1]:
            if op.is_terminator:
                self.error(f"'{op.opname}' must be the last op of its block",
                           self.op_locs[id(op)])
        if ops and ops[-1].is_terminator and type(ops[-1]) is not term:
            self.error(f"'{ops[-1].opname}' cannot end a {what} body; expected '{want}'",
                       self.op_locs[id(ops[-1])])
        elif ops and not ops[-1].is_terminator:
            self.error(f"{what} body must end with '{want}'", self.op_locs[id(ops[-1])])
        elif not ops and term is YieldOp:
            self.error(f"{what} body must end with '{want}'", at)

    def flush_undefined(self) -> None:
        """Report the uses of undefined values seen so far (at the end of a function, when
        the note can tell whether the name is defined later)."""
        for name, loc in self.undefined:
            notes: tuple[Diagnostic, ...] = ()
            if name in self.closed:
                notes = (note(f"'%{name}' is defined inside an nf.kernel here and is not "
                              "visible outside it; use the kernel's results",
                              self.closed[name]),)
            elif name in self.def_locs:
                notes = (note(f"'%{name}' is defined here, after its use",
                              self.def_locs[name]),)
            else:
                close = difflib.get_close_matches(name, list(self.def_locs), n=1)
                if close:
                    notes = (note(f"did you mean '%{close[0]}'?", self.def_locs[close[0]]),)
            self.error(f"use of undefined value '%{name}'", loc, *notes)
        self.undefined = []

    # ---- ops ------------------------------------------------------------------------------------

    def results(self, ch: list) -> _Results:
        return _Results(ch)

    def axes(self, ch: list) -> tuple[Axis, ...]:
        return tuple(c for c in ch if c is not None)

    def axis(self, ch: list) -> Axis:
        return Axis(str(ch[0]), self.integer(ch[1]))

    def _names(self, res: _Results | None, n: int, what: str, at: Loc) -> list[str | None]:
        toks = list(res or [])
        if len(toks) != n:
            self.error(f"{what} has {n} result{_s(n)} but {len(toks)} name{_s(len(toks))} "
                       "on the left of '='", at)
        names: list[str | None] = [str(t)[1:] for t in toks[:n]]
        return names + [None] * (n - len(names))

    def _define_results(self, op: Op, res: _Results | None) -> None:
        for v, tok in zip(op.results, res or [], strict=False):
            self.define(str(tok)[1:], v, self.loc(tok))

    def compute_op(self, ch: list) -> ComputeOp:
        res, kw, dims, red, raxes, body, attrs, ttok, src = ch
        at = self.loc(kw)
        names = self._names(res, 1, "nf.compute", at)
        op = ComputeOp(self.tensor_type(ttok), dims, body.expr,
                       reduce=str(red) if red is not None else None, raxes=raxes or (),
                       loc=src, attrs=attrs, name=names[0])
        self.op_locs[id(op)] = at
        self._define_results(op, res)
        return op

    def call_op(self, ch: list) -> CallOp:
        res, kw, sym = ch[0], ch[1], ch[2]
        rest = ch[3:]
        args = [c for c in rest if isinstance(c, Token) and c.type == "VALUE"]
        attrs = next((c for c in rest if isinstance(c, dict)), None)
        arg_types, res_types = [c for c in rest if isinstance(c, _Types)]
        src = next((c for c in rest if isinstance(c, Loc)), None)
        at = self.loc(kw)
        values = [self.lookup(a) for a in args]
        self._check_types("nf.call", values, [t for _, t in arg_types],
                          [t for t, _ in arg_types], at, args)
        types = [t for t, _ in res_types]
        names = self._names(res, len(types), "nf.call", at)
        op = CallOp(str(sym)[1:], values, types, loc=src, attrs=attrs, names=names)
        self.op_locs[id(op)] = at
        self._define_results(op, res)
        return op

    def allreduce_op(self, ch: list) -> AllReduceOp:
        res, kw = ch[0], ch[1]
        rest = ch[2:]
        args = [c for c in rest if isinstance(c, Token) and c.type == "VALUE"]
        ttoks = [c for c in rest if isinstance(c, Token) and c.type == "TENSOR"]
        attrs = next((c for c in rest if isinstance(c, dict)), None)
        src = next((c for c in rest if isinstance(c, Loc)), None)
        at = self.loc(kw)
        values = [self.lookup(a) for a in args]
        self._check_types("nf.allreduce", values, ttoks, [self.tensor_type(t) for t in ttoks],
                          at, args)
        names = self._names(res, len(values), "nf.allreduce", at)
        op = AllReduceOp(values, loc=src, attrs=attrs, names=names)
        self.op_locs[id(op)] = at
        self._define_results(op, res)
        return op

    def return_op(self, ch: list) -> ReturnOp | YieldOp:
        kw = ch[0]
        vals = [c for c in ch[1:] if isinstance(c, Token) and c.type == "VALUE"]
        ttoks = [c for c in ch[1:] if isinstance(c, Token) and c.type == "TENSOR"]
        src = next((c for c in ch[1:] if isinstance(c, Loc)), None)
        values = [self.lookup(v) for v in vals]
        types = [self.tensor_type(t) for t in ttoks]
        before = self.diags.error_count
        self._check_types(str(kw), values, ttoks, types, self.loc(kw), vals)
        op = (YieldOp if kw.type == "YIELD" else ReturnOp)(values, loc=src)
        self.op_locs[id(op)] = self.loc(kw)
        # the enclosing function or kernel compares its result types with these, unless they
        # were already found wrong (one mistake, one error)
        self.written_types[id(op)] = types if self.diags.error_count == before else None
        return op

    def kernel_begin(self, ch: list) -> _KernelHead:
        res, kw, attrs = ch
        self.kernel_depth += 1
        if self.kernel_depth > self.limits.max_kernel_depth:
            raise self.fatal(f"nf.kernel regions nested too deeply (the limit is "
                             f"{self.limits.max_kernel_depth})", self.loc(kw))
        self.scopes.append({})
        return _KernelHead(res, attrs, self.loc(kw))

    def kernel_op(self, ch: list) -> KernelOp:
        head: _KernelHead = ch[0]
        ops = [c for c in ch[1:] if isinstance(c, Op)]
        ttoks = [c for c in ch[1:] if isinstance(c, Token) and c.type == "TENSOR"]
        src = next((c for c in ch[1:] if isinstance(c, Loc)), None)
        declared = [self.tensor_type(t) for t in ttoks]
        self._check_block(ops, YieldOp, "nf.kernel", head.loc)
        term = ops[-1] if ops else None
        if isinstance(term, YieldOp):
            got = self.written_types[id(term)]
            if got is not None and got != declared:
                self.error(f"type mismatch: nf.kernel declares results "
                           f"({', '.join(map(str, declared))}) but nf.yield gives "
                           f"({', '.join(map(str, got))})", self.op_locs[id(term)])
        else:
            ops = [op for op in ops if not op.is_terminator]
            ops.append(YieldOp([self.placeholder(t) for t in declared]))
            term = ops[-1]
        for name in self.scopes.pop():
            self.closed[name] = self.def_locs.get(name, head.loc)
        self.kernel_depth -= 1
        names = self._names(head.names, len(term.values), "nf.kernel", head.loc)
        op = KernelOp(Block(ops), loc=src, attrs=head.attrs, names=names)
        self.op_locs[id(op)] = head.loc
        self._define_results(op, head.names)
        return op

    def location(self, ch: list) -> Loc:
        _, file, line, col, _, end = ch
        return Loc(self.string(file), self.integer(line), self.integer(col),
                   self.integer(end) if end is not None else None)

    # ---- expressions ----------------------------------------------------------------------------

    def _x(self, expr: Expr, kids: list[_X], tok: Token | _X, **kw: bool) -> _X:
        depth = 1 + max((k.depth for k in kids), default=0)
        line, col = (tok.line, tok.col) if isinstance(tok, _X) else (tok.line, tok.column)
        if depth > self.limits.max_expr_depth:
            raise self.fatal(f"expression nested too deeply (the limit is "
                             f"{self.limits.max_expr_depth} levels)",
                             Loc(self.filename, line or 1, col or 1))
        return _X(expr, depth, line or 1, col or 1, **kw)

    def number(self, ch: list) -> _X:
        tok = ch[0]
        text = str(tok)
        value: int | float
        if tok.type == "INF":
            value = math.inf
        elif tok.type == "NAN":
            value = math.nan
        elif any(c in text for c in ".eE"):
            value = float(text)
        elif len(text) > _MAX_DIGITS:
            self.error(f"integer literal '{_short(tok)}' is too large", self.loc(tok))
            value = 0
        else:
            value = int(text)
        return self._x(Const(value), [], tok, lit=True, num=True)

    def boolean(self, ch: list) -> _X:
        return self._x(Const(ch[0] == "true", DType.I1), [], ch[0])

    def index(self, ch: list) -> _X:
        return self._x(Index(str(ch[0])), [], ch[0])

    def paren(self, ch: list) -> _X:
        x: _X = ch[0]
        return _X(x.expr, x.depth, x.line, x.col)

    def load(self, ch: list) -> _X:
        tok, kids = ch[0], [c for c in ch[1:] if c is not None]
        return self._x(Load(self.lookup(tok), tuple(k.expr for k in kids)), kids, tok)

    def neg(self, ch: list) -> _X:
        tok, x = ch
        c = x.expr
        # `-1.5` is the literal -1.5, except where no literal prints that way: `-0` (the
        # integer zero has no sign) and `-nan` (nan prints without one)
        if x.lit and isinstance(c, Const) and c.value == c.value and not (
                isinstance(c.value, int) and c.value == 0):
            return _X(Const(-c.value), x.depth, tok.line, tok.column, num=True)
        return self._x(Unary("neg", x.expr), [x], tok)

    def not_(self, ch: list) -> _X:
        return self._x(Unary("not", ch[1].expr), [ch[1]], ch[0])

    def binary(self, ch: list) -> _X:
        a, op, b = ch
        return self._x(Binary(str(op), a.expr, b.expr), [a, b], a)

    def call(self, ch: list) -> _X:
        tok, kids = ch[0], [c for c in ch[1:] if c is not None]
        name, args = str(tok), tuple(k.expr for k in kids)
        want = 3 if name == "select" else 1 if name in _DTYPES else INTRINSICS.get(name)
        if want is None:
            close = difflib.get_close_matches(name, [*INTRINSICS, "select", *_DTYPES], n=1)
            hint = (f"; did you mean '{close[0]}'?" if close else
                    f" (the intrinsics are {', '.join(INTRINSICS)}, select and the casts "
                    f"{', '.join(_DTYPES)})")
            self.error(f"unknown intrinsic '{name}'{hint}", self.loc(tok))
            return self._x(Const(0), kids, tok)
        if len(args) != want:
            self.error(f"'{name}' takes {want} argument{_s(want)}, got {len(args)}",
                       self.loc(tok))
            return self._x(Const(0), kids, tok)
        if name == "select":
            return self._x(Select(*args), kids, tok)
        if name in _DTYPES:
            if kids[0].num:
                c = args[0]
                assert isinstance(c, Const)
                return _X(Const(c.value, DType(name)), kids[0].depth, tok.line, tok.column)
            return self._x(Cast(DType(name), args[0]), kids, tok)
        return self._x(Call(name, args), kids, tok)

    # ---- attributes and locations ---------------------------------------------------------------

    def attr_dict(self, ch: list) -> dict[str, Any]:
        out: dict[str, Any] = {}
        depth = 0
        for entry in ch:
            if entry is None:
                continue
            (key, tok), value = entry
            if key in out:
                self.error(f"duplicate attribute '{key}'", self.loc(tok))
            out[key] = value
            depth = max(depth, self.attr_depth.get(id(value), 0))
        self._nest(out, depth + 1, ch)
        return out

    def attr_entry(self, ch: list) -> tuple[tuple[str, Token], Any]:
        tok = ch[0]
        key = self.string(tok) if tok.type == "STRING" else str(tok)
        return (key, tok), ch[1]

    def attr_string(self, ch: list) -> str:
        return self.string(ch[0])

    def attr_number(self, ch: list) -> int | float:
        sign = -1 if len(ch) == 2 else 1
        x = self.number(ch[-1:]).expr
        assert isinstance(x, Const)
        return sign * x.value

    def attr_bool(self, ch: list) -> bool:
        return ch[0] == "true"

    def attr_list(self, ch: list) -> list[Any]:
        out = [c for c in ch[1:] if c is not None]
        self._nest(out, 1 + max((self.attr_depth.get(id(c), 0) for c in out), default=0), ch)
        return out

    def _nest(self, value: Any, depth: int, ch: list) -> None:
        if depth > self.limits.max_attr_depth:
            tok = next((c for c in ch if isinstance(c, Token)), None)
            at = self.loc(tok) if tok is not None else Loc(self.filename, 1, 1)
            raise self.fatal(f"attribute nested too deeply (the limit is "
                             f"{self.limits.max_attr_depth} levels)", at)
        self.attr_depth[id(value)] = depth

    def string(self, tok: Token) -> str:
        """The value of a JSON string literal."""
        try:
            return json.loads(str(tok))
        except json.JSONDecodeError as exc:
            self.error(f"invalid string literal: {exc.msg.lower()}", self.loc(tok))
            return ""


def _s(n: int) -> str:
    return "" if n == 1 else "s"


def _short(tok: Token) -> str:
    text = str(tok)
    return text if len(text) <= 20 else text[:17] + "..."
