"""Gradients of one compute with respect to its inputs, in gather form.

For `B[x] = R_r F(..., A[f(x, r)], ...)` and a differentiable load `A[f(x, r)]` of the body,
the contribution to `dA` is

    dA[z] += sum over (x, r) with f(x, r) = z of  dB[x] * dF/dA[f(x, r)] * W(x, r)

where `W` is 1 for `sum` and no reduction, the arg-extremum indicator for `max`/`min` and the
product of the other factors for `prod`. `indexsolve.invert_access` turns the condition
`f(x, r) = z` into new reduction axes, substitutions and guards, so the result is again a
compute over `A`'s index space: no scatter, no atomics.

Symbolic derivative rules (`derivative`) are the `grad` column of the operator table
(`nfc.ops`): each row's rule gets the node, its operands' derivatives and the zero-aware
builders of `simp` (`_GradCtx`). Loads are the variables: each distinct load is one, repeated
identical loads add up, loads of the same tensor at different indices are separate
contributions. Ties: `max(a, b)` routes the gradient to `b` when `a == b` (so `max(x, 0.0)`
has gradient 0 at 0, like PyTorch's relu), `min(a, b)` likewise to `b`; `max`/`min`
reductions route it to the first extremal point in row-major order of the reduction axes;
`abs` has gradient 0 at 0.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from nfc import ops
from nfc.ir import (
    Axis,
    Binary,
    Cast,
    ComputeOp,
    Const,
    DType,
    Expr,
    Index,
    Load,
    Loc,
    Select,
    TensorType,
    Value,
    substitute_indices,
)
from nfc.passes.autodiff import simp
from nfc.passes.autodiff.indexsolve import invert_access


@dataclass(frozen=True)
class Problem:
    """A construct that has no gradient, found while differentiating."""

    message: str
    loc: Loc | None


def value_loads(e: Expr) -> list[Load]:
    """Distinct loads of `e` in value positions (not inside another load's indices)."""
    out: list[Load] = []
    seen: set[Load] = set()

    def visit(x: Expr) -> None:
        if isinstance(x, Load):
            if x not in seen:
                seen.add(x)
                out.append(x)
            return  # loads inside indices are index-only uses: no gradient flows there
        for k in x.children():
            visit(k)

    visit(e)
    return out


def derivative(e: Expr, target: Load, problems: list[str]) -> Expr | None:
    """`d e / d target` with None for an exact zero; unsupported constructs go to `problems`."""
    d = _Deriv(target, problems)
    return d(e)


@dataclass
class _Deriv:
    target: Load
    problems: list[str]
    memo: dict[int, Expr | None] = field(default_factory=dict)
    deps: dict[int, bool] = field(default_factory=dict)

    def depends(self, e: Expr) -> bool:
        """Whether `e` reads the target in a value position (memoised per node)."""
        key = id(e)
        if key not in self.deps:
            self.deps[key] = (e == self.target if isinstance(e, Load)
                              else any(self.depends(k) for k in e.children()))
        return self.deps[key]

    def __call__(self, e: Expr) -> Expr | None:
        key = id(e)
        if key not in self.memo:
            self.memo[key] = self._d(e) if self.depends(e) else None
        return self.memo[key]

    def _d(self, e: Expr) -> Expr | None:
        if isinstance(e, Load):
            return Const(1.0) if e == self.target else None
        row = ops.find(e)
        if row is None:
            return None
        ctx = _GradCtx(e, e.children(), self)
        if row.grad is None:  # an intrinsic without a derivative rule (a plugin's)
            if any(ctx.d(i) is not None for i in range(len(ctx.args))):
                self.problems.append(f"intrinsic '{row.name}' has no derivative")
            return None
        return row.grad(ctx)


@dataclass
class _GradCtx:
    """What a row's derivative rule sees (nfc.ops.Grad): the node, its operands, their
    derivatives and the builders of `simp`, which take None as zero."""

    e: Expr
    args: tuple[Expr, ...]
    deriv: _Deriv

    def d(self, i: int) -> Expr | None:
        return self.deriv(self.args[i])

    def problem(self, message: str) -> None:
        self.deriv.problems.append(message)

    add = staticmethod(simp.add)
    sub = staticmethod(simp.sub)
    mul = staticmethod(simp.mul)
    div = staticmethod(simp.div)
    neg = staticmethod(simp.neg)
    select = staticmethod(simp.select)


def guard_unproven_loads(op: ComputeOp, rounds: int = 3) -> None:
    """Wrap each load the bounds checker cannot prove in a guard on its own indices.

    The gradient evaluates a forward load only at points of the forward domain where the
    forward evaluated it too (the outer guards restore the domain, inner selects are kept), so
    the load is in bounds there and the guard never changes a value; it only gives the
    verifier the fact it cannot derive (e.g. `z + r` from facts on `z - r` and `r`).
    """
    from nfc.bounds import check_bounds

    for _ in range(rounds):
        bad: dict[Load, set[int]] = {}
        for v in check_bounds(op):
            bad.setdefault(v.load, set()).add(v.dim)
        if not bad:
            return

        def wrap(e: Expr, bad: dict[Load, set[int]] = bad) -> Expr | None:
            if not isinstance(e, Load) or e not in bad:
                return None
            conds: list[Expr] = []
            for d in sorted(bad[e]):
                idx, size = e.indices[d], e.tensor.shape[d]
                conds += [Binary("<=", Const(0), idx), Binary("<", idx, Const(size))]
            zero = Const(0.0) if e.tensor.dtype.is_float else Const(0)
            return Select(simp.conj(conds), e, zero)

        op.body = op.body.map(wrap)


def _reuse_result(partial: Expr, op: ComputeOp) -> Expr:
    """Read the forward result instead of recomputing the whole body (`exp`, `sigmoid`)."""
    if op.reduce is not None:
        return partial
    body, res = op.body, Load(op.result, tuple(Index(a.name) for a in op.dims))
    return partial.map(lambda x: res if x == body else None)


def linear_index(axes: tuple[Axis, ...]) -> Expr:
    """Row-major linear index of `axes` (0 for none)."""
    out: Expr = Const(0)
    stride = 1
    for a in reversed(axes):
        term = Index(a.name) if stride == 1 else Binary("*", Const(stride), Index(a.name))
        out = term if isinstance(out, Const) and out.value == 0 else Binary("+", term, out)
        stride *= a.extent
    return out


@dataclass
class Contribution:
    """Part of a tensor's gradient: an elementwise body over `dims`, or a compute's result."""

    dims: tuple[Axis, ...]
    body: Expr | None = None
    value: Value | None = None


@dataclass
class ComputeGrad:
    """Differentiates one forward compute; new computes go to `emit`."""

    op: ComputeOp
    dout: Value
    emit: Callable[[ComputeOp], Value]
    problems: list[Problem]
    grad_name: Callable[[Value], str] = lambda v: f"d_{v.name}" if v.name else "d"
    aux: dict[str, Value] = field(default_factory=dict)

    def contributions(self, target: Load, zdims: tuple[Axis, ...]) -> list[Contribution]:
        """The contribution of the load `target` of this compute's body to its tensor."""
        op = self.op
        msgs: list[str] = []
        partial = derivative(op.body, target, msgs)
        for m in dict.fromkeys(msgs):
            self.problems.append(Problem(m, op.loc))
        if partial is None:
            return []
        inv = invert_access(op.all_axes, target.indices, zdims)
        if inv is None:
            return []
        partial = _reuse_result(partial, op)
        x = tuple(Index(a.name) for a in op.dims)
        seed = self.dout.owner
        if (isinstance(seed, ComputeOp) and seed.reduce is None
                and not any(isinstance(n, Load | Index) for n in seed.body.walk())):
            term = simp.mul(seed.body, partial)  # a constant gradient (the loss seed): inline
        else:
            term = simp.mul(Load(self.dout, x), partial)
        if op.reduce in ("max", "min"):
            mask = Binary("==", linear_index(op.raxes), Load(self._argext(), x))
            term = simp.select(mask, term, None)
        elif op.reduce == "prod":
            excl = self._exclusive_product()
            term = simp.mul(term, Load(excl, x + tuple(Index(a.name) for a in op.raxes)))
        elif op.reduce not in (None, "sum"):
            self.problems.append(Problem(f"reduction '{op.reduce}' has no gradient", op.loc))
            return []
        assert term is not None
        body = simp.guard(inv.guards, substitute_indices(term, inv.subst))
        assert body is not None
        if target.tensor.dtype != op.result.dtype:
            body = Cast(target.tensor.dtype, body)
        ranges = {a.name: (0, a.extent - 1) for a in zdims + inv.axes}
        body = simp.tidy(body, ranges)
        c = ComputeOp(target.tensor.type, zdims, body, reduce="sum" if inv.axes else None,
                      raxes=inv.axes, loc=op.loc, name=self.grad_name(target.tensor))
        guard_unproven_loads(c)
        if not inv.axes:
            return [Contribution(zdims, body=c.body)]
        return [Contribution(zdims, value=self.emit(c))]

    def _argext(self) -> Value:
        """`idx[x]`: row-major position of the first extremum (min over matching points)."""
        if "argext" not in self.aux:
            op = self.op
            x = tuple(Index(a.name) for a in op.dims)
            n = math.prod(a.extent for a in op.raxes)
            body = Select(Binary("==", op.body, Load(op.result, x)), linear_index(op.raxes),
                          Const(n))
            dtype = DType.I32 if n < 2**31 - 1 else DType.I64
            c = ComputeOp(TensorType(op.result.shape, dtype), op.dims, body, reduce="min",
                          raxes=op.raxes, loc=op.loc, name=f"arg{op.reduce}")
            self.aux["argext"] = self.emit(c)
        return self.aux["argext"]

    def _exclusive_product(self) -> Value:
        """`excl[x, r] = prod over r' != r of F(x, r')` (exact even when factors are 0)."""
        if "excl" not in self.aux:
            op = self.op
            used = {a.name for a in op.all_axes}
            fresh: list[Axis] = []
            for a in op.raxes:
                name = a.name + "_"
                while name in used:
                    name += "_"
                used.add(name)
                fresh.append(Axis(name, a.extent))
            renamed = substitute_indices(
                op.body, {a.name: Index(f.name) for a, f in zip(op.raxes, fresh, strict=True)})
            same = simp.conj([Binary("==", Index(a.name), Index(f.name))
                              for a, f in zip(op.raxes, fresh, strict=True)])
            dims = op.dims + op.raxes
            c = ComputeOp(TensorType(tuple(a.extent for a in dims), op.result.dtype), dims,
                          Select(same, Const(1.0), renamed), reduce="prod", raxes=tuple(fresh),
                          loc=op.loc, name="prod_excl")
            self.aux["excl"] = self.emit(c)
        return self.aux["excl"]
