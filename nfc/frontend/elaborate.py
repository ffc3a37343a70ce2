"""Elaboration of statements: bindings, compile-time `if` and `for`, op inlining.

Each op call is inlined: the argument types bind the op's shape and dtype variables, and the
op body is elaborated in a fresh environment with concrete shapes, emitting computes located
in the op's own file (with `nf.callsite` naming the call in the user's file).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from nfc.diagnostics import CompileError, error, note
from nfc.frontend import ast
from nfc.frontend.context import (
    POISON,
    CompileTimeBinding,
    Ctx,
    DTypeBinding,
    Env,
    Fatal,
    Poisoned,
    TensorInfo,
)
from nfc.frontend.ellipsis import ELLIPSIS
from nfc.frontend.emit_ir import Lowering
from nfc.frontend.estimate import Estimator
from nfc.frontend.imports import suggest
from nfc.frontend.limits import MAX_CALL_DEPTH, STATEMENTS, check_elements
from nfc.frontend.scalars import coerce, sty
from nfc.frontend.shapes import (
    DTYPES,
    CTValue,
    Unbound,
    eval_ct,
    format_ct,
    format_tensor_type,
    format_type,
    is_dtype_var,
    unify_params,
)
from nfc.frontend.tensors import TensorExpr, aligned, broadcast_shape, compute
from nfc.ir import TensorType, Value

if TYPE_CHECKING:
    from nfc.frontend.model import ModelState


@dataclass
class Frame:
    """What the statements being elaborated belong to: an op call or a model."""

    op: ast.OpDef | None = None
    outputs: dict[str, TensorType] = field(default_factory=dict)
    final: set[int] = field(default_factory=set)
    """ids of the statements that define a single-output op's result."""
    single: TensorType | None = None
    last: str | None = None
    model: ModelState | None = None
    failed: bool = False
    """Whether a statement failed (its diagnostics are reported already)."""

    def declared(self, name: str, stmt: ast.Stmt) -> TensorType | None:
        """The declared type of `name` when `stmt` assigns an op output."""
        if self.single is not None:
            return self.single if id(stmt) in self.final else None
        return self.outputs.get(name)


def final_statements(body: tuple[ast.Stmt, ...]) -> set[int] | None:
    """ids of the statements that may run last in `body` (None: not an assignment)."""
    if not body:
        return None
    last = body[-1]
    if isinstance(last, ast.For):
        return final_statements(last.body)
    if isinstance(last, ast.If):
        a, b = final_statements(last.then), final_statements(last.orelse)
        return None if a is None or b is None else a | b
    if isinstance(last, ast.Assign | ast.Comprehension):
        return {id(last)}
    return None


def targets(s: ast.Stmt) -> list[str]:
    """Names a statement binds (for poisoning after a failure)."""
    if isinstance(s, ast.Assign):
        return [t.name for t in s.targets]
    if isinstance(s, ast.Comprehension | ast.Decl):
        return [s.target.name]
    if isinstance(s, ast.For):
        return [n for x in s.body for n in targets(x)]
    if isinstance(s, ast.If):
        return [n for x in (*s.then, *s.orelse) for n in targets(x)]
    return []


