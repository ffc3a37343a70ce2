"""Optimizers as IR computes: SGD (momentum, Nesterov), Adam, AdamW, weight decay, clipping.

The formulas follow PyTorch (`torch.optim.SGD`, `Adam`, `AdamW`, `clip_grad_norm_`), so a
step can be compared with it number for number:

- clipping by global norm: `g *= min(1, clip_norm / (sqrt(sum of all g^2) + 1e-6))`;
- SGD: `g += wd * p`; with momentum `buf = momentum * buf + (1 - dampening) * g` and
  `upd = g + momentum * buf` (Nesterov) or `buf`; `p -= lr * upd`. The buffer starts at zero,
  which equals PyTorch's first step `buf = g` when dampening is 0;
- Adam: `g += wd * p`; `m = b1 m + (1 - b1) g`, `v = b2 v + (1 - b2) g^2`,
  `p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)` with `t = step + 1`;
- AdamW: like Adam without `wd * p` in `g`; instead `p *= 1 - lr * wd` first.

Optimizer state (momentum buffers, moments, the step counter) lives in new function arguments
with role "opt_state" and `nf.init = "zeros"`; their new values are results updated in place.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nfc.diagnostics import error
from nfc.ir import (
    Axis,
    Binary,
    Call,
    Cast,
    ComputeOp,
    Const,
    DType,
    Expr,
    Index,
    Load,
    Loc,
    TensorType,
    Value,
)
from nfc.passes.autodiff.graph import PHASE

_KEYS: dict[str, dict[str, Any]] = {
    "sgd": {"lr": None, "momentum": 0.0, "dampening": 0.0, "nesterov": False,
            "weight_decay": 0.0, "clip_norm": 0.0},
    "adam": {"lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.0,
             "clip_norm": 0.0},
    "adamw": {"lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.01,
              "clip_norm": 0.0},
}


@dataclass(frozen=True)
class OptimizerSpec:
    """A validated optimizer description (see the module docstring for the formulas)."""

    name: str
    hp: dict[str, Any] = field(default_factory=dict)

    def __getitem__(self, key: str) -> Any:
        return self.hp[key]


def parse_optimizer(attrs: Any, loc: Loc | None) -> OptimizerSpec:
    """The optimizer of a module's `nf.optimizer` attribute; CompileError when malformed."""
    if not isinstance(attrs, dict) or not isinstance(attrs.get("name"), str):
        raise error("nf.optimizer must be a dictionary with a 'name'", loc)
    name = attrs["name"].lower()
    if name not in _KEYS:
        raise error(f"unknown optimizer '{attrs['name']}'; expected one of "
                    f"{', '.join(sorted(_KEYS))}", loc)
    defaults = _KEYS[name]
    unknown = sorted(k for k in attrs if k != "name" and k not in defaults)
    if unknown:
        raise error(f"optimizer '{name}' has no option '{unknown[0]}'; options: "
                    f"{', '.join(defaults)}", loc)
    hp = dict(defaults)
    for k, v in attrs.items():
        if k == "name":
            continue
        want_bool = isinstance(defaults[k], bool)
        if want_bool != isinstance(v, bool) or not isinstance(v, int | float):
            kind = "true or false" if want_bool else "a number"
            raise error(f"optimizer option '{k}' must be {kind}, got {v!r}", loc)
        hp[k] = v if want_bool else float(v)
    if hp["lr"] is None:
        raise error(f"optimizer '{name}' needs a learning rate 'lr'", loc)
    if hp.get("nesterov") and hp["momentum"] <= 0.0:
        raise error("nesterov momentum needs momentum > 0", loc)
    return OptimizerSpec(name, hp)


@dataclass
class StateArg:
    """A new optimizer-state argument and the value that replaces it after the step."""

    arg: Value
    attrs: dict[str, Any]
    new: Value | None = None


