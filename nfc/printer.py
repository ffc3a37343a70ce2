"""The printer of the textual IR. Its output parses back to the same IR (see nfc.irparser).

The format, by example:

    nf.module @m attributes {nf.batch = 16} {
      nf.func @forward(%x: tensor<4x8xf32> {nf.role = "input"}) -> (tensor<4xf32>) {
        %s = nf.compute [i: 4] sum [k: 8] (%x[i, k] * 2.0) : tensor<4xf32> loc("m.nf":3:5)
        nf.return %s : tensor<4xf32>
      }
    }

Scalar expressions print infix with the usual precedence; intrinsics and `select(c, a, b)` as
calls; casts and typed literals as `f32(x)`; weakly typed literals bare.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from nfc.ir import (
    BINARY_PRECEDENCE,
    COMPARISONS,
    AllReduceOp,
    Binary,
    Block,
    Call,
    CallOp,
    Cast,
    ComputeOp,
    Const,
    Expr,
    Func,
    Index,
    KernelOp,
    Load,
    Loc,
    Module,
    Op,
    Select,
    TerminatorOp,
    Unary,
    Value,
)

_NAME_RE = re.compile(r"[A-Za-z0-9_]+\Z")
_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*\Z")
_UNARY_PREC = {"neg": 7, "not": 3}


def format_float(x: float) -> str:
    """A float literal that reads back to the same value and never looks like an integer."""
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    text = repr(float(x))
    if not any(c in text for c in ".en"):
        text += ".0"
    return text


def format_const(c: Const) -> str:
    """A literal, wrapped in its dtype when it is strongly typed."""
    if isinstance(c.value, bool):
        text = "true" if c.value else "false"
    elif isinstance(c.value, float):
        text = format_float(c.value)
    else:
        text = str(int(c.value))
    if c.dtype is not None and not isinstance(c.value, bool):
        return f"{c.dtype}({text})"
    return text


def format_attr(v: Any) -> str:
    """An attribute value: int, float, bool, string, list or dict."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return format_float(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, list | tuple):
        return "[" + ", ".join(format_attr(x) for x in v) + "]"
    if isinstance(v, dict):
        return format_attr_dict(v)
    raise TypeError(f"attribute value of unsupported type: {v!r}")


def format_attr_dict(d: dict[str, Any]) -> str:
    """`{key = value, ...}` with keys in insertion order."""
    items = []
    for k, v in d.items():
        key = k if _KEY_RE.match(k) else json.dumps(k)
        items.append(f"{key} = {format_attr(v)}")
    return "{" + ", ".join(items) + "}"


def format_loc(loc: Loc) -> str:
    """`loc("file":line:col)` or `loc("file":line:col to :end)`."""
    text = f"loc({json.dumps(loc.file)}:{loc.line}:{loc.col}"
    if loc.end_col is not None:
        text += f" to :{loc.end_col}"
    return text + ")"


class Namer:
    """Gives every value of a function a unique printed name, preferring its hint.

    The k-th value hinted `h` is named `h`, `h_1`, `h_2`, ... (skipping names taken). Each
    hint remembers the suffix it reached, so naming n values costs O(n) set lookups however
    many share a hint (a loop of `h = h * 1.0` makes thousands of `h`).
    """

    def __init__(self) -> None:
        self.names: dict[int, str] = {}
        self.used: set[str] = set()
        self.counter = 0
        self.next_suffix: dict[str, int] = {}

    def add(self, v: Value) -> None:
        """Name `v` (once)."""
        if id(v) in self.names:
            return
        hint = v.name
        if hint is not None:
            hint = re.sub(r"[^A-Za-z0-9_]", "_", hint) or None
        if hint is not None and hint in self.used:
            # names are never released, so every suffix below the one reached is still taken
            n = self.next_suffix.get(hint, 1)
            while f"{hint}_{n}" in self.used:
                n += 1
            self.next_suffix[hint] = n + 1
            hint = f"{hint}_{n}"
        if hint is None:
            while str(self.counter) in self.used:
                self.counter += 1
            hint = str(self.counter)
        self.used.add(hint)
        self.names[id(v)] = hint

    def __call__(self, v: Value) -> str:
        name = self.names.get(id(v))
        return f"%{name}" if name is not None else f"%<<unknown {v.name}>>"


def format_expr(e: Expr, name: Namer | None = None) -> str:
    """A scalar expression in the textual syntax."""
    name = name or (lambda v: f"%{v.name}")  # type: ignore[assignment]
    return _expr(e, name, 0)


def _prec(e: Expr) -> int:
    if isinstance(e, Binary):
        return BINARY_PRECEDENCE[e.op]
    if isinstance(e, Unary):
        return _UNARY_PREC[e.op]
    if isinstance(e, Const) and e.dtype is None and not isinstance(e.value, bool):
        v = float(e.value)
        if v < 0 or (v == 0 and math.copysign(1.0, v) < 0):
            return 7  # a negative literal prints with a leading minus
    return 9


