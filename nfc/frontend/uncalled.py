"""Checking the ops a compilation does not call, as LLVM's verifier checks every function.

An op is elaborated (shapes, dtypes, ranges, bounds proofs) at each call, with the call's
sizes. An op that nothing calls, a library compiled on its own or a helper left over in a
model file, is checked here with sizes of our choosing, at *samples*: the op is elaborated as
if called with

- each shape variable a distinct size of at least 5 (descending in the order the parameters
  name them, then ascending), the leading dimensions `...` as [3, 4];
- each dtype variable f32, or i32 for a tensor that the body uses inside a subscript (ids);
  when that fails, every dtype variable i32: an op that works for some dtypes is not wrong;
- each compile-time parameter its default; without one, 2 (int), 0.5 (float) or true (bool).
  An op with an `ints` parameter without a default is not elaborated (no list is a sensible
  guess).

Samples whose signature is not valid (a dimension that is not positive, sizes that do not
unify) are skipped, and so is an op too big to sample (more than SAMPLE_STATEMENTS statements
at a sample, or past FILE_STATEMENTS for the file): such an op is checked at its calls.

**An error is reported when it occurs at every valid sample of sizes** (and no choice of
dtypes elaborates cleanly), with a note naming the sizes of the first sample: a division by
zero, a float index, a reduction whose range cannot be inferred, a shape mismatch, a result of
the wrong shape, an access out of bounds at every size tried. An
error that only some sizes provoke (`x[1]` with `x: T[N]` fails for N = 1 only, a slice op
reads past the end only for large starts) is a precondition of the op: it is reported at the
calls that break it, with their sizes, like every error of a called op.

The signature is also checked for all sizes at once: a dimension that is affine in the shape
variables (shape variables are unknown positive integers) and not positive for any of them,
such as `T[-1]` or `T[N - 2 * N]`, is an error.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from nfc.diagnostics import CompileError, Diagnostic, error, note
from nfc.frontend import ast
from nfc.frontend.context import Ctx, Env, Fatal, Poisoned, TensorInfo
from nfc.frontend.elaborate import Elaborator, Frame
from nfc.frontend.ellipsis import ELLIPSIS, leading
from nfc.frontend.imports import ModuleScope
from nfc.frontend.limits import MAX_TENSOR_ELEMENTS, STATEMENTS
from nfc.frontend.shapes import (
    DTYPES,
    CTValue,
    Unbound,
    dtype_class,
    eval_ct,
    format_ct,
    format_expr,
    is_dtype_var,
    names_in,
    unify_params,
)
from nfc.ir import DType, TensorType, Value

#: Values of compile-time parameters without a default, by kind.
SAMPLE_CPARAMS: dict[str, CTValue] = {"int": 2, "float": 0.5, "bool": True}
#: The leading dimensions `...` stands for at a sample.
SAMPLE_LEAD = (3, 4)
#: The smallest sampled size of a shape variable (above SAMPLE_LEAD and the int parameters,
#: so that no two sizes of a sample coincide).
SAMPLE_MIN = 5


@dataclass(frozen=True)
class Sample:
    """One instantiation of an op: sizes, dtypes and compile-time arguments."""

    sizes: dict[str, int]
    dtypes: dict[str, DType]
    cparams: dict[str, CTValue]
    """The compile-time arguments passed (those without a default)."""

    def describe(self, lead: bool) -> str:
        """`N = 7, K = 6, '...' = [3, 4], T = f32`."""
        parts = [f"{k} = {v}" for k, v in self.sizes.items()]
        if lead:
            parts.append(f"'...' = {format_ct(SAMPLE_LEAD)}")
        parts += [f"{k} = {v}" for k, v in self.dtypes.items()]
        parts += [f"{k} = {format_ct(v)}" for k, v in self.cparams.items()]
        return ", ".join(parts)


def check_uncalled(scope: ModuleScope, ops: list[ast.OpDef], training: bool) -> list[Diagnostic]:
    """Diagnostics of the ops `ops` of `scope`'s file, checked as described above."""
    out: list[Diagnostic] = []
    budget = _Budget(STATEMENTS.value())
    for op in ops:
        out += _OpCheck(op, scope, training, budget).run()
    return out


