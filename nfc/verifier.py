"""The IR verifier: structural, typing and bounds rules every module must satisfy.

`verify(module)` raises one CompileError listing every problem found, each located at its op.
It checks:
- functions: unique names; `arg_attrs` parallel to `args`; `nf.role` in input/param/state/rng
  (an rng argument is `tensor<2xi64>`), `nf.trainable` a bool, `nf.init` a known
  initializer; the body ends with `nf.return` and has no other; `nf.results` names one
  result per returned value; no recursion through `nf.call`;
- SSA: every operand is defined before its use (function arguments, earlier ops; a kernel body
  sees the outer values defined before the kernel, and its own values are not visible after
  it); no value is defined twice;
- computes: extents >= 1, element counts <= `MAX_ELEMENTS`, axis names distinct across dims
  and reduction axes, a known reduction exactly when there are reduction axes, result shape =
  dim extents in order, index variables bound, load arity = tensor rank, integer indices, the
  typing rules below, and in-bounds loads (`nfc.bounds.check_bounds`);
- calls: the callee exists, argument and result types match its signature;
- kernels: not nested; the body ends with `nf.yield` of the kernel's result types.
- use lists (`check_use_lists`): every op is linked to its block and is a user of exactly the
  values it reads.

Typing rules (`infer_dtype`) are the operator table's (`nfc.ops`, docs/operators.md), the same
the interpreter, simplifier, cost model, frontend and backends apply: literals without a dtype
and index variables are weak: they take the type of the other operand. Two typed operands must
have the same type. A weak float never meets an integer. Each operator's row names what its
operands may be: arithmetic is not defined on i1; `/` needs floats (use `//` on integers);
`and`/`or`/`not`/select conditions take i1; comparisons and `isfinite` give i1; exp, log,
sqrt, rsqrt, tanh, sigmoid, erf, softplus, log1p, expm1, atan2 and pow take floats; abs, max,
min any number; philox takes integers and gives a weak float. A compute's body has the
result's type (or is weak).
"""

from __future__ import annotations

import re
from typing import Any

from nfc import ops
from nfc.bounds import check_bounds
from nfc.diagnostics import DiagnosticEngine
from nfc.ir import (
    INTRINSICS,
    MAX_ELEMENTS,
    REDUCTIONS,
    AllReduceOp,
    Binary,
    Block,
    Call,
    CallOp,
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
    TensorType,
    Unary,
    Value,
    YieldOp,
)
from nfc.ops import Kind

ROLES = frozenset({"input", "param", "state", "rng", "opt_state", "step"})
INITIALIZERS = ("normal", "uniform", "zeros", "ones", "const", "glorot_uniform", "he_normal")
_INIT_RE = re.compile(r"\s*(" + "|".join(INITIALIZERS) + r")\s*(\(.*\))?\s*\Z")


def _vname(v: Value) -> str:
    return f"%{v.name or '?'}"


class _Typer:
    """Infers kinds bottom-up with the operator table's rules (nfc.ops), recording every
    error; None marks an already reported error."""

    def __init__(self, bound: set[str] | None) -> None:
        self.bound = bound
        self.errors: list[str] = []

    def err(self, msg: str) -> None:
        self.errors.append(msg)

    def kind(self, e: Expr) -> Kind | None:
        if isinstance(e, Const):
            if e.is_float and e.dtype is not None and not e.dtype.is_float:
                self.err(f"float literal {e.value!r} typed {e.dtype}")
                return None
            return ops.const_kind(e)
        if isinstance(e, Index):
            if self.bound is not None and e.name not in self.bound:
                self.err(f"unknown index variable '{e.name}'")
                return None
            return ops.WEAK_INT
        if isinstance(e, Load):
            return self.load(e)
        row = ops.find(e)
        if isinstance(e, Call):
            n = INTRINSICS.get(e.fn)
            if n is None:
                self.err(f"unknown intrinsic '{e.fn}'")
                return None
            if len(e.args) != n:
                self.err(f"'{e.fn}' takes {n} arguments, {len(e.args)} given")
                return None
        kinds = [self.kind(c) for c in e.children()]
        if row is None:
            what = {Unary: "unary operator", Binary: "binary operator"}.get(type(e))
            self.err(f"unknown {what} '{ops.key(e)}'" if what else
                     f"unknown expression node {type(e).__name__}")
            return None
        return ops.check_strict(row, e, kinds, self.err)[1]

    def load(self, e: Load) -> Kind | None:
        t = e.tensor
        ok = True
        if len(e.indices) != t.type.rank:
            self.err(f"load of '{_vname(t)}' has {len(e.indices)} indices but the tensor has "
                     f"rank {t.type.rank} ({t.type})")
            ok = False
        for d, ie in enumerate(e.indices):
            k = self.kind(ie)
            if ops.is_float(k):
                self.err(f"index {d} of '{_vname(t)}' has type {k}; indices must be integers")
                ok = False
        return t.dtype if ok else None