def _expr(e: Expr, name: Any, ctx: int) -> str:
    if isinstance(e, Const):
        text = format_const(e)
    elif isinstance(e, Index):
        text = e.name
    elif isinstance(e, Load):
        text = name(e.tensor) + "[" + ", ".join(_expr(i, name, 0) for i in e.indices) + "]"
    elif isinstance(e, Unary):
        p = _UNARY_PREC[e.op]
        inner = _expr(e.x, name, p + (1 if e.op == "neg" else 0))
        text = f"-{inner}" if e.op == "neg" else f"not {inner}"
        if e.op == "neg" and inner.startswith("-"):
            text = f"-({inner})"
        return f"({text})" if p < ctx else text
    elif isinstance(e, Binary):
        p = BINARY_PRECEDENCE[e.op]
        # comparisons do not chain; everything else is left-associative
        lp = p + 1 if e.op in COMPARISONS else p
        text = f"{_expr(e.a, name, lp)} {e.op} {_expr(e.b, name, p + 1)}"
        return f"({text})" if p < ctx else text
    elif isinstance(e, Call):
        text = e.fn + "(" + ", ".join(_expr(a, name, 0) for a in e.args) + ")"
    elif isinstance(e, Select):
        text = f"select({_expr(e.cond, name, 0)}, {_expr(e.a, name, 0)}, {_expr(e.b, name, 0)})"
    elif isinstance(e, Cast):
        text = f"{e.dtype}({_expr(e.x, name, 0)})"
    else:
        raise TypeError(f"unknown expression node {e!r}")
    return f"({text})" if _prec(e) < ctx else text


class Printer:
    """Prints modules, functions and ops; `locs=False` leaves locations out."""

    def __init__(self, *, locs: bool = True) -> None:
        self.locs = locs

    def module(self, m: Module) -> str:
        """The whole module, ending in a newline."""
        head = f"nf.module @{m.name}"
        if m.attrs:
            head += f" attributes {format_attr_dict(m.attrs)}"
        lines = [head + " {"]
        for f in m.funcs:
            lines += self.func(f, indent="  ")
        lines.append("}")
        return "\n".join(lines) + "\n"

    def func(self, f: Func, indent: str = "") -> list[str]:
        """Lines of one function."""
        namer = Namer()
        for a in f.args:
            namer.add(a)
        for op in f.walk():
            for r in op.results:
                namer.add(r)
        args = []
        for a, attrs in zip(f.args, f.arg_attrs, strict=True):
            text = f"{namer(a)}: {a.type}"
            if attrs:
                text += " " + format_attr_dict(attrs)
            args.append(text)
        rtypes = ", ".join(str(t) for t in f.result_types) if f.body.ops else ""
        head = f"{indent}nf.func @{f.name}({', '.join(args)}) -> ({rtypes})"
        if f.attrs:
            head += f" attributes {format_attr_dict(f.attrs)}"
        if f.loc is not None and self.locs:
            head += " " + format_loc(f.loc)
        lines = [head + " {"]
        lines += self.block(f.body, namer, indent + "  ")
        lines.append(indent + "}")
        return lines

    def block(self, b: Block, namer: Namer, indent: str) -> list[str]:
        """Lines of the ops of a block."""
        out: list[str] = []
        for op in b.ops:
            out += self.op(op, namer, indent)
        return out

    def _tail(self, op: Op) -> str:
        return f" {format_loc(op.loc)}" if op.loc is not None and self.locs else ""

    def _attrs(self, op: Op) -> str:
        return f" {format_attr_dict(op.attrs)}" if op.attrs else ""

    def op(self, op: Op, namer: Namer, indent: str) -> list[str]:
        """Lines of one op (several for a kernel)."""
        res = ", ".join(namer(r) for r in op.results)
        if isinstance(op, ComputeOp):
            dims = ", ".join(str(a) for a in op.dims)
            text = f"{res} = nf.compute [{dims}]"
            if op.reduce is not None:
                text += f" {op.reduce} [{', '.join(str(a) for a in op.raxes)}]"
            text += f" ({format_expr(op.body, namer)}){self._attrs(op)} : {op.result.type}"
            return [indent + text + self._tail(op)]
        if isinstance(op, CallOp):
            args = ", ".join(namer(a) for a in op.args)
            atypes = ", ".join(str(a.type) for a in op.args)
            rtypes = ", ".join(str(r.type) for r in op.results)
            lhs = f"{res} = " if op.results else ""
            text = (f"{lhs}nf.call @{op.callee}({args}){self._attrs(op)} : ({atypes}) -> "
                    f"({rtypes})")
            return [indent + text + self._tail(op)]
        if isinstance(op, TerminatorOp):
            vals = ", ".join(namer(v) for v in op.values)
            types = ", ".join(str(v.type) for v in op.values)
            text = op.opname + (f" {vals} : {types}" if op.values else "")
            return [indent + text + self._tail(op)]
        if isinstance(op, AllReduceOp):
            vals = ", ".join(namer(v) for v in op.values)
            types = ", ".join(str(v.type) for v in op.values)
            text = f"{res} = nf.allreduce {vals}{self._attrs(op)} : {types}"
            return [indent + text + self._tail(op)]
        if isinstance(op, KernelOp):
            lines = [f"{indent}{res} = nf.kernel{self._attrs(op)} {{"]
            lines += self.block(op.body, namer, indent + "  ")
            types = ", ".join(str(r.type) for r in op.results)
            lines.append(f"{indent}}} : {types}{self._tail(op)}")
            return lines
        raise TypeError(f"cannot print {op!r}")


def print_module(m: Module, *, locs: bool = True) -> str:
    """The textual form of a module."""
    return Printer(locs=locs).module(m)


def print_func(f: Func, *, locs: bool = True) -> str:
    """The textual form of one function."""
    return "\n".join(Printer(locs=locs).func(f)) + "\n"