def referenced_ops(scope: ModuleScope, body: tuple[ast.Stmt, ...]) -> set[int]:
    """ids of the ops that `body` (in `scope`) calls, directly or through other ops, in any
    branch: those are checked at their calls, in the configurations that take them."""
    seen: set[int] = set()
    todo: list[tuple[tuple[ast.Stmt, ...], ModuleScope]] = [(body, scope)]
    while todo:
        stmts, sc = todo.pop()
        exprs: list[ast.Expr] = []
        pending = list(stmts)
        while pending:
            s = pending.pop()
            if isinstance(s, ast.For):
                pending += s.body
            elif isinstance(s, ast.If):
                pending += [*s.then, *s.orelse]
            elif isinstance(s, ast.Assign | ast.Comprehension | ast.Update):
                exprs.append(s.value)
        while exprs:
            e = exprs.pop()
            exprs += e.children()
            if isinstance(e, ast.Call):
                try:
                    found = sc.lookup_op(e.fn, e.fn_loc)
                except CompileError:  # ambiguous: reported by the elaboration
                    found = None
                if found is not None and id(found[0]) not in seen:
                    seen.add(id(found[0]))
                    todo.append((found[0].body, found[1]))
    return seen


#: Most statements elaborated for one sample, and for all the samples of one file: an op
#: bigger than that is checked only at its calls (elaborating it is a job for its callers).
SAMPLE_STATEMENTS = 100_000
FILE_STATEMENTS = 1_000_000


@dataclass
class _Budget:
    """Statements left for the samples of one file."""

    real: int
    """The budget of a compilation (limits.STATEMENTS)."""
    left: int = FILE_STATEMENTS


class _TooBig(Exception):
    """A sample ran out of the statements allowed to samples (not of the real budget)."""


