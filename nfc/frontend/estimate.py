"""Lower bounds on the statements that unrolling a loop or inlining an op call elaborates.

The elaborator counts every statement it elaborates against a budget (limits.STATEMENTS). To
refuse a runaway unroll at once instead of after building a million computes, each loop and
each op call is estimated first, from the syntax alone:

- a statement counts 1, plus the op bodies its right-hand side inlines;
- `for i in lo..hi { body }` counts (hi - lo) * (1 + body) when its bounds are known now, and 0
  iterations otherwise (a bound may depend on an enclosing loop variable or on a shape);
- a statement `if` counts its branch when the condition is a known boolean, else the cheaper
  branch;
- an op call counts its body with nothing known (shapes, compile-time arguments), memoised per
  op; a recursive call counts 0 (recursion is an error of its own).

Every rule rounds down, so an estimate above the budget proves that elaboration would exceed
it: the refusal is never premature. What the estimate misses is still counted statement by
statement as it is elaborated.
"""

from __future__ import annotations

from collections.abc import Callable

from nfc.diagnostics import CompileError
from nfc.frontend import ast
from nfc.frontend.builtins import BUILTINS
from nfc.frontend.imports import ModuleScope
from nfc.frontend.scalars import INTRINSIC_ARITY
from nfc.frontend.shapes import DTYPES, CTValue, Unbound, eval_ct

#: `const_of(name)`: the compile-time value a name has now, None when it has none.
ConstOf = Callable[[str], CTValue | None]


class Estimator:
    """Estimates statement counts in one scope; `op_costs` memoises op bodies across calls."""

    def __init__(self, scope: ModuleScope, const_of: ConstOf, op_costs: dict[int, int],
                 cap: int) -> None:
        self.scope = scope
        self.const_of = const_of
        self.op_costs = op_costs
        self.cap = cap
        """Counting stops past this (the estimate only needs to exceed the budget)."""

    def block(self, stmts: tuple[ast.Stmt, ...], unknown: frozenset[str] = frozenset()) -> int:
        """Statements elaborated by `stmts`, at least; names in `unknown` have no value."""
        total = 0
        for s in stmts:
            total += 1 + self.stmt(s, unknown)
            if total > self.cap:
                break
        return total

    def stmt(self, s: ast.Stmt, unknown: frozenset[str]) -> int:
        """What `s` elaborates beyond itself."""
        if isinstance(s, ast.For):
            lo, hi = self.value(s.lo, unknown), self.value(s.hi, unknown)
            if not isinstance(lo, int) or not isinstance(hi, int) or hi <= lo:
                return 0
            per = 1 + self.block(s.body, unknown | {s.var})
            return min((hi - lo) * per, self.cap + 1)
        if isinstance(s, ast.If):
            cond = self.value(s.cond, unknown)
            if isinstance(cond, bool):
                return self.block(s.then if cond else s.orelse, unknown)
            return min(self.block(s.then, unknown), self.block(s.orelse, unknown))
        if isinstance(s, ast.Assign | ast.Update):
            return self.calls(s.value)
        return 0

    def calls(self, e: ast.Expr) -> int:
        """Statements of the op bodies that evaluating tensor expression `e` inlines."""
        total = 0
        stack = [e]
        while stack and total <= self.cap:
            x = stack.pop()
            stack.extend(x.children())
            if isinstance(x, ast.Call):
                stack.extend(t.value for t in x.targs)
                total += self.op_cost(x)
        return total

    def op_cost(self, call: ast.Call) -> int:
        """Statements of the body of the op `call` inlines (0 for anything else)."""
        fn = call.fn
        if fn in INTRINSIC_ARITY or fn in DTYPES or fn in BUILTINS:
            return 0
        try:
            found = self.scope.lookup_op(fn, call.fn_loc)
        except CompileError:
            return 0
        if found is None:
            return 0
        op, scope = found
        cost = self.op_costs.get(id(op))
        if cost is None:
            self.op_costs[id(op)] = 0  # a recursive call counts 0
            sub = Estimator(scope, _nothing, self.op_costs, self.cap)
            cost = self.op_costs[id(op)] = sub.block(op.body)
        return cost

    def value(self, e: ast.Expr, unknown: frozenset[str]) -> CTValue | None:
        """The compile-time value of `e` now, None when it is not known (or not one)."""
        def look(name: str, loc: ast.Loc) -> CTValue:
            v = None if name in unknown else self.const_of(name)
            if v is None:
                raise Unbound(name)
            return v

        if isinstance(e, ast.Name) and e.id not in unknown:
            return self.const_of(e.id)
        try:
            return eval_ct(e, look)
        except (Unbound, CompileError):
            return None


def _nothing(name: str) -> CTValue | None:
    return None