class Elaborator(Lowering):
    """Elaborates the statements of one model body or one inlined op call."""

    def __init__(self, ctx: Ctx, env: Env, frame: Frame) -> None:
        self.ctx = ctx
        self.env = env
        self.frame = frame

    # ---- statements ---------------------------------------------------------------------

    def block(self, stmts: tuple[ast.Stmt, ...]) -> None:
        """Elaborate statements; a failing statement does not stop the next one."""
        for s in stmts:
            self.ctx.tick(s.loc)
            try:
                self.stmt(s)
            except Poisoned:
                self.poison(s)
            except CompileError as err:
                self.ctx.report(err)
                self.poison(s)
            else:
                continue
            self.frame.failed = True

    def poison(self, s: ast.Stmt) -> None:
        """Mark the names `s` should have bound as failed."""
        for n in targets(s):
            self.env.vars[n] = POISON

    def stmt(self, s: ast.Stmt) -> None:
        """Elaborate one statement."""
        if isinstance(s, ast.Assign):
            out = self.tensor(s.value)
            if len(s.targets) > 1:
                n = len(out) if isinstance(out, tuple) else 1
                if n != len(s.targets):
                    raise error(f"{len(s.targets)} names are assigned but the right-hand side "
                                f"has {n} result{'s' * (n != 1)}", s.loc)
                assert isinstance(out, tuple)
                for t, tv in zip(s.targets, out, strict=True):
                    self.bind(t, tv, s)
            elif isinstance(out, tuple):
                fn = s.value.fn if isinstance(s.value, ast.Call) else "..."
                raise error(f"op '{fn}' returns {len(out)} results; assign them to as many "
                            f"names (`a, b = {fn}(...)`)", s.value.loc)
            else:
                self.bind(s.targets[0], out, s)
        elif isinstance(s, ast.Comprehension):
            name = s.target.name
            op = self.comprehension(s, list(s.indices), s.value, self.frame.declared(name, s),
                                    name, s.loc)
            self.ctx.emit(op)
            self.ctx.check_bounds(op)
            self.env.vars[name] = TensorInfo.local(op.result, name, s.target.loc)
            self.frame.last = name
        elif isinstance(s, ast.If):
            cond = self.tv(s.cond).const
            if not isinstance(cond, bool):
                raise error("the condition of a statement `if` must be a compile-time boolean; "
                            "for element-wise choices write `a if c else b`", s.cond.loc)
            self.block(s.then if cond else s.orelse)
        elif isinstance(s, ast.For):
            self.loop(s)
        elif self.frame.model is not None:
            self.frame.model.stmt(self, s)
        else:
            kind = s.kind if isinstance(s, ast.Decl) else type(s).__name__.lower()
            raise error(f"'{kind}' statements are only allowed in a model", s.loc)

    def estimator(self) -> Estimator:
        """Statement estimates in the current environment (nfc.frontend.estimate)."""
        return Estimator(self.env.scope, self.const_of, self.ctx.op_costs,
                         self.ctx.max_statements)

    def budget_error(self, what: str, need: int, loc: ast.Loc) -> Fatal:
        """`what` would elaborate `need` statements more than the budget allows: elaboration
        stops (every later statement would be refused as well)."""
        budget = self.ctx.max_statements
        self.ctx.out_of_statements = True
        before = f" after the {self.ctx.ticks} before it" if need <= budget else ""
        return Fatal(error(f"{what} would elaborate at least {need} statements{before}, more "
                           f"than the budget of {budget} {STATEMENTS.what} "
                           f"({STATEMENTS.hint()})", loc, *self.ctx.call_notes()))

    def loop(self, s: ast.For) -> None:
        """Unroll `for i in lo..hi { ... }`; the loop variable is a compile-time int. The
        loop is estimated first and refused before unrolling when it exceeds the budget."""
        lo, hi = self.ct_int(s.lo, "a loop bound"), self.ct_int(s.hi, "a loop bound")
        trips = max(0, hi - lo)
        per = 1 + self.estimator().block(s.body, frozenset({s.var}))
        if trips and self.ctx.ticks + trips * per > self.ctx.max_statements:
            raise self.budget_error(f"loop of {trips} iterations ({per} statements each)",
                                    trips * per, s.loc)
        saved = self.env.vars.get(s.var)
        for i in range(lo, hi):
            self.ctx.tick(s.loc)
            self.env.vars[s.var] = CompileTimeBinding(i)
            self.block(s.body)
        if saved is None:
            self.env.vars.pop(s.var, None)
        else:
            self.env.vars[s.var] = saved

    def bind(self, target: ast.Target, tv: TensorExpr, s: ast.Stmt) -> None:
        """Bind a tensor-level result to a name (materialising it)."""
        declared = self.frame.declared(target.name, s)
        if declared is None and tv.const is not None:
            self.env.vars[target.name] = CompileTimeBinding(tv.const)
            return
        value = self.materialize(tv, target.name, s.loc, declared)
        self.env.vars[target.name] = TensorInfo.local(value, target.name, target.loc)
        self.frame.last = target.name

    def materialize(self, tv: TensorExpr, name: str | None, loc: ast.Loc,
                    declared: TensorType | None = None) -> Value:
        """A tensor value for `tv`, broadcast and converted to `declared` when given."""
        if declared is not None:
            if tv.shape != declared.shape:
                if broadcast_shape([tv.shape, declared.shape], loc, "the result") \
                        != declared.shape:
                    raise error(f"result '{name}' has shape [{', '.join(map(str, tv.shape))}]"
                                f" but the op declares {format_tensor_type(declared)}", loc)
                tv = TensorExpr(declared.shape, aligned(tv, declared.shape))
            sv = coerce(tv.sv, sty(declared.dtype), loc)
            tv = TensorExpr(tv.shape, sv, tv.value if sv.ty == tv.sv.ty else None)
        if tv.value is not None:
            return tv.value
        op = compute(tv.shape, tv.sv, None, loc, name)
        self.ctx.emit(op)
        self.ctx.check_bounds(op)
        return op.result

    # ---- op calls -----------------------------------------------------------------------

    def call_op(self, e: ast.Call) -> list[TensorInfo]:
        """Inline a call of an op: unify, elaborate its body, check its results."""
        found = self.env.scope.lookup_op(e.fn, e.fn_loc)
        assert found is not None
        op, scope = found
        if any(o is op for o in self.ctx.active):
            chain = " -> ".join([n for n, _ in self.ctx.calls] + [op.name])
            raise error(f"op '{op.name}' calls itself ({chain}); recursion cannot be inlined",
                        e.loc)
        if len(self.ctx.calls) >= MAX_CALL_DEPTH:
            raise error(f"op calls nested more than {MAX_CALL_DEPTH} deep", e.loc)
        need = self.estimator().op_cost(e)
        if self.ctx.ticks + need > self.ctx.max_statements:
            raise self.budget_error(f"inlining op '{op.name}'", need, e.loc)
        decl = note(f"'{op.name}' declared here", op.loc)
        if len(e.args) != len(op.params):
            raise error(f"op '{op.name}' takes {len(op.params)} argument"
                        f"{'s' * (len(op.params) != 1)} but {len(e.args)} "
                        f"{'were' if len(e.args) != 1 else 'was'} given", e.loc, decl)
        cvals = self.template_args(e, op)
        args = [self.tv(a) for a in e.args]
        # a literal argument takes the dtype its parameter's dtype variable gets elsewhere
        bound = {p.type.dtype: tv.sv.ty.dtype for p, tv in zip(op.params, args, strict=True)
                 if tv.sv.ty.dtype is not None and is_dtype_var(p.type.dtype)}
        values = []
        for p, a, tv in zip(op.params, e.args, args, strict=True):
            hint = DTYPES.get(p.type.dtype) or bound.get(p.type.dtype)
            if tv.value is None and hint is not None and tv.sv.ty.dtype is None:
                tv = TensorExpr(tv.shape, coerce(tv.sv, sty(hint), a.loc))
            values.append(self.materialize(tv, None, a.loc))
        b = unify_params(op, [v.type for v in values], [a.loc for a in e.args], cvals)
        known: dict[str, CTValue] = {**cvals, **b.dims}
        if b.ellipsis is not None:
            known[ELLIPSIS] = b.ellipsis
        env = Env(scope, self.env.training)
        env.vars.update({k: CompileTimeBinding(v) for k, v in known.items()})
        env.vars.update({k: DTypeBinding(v) for k, v in b.dtypes.items()})
        for p, v in zip(op.params, values, strict=True):
            info = TensorInfo(v, p.name, p.loc, "", p.type, known)
            info.decl_text = info.describe()
            env.vars[p.name] = info
        frame = Frame(op=op, outputs=self.output_types(op, known, b.dtypes, e))
        if op.single_output:
            frame.single = frame.outputs.pop("")
            final = final_statements(op.body)
            if final is None:
                raise error(f"the last statement of op '{op.name}' must assign its result",
                            op.loc, note("called here", e.loc))
            frame.final = final
        self.ctx.calls.append((op.name, e.loc))
        self.ctx.active.append(op)
        try:
            Elaborator(self.ctx, env, frame).block(op.body)
        finally:
            self.ctx.calls.pop()
            self.ctx.active.pop()
        return self.results(op, env, frame, e)

    def template_args(self, e: ast.Call, op: ast.OpDef) -> dict[str, CTValue]:
        """Values of the op's compile-time parameters at this call."""
        names = [c.name for c in op.cparams]
        given: dict[str, tuple[CTValue, ast.TArg]] = {}
        for ta in e.targs:
            name = ta.name
            if name is None:
                if len(op.cparams) != 1:
                    raise error(f"name the compile-time arguments of '{op.name}' "
                                f"(`{op.name}<p = ...>`)", ta.loc)
                name = names[0]
            if name not in names:
                raise error(f"op '{op.name}' has no compile-time parameter '{name}'"
                            f"{suggest(name, names)}", ta.loc,
                            note(f"'{op.name}' declared here", op.loc))
            if name in given:
                raise error(f"compile-time argument '{name}' given twice", ta.loc)
            given[name] = (eval_ct(ta.value, self.ct_lookup), ta)
        out: dict[str, CTValue] = {}
        for cp in op.cparams:
            if cp.name in given:
                value, where = given[cp.name][0], given[cp.name][1].loc
            elif cp.default is not None:
                def look(n: str, loc: ast.Loc) -> CTValue:
                    if n in out:
                        return out[n]
                    raise error(f"unknown name '{n}' in a default value", loc)
                value, where = eval_ct(cp.default, look), cp.default.loc
            else:
                raise error(f"op '{op.name}' needs the compile-time argument '{cp.name}' "
                            f"(`{op.name}<{cp.name} = ...>(...)`)", e.loc,
                            note("declared here", cp.loc))
            out[cp.name] = check_kind(value, cp, where)
        return out

    def output_types(self, op: ast.OpDef, known: dict[str, CTValue], dtypes: dict,
                     e: ast.Call) -> dict[str, TensorType]:
        """The concrete types of the op's outputs at this call."""
        out: dict[str, TensorType] = {}
        for p in op.outputs:
            dt = p.type.dtype
            if dt in dtypes:
                dtype = dtypes[dt]
            elif dt in DTYPES:
                dtype = DTYPES[dt]
            else:
                raise error(f"dtype variable '{dt}' of the result of '{op.name}' is not bound "
                            "by any parameter", p.type.dtype_loc, note("called here", e.loc))
            dims: list[int] = []
            for d in p.type.dims:
                if isinstance(d, ast.EllipsisExpr):
                    lead = known.get(ELLIPSIS)
                    if not isinstance(lead, tuple):
                        raise error(f"'...' in the result type of '{op.name}' is not bound by "
                                    "any parameter", d.loc, note("called here", e.loc))
                    dims += lead
                    continue

                def look(n: str, loc: ast.Loc) -> CTValue:
                    if n in known:
                        return known[n]
                    raise Unbound(n)
                try:
                    v = eval_ct(d, look)
                except Unbound as u:
                    raise error(f"'{u.name}' in the result type of '{op.name}' is not bound by "
                                "any parameter", d.loc, note("called here", e.loc)) from None
                if isinstance(v, bool) or not isinstance(v, int):
                    raise error(f"dimension of the result of '{op.name}' is {format_ct(v)}, "
                                "not an integer", d.loc, note("called here", e.loc))
                dims.append(v)
            check_elements(tuple(dims), f"result of '{op.name}'", e.loc)
            out[p.name] = TensorType(tuple(dims), dtype)
        return out

    def results(self, op: ast.OpDef, env: Env, frame: Frame, e: ast.Call) -> list[TensorInfo]:
        """The op's result tensors after its body ran."""
        names = [frame.last] if op.single_output else [p.name for p in op.outputs]
        types = [frame.single] if op.single_output else [frame.outputs[n] for n in names
                                                         if n is not None]
        out = []
        for name, t, p in zip(names, types, op.outputs, strict=True):
            b = env.vars.get(name) if name is not None else None
            # after a failed statement, the result the body seems to have (an earlier valid
            # statement, when the failed one was last) proves nothing: say no more
            if b is POISON or frame.failed:
                raise Poisoned
            if not isinstance(b, TensorInfo):
                what = f"output '{name}'" if name else "its result"
                raise error(f"op '{op.name}' never assigns {what}", p.loc,
                            note("called here", e.loc))
            if b.value.type != t:
                raise error(f"result of '{op.name}' is {format_tensor_type(b.value.type)} but "
                            f"the op declares {format_type(p.type)} = {format_tensor_type(t)}",
                            b.decl_loc or p.loc, note("called here", e.loc))
            out.append(TensorInfo(b.value, name or op.name, e.loc,
                                  f"{format_tensor_type(t)} (result of '{op.name}')"))
        return out


def check_kind(value: CTValue, cp: ast.CParam, loc: ast.Loc) -> CTValue:
    """A compile-time argument converted to its parameter's kind."""
    kind = cp.kind
    if kind == "int" and isinstance(value, int) and not isinstance(value, bool):
        return value
    if kind == "float" and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if kind == "bool" and isinstance(value, bool):
        return value
    if kind == "ints" and isinstance(value, tuple):
        return value
    raise error(f"compile-time parameter '{cp.name}' is {kind} but the argument is "
                f"{format_ct(value)}", loc, note("declared here", cp.loc))