class _OpCheck:
    def __init__(self, op: ast.OpDef, scope: ModuleScope, training: bool,
                 budget: _Budget) -> None:
        self.op = op
        self.scope = scope
        self.training = training
        self.budget = budget
        self.lead = any(leading(p.type) for p in op.params)

    # ---- the signature, for all sizes ---------------------------------------------------

    def run(self) -> list[Diagnostic]:
        cparams: dict[str, CTValue] = {}
        sampled = True
        for cp in self.op.cparams:
            if cp.default is None:
                sampled = sampled and cp.kind in SAMPLE_CPARAMS
                cparams[cp.name] = SAMPLE_CPARAMS.get(cp.kind, ())
        try:
            values = self.cparam_values(cparams)
        except CompileError as err:
            return err.diagnostics
        found = self.signature(values)
        if found or not sampled:
            return found
        return self.samples(cparams, values)

    def cparam_values(self, given: dict[str, CTValue]) -> dict[str, CTValue]:
        """Every compile-time parameter's value: `given`, else its default."""
        out: dict[str, CTValue] = {}
        for cp in self.op.cparams:
            if cp.name in given:
                out[cp.name] = given[cp.name]
                continue
            assert cp.default is not None

            def look(n: str, loc: ast.Loc) -> CTValue:
                if n in out:
                    return out[n]
                raise error(f"unknown name '{n}' in a default value", loc)
            out[cp.name] = eval_ct(cp.default, look)
        return out

    def signature(self, cvals: dict[str, CTValue]) -> list[Diagnostic]:
        """Dimensions that are not positive for any sizes (affine ones only)."""
        out: list[Diagnostic] = []
        unknown = {c.name for c in self.op.cparams if c.default is None}
        for p in (*self.op.params, *self.op.outputs):
            for d in p.type.dims:
                if isinstance(d, ast.EllipsisExpr):
                    continue
                names = [n for n in names_in(d) if n not in cvals or n in unknown]
                worst = _max_over_sizes(d, names, cvals, unknown)
                if worst is not None and worst <= 0:
                    what = f"'{p.name}'" if p.name else "the result"
                    text = format_expr(d)
                    shown = text if not names else f"{text}, at most {worst} for positive sizes"
                    out.append(Diagnostic("error", f"a dimension of {what} is {shown}; sizes "
                                          "must be positive", d.loc))
        return out

    # ---- samples ------------------------------------------------------------------------

    def samples(self, cparams: dict[str, CTValue],
                cvals: dict[str, CTValue]) -> list[Diagnostic]:
        names: list[str] = []
        for p in self.op.params:
            for d in p.type.dims:
                names += [n for n in names_in(d) if n not in cvals and n != ELLIPSIS
                          and n not in names]
        dvars = [p.type.dtype for p in self.op.params if is_dtype_var(p.type.dtype)]
        dvars = list(dict.fromkeys(dvars))
        ids = self.index_dtype_vars()
        guess = {v: DType.I32 if v in ids or dtype_class(v) else DType.F32 for v in dvars}
        descending = {n: SAMPLE_MIN + len(names) - 1 - k for k, n in enumerate(names)}
        ascending = {n: SAMPLE_MIN + k for k, n in enumerate(names)}
        assignments = [guess]
        if any(dt is not DType.I32 for dt in guess.values()):
            assignments.append(dict.fromkeys(dvars, DType.I32))
        found: tuple[Sample, list[Diagnostic], set[tuple[str, int, int]]] | None = None
        for dtypes in assignments:
            first: tuple[Sample, list[Diagnostic]] | None = None
            common: set[tuple[str, int, int]] = set()
            for sizes in (descending, ascending):
                sample = Sample(sizes, dtypes, cparams)
                types = self.arg_types(sample, cvals)
                if types is None:
                    continue
                try:
                    diags = self.elaborate(sample, types)
                except _TooBig:
                    return []
                locs = {_key(d) for d in diags}
                common = locs if first is None else common & locs
                if first is None:
                    first = (sample, diags)
                if not common:
                    break
            if first is None:
                continue  # no valid sizes: nothing to check
            if not common:
                return []  # clean here, or failing only at some sizes: not an error of the op
            if found is None:
                found = (*first, common)
        if found is None:
            return []
        sample, diags, common = found
        where = note(f"op '{self.op.name}' is not called, so it was checked as if called "
                     f"with {sample.describe(self.lead)}", self.op.loc)
        return [replace(d, notes=(*(n for n in d.notes if n.loc != self.op.loc), where))
                for d in diags if _key(d) in common]

    def index_dtype_vars(self) -> set[str]:
        """Dtype variables of parameters that the body reads inside a subscript (ids)."""
        params = {p.name: p.type.dtype for p in self.op.params}
        out: set[str] = set()
        stack: list[ast.Expr] = []
        todo: list[ast.Stmt] = list(self.op.body)
        while todo:
            s = todo.pop()
            if isinstance(s, ast.For | ast.If):
                todo += s.body if isinstance(s, ast.For) else [*s.then, *s.orelse]
            elif isinstance(s, ast.Assign | ast.Comprehension):
                stack.append(s.value)
        inside: list[ast.Expr] = []
        while stack:
            e = stack.pop()
            if isinstance(e, ast.Subscript):
                inside += e.indices
            stack += e.children()
        while inside:
            e = inside.pop()
            name = e.name if isinstance(e, ast.Subscript) else \
                e.id if isinstance(e, ast.Name) else None
            if name in params:
                out.add(params[name])
            inside += e.children()
        return out

    def arg_types(self, sample: Sample, cvals: dict[str, CTValue]) -> list[TensorType] | None:
        """The argument types of `sample`, None when its signature is not valid."""
        known: dict[str, CTValue] = {**cvals, **sample.sizes}

        def look(n: str, loc: ast.Loc) -> CTValue:
            if n in known:
                return known[n]
            raise Unbound(n)

        types: list[TensorType] = []
        try:
            for p in self.op.params:
                dims: list[int] = []
                for d in p.type.dims:
                    if isinstance(d, ast.EllipsisExpr):
                        dims += SAMPLE_LEAD
                        continue
                    v = eval_ct(d, look)
                    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                        return None
                    dims.append(v)
                size = 1
                for n in dims:
                    size *= n
                if size > MAX_TENSOR_ELEMENTS:
                    return None
                dt = p.type.dtype
                types.append(TensorType(tuple(dims), sample.dtypes.get(dt) or DTYPES[dt]))
            locs = [p.loc for p in self.op.params]
            b = unify_params(self.op, types, locs, cvals)
            bound: dict[str, CTValue] = {**cvals, **b.dims}

            def look_out(n: str, loc: ast.Loc) -> CTValue:
                if n in bound:
                    return bound[n]
                raise Unbound(n)

            for p in self.op.outputs:
                for d in p.type.dims:
                    if not isinstance(d, ast.EllipsisExpr):
                        v = eval_ct(d, look_out)
                        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                            return None
        except (CompileError, Unbound, KeyError):
            return None
        return types

    def elaborate(self, sample: Sample, types: list[TensorType]) -> list[Diagnostic]:
        """The diagnostics of a call of the op with `types` (as compile_op builds one)."""
        op = self.op
        allowed = min(self.budget.real, SAMPLE_STATEMENTS, self.budget.left)
        ctx = Ctx(self.training, max_statements=allowed)
        env = Env(self.scope, self.training)
        for i, (t, p) in enumerate(zip(types, op.params, strict=True)):
            env.vars[f"__arg{i}"] = TensorInfo.local(Value(t, p.name), p.name, p.loc)
        targs = tuple(ast.TArg(op.loc, k, _literal(v, op.loc))
                      for k, v in sample.cparams.items())
        call = ast.Call(op.loc, op.name, op.loc, targs,
                        tuple(ast.Name(op.loc, f"__arg{i}") for i in range(len(types))))
        try:
            Elaborator(ctx, env, Frame()).call_op(call)
        except Fatal as f:
            ctx.report(f.err, with_calls=False)
        except CompileError as err:
            ctx.report(err, with_calls=False)
        except Poisoned:
            pass
        self.budget.left = max(0, self.budget.left - ctx.ticks)
        if ctx.out_of_statements and allowed < self.budget.real:
            raise _TooBig
        return ctx.diagnostics


