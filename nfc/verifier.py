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

Typing rules (`infer_dtype`): literals without a dtype and index variables are weak: they
take the type of the other operand. Two typed operands must have the same type. A weak float
never meets an integer. Arithmetic is not defined on i1; `/` needs floats (use `//` on
integers); `and`/`or`/`not`/select conditions take i1; comparisons give i1. exp, log, sqrt,
rsqrt, tanh, sigmoid, erf and pow take floats; abs, max, min any number; philox takes integers
and gives a weak float. A compute's body has the result's type (or is weak).
"""

from __future__ import annotations

import re
from typing import Any

from nfc.bounds import check_bounds
from nfc.diagnostics import DiagnosticEngine
from nfc.ir import (
    COMPARISONS,
    INTRINSICS,
    MAX_ELEMENTS,
    REDUCTIONS,
    Binary,
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

WEAK_INT = "int"
WEAK_FLOAT = "float"
Kind = DType | str

ROLES = frozenset({"input", "param", "state", "rng", "opt_state", "step"})
INITIALIZERS = ("normal", "uniform", "zeros", "ones", "const", "glorot_uniform", "he_normal")
_INIT_RE = re.compile(r"\s*(" + "|".join(INITIALIZERS) + r")\s*(\(.*\))?\s*\Z")
_FLOAT_FNS = frozenset({"exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "erf"})


def _vname(v: Value) -> str:
    return f"%{v.name or '?'}"


def _is_float(k: Kind) -> bool:
    return k == WEAK_FLOAT or (isinstance(k, DType) and k.is_float)


class _Typer:
    """Infers kinds bottom-up, recording every error; None marks an already reported error."""

    def __init__(self, bound: set[str] | None) -> None:
        self.bound = bound
        self.errors: list[str] = []

    def err(self, msg: str) -> None:
        self.errors.append(msg)

    def unify(self, what: str, a: Kind | None, b: Kind | None) -> Kind | None:
        if a is None or b is None:
            return None
        if isinstance(a, DType) and isinstance(b, DType):
            if a != b:
                self.err(f"operands of '{what}' have different types {a} and {b}")
                return None
            return a
        if isinstance(a, DType) or isinstance(b, DType):
            strong, weak = (a, b) if isinstance(a, DType) else (b, a)
            assert isinstance(strong, DType)
            if weak == WEAK_FLOAT and not strong.is_float:
                self.err(f"a float operand of '{what}' meets an integer operand of type "
                         f"{strong}")
                return None
            return strong
        return WEAK_FLOAT if WEAK_FLOAT in (a, b) else WEAK_INT

    def kind(self, e: Expr) -> Kind | None:
        if isinstance(e, Const):
            if isinstance(e.value, bool):
                return DType.I1
            if e.dtype is None:
                return WEAK_FLOAT if e.is_float else WEAK_INT
            if e.is_float and not e.dtype.is_float:
                self.err(f"float literal {e.value!r} typed {e.dtype}")
                return None
            return e.dtype
        if isinstance(e, Index):
            if self.bound is not None and e.name not in self.bound:
                self.err(f"unknown index variable '{e.name}'")
                return None
            return WEAK_INT
        if isinstance(e, Load):
            return self.load(e)
        if isinstance(e, Unary):
            k = self.kind(e.x)
            if k is None:
                return None
            if e.op == "not":
                if k != DType.I1:
                    self.err(f"'not' needs an i1 operand, not {k}")
                    return None
                return DType.I1
            if e.op != "neg":
                self.err(f"unknown unary operator '{e.op}'")
                return None
            if k == DType.I1:
                self.err("negation of an i1 value")
                return None
            return k
        if isinstance(e, Binary):
            return self.binary(e)
        if isinstance(e, Select):
            c = self.kind(e.cond)
            if c is not None and c != DType.I1:
                self.err(f"select condition has type {c}, expected i1")
            return self.unify("select", self.kind(e.a), self.kind(e.b))
        if isinstance(e, Cast):
            return e.dtype if self.kind(e.x) is not None else None
        if isinstance(e, Call):
            return self.call(e)
        self.err(f"unknown expression node {type(e).__name__}")
        return None

    def load(self, e: Load) -> Kind | None:
        t = e.tensor
        ok = True
        if len(e.indices) != t.type.rank:
            self.err(f"load of '{_vname(t)}' has {len(e.indices)} indices but the tensor has "
                     f"rank {t.type.rank} ({t.type})")
            ok = False
        for d, ie in enumerate(e.indices):
            k = self.kind(ie)
            if k is not None and _is_float(k):
                self.err(f"index {d} of '{_vname(t)}' has type {k}; indices must be integers")
                ok = False
        return t.dtype if ok else None

    def binary(self, e: Binary) -> Kind | None:
        a, b = self.kind(e.a), self.kind(e.b)
        if e.op in ("and", "or"):
            for k in (a, b):
                if k is not None and k != DType.I1:
                    self.err(f"'{e.op}' needs i1 operands, not {k}")
                    return None
            return DType.I1 if a is not None and b is not None else None
        if e.op in COMPARISONS:
            return DType.I1 if self.unify(e.op, a, b) is not None else None
        if e.op not in ("+", "-", "*", "/", "//", "%"):
            self.err(f"unknown binary operator '{e.op}'")
            return None
        k = self.unify(e.op, a, b)
        if k is None:
            return None
        if k == DType.I1:
            self.err(f"arithmetic '{e.op}' on i1 values")
            return None
        if e.op == "/" and not _is_float(k):
            self.err(f"'/' on integers ({k}); use '//' for floor division")
            return None
        return k

    def call(self, e: Call) -> Kind | None:
        if e.fn not in INTRINSICS:
            self.err(f"unknown intrinsic '{e.fn}'")
            return None
        if len(e.args) != INTRINSICS[e.fn]:
            self.err(f"'{e.fn}' takes {INTRINSICS[e.fn]} arguments, {len(e.args)} given")
            return None
        ks = [self.kind(a) for a in e.args]
        if any(k is None for k in ks):
            return None
        if e.fn == "philox":
            if any(_is_float(k) for k in ks):  # type: ignore[arg-type]
                self.err("philox takes integer arguments")
                return None
            return WEAK_FLOAT
        k = self.unify(e.fn, ks[0], ks[1]) if len(ks) == 2 else ks[0]
        if k is None:
            return None
        if k == DType.I1:
            self.err(f"'{e.fn}' of i1 values")
            return None
        if e.fn in _FLOAT_FNS or e.fn == "pow":
            if isinstance(k, DType) and not k.is_float:
                self.err(f"'{e.fn}' needs a float operand, not {k}")
                return None
            if k == WEAK_INT:
                return WEAK_FLOAT
        return k


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
        if not ops or not isinstance(ops[-1], ReturnOp) or isinstance(ops[-1], YieldOp):
            self.error(f"@{f.name} does not end with nf.return", f.loc)
        self.block(ops, in_kernel=False)
        if ops and isinstance(ops[-1], ReturnOp) and not isinstance(ops[-1], YieldOp):
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
            else:
                self.error(f"unknown op {op.opname}", op.loc)
            for j, r in enumerate(op.results):
                if id(r) in self.defined:
                    self.error(f"'{_vname(r)}' is defined twice", op.loc)
                if r.owner is not op or r.index != j:
                    self.error(f"result {j} of {op.opname} has a wrong owner link", op.loc)
                self.defined.add(id(r))
                self.seen.add(id(r))

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
        if ops and isinstance(ops[-1], ReturnOp) and not isinstance(ops[-1], YieldOp):
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
            elif k == WEAK_FLOAT and not rt.dtype.is_float:
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


def verify_func(func: Func, module: Module | None = None) -> None:
    """Verify one function (calls are checked against `module` when given)."""
    eng = DiagnosticEngine()
    _FuncVerifier(func, module, eng).run()
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
    _call_cycles(module, eng)
    eng.check()

