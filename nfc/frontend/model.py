"""Models: declarations, state updates, outputs and `minimize`, assembled into `@forward`.

The function's arguments are the declarations in source order (roles input, param, state)
followed by `%rng: tensor<2xi64>` = (seed, step) when the model draws random numbers. Its
results are the loss (when minimised), the outputs, then the state updates `state:<name>`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nfc.diagnostics import CompileError, error, note
from nfc.frontend import ast, limits
from nfc.frontend.context import CompileTimeBinding, Fatal, TensorInfo
from nfc.frontend.imports import suggest
from nfc.frontend.limits import check_elements
from nfc.frontend.scalars import coerce, sty
from nfc.frontend.shapes import DTYPES, format_tensor_type, is_dtype_var
from nfc.frontend.tensors import TensorExpr, aligned, broadcast_shape
from nfc.ir import (
    Axis,
    Block,
    Call,
    ComputeOp,
    Const,
    DType,
    Expr,
    Func,
    Index,
    Load,
    Loc,
    ReturnOp,
    TensorType,
    Value,
)
from nfc.printer import format_float

if TYPE_CHECKING:
    from nfc.frontend.elaborate import Elaborator

#: Initializers: name -> number of arguments.
INITIALIZERS = {"normal": 2, "uniform": 2, "const": 1, "zeros": 0, "ones": 0,
                "glorot_uniform": 0, "he_normal": 0}
OPTIMIZERS = ("sgd", "adam", "adamw", "rmsprop", "adagrad")


@dataclass
class ModelState:
    """What a model body declares and produces."""

    model: ast.ModelDef
    args: list[Value] = field(default_factory=list)
    arg_attrs: list[dict[str, Any]] = field(default_factory=list)
    declared: dict[str, ast.Decl] = field(default_factory=dict)
    states: dict[str, Value] = field(default_factory=dict)
    updates: dict[str, tuple[Value, ast.Update]] = field(default_factory=dict)
    outputs: dict[str, tuple[Value, ast.Target]] = field(default_factory=dict)
    minimize: tuple[str, Value, dict[str, Any]] | None = None
    rng: Value | None = None
    param_bytes: int = 0
    max_param_bytes: int = field(default_factory=limits.PARAM_BYTES.value)

    def stmt(self, el: Elaborator, s: ast.Stmt) -> None:
        """A model-only statement."""
        if isinstance(s, ast.Decl):
            self.decl(el, s)
        elif isinstance(s, ast.Update):
            self.update(el, s)
        elif isinstance(s, ast.Output):
            for t in s.names:
                if t.name in self.outputs:
                    raise error(f"'{t.name}' is already an output", t.loc,
                                note("first listed here", self.outputs[t.name][1].loc))
                info = el.tensor_info(t.name, t.loc)
                self.outputs[t.name] = (info.value, t)
        elif isinstance(s, ast.Minimize):
            self.minimize_stmt(el, s)
        else:  # pragma: no cover - the parser produces no other statement
            raise AssertionError(s)

    def decl(self, el: Elaborator, d: ast.Decl) -> None:
        """`input`, `param`, `state` and `random` declarations."""
        name = d.target.name
        if name in self.declared:
            raise error(f"'{name}' is already declared", d.target.loc,
                        note("first declared here", self.declared[name].loc))
        t = self.type_of(el, d.type, name)
        for flag, loc in d.flags:
            wants = {"frozen": "param", "grad": "input"}[flag]
            if d.kind != wants:
                raise error(f"'{flag}' applies only to {wants} declarations, not to "
                            f"{'an' if d.kind == 'input' else 'a'} {d.kind}", loc)
            if flag == "grad" and not t.dtype.is_float:
                raise error(f"input '{name}' is {t.dtype}: only a float input has a gradient",
                            loc)
        flags = {f for f, _ in d.flags}
        self.declared[name] = d
        values = {k: v.value for k, v in el.env.vars.items() if isinstance(v, CompileTimeBinding)}
        if d.kind == "random":
            if d.init is not None:
                raise error("a random tensor takes no initializer", d.init.loc)
            if not t.dtype.is_float:
                raise error(f"random tensors are floats, not {t.dtype}", d.type.dtype_loc)
            value = self.random(el, t, name, d.loc)
        else:
            self.count(el, d, t)
            value = Value(t, name)
            attrs: dict[str, Any] = {"nf.role": d.kind}
            if d.kind == "input":
                if d.init is not None:
                    raise error("an input takes no initializer", d.init.loc)
                if "grad" in flags:
                    attrs["nf.grad"] = True
            else:
                if d.init is None and d.kind == "param":
                    raise error(f"param '{name}' needs an initializer, e.g. "
                                "`= normal(0.0, 0.1)`", d.loc)
                attrs["nf.init"] = init_text(el, d.init) if d.init is not None else "zeros"
                if d.kind == "param":
                    attrs["nf.trainable"] = "frozen" not in flags
                else:
                    self.states[name] = value
            self.args.append(value)
            self.arg_attrs.append(attrs)
        info = TensorInfo(value, name, d.target.loc, "", d.type, values)
        info.decl_text = info.describe()
        el.env.vars[name] = info

    def count(self, el: Elaborator, d: ast.Decl, t: TensorType) -> None:
        """Add a declared tensor to the budgets (parameter bytes, tensor bytes); past a
        budget, elaboration stops at this declaration."""
        if d.kind == "param":
            self.param_bytes += t.nbytes
            if self.param_bytes > self.max_param_bytes:
                raise Fatal(error(
                    f"the parameters of model '{self.model.name}' take "
                    f"{limits.human_bytes(self.param_bytes)} with '{d.target.name}' "
                    f"({format_tensor_type(t)}), more than the budget of "
                    f"{limits.human_bytes(self.max_param_bytes)} "
                    f"({limits.PARAM_BYTES.hint()})", d.loc))
        el.ctx.count_bytes(t.nbytes, d.loc)

    def type_of(self, el: Elaborator, t: ast.TypeExpr, name: str) -> TensorType:
        """A concrete declared type."""
        if t.dtype not in DTYPES:
            if is_dtype_var(t.dtype):
                raise error(f"dtype variable '{t.dtype}' in a model; models use concrete "
                            "dtypes such as f32", t.dtype_loc)
            raise error(f"unknown dtype '{t.dtype}'{suggest(t.dtype, list(DTYPES))}",
                        t.dtype_loc)
        dims = tuple(el.ct_int(d, "a dimension") for d in t.dims)
        check_elements(dims, f"'{name}'", t.loc)
        return TensorType(dims, DTYPES[t.dtype])

    def random(self, el: Elaborator, t: TensorType, name: str, loc: Loc) -> Value:
        """`philox(rng[0] + salt, rng[1] * size + linear index)`, one salt per declaration."""
        if self.rng is None:
            self.rng = Value(TensorType((2,), DType.I64), "rng")
        el.ctx.salt += 1
        linear: Expr | None = None
        stride = 1
        for k in reversed(range(t.rank)):
            term: Expr = Index(f"i{k}") if stride == 1 else Index(f"i{k}") * stride
            linear = term if linear is None else term + linear
            stride *= t.shape[k]
        key = Load(self.rng, (Const(0),)) + Const(el.ctx.salt << 32)
        counter = Load(self.rng, (Const(1),)) * Const(t.size)
        if linear is not None:
            counter = counter + linear
        dims = tuple(Axis(f"i{k}", n) for k, n in enumerate(t.shape))
        op = ComputeOp(t, dims, Call("philox", (key, counter)), loc=loc, name=name)
        el.ctx.emit(op)
        return op.result

    def update(self, el: Elaborator, s: ast.Update) -> None:
        """`update s = expr`: the value of state `s` for the next step."""
        name = s.target.name
        if name not in self.states:
            raise error(f"'{name}' is not a state; declare it with `state {name}: ...`",
                        s.target.loc)
        if name in self.updates:
            raise error(f"state '{name}' is updated twice", s.loc,
                        note("first updated here", self.updates[name][1].loc))
        t = self.states[name].type
        tv = el.tv(s.value)
        if isinstance(tv, tuple):
            raise error("the update has several results", s.value.loc)
        if tv.shape != t.shape:
            if broadcast_shape([tv.shape, t.shape], s.loc, "the update") != t.shape:
                raise error(f"update of '{name}' has shape "
                            f"[{', '.join(map(str, tv.shape))}] but the state is "
                            f"{format_tensor_type(t)}", s.value.loc)
            tv = TensorExpr(t.shape, aligned(tv, t.shape))
        sv = coerce(tv.sv, sty(t.dtype), s.value.loc)
        tv = TensorExpr(tv.shape, sv, tv.value if sv.ty == tv.sv.ty else None)
        self.updates[name] = (el.materialize(tv, name, s.loc), s)

    def minimize_stmt(self, el: Elaborator, s: ast.Minimize) -> None:
        """`minimize loss with opt(k = v, ...)`."""
        if self.minimize is not None:
            raise error("a model minimizes one loss", s.loc)
        info = el.tensor_info(s.target.name, s.target.loc)
        t = info.value.type
        if t.rank != 0 or not t.dtype.is_float:
            raise error(f"the loss must be a float scalar, but '{s.target.name}' is "
                        f"{format_tensor_type(t)}", s.target.loc)
        if s.optimizer not in OPTIMIZERS:
            raise error(f"unknown optimizer '{s.optimizer}'{suggest(s.optimizer, OPTIMIZERS)}"
                        f" (known: {', '.join(OPTIMIZERS)})", s.optimizer_loc)
        opt: dict[str, Any] = {"name": s.optimizer}
        for kw in s.kwargs:
            if kw.name in opt:
                raise error(f"optimizer argument '{kw.name}' given twice", kw.loc)
            value = el.tv(kw.value).const
            if value is None:
                raise error(f"optimizer argument '{kw.name}' must be a compile-time number",
                            kw.value.loc)
            opt[kw.name] = value
        self.minimize = (s.target.name, info.value, opt)

    def func(self, el: Elaborator) -> tuple[Func, dict[str, Any]]:
        """The `@forward` function and the module attributes."""
        results: list[Value] = []
        names: list[str] = []
        attrs: dict[str, Any] = {"nf.model": self.model.name}
        if self.minimize is not None:
            name, value, opt = self.minimize
            results.append(value)
            names.append(name)
            attrs["nf.loss"] = name
            attrs["nf.optimizer"] = opt
        for name, (value, _) in self.outputs.items():
            results.append(value)
            names.append(name)
        for name, (value, _) in self.updates.items():
            results.append(value)
            names.append(f"state:{name}")
        if not results:
            raise error(f"model '{self.model.name}' produces nothing: add `minimize loss with "
                        "sgd(lr = 0.1)` or `output name`", self.model.loc)
        args, arg_attrs = list(self.args), list(self.arg_attrs)
        if self.rng is not None:
            args.append(self.rng)
            arg_attrs.append({"nf.role": "rng"})
        body = Block([*el.ctx.ops, ReturnOp(results, loc=self.model.loc)])
        f = Func("forward", args, body, arg_attrs=arg_attrs, attrs={"nf.results": names},
                 loc=self.model.loc)
        return f, attrs


def init_text(el: Elaborator, e: ast.Expr) -> str:
    """An initializer as text: `normal(0.0, 0.1)`, `zeros`, ..."""
    if isinstance(e, ast.Name) and INITIALIZERS.get(e.id) == 0:
        return e.id
    name = e.fn if isinstance(e, ast.Call) else e.id if isinstance(e, ast.Name) else None
    if name not in INITIALIZERS:
        shown = f" '{name}'" if name else ""
        raise error(f"unknown initializer{shown}{suggest(name or '', list(INITIALIZERS))} "
                    f"(known: {', '.join(INITIALIZERS)})", e.loc)
    args = e.args if isinstance(e, ast.Call) else ()
    if len(args) != INITIALIZERS[name]:
        raise error(f"initializer '{name}' takes {INITIALIZERS[name]} arguments but "
                    f"{len(args)} were given", e.loc)
    if not args:
        return name
    texts = []
    for a in args:
        v = el.tv(a).const
        if v is None or isinstance(v, bool):
            raise error("initializer arguments must be compile-time numbers", a.loc)
        texts.append(format_float(float(v)))
    return f"{name}({', '.join(texts)})"


def model_params(m: ast.ModelDef, el: Elaborator,
                 overrides: dict[str, int | float | bool]) -> None:
    """Bind the model's compile-time parameters (defaults, then overrides)."""
    names = [p.name for p in m.params]
    for key in overrides:
        if key not in names:
            raise CompileError([error(f"model '{m.name}' has no parameter '{key}'"
                                      f"{suggest(key, names)}", m.loc).diagnostics[0]])
    for p in m.params:
        if p.name in el.env.vars:
            raise error(f"parameter '{p.name}' is declared twice", p.loc)
        default = el.tv(p.default).const
        if default is None:
            raise error("a model parameter needs a compile-time default", p.default.loc)
        value = overrides.get(p.name, default)
        if isinstance(default, bool) != isinstance(value, bool) or (
                isinstance(default, int) and isinstance(value, float)):
            raise error(f"parameter '{p.name}' is {type(default).__name__} but the value "
                        f"given is {value!r}", p.loc)
        if isinstance(default, float) and not isinstance(value, bool):
            value = float(value)
        el.env.vars[p.name] = CompileTimeBinding(value)