def infer_dtype(e: Expr) -> DType | None:
    """The type of the scalar expression `e`; None when it is weak (only weak literals and
    index variables decide it). Raises ValueError when `e` breaks the typing rules."""
    t = _Typer(None)
    k = t.kind(e)
    if t.errors:
        raise ValueError(t.errors[0])
    return k if isinstance(k, DType) else None


def expr_kind(e: Expr) -> Kind:
    """Like `infer_dtype`, but tells weak integers ("int") from weak floats ("float")."""
    t = _Typer(None)
    k = t.kind(e)
    if t.errors or k is None:
        raise ValueError(t.errors[0] if t.errors else "ill-typed expression")
    return k


# ---------------------------------------------------------------------------------------------
# ops and functions


class _FuncVerifier:
    def __init__(self, func: Func, module: Module | None, eng: DiagnosticEngine) -> None:
        self.func = func
        self.module = module
        self.eng = eng
        self.defined: set[int] = set()
        self.seen: set[int] = set()  # every value defined so far, kernel-private ones too
        self.everywhere = {id(a) for a in func.args}
        for op in func.walk():
            self.everywhere.update(id(r) for r in op.results)

    def error(self, msg: str, loc: Loc | None) -> None:
        self.eng.error(msg, loc if loc is not None else self.func.loc)

    def check_type(self, t: TensorType, what: str, loc: Loc | None) -> None:
        if any(d < 1 for d in t.shape):
            self.error(f"{what} has type {t} with an empty dimension", loc)
        elif t.size > MAX_ELEMENTS:
            self.error(f"{what} has {t.size} elements, more than the limit {MAX_ELEMENTS}", loc)

    def run(self) -> None:
        f = self.func
        if len(f.arg_attrs) != len(f.args):
            self.error(f"@{f.name} has {len(f.args)} arguments but {len(f.arg_attrs)} "
                       "argument attribute dicts", f.loc)
        for i, a in enumerate(f.args):
            if id(a) in self.defined:
                self.error(f"argument '{_vname(a)}' appears twice in @{f.name}", f.loc)
            self.defined.add(id(a))
            self.check_type(a.type, f"argument '{_vname(a)}'", f.loc)
            if i < len(f.arg_attrs):
                self.arg_attrs(a, f.arg_attrs[i])
        ops = f.body.ops
        if not ops or not isinstance(ops[-1], ReturnOp):
            self.error(f"@{f.name} does not end with nf.return", f.loc)
        self.block(ops, in_kernel=False)
        if ops and isinstance(ops[-1], ReturnOp):
            names = f.attrs.get("nf.results")
            n = len(ops[-1].values)
            if names is not None and (not isinstance(names, list | tuple) or len(names) != n
                                      or not all(isinstance(s, str) for s in names)):
                self.error(f"nf.results of @{f.name} must name its {n} results, got "
                           f"{names!r}", ops[-1].loc)

    def arg_attrs(self, a: Value, attrs: dict[str, Any]) -> None:
        loc = self.func.loc
        role = attrs.get("nf.role")
        if role is not None and role not in ROLES:
            self.error(f"argument '{_vname(a)}' has nf.role {role!r}; expected one of "
                       f"{', '.join(sorted(ROLES))}", loc)
        if role == "rng" and a.type != TensorType((2,), DType.I64):
            self.error(f"rng argument '{_vname(a)}' has type {a.type}, expected "
                       "tensor<2xi64>", loc)
        tr = attrs.get("nf.trainable")
        if tr is not None and not isinstance(tr, bool):
            self.error(f"nf.trainable of '{_vname(a)}' must be true or false", loc)
        init = attrs.get("nf.init")
        if init is not None and (not isinstance(init, str) or not _INIT_RE.match(init)):
            self.error(f"nf.init of '{_vname(a)}' is {init!r}; expected one of "
                       f"{', '.join(INITIALIZERS)}", loc)

    def use(self, v: Value, op: Op) -> None:
        if id(v) in self.defined:
            return
        if id(v) in self.seen:
            self.error(f"'{_vname(v)}' is defined inside an nf.kernel body and is not visible "
                       "outside it", op.loc)
        elif id(v) in self.everywhere:
            self.error(f"'{_vname(v)}' is used before its definition", op.loc)
        else:
            self.error(f"'{_vname(v)}' is not defined in @{self.func.name}", op.loc)

    def block(self, ops: list[Op], in_kernel: bool) -> None:
        for i, op in enumerate(ops):
            last = i == len(ops) - 1
            if not isinstance(op, KernelOp):  # a kernel's body ops check their own operands
                for v in op.operands:
                    self.use(v, op)
            if isinstance(op, YieldOp):
                if not in_kernel or not last:
                    self.error("nf.yield outside the end of a kernel body", op.loc)
            elif isinstance(op, ReturnOp):
                if in_kernel or not last:
                    self.error("nf.return before the end of the function", op.loc)
            elif isinstance(op, ComputeOp):
                self.compute(op)
            elif isinstance(op, CallOp):
                self.call(op)
            elif isinstance(op, KernelOp):
                self.kernel(op, in_kernel)
            elif isinstance(op, AllReduceOp):
                self.allreduce(op, in_kernel)
            else:
                self.error(f"unknown op {op.opname}", op.loc)
            for j, r in enumerate(op.results):
                if id(r) in self.defined:
                    self.error(f"'{_vname(r)}' is defined twice", op.loc)
                if r.owner is not op or r.index != j:
                    self.error(f"result {j} of {op.opname} has a wrong owner link", op.loc)
                self.defined.add(id(r))
                self.seen.add(id(r))

    def allreduce(self, op: AllReduceOp, in_kernel: bool) -> None:
        if in_kernel:
            self.error("nf.allreduce inside a kernel", op.loc)
        if not op.values:
            self.error("nf.allreduce reduces no tensor", op.loc)
        for v, r in zip(op.values, op.results, strict=False):
            if not v.type.dtype.is_float or r.type != v.type:
                self.error(f"nf.allreduce of {v.type} must give a float tensor of the same "
                           f"type, not {r.type}", op.loc)
        if len(op.values) != len(op.results):
            self.error("nf.allreduce has one result per operand", op.loc)

    def kernel(self, op: KernelOp, in_kernel: bool) -> None:
        if in_kernel:
            self.error("nf.kernel inside another kernel", op.loc)
        ops = op.body.ops
        term = ops[-1] if ops else None
        if not isinstance(term, YieldOp):
            self.error("the body of nf.kernel does not end with nf.yield", op.loc)
        else:
            got = [v.type for v in term.values]
            want = [r.type for r in op.results]
            if got != want:
                self.error(f"nf.kernel yields ({', '.join(map(str, got))}) but its results "
                           f"are ({', '.join(map(str, want))})", term.loc or op.loc)
        outer = set(self.defined)
        self.block(ops, in_kernel=True)
        self.defined = outer  # values of the body are private to it

    def call(self, op: CallOp) -> None:
        if self.module is None or not self.module.has_func(op.callee):
            self.error(f"call of unknown function '@{op.callee}'", op.loc)
            return
        callee = self.module.func(op.callee)
        want = [a.type for a in callee.args]
        got = [a.type for a in op.args]
        if len(got) != len(want):
            self.error(f"call of '@{op.callee}' passes {len(got)} arguments, it takes "
                       f"{len(want)}", op.loc)
        else:
            for i, (g, w) in enumerate(zip(got, want, strict=True)):
                if g != w:
                    self.error(f"argument {i} of the call of '@{op.callee}' has type {g}, "
                               f"expected {w}", op.loc)
        ops = callee.body.ops
        if ops and isinstance(ops[-1], ReturnOp):
            rw = callee.result_types
            rg = [r.type for r in op.results]
            if rg != rw:
                self.error(f"call of '@{op.callee}' has result types "
                           f"({', '.join(map(str, rg))}) but the callee returns "
                           f"({', '.join(map(str, rw))})", op.loc)

    def compute(self, op: ComputeOp) -> None:
        n_before = self.eng.error_count
        loc = op.loc
        names: set[str] = set()
        for a in op.all_axes:
            if a.extent < 1:
                self.error(f"axis '{a.name}' has extent {a.extent}; extents must be at "
                           "least 1", loc)
            if a.name in names:
                self.error(f"axis name '{a.name}' is used twice", loc)
            names.add(a.name)
        if op.reduce is None and op.raxes:
            self.error("reduction axes without a reduction", loc)
        if op.reduce is not None:
            if op.reduce not in REDUCTIONS:
                self.error(f"unknown reduction '{op.reduce}'", loc)
            if not op.raxes:
                self.error(f"'{op.reduce}' reduction without reduction axes", loc)
        if len(op.results) != 1:
            self.error("nf.compute must have exactly one result", loc)
            return
        rt = op.result.type
        shape = tuple(a.extent for a in op.dims)
        if rt.shape != shape:
            dims = ", ".join(str(a) for a in op.dims)
            self.error(f"result type {rt} does not match the dims [{dims}]", loc)
        if rt.shape != shape or all(a.extent >= 1 for a in op.dims):
            self.check_type(rt, f"result '{_vname(op.result)}'", loc)
        typer = _Typer(names)
        k = typer.kind(op.body)
        for msg in typer.errors:
            self.error(msg, loc)
        if k is not None:
            if isinstance(k, DType) and k != rt.dtype:
                self.error(f"the body has type {k} but the result type is {rt}", loc)
            elif k == ops.WEAK_FLOAT and not rt.dtype.is_float:
                self.error(f"the body is a float but the result type is {rt}", loc)
        if self.eng.error_count == n_before:
            for v in check_bounds(op):
                self.error(v.message(), loc)