@dataclass
class UpdateBuilder:
    """Emits the update computes of one optimizer step."""

    spec: OptimizerSpec
    emit_list: list[ComputeOp]
    loc: Loc | None
    states: list[StateArg] = field(default_factory=list)

    def _emit(self, t: TensorType, dims: tuple[Axis, ...], body: Expr, name: str,
              reduce: str | None = None, raxes: tuple[Axis, ...] = ()) -> Value:
        op = ComputeOp(t, dims, body, reduce=reduce, raxes=raxes, loc=self.loc,
                       attrs={PHASE: "update"}, name=name)
        self.emit_list.append(op)
        return op.result

    def _state(self, name: str, t: TensorType) -> Value:
        v = Value(t, name)
        self.states.append(StateArg(v, {"nf.role": "opt_state", "nf.init": "zeros"}))
        return v

    def run(self, params: list[Value], grads: list[Value], used: set[str]) -> list[Value]:
        """New values of `params` (same order) after one step with gradients `grads`."""
        sp = self.spec
        scale = self._clip_scale(grads) if sp["clip_norm"] > 0 else None
        step = None
        if sp.name in ("adam", "adamw"):
            step = self._state(_fresh("step", used), TensorType((), DType.I64))
        bias: dict[DType, tuple[Value, Value]] = {}
        out = []
        for p, g in zip(params, grads, strict=True):
            dims = tuple(Axis(f"i{j}", n) for j, n in enumerate(p.shape))
            x = tuple(Index(a.name) for a in dims)
            gx: Expr = Load(g, x)
            if scale is not None:
                gx = Binary("*", gx, Load(scale, ()))
            wd = sp["weight_decay"]
            if wd and sp.name != "adamw":
                gx = Binary("+", gx, Binary("*", Const(wd), Load(p, x)))
            px: Expr = Load(p, x)
            base = p.name or "p"
            if sp.name == "sgd":
                upd = gx
                if sp["momentum"] > 0:
                    buf = self._state(_fresh(f"{base}_mom", used), p.type)
                    mom = Const(sp["momentum"])
                    new_buf = self._emit(p.type, dims, Binary("+", Binary(
                        "*", mom, Load(buf, x)), _scaled(1.0 - sp["dampening"], gx)),
                        f"{base}_mom_new")
                    self.states[-1].new = new_buf
                    upd = (Binary("+", gx, Binary("*", mom, Load(new_buf, x)))
                           if sp["nesterov"] else Load(new_buf, x))
                body = Binary("-", px, Binary("*", Const(sp["lr"]), upd))
            else:
                assert step is not None
                if p.dtype not in bias:
                    bias[p.dtype] = self._bias_corrections(step, p.dtype)
                bc1, bc2 = bias[p.dtype]
                b1, b2 = sp["beta1"], sp["beta2"]
                m = self._state(_fresh(f"{base}_m", used), p.type)
                m_new = self._emit(p.type, dims, Binary("+", Binary("*", Const(b1), Load(m, x)),
                                                        _scaled(1.0 - b1, gx)), f"{base}_m_new")
                self.states[-1].new = m_new
                v = self._state(_fresh(f"{base}_v", used), p.type)
                v_new = self._emit(p.type, dims, Binary("+", Binary("*", Const(b2), Load(v, x)),
                                                        _scaled(1.0 - b2, Binary("*", gx, gx))),
                                   f"{base}_v_new")
                self.states[-1].new = v_new
                mhat = Binary("/", Load(m_new, x), Load(bc1, ()))
                vhat = Binary("/", Load(v_new, x), Load(bc2, ()))
                step_dir = Binary("/", mhat, Binary("+", Call("sqrt", (vhat,)),
                                                    Const(sp["eps"])))
                if sp.name == "adamw" and wd:
                    px = Binary("*", px, Const(1.0 - sp["lr"] * wd))
                body = Binary("-", px, Binary("*", Const(sp["lr"]), step_dir))
            out.append(self._emit(p.type, dims, body, f"{base}_new"))
        if step is not None:
            new_step = self._emit(step.type, (), Binary("+", Load(step, ()), Const(1)),
                                  "step_new")
            next(s for s in self.states if s.arg is step).new = new_step
        return out

    def _clip_scale(self, grads: list[Value]) -> Value:
        """`min(1, clip_norm / (global norm + 1e-6))` as a scalar of the first grad's type."""
        dtype = grads[0].dtype
        total: Expr | None = None
        for g in grads:
            axes = tuple(Axis(f"i{j}", n) for j, n in enumerate(g.shape))
            x = tuple(Index(a.name) for a in axes)
            sq: Expr = Binary("*", Load(g, x), Load(g, x))
            if g.dtype != dtype:
                sq = Cast(dtype, sq)
            s = self._emit(TensorType((), dtype), (), sq, f"sqnorm_{g.name or 'g'}",
                           reduce="sum" if axes else None, raxes=axes)
            total = Load(s, ()) if total is None else Binary("+", total, Load(s, ()))
        assert total is not None
        norm = Binary("+", Call("sqrt", (total,)), Const(1e-6))
        scale = Call("min", (Const(1.0), Binary("/", Const(self.spec["clip_norm"]), norm)))
        s = self._emit(TensorType((), dtype), (), scale, "clip_scale")
        if any(g.dtype != dtype for g in grads):
            raise error("gradient clipping needs parameters of one dtype", self.loc)
        return s

    def _bias_corrections(self, step: Value, dtype: DType) -> tuple[Value, Value]:
        t = Cast(dtype, Binary("+", Load(step, ()), Const(1)))
        out = []
        for k, beta in (("1", self.spec["beta1"]), ("2", self.spec["beta2"])):
            body = Binary("-", Const(1.0), Call("pow", (Cast(dtype, Const(beta)), t)))
            out.append(self._emit(TensorType((), dtype), (), body, f"bias_corr{k}"))
        return out[0], out[1]


def _scaled(k: float, e: Expr) -> Expr:
    return e if k == 1.0 else Binary("*", Const(k), e)


def _fresh(base: str, used: set[str]) -> str:
    name, n = base, 1
    while name in used:
        n += 1
        name = f"{base}_{n}"
    used.add(name)
    return name
