"""Checks of op definitions that need no call: names, dtypes, signatures, outputs.

Elaboration checks everything at each call with concrete shapes; these checks also cover ops
that are never called (a library compiled on its own) and say things once, at the definition.
"""

from __future__ import annotations

import difflib

from nfc.diagnostics import Diagnostic, note
from nfc.frontend import ast
from nfc.frontend.builtins import BUILTINS
from nfc.frontend.context import FLOAT_CONSTANTS, shorten
from nfc.frontend.ellipsis import ELLIPSIS, WHERE, leading, type_errors
from nfc.frontend.imports import ModuleScope
from nfc.frontend.scalars import INTRINSIC_ARITY
from nfc.frontend.shapes import DTYPES, is_dtype_var, names_in


class _OpChecker:
    def __init__(self, op: ast.OpDef, scope: ModuleScope, diags: list[Diagnostic]) -> None:
        self.op = op
        self.scope = scope
        self.diags = diags
        self.reported: set[str] = set()

    def err(self, msg: str, loc: ast.Loc, *notes: Diagnostic) -> None:
        self.diags.append(Diagnostic("error", msg, loc, tuple(notes)))

    def unknown(self, name: str, loc: ast.Loc, cands: set[str], what: str = "name") -> None:
        if name in self.reported:
            return
        self.reported.add(name)
        sugg = difflib.get_close_matches(name, sorted(cands), 1) if len(name) < 100 else []
        hint = f"; did you mean '{sugg[0]}'?" if sugg else ""
        self.err(f"unknown {what} '{shorten(name)}'{hint}", loc)

    def signature(self) -> set[str]:
        op = self.op
        defined = {"training", *FLOAT_CONSTANTS}
        seen: dict[str, ast.Node] = {}
        for item in (*op.cparams, *op.params, *(p for p in op.outputs if p.name)):
            if item.name in seen:
                self.err(f"'{item.name}' is declared twice in the signature of '{op.name}'",
                         item.loc, note("first declared here", seen[item.name].loc))
            seen[item.name] = item
        defined |= {c.name for c in op.cparams}
        dtype_vars: set[str] = set()
        for p in (*op.params, *op.outputs):
            for bad, msg in type_errors(p.type):
                self.err(msg, bad.loc)
        if any(leading(p.type) for p in op.params):
            defined.add(ELLIPSIS)
        for p in op.params:
            dt = p.type.dtype
            if is_dtype_var(dt):
                dtype_vars.add(dt)
            elif dt not in DTYPES:
                self.unknown(dt, p.type.dtype_loc, set(DTYPES), "dtype")
            for d in p.type.dims:
                defined |= set(names_in(d))
        for p in op.outputs:
            dt = p.type.dtype
            if is_dtype_var(dt) and dt not in dtype_vars:
                self.err(f"dtype variable '{dt}' of the result is not bound by any parameter",
                         p.type.dtype_loc)
            elif not is_dtype_var(dt) and dt not in DTYPES:
                self.unknown(dt, p.type.dtype_loc, set(DTYPES), "dtype")
            if leading(p.type) and ELLIPSIS not in defined:
                self.err(f"'...' in the result type of '{op.name}' is not bound by any "
                         "parameter", p.type.dims[0].loc)
            for d in p.type.dims:
                for n in names_in(d):
                    if n not in defined:
                        self.err(f"'{n}' in the result type is not bound by any parameter",
                                 d.loc)
        return defined | dtype_vars | {p.name for p in op.params}

    def run(self) -> None:
        defined = self.signature()
        self.block(self.op.body, defined)
        if self.op.single_output:
            if not _ends_in_assignment(self.op.body):
                self.err(f"the last statement of op '{self.op.name}' must assign its result",
                         self.op.body[-1].loc if self.op.body else self.op.loc)
        else:
            for p in self.op.outputs:
                if p.name not in defined:
                    self.err(f"output '{p.name}' of '{self.op.name}' is never assigned", p.loc)

    def block(self, stmts: tuple[ast.Stmt, ...], defined: set[str]) -> None:
        for s in stmts:
            if isinstance(s, ast.Assign):
                self.expr(s.value, defined, set())
                defined |= {t.name for t in s.targets}
            elif isinstance(s, ast.Comprehension):
                idx = set()
                for k, ix in enumerate(s.indices):
                    if ix.name == ELLIPSIS and k > 0:
                        self.err("'...' must come first in an index list", ix.loc)
                    elif ix.name == ELLIPSIS and ELLIPSIS not in defined:
                        self.err("'...' in an index list stands for the leading indices of an "
                                 "op whose signature has '...' (`x: T[..., D]`)", ix.loc)
                    for bound in (ix.lo, ix.hi):
                        if bound is not None:
                            self.expr(bound, defined, set())
                    idx.add(ix.name)
                self.expr(s.value, defined, idx)
                defined.add(s.target.name)
            elif isinstance(s, ast.For):
                self.expr(s.lo, defined, set())
                self.expr(s.hi, defined, set())
                defined.add(s.var)
                self.block(s.body, defined)
            elif isinstance(s, ast.If):
                self.expr(s.cond, defined, set())
                self.block(s.then, defined)
                self.block(s.orelse, defined)
            else:
                kind = s.kind if isinstance(s, ast.Decl) else type(s).__name__.lower()
                self.err(f"'{kind}' statements are only allowed in a model", s.loc)

    def expr(self, e: ast.Expr, defined: set[str], idx: set[str]) -> None:
        if isinstance(e, ast.Name):
            if e.id not in idx and e.id not in defined:
                self.unknown(e.id, e.loc, defined | idx)
        elif isinstance(e, ast.Subscript):
            if e.name not in defined:
                self.unknown(e.name, e.name_loc, defined)
            for k, ix in enumerate(e.indices):
                if not isinstance(ix, ast.EllipsisExpr):
                    self.expr(ix, defined, idx)
                elif k > 0:
                    self.err(WHERE, ix.loc)
                elif ELLIPSIS not in idx:
                    self.err("'...' in a subscript stands for the '...' indices of the "
                             "left-hand side, which has none: write `y[..., d] = x[..., d]`",
                             ix.loc)
            return
        elif isinstance(e, ast.EllipsisExpr):
            self.err(WHERE, e.loc)
        elif isinstance(e, ast.Call):
            known = e.fn in INTRINSIC_ARITY or e.fn in DTYPES or e.fn in BUILTINS \
                or e.fn in defined or e.fn in self.scope.ops or e.fn in self.scope.imported
            if not known and not self.scope.incomplete:
                self.unknown(e.fn, e.fn_loc, {*INTRINSIC_ARITY, *BUILTINS,
                                              *self.scope.op_names()}, "op or function")
            for ta in e.targs:
                self.expr(ta.value, defined, idx)
        elif isinstance(e, ast.Reduce):
            inner = set(idx)
            for ri in e.indices:
                for bound in (ri.lo, ri.hi):
                    if bound is not None:  # may use enclosing and earlier indices
                        self.expr(bound, defined, set(inner))
                inner.add(ri.name)
            self.expr(e.body, defined, inner)
            return
        elif isinstance(e, ast.RangeArg):
            self.expr(e.lo, defined, idx)
            self.expr(e.hi, defined, idx)
            return
        for c in e.children():
            self.expr(c, defined, idx)


def _ends_in_assignment(body: tuple[ast.Stmt, ...]) -> bool:
    if not body:
        return False
    last = body[-1]
    if isinstance(last, ast.For):
        return _ends_in_assignment(last.body)
    if isinstance(last, ast.If):
        return _ends_in_assignment(last.then) and _ends_in_assignment(last.orelse)
    return isinstance(last, ast.Assign | ast.Comprehension)


def check_op(op: ast.OpDef, scope: ModuleScope) -> list[Diagnostic]:
    """Diagnostics for one op definition of `scope`'s file."""
    diags: list[Diagnostic] = []
    _OpChecker(op, scope, diags).run()
    return diags


def check_ops(scope: ModuleScope) -> list[Diagnostic]:
    """Diagnostics for the op definitions of one file."""
    return [d for op in scope.ops.values() for d in check_op(op, scope)]