def _call_cycles(module: Module, eng: DiagnosticEngine) -> None:
    graph = {f.name: sorted({op.callee for op in f.walk() if isinstance(op, CallOp)})
             for f in module.funcs}
    state: dict[str, int] = {}

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for callee in graph.get(name, []):
            if state.get(callee) == 1:
                cyc = path[path.index(callee):] + [callee] if callee in path else [name, callee]
                f = module.func(name)
                eng.error("recursive nf.call: " + " -> ".join(f"@{c}" for c in cyc), f.loc)
            elif callee in graph and callee not in state:
                visit(callee, path + [callee])
        state[name] = 2

    for name in graph:
        if name not in state:
            visit(name, [name])


def check_use_lists(func: Func, eng: DiagnosticEngine) -> None:
    """The links the rewrite API maintains are right: every block of `func` knows its owner
    and every op its block; every op is attached, and among the ops of `func` the users of a
    value are exactly the ones that read it (an argument object shared with another function
    may have users there too)."""
    readers: dict[Value, set[Op]] = {a: set() for a in func.args}
    ops: set[Op] = set()
    bad: list[str] = []

    def block(b: Block, owner: Op | Func) -> None:
        if b.parent is not owner or not b.attached:
            bad.append(f"a block of {getattr(owner, 'opname', '@' + func.name)} is not linked "
                       "to it")
        for op in b.ops:
            ops.add(op)
            if op.parent is not b or not op.attached:
                bad.append(f"{op.opname} is not linked to its block")
            for r in op.results:
                readers.setdefault(r, set())
            for v in op.direct_operands:
                readers.setdefault(v, set()).add(op)
            for region in op.regions():
                block(region, op)

    block(func.body, func)
    for v, want in readers.items():
        uses = ops.intersection(v.uses)
        if uses != want:
            bad.append(f"the use list of '{_vname(v)}' has {len(uses - want)} op(s) that do "
                       f"not read it and misses {len(want - uses)} that do")
    for msg in bad:
        eng.error(f"broken use lists in @{func.name}: {msg} (change the IR through "
                  "nfc.rewrite.Rewriter or the nfc.ir methods)", func.loc)


def verify_func(func: Func, module: Module | None = None) -> None:
    """Verify one function (calls are checked against `module` when given)."""
    eng = DiagnosticEngine()
    _FuncVerifier(func, module, eng).run()
    check_use_lists(func, eng)
    eng.check()


def verify(module: Module) -> None:
    """Raise a CompileError listing every problem of `module`; return None when it is valid."""
    eng = DiagnosticEngine()
    seen: set[str] = set()
    for f in module.funcs:
        if f.name in seen:
            eng.error(f"function '@{f.name}' is defined twice", f.loc)
        seen.add(f.name)
    for f in module.funcs:
        _FuncVerifier(f, module, eng).run()
        check_use_lists(f, eng)
    _call_cycles(module, eng)
    eng.check()