def _key(d: Diagnostic) -> tuple[str, int, int]:
    loc = d.loc
    return ("", 0, 0) if loc is None else (loc.file, loc.line, loc.col)


def _literal(value: CTValue, loc: ast.Loc) -> ast.Expr:
    if isinstance(value, bool):
        return ast.Bool(loc, value)
    assert isinstance(value, int | float)
    return ast.Num(loc, value)


def _max_over_sizes(d: ast.Expr, names: list[str], cvals: dict[str, CTValue],
                    unknown: set[str]) -> int | None:
    """The largest value of dimension `d` over positive sizes of the shape variables `names`
    when `d` is affine in them; None when it is unbounded, not affine or not an integer.

    An affine form c + sum(a_i * n_i) over n_i >= 1 is bounded above only when every a_i <= 0,
    and then its largest value is at n_i = 1. Compile-time parameters without a default may
    take any value: a dimension that depends on one is never reported.
    """
    if any(n in unknown for n in names):
        return None

    def at(point: dict[str, int]) -> int | None:
        def look(n: str, loc: ast.Loc) -> CTValue:
            if n in point:
                return point[n]
            if n in cvals:
                return cvals[n]
            raise Unbound(n)
        try:
            v = eval_ct(d, look)
        except (CompileError, Unbound):
            return None
        return v if isinstance(v, int) and not isinstance(v, bool) else None

    ones = dict.fromkeys(names, 1)
    base = at(ones)
    if base is None:
        return None
    coeffs = []
    for n in names:
        step, twice = at({**ones, n: 2}), at({**ones, n: 3})
        if step is None or twice is None or twice - step != step - base:
            return None
        coeffs.append(step - base)
    if any(a > 0 for a in coeffs):
        return None
    # affine in each variable alone; check a mixed point so that products are not taken for
    # sums (N * M - 5 varies like N + M near 1 but not at 2, 2)
    if len(names) > 1 and at(dict.fromkeys(names, 2)) != base + sum(coeffs):
        return None
    return base
