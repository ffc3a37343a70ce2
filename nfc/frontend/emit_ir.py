"""Lowering of expressions: element expressions (inside comprehensions) and whole-tensor
expressions (tensor-level statements), with reductions hoisted into their own computes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from nfc.diagnostics import CompileError, Diagnostic, error, note
from nfc.frontend import ast, builtins, scalars
from nfc.frontend.builtins import BUILTINS
from nfc.frontend.context import (
    CompileTimeBinding,
    Ctx,
    DTypeBinding,
    Env,
    Poison,
    Poisoned,
    TensorInfo,
)
from nfc.frontend.ellipsis import ELLIPSIS, WHERE, ellipsis_names, expand, ir_name
from nfc.frontend.limits import MAX_EXPR_DEPTH, MAX_KEPT_DEPTH, check_elements
from nfc.frontend.ranges import Range, RangeTable, explicit, infer
from nfc.frontend.scalars import ScalarExpr, ScalarType, default_dtype
from nfc.frontend.shapes import DTYPES, CTValue, eval_int, format_ct
from nfc.frontend.tensors import TensorExpr, elementwise
from nfc.ir import (
    Axis,
    Binary,
    ComputeOp,
    Const,
    DType,
    Expr,
    Index,
    Load,
    Loc,
    Select,
    TensorType,
    Unary,
    index_names,
)

IDENTITY = {"sum": 0, "prod": 1, "max": float("-inf"), "min": float("inf")}


def identity(op: str, dtype: DType) -> Const:
    """The identity of reduction `op` in `dtype` (the extreme integers for max and min)."""
    ident = IDENTITY[op]
    if dtype.is_int and isinstance(ident, float):
        import numpy as np

        info = np.iinfo(dtype.numpy)
        return Const(int(info.min if op == "max" else info.max))
    return Const(ident if dtype.is_int else float(ident))


@dataclass
class Scope:
    """Index variables visible in an element expression, and the guards around it."""

    names: dict[str, tuple[Expr, str]]  # surface name -> (index expression, IR name)
    order: list[Axis]                   # every index in scope, outermost first
    guards: list[Expr]
    ranges: RangeTable
    used: set[str] = field(default_factory=set)
    keep: str | None = None
    """"index expression" in a subscript, "condition" in the condition of `a if c else b`:
    there an integer or boolean sub-expression cannot become a compute of its own (an index
    would become data, a guard would lose the facts the bounds proof takes from it)."""

    def child(self) -> Scope:
        """A nested scope (a reduction body)."""
        return Scope(dict(self.names), list(self.order), list(self.guards), self.ranges,
                     self.used, self.keep)

    def bind(self, name: str, rng: Range, base: str | None = None) -> Axis:
        """Introduce index `name`; its IR name (`base`, by default `name`) is unique within
        the statement."""
        base = base or name
        ir_name = base
        n = 1
        while ir_name in self.used:
            ir_name = f"{base}_{n}"
            n += 1
        self.used.add(ir_name)
        ex: Expr = Index(ir_name)
        if rng.lo:
            ex = Binary("+", ex, Const(rng.lo))
        self.names[name] = (ex, ir_name)
        axis = Axis(ir_name, rng.extent)
        self.order.append(axis)
        return axis


class Lowering:
    """Expression lowering; the elaborator supplies `call_op` for op calls."""

    env: Env
    ctx: Ctx

    # ---- helpers ------------------------------------------------------------------------

    def ct_lookup(self, name: str, loc: Loc) -> CTValue:
        """Lookup for eval_ct in the current environment."""
        b = self.env.get(name)
        if isinstance(b, CompileTimeBinding):
            return b.value
        if isinstance(b, Poison):
            raise Poisoned
        if b is None:
            raise self.env.unknown(name, loc)
        raise error(f"'{name}' is not a compile-time value", loc)

    def ct_int(self, e: ast.Expr, what: str) -> int:
        """A compile-time integer expression."""
        return eval_int(e, self.ct_lookup, what)

    def tensor_info(self, name: str, loc: Loc) -> TensorInfo:
        """The tensor bound to `name`, or a diagnostic."""
        b = self.env.get(name)
        if isinstance(b, TensorInfo):
            return b
        if isinstance(b, Poison):
            raise Poisoned
        if b is None:
            raise self.env.unknown(name, loc, self.env.scope.op_names())
        if isinstance(b, CompileTimeBinding):
            raise error(f"'{name}' is a compile-time value ({format_ct(b.value)}), not a "
                        "tensor", loc)
        raise error(f"'{name}' is a dtype, not a tensor", loc)

    def shape_of(self, name: str) -> tuple[int, ...] | None:
        """Shape of the tensor named `name`, None if it is not a tensor."""
        b = self.env.get(name)
        return b.value.shape if isinstance(b, TensorInfo) else None

    def const_of(self, name: str) -> CTValue | None:
        """The value of a compile-time name, None for anything else."""
        b = self.env.get(name)
        return b.value if isinstance(b, CompileTimeBinding) else None

    def infer(self, stmt: ast.Node, lhs: list[tuple[str, ast.Node, Range | None]],
              value: ast.Expr) -> RangeTable:
        """Index ranges of a statement (nfc.frontend.ranges.infer). When inference fails
        and an accessed tensor is unknown or failed, that is reported (or silenced) instead,
        so a failed definition does not cascade into range errors."""
        def accessed(subs: list[ast.Subscript]) -> None:
            for sub in subs:
                self.tensor_info(sub.name, sub.name_loc)

        return infer(stmt, lhs, value, self.shape_of, self.ct_int, self.const_of, accessed)

    def dtype_named(self, name: str) -> DType | None:
        """The dtype a cast named `name` converts to, None if `name` is no dtype."""
        if name in DTYPES:
            return DTYPES[name]
        b = self.env.get(name)
        return b.dtype if isinstance(b, DTypeBinding) else None

    def unknown_callee(self, call: ast.Call) -> CompileError:
        """An unknown function name with a suggestion."""
        cands = [*scalars.INTRINSIC_ARITY, *DTYPES, *BUILTINS, *self.env.scope.op_names()]
        return self.env.unknown(call.fn, call.fn_loc, cands, what="op or function")

    def arity(self, call: ast.Call, n: int) -> None:
        """Check the number of arguments of an intrinsic or cast."""
        if len(call.args) != n:
            hint = ""
            if call.fn in ("max", "min") and all(isinstance(a, ast.Name) for a in call.args):
                hint = (f"; a reduction `{call.fn}(j) body` needs its body on the same line, "
                        f"and the body cannot start with '-' (write `{call.fn}(j) (-x[j])`)")
            raise error(f"'{call.fn}' takes {n} argument{'s' * (n != 1)} but "
                        f"{len(call.args)} {'were' if len(call.args) != 1 else 'was'} "
                        f"given{hint}", call.loc)

    # ---- element expressions ------------------------------------------------------------

    def scalar(self, e: ast.Expr, sc: Scope) -> ScalarExpr:
        """Lower an element expression (kept at most MAX_EXPR_DEPTH deep, see `shallow`)."""
        return self.shallow(self._scalar(e, sc), sc, e.loc)

    def _scalar(self, e: ast.Expr, sc: Scope) -> ScalarExpr:
        if isinstance(e, ast.Num | ast.Bool):
            return scalars.const(e.value)
        if isinstance(e, ast.Name):
            if e.id in sc.names:
                return ScalarExpr(sc.names[e.id][0], scalars.WEAK_INT)
            b = self.env.get(e.id)
            if isinstance(b, CompileTimeBinding):
                if isinstance(b.value, tuple):
                    raise error(f"'{e.id}' is a list; it cannot be used in an expression",
                                e.loc)
                return scalars.const(b.value)
            if isinstance(b, TensorInfo):
                if b.value.type.rank:
                    raise error(f"tensor '{e.id}' of rank {b.value.type.rank} needs "
                                "subscripts here", e.loc)
                return self.load(ast.Subscript(e.loc, e.id, e.loc, ()), b, [])
            if isinstance(b, Poison):
                raise Poisoned
            if b is None:
                raise self.env.unknown(e.id, e.loc, list(sc.names))
            raise error(f"'{e.id}' is a dtype; use it as a cast `{e.id}(x)`", e.loc)
        if isinstance(e, ast.Subscript):
            if e.name in sc.names:
                raise error(f"'{e.name}' is an index, not a tensor", e.name_loc)
            info = self.tensor_info(e.name, e.name_loc)
            indices = []
            isc = replace(sc, keep="index expression")
            for ix in e.indices:
                v = self.scalar(ix, isc)
                if v.ty.kind != "int":
                    what = (f"float tensor '{ix.name}'" if isinstance(ix, ast.Subscript)
                            and v.ty.kind == "float" else f"a {v.ty} value")
                    raise error(f"{what} cannot be used as an index; indices must be "
                                "integers", ix.loc)
                scalars.check_index_expr(v.expr, ix.loc)
                indices.append(v.expr)
            return self.load(e, info, indices)
        if isinstance(e, ast.Call):
            return self.scalar_call(e, sc)
        if isinstance(e, ast.Reduce):
            return self.hoist(e, sc)
        if isinstance(e, ast.BinOp | ast.BoolOp):
            # a loop along the chain `a + b - c ...`, each link kept shallow
            first, links = ast.chain(e)
            acc = self.scalar(first, sc)
            for link in links:
                b = self.scalar(link.b, sc)
                acc = self.shallow(_apply(link, acc, b), sc, link.loc)
            return acc
        if isinstance(e, ast.Compare):
            vals = [self.scalar(x, sc) for x in e.operands]
            return self.comparisons(e, vals, lambda v: self.shallow(v, sc, e.loc))
        if isinstance(e, ast.Unary):
            x = self.scalar(e.x, sc)
            return scalars.negate(x, e.loc) if e.op == "neg" else scalars.logical_not(x, e.loc)
        if isinstance(e, ast.EllipsisExpr):
            raise error(WHERE, e.loc)
        if isinstance(e, ast.IfExp):
            c = self.scalar(e.cond, replace(sc, keep=sc.keep or "condition"))
            if c.const is not None:
                return self.scalar(e.a if c.const else e.b, sc)
            inner = sc.child()
            inner.guards.append(c.expr)
            a = self.scalar(e.a, inner)
            inner = sc.child()
            inner.guards.append(Unary("not", c.expr))
            b = self.scalar(e.b, inner)
            return scalars.select(c, a, b, e.loc)
        raise error("a range or a list is not allowed here", e.loc)

    def shallow(self, sv: ScalarExpr, sc: Scope, loc: Loc) -> ScalarExpr:
        """`sv`, or a load of a compute of its own holding it when it is MAX_EXPR_DEPTH deep
        or more (a long operator chain), so that no pass or code generator has to recurse
        deeper. Enclosing guards go with it like with a hoisted reduction. Weakly typed
        values, and integers and booleans in subscripts and conditions (see Scope.keep),
        cannot move: they are refused past MAX_KEPT_DEPTH instead."""
        depth = self.ctx.depth(sv.expr)
        if depth < MAX_EXPR_DEPTH:
            return sv
        if sv.ty.dtype is None or (sc.keep is not None and sv.ty.kind != "float"):
            if depth > MAX_KEPT_DEPTH:
                raise error(f"{sc.keep or 'expression'} nested more than {MAX_KEPT_DEPTH} "
                            "deep; split it into several statements", loc)
            return sv
        return self.own_compute(sv, sc, loc)

    def own_compute(self, sv: ScalarExpr, sc: Scope, loc: Loc,
                    attrs: dict[str, object] | None = None) -> ScalarExpr:
        """A load of a compute of its own holding `sv` (a strongly typed value), over the
        enclosing indices it uses; the enclosing guards go with it (0 where they fail), so
        that guarded accesses stay guarded. `attrs` are set on that compute."""
        assert sv.ty.dtype is not None
        guard: Expr | None = None
        for g in sc.guards:
            guard = g if guard is None else Binary("and", guard, g)
        used = index_names(sv.expr) | (index_names(guard) if guard is not None else set())
        dims = tuple(a for a in sc.order if a.name in used)
        expr = sv.expr
        if guard is not None:
            dt = sv.ty.dtype
            zero = Const(False) if dt is DType.I1 else Const(0) if dt.is_int else Const(0.0)
            expr = Select(guard, expr, zero)
        op = ComputeOp(TensorType(tuple(a.extent for a in dims), sv.ty.dtype), dims, expr,
                       loc=loc)
        op.attrs.update(attrs or {})
        self.ctx.emit(op)
        self.ctx.check_bounds(op)
        return ScalarExpr(Load(op.result, tuple(Index(a.name) for a in dims)), sv.ty)

    def stop_gradient(self, e: ast.Call, sc: Scope) -> ScalarExpr:
        """`stop_gradient(v)` in an element expression: the value of `v`, computed by a
        compute of its own (over the enclosing indices `v` uses, under the enclosing guards)
        that carries `nf.stop_gradient`, so autodiff passes nothing back through it. A value
        that cannot carry a gradient (an integer, a boolean, a constant, one that reads no
        tensor) is itself."""
        if e.targs:
            raise error("'stop_gradient' takes no compile-time arguments", e.loc)
        self.arity(e, 1)
        sv = self.scalar(e.args[0], sc)
        if sv.ty.kind != "float" or sv.ty.dtype is None or not _reads_tensor(sv.expr):
            return sv
        return self.own_compute(sv, sc, e.loc, {"nf.stop_gradient": True})

    def comparisons(self, e: ast.Compare, vals: list[ScalarExpr],
                    keep: Callable[[ScalarExpr], ScalarExpr]) -> ScalarExpr:
        """`a < b <= c` is `a < b and b <= c`; `keep` keeps each step shallow."""
        out: ScalarExpr | None = None
        for k, op in enumerate(e.ops):
            c = scalars.compare(op, vals[k], vals[k + 1], e.loc)
            out = c if out is None else keep(scalars.logic("and", out, c, e.loc))
        assert out is not None
        return out

    def load(self, e: ast.Subscript, info: TensorInfo, indices: list[Expr]) -> ScalarExpr:
        """A located load of `info` (rank checked)."""
        rank = info.value.type.rank
        if len(indices) != rank:
            raise error(f"'{e.name}' has rank {rank} but is indexed with {len(indices)} "
                        f"subscript{'s' * (len(indices) != 1)}", e.loc,
                        *_decl_note(info))
        ld = Load(info.value, tuple(indices))
        self.ctx.record_load(ld, e, info)
        return ScalarExpr(ld, scalars.sty(info.value.dtype))

    def scalar_call(self, e: ast.Call, sc: Scope) -> ScalarExpr:
        """Intrinsics and casts inside element expressions."""
        if e.targs and e.fn not in BUILTINS and self.env.scope.lookup_op(e.fn, e.fn_loc) is None:
            raise error(f"'{e.fn}' takes no compile-time arguments", e.loc)
        if e.fn == "stop_gradient":
            return self.stop_gradient(e, sc)
        if e.fn in scalars.INTRINSIC_ARITY:
            self.arity(e, scalars.INTRINSIC_ARITY[e.fn])
            return scalars.intrinsic(e.fn, [self.scalar(a, sc) for a in e.args], e.loc)
        dt = self.dtype_named(e.fn)
        if dt is not None:
            self.arity(e, 1)
            return scalars.cast(dt, self.scalar(e.args[0], sc), e.loc)
        if e.fn in BUILTINS or self.env.scope.lookup_op(e.fn, e.fn_loc) is not None:
            raise error(f"'{e.fn}' works on whole tensors and cannot be called inside an "
                        f"element expression; assign its result first (`t = {e.fn}(...)`) and "
                        "index that", e.loc)
        raise self.unknown_callee(e)

    # ---- reductions ---------------------------------------------------------------------

    def reduction(self, e: ast.Reduce, sc: Scope) -> tuple[list[Axis], ScalarExpr, Scope]:
        """Bind the reduction's indices and lower its body; directly nested reductions of the
        same kind (`sum(i) sum(j) x`) merge into one."""
        inner = sc.child()
        axes: list[Axis] = []
        body: ast.Expr = e
        dependent: list[tuple[ast.RedIndex, tuple[ast.Expr | None, ast.Expr | None]]] = []
        while isinstance(body, ast.Reduce) and body.op == e.op:
            for ri in body.indices:
                rng = sc.ranges[(id(body), ri.name)]
                axes.append(inner.bind(ri.name, rng))
                if rng.bounds is not None:
                    dependent.append((ri, rng.bounds))
            body = body.body
        # a range that depends on other indices (`sum(j in 0..i + 1)`) spans their hull and
        # guards the body: `lo <= j < hi`, the identity elsewhere
        guard: ScalarExpr | None = None
        for ri, (lo, hi) in dependent:
            j = ast.Name(ri.loc, ri.name)
            for cond in (ast.Compare(ri.loc, ("<=",), (lo, j)) if lo is not None else None,
                         ast.Compare(ri.loc, ("<",), (j, hi)) if hi is not None else None):
                if cond is not None:
                    c = self.scalar(cond, replace(inner, keep="condition"))
                    guard = c if guard is None else scalars.logic("and", guard, c, ri.loc)
        if guard is not None:
            inner.guards.append(guard.expr)
        sv = self.scalar(body, inner)
        if sv.ty.kind == "bool":
            raise error(f"'{e.op}' of booleans; convert them with i32(...) or f32(...)", e.loc)
        if sv.ty.dtype is None:
            sv = scalars.coerce(sv, ScalarType(sv.ty.kind, default_dtype(sv.ty)), e.loc)
        if guard is not None:
            assert sv.ty.dtype is not None
            sv = ScalarExpr(Select(guard.expr, sv.expr, identity(e.op, sv.ty.dtype)), sv.ty)
        return axes, sv, inner

    def hoist(self, e: ast.Reduce, sc: Scope) -> ScalarExpr:
        """A reduction inside a larger expression becomes its own compute, over the enclosing
        indices it uses; enclosing guards go with it so that guarded accesses stay guarded."""
        axes, body, _ = self.reduction(e, sc)
        guard: Expr | None = None
        for g in sc.guards:
            guard = g if guard is None else Binary("and", guard, g)
        used = index_names(body.expr) | (index_names(guard) if guard is not None else set())
        dims = tuple(a for a in sc.order if a.name in used)
        expr = body.expr
        assert body.ty.dtype is not None
        if guard is not None:
            expr = Select(guard, expr, identity(e.op, body.ty.dtype))
        op = ComputeOp(TensorType(tuple(a.extent for a in dims), body.ty.dtype), dims, expr,
                       reduce=e.op, raxes=tuple(axes), loc=e.loc)
        self.ctx.emit(op)
        self.ctx.check_bounds(op)
        return ScalarExpr(Load(op.result, tuple(Index(a.name) for a in dims)), body.ty)

    # ---- comprehensions -----------------------------------------------------------------

    def comprehension(self, stmt: ast.Node, lhs: list[ast.LhsIndex], value: ast.Expr,
                      declared: TensorType | None, name: str, loc: Loc) -> ComputeOp:
        """One compute for `name[lhs] = value` (reductions inside are hoisted)."""
        fixed: list[tuple[str, ast.Node, Range | None]] = []
        lhs, value, lead = self.expand_ellipsis(lhs, value)
        if declared is not None and len(lhs) != declared.rank:
            raise error(f"'{name}' is declared with rank {declared.rank} but assigned with "
                        f"{len(lhs)} indices", loc)
        for k, ix in enumerate(lhs):
            rng = None
            if ix.lo is not None and ix.hi is not None:
                rng = explicit(ix.lo, ix.hi, ix.name, ix, self.ct_int, [x.name for x in lhs])
                if declared is not None and rng.extent != declared.shape[k]:
                    shown = "'...'" if ix.name.startswith(ELLIPSIS) else f"'{ix.name}'"
                    raise error(f"index {shown} ranges over {rng.extent} values but "
                                f"dimension {k} of '{name}' has size {declared.shape[k]}",
                                ix.loc)
            elif declared is not None:
                rng = Range(0, declared.shape[k])
            fixed.append((ix.name, ix, rng))
        table = self.infer(stmt, fixed, value)
        sc = Scope({}, [], [], table)
        dims = tuple(sc.bind(ix.name, table[(id(stmt), ix.name)],
                             ir_name(ix.name, lead) if k < lead else None)
                     for k, ix in enumerate(lhs))
        shape = tuple(a.extent for a in dims)
        check_elements(shape, f"'{name}'", loc)
        reduce, raxes = None, ()
        if isinstance(value, ast.Reduce):
            axes, body, _ = self.reduction(value, sc)
            reduce, raxes = value.op, tuple(axes)
        else:
            body = self.scalar(value, sc)
        if declared is not None:
            body = scalars.coerce(body, scalars.sty(declared.dtype), value.loc)
        dtype = default_dtype(body.ty)
        op = ComputeOp(TensorType(shape, dtype), dims, body.expr, reduce=reduce, raxes=raxes,
                       loc=loc, name=name)
        return op

    def expand_ellipsis(self, lhs: list[ast.LhsIndex], value: ast.Expr
                        ) -> tuple[list[ast.LhsIndex], ast.Expr, int]:
        """`y[..., d] = x[..., d]` with the indices `...` stands for written out (they range
        over the leading dimensions bound at the call), and their number."""
        bad = [ix for k, ix in enumerate(lhs) if ix.name == ELLIPSIS and k > 0]
        if bad:
            raise error("'...' must come first in an index list", bad[0].loc)
        if not lhs or lhs[0].name != ELLIPSIS:
            return lhs, expand(value, None), 0
        b = self.env.get(ELLIPSIS)
        if not isinstance(b, CompileTimeBinding) or not isinstance(b.value, tuple):
            raise error("'...' in an index list stands for the leading indices of an op whose "
                        "signature has '...' (`x: T[..., D]`)", lhs[0].loc)
        loc = lhs[0].loc
        names = ellipsis_names(len(b.value))
        lead = [ast.LhsIndex(loc, n, ast.Num(loc, 0), ast.Num(loc, size))
                for n, size in zip(names, b.value, strict=True)]
        return lead + lhs[1:], expand(value, names), len(names)

    # ---- whole-tensor expressions -------------------------------------------------------

    def tensor(self, e: ast.Expr) -> TensorExpr | tuple[TensorExpr, ...]:
        """Lower a tensor-level expression; op calls with several results give a tuple."""
        if isinstance(e, ast.Call) and e.fn not in scalars.INTRINSIC_ARITY \
                and self.dtype_named(e.fn) is None:
            if e.fn in BUILTINS:
                return self.builtin(e)
            if self.env.scope.lookup_op(e.fn, e.fn_loc) is not None:
                results = self.call_op(e)
                if len(results) == 1:
                    return TensorExpr.of(results[0].value)
                return tuple(TensorExpr.of(r.value) for r in results)
            raise self.unknown_callee(e)
        return self.tv(e)

    def tv(self, e: ast.Expr) -> TensorExpr:
        """A tensor-level expression with exactly one value (kept shallow, see `shallow`)."""
        return self.shallow_tv(self._tv(e), e.loc)

    def shallow_tv(self, tv: TensorExpr, loc: Loc) -> TensorExpr:
        """`tv`, materialised when its body is MAX_EXPR_DEPTH deep or more (see `shallow`)."""
        if tv.value is not None or self.ctx.depth(tv.sv.expr) < MAX_EXPR_DEPTH:
            return tv
        if tv.sv.ty.dtype is None:
            if self.ctx.depth(tv.sv.expr) > MAX_KEPT_DEPTH:
                raise error(f"expression nested more than {MAX_KEPT_DEPTH} deep; split it "
                            "into several statements", loc)
            return tv
        return TensorExpr.of(self.materialize(tv, None, loc))

    def _tv(self, e: ast.Expr) -> TensorExpr:
        if isinstance(e, ast.Num | ast.Bool):
            return TensorExpr.scalar(scalars.const(e.value))
        if isinstance(e, ast.Name):
            b = self.env.get(e.id)
            if isinstance(b, TensorInfo):
                return TensorExpr.of(b.value)
            if isinstance(b, CompileTimeBinding) and isinstance(b.value, tuple):
                raise error(f"'{e.id}' is a list; it cannot be used in an expression", e.loc)
            if isinstance(b, CompileTimeBinding):
                return TensorExpr.scalar(scalars.const(b.value))
            if isinstance(b, Poison):
                raise Poisoned
            if b is None:
                raise self.env.unknown(e.id, e.loc, self.env.scope.op_names())
            raise error(f"'{e.id}' is a dtype; use it as a cast `{e.id}(x)`", e.loc)
        if isinstance(e, ast.Subscript):
            for ix in e.indices:
                if isinstance(ix, ast.Name) and self.env.get(ix.id) is None:
                    raise error(f"unknown name '{ix.id}': index variables exist only in "
                                f"comprehensions (`t[{ix.id}, ...] = ...`) and reductions",
                                ix.loc)
        if isinstance(e, ast.Subscript | ast.Reduce):
            sc = Scope({}, [], [], self.infer(e, [], e))
            sv = self.scalar(e, sc)
            if isinstance(sv.expr, Load) and not sv.expr.indices:
                return TensorExpr.of(sv.expr.tensor)
            return TensorExpr.scalar(sv)
        if isinstance(e, ast.Call):
            if e.fn in scalars.INTRINSIC_ARITY or self.dtype_named(e.fn) is not None:
                return self.tensor_intrinsic(e)
            out = self.tensor(e)
            if isinstance(out, tuple):
                raise error(f"op '{e.fn}' returns {len(out)} results; assign them to as many "
                            f"names (`a, b = {e.fn}(...)`)", e.loc)
            return out
        if isinstance(e, ast.BinOp | ast.BoolOp):
            # a loop along the chain `a + b - c ...`, each link kept shallow
            first, links = ast.chain(e)
            acc = self.tv(first)
            for link in links:
                b = self.tv(link.b)
                acc = self.shallow_tv(elementwise([acc, b], _applier(link), link.loc,
                                                  f"'{link.op}'"), link.loc)
            return acc
        if isinstance(e, ast.Compare):
            ops = [self.tv(x) for x in e.operands]
            if len(ops) == 2:
                return elementwise(ops, lambda v: self.comparisons(e, v, _same), e.loc,
                                   "a comparison")
            # a long chain `a < b < c ...`: one link at a time, each kept shallow
            out: TensorExpr | None = None
            for k, op in enumerate(e.ops):
                c = elementwise(ops[k:k + 2], _comparer(op, e.loc), e.loc, "a comparison")
                out = c if out is None else self.shallow_tv(
                    elementwise([out, c], _conjunction(e.loc), e.loc, "a comparison"), e.loc)
            assert out is not None
            return out
        if isinstance(e, ast.Unary):
            x = self.tv(e.x)
            fn = scalars.negate if e.op == "neg" else scalars.logical_not
            return elementwise([x], lambda v: fn(v[0], e.loc), e.loc, e.op)
        if isinstance(e, ast.IfExp):
            c = self.tv(e.cond)
            if c.const is not None:
                if not isinstance(c.const, bool):
                    raise error("the condition of 'if' must be a boolean", e.cond.loc)
                return self.tv(e.a if c.const else e.b)
            a, b = self.tv(e.a), self.tv(e.b)
            return elementwise([c, a, b], lambda v: scalars.select(v[0], v[1], v[2], e.loc),
                               e.loc, "'if'")
        raise error("a range or a list is not allowed here", e.loc)

    def tensor_intrinsic(self, e: ast.Call) -> TensorExpr:
        """Intrinsics and casts applied elementwise to whole tensors."""
        dt = self.dtype_named(e.fn)
        if dt is not None:
            self.arity(e, 1)
            return elementwise([self.tv(e.args[0])], lambda v: scalars.cast(dt, v[0], e.loc),
                               e.loc, e.fn)
        self.arity(e, scalars.INTRINSIC_ARITY[e.fn])
        args = [self.tv(a) for a in e.args]
        return elementwise(args, lambda v: scalars.intrinsic(e.fn, v, e.loc), e.loc,
                           f"'{e.fn}'")

    def builtin(self, e: ast.Call) -> TensorExpr:
        """`reshape`, `transpose`, `zeros`, `full`, `zeros_like` (nfc.frontend.builtins)."""
        return builtins.builtin(self, e)

    def call_op(self, e: ast.Call) -> list[TensorInfo]:
        """Inline an op call (implemented by the elaborator)."""
        raise NotImplementedError


def _apply(link: ast.BinOp | ast.BoolOp, a: ScalarExpr, b: ScalarExpr) -> ScalarExpr:
    """One link `a op b` of an operator chain."""
    if isinstance(link, ast.BinOp):
        return scalars.binop(link.op, a, b, link.loc)
    return scalars.logic(link.op, a, b, link.loc)


def _applier(link: ast.BinOp | ast.BoolOp) -> Callable[[list[ScalarExpr]], ScalarExpr]:
    return lambda v: _apply(link, v[0], v[1])


def _comparer(op: str, loc: Loc) -> Callable[[list[ScalarExpr]], ScalarExpr]:
    return lambda v: scalars.compare(op, v[0], v[1], loc)


def _conjunction(loc: Loc) -> Callable[[list[ScalarExpr]], ScalarExpr]:
    return lambda v: scalars.logic("and", v[0], v[1], loc)


def _reads_tensor(e: Expr) -> bool:
    """Whether `e` loads from a tensor (else it has no gradient to stop)."""
    stack = [e]
    while stack:
        x = stack.pop()
        if isinstance(x, Load):
            return True
        stack.extend(x.children())
    return False


def _same(sv: ScalarExpr) -> ScalarExpr:
    return sv


def _decl_note(info: TensorInfo) -> list[Diagnostic]:
    return [note(f"'{info.name}' declared here as {info.decl_text}", info.decl_loc)]

