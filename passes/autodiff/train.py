"""The training graph: `@train_step` (forward, loss, backward, optimizer update) and `@eval`.

From a module whose `@forward` names its results (`nf.results`) and whose attributes give the
loss (`nf.loss`) and the optimizer (`nf.optimizer`), `build_train_step` makes

    nf.func @train_step(<forward args>, <optimizer state args>) -> (
        <forward results>, <new params>, <input gradients>, <new optimizer state>)
      attributes {nf.results = [..., "param:w", "opt_state:w_m", ...],
                  nf.inplace = {"<result index>": "<argument name>", ...}}

Forward results named `state:<name>` (running statistics of batch norm, written by `update`
statements) are updated in place too. Trainable parameters are the args with role "param"
whose `nf.trainable` is not false; inputs, state and rng args get no gradient, except inputs
marked `nf.grad = true`, whose gradients are results `grad:<name>` (after the new params).
Dropout masks are forward values (`philox` computes keyed by the rng arg), so the backward
reads the very mask the forward used.

`@eval`: when `@forward` has no rng argument and no state results, its copy without update
results is added as `@eval`. Otherwise the module was compiled in training mode and its
forward is not an evaluation function; `build_training_module` compiles the source a second
time with `training=False` and takes that `@forward` as `@eval`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nfc.diagnostics import CompileError, error
from nfc.ir import Func, Module, Value
from nfc.passes.autodiff.graph import reverse_mode
from nfc.passes.autodiff.optim import UpdateBuilder, parse_optimizer
from nfc.passes.dce import dce_func
from nfc.rewrite import Rewriter

STATE_PREFIX = "state:"
GRAD_PREFIX = "grad:"


def trainable_params(func: Func) -> list[Value]:
    """Args with role "param", a float dtype and `nf.trainable` not false."""
    return [a for a, attrs in zip(func.args, func.arg_attrs, strict=True)
            if attrs.get("nf.role") == "param" and attrs.get("nf.trainable", True) is not False
            and a.dtype.is_float]


def grad_inputs(func: Func) -> list[Value]:
    """Float args with role "input" and `nf.grad = true` (`input x: ... grad`): their
    gradients are results `grad:<name>` of `@train_step`."""
    return [a for a, attrs in zip(func.args, func.arg_attrs, strict=True)
            if attrs.get("nf.role") == "input" and attrs.get("nf.grad") is True
            and a.dtype.is_float]


def _result_names(func: Func) -> list[str]:
    names = func.attrs.get("nf.results")
    n = len(func.ret.values)
    if not isinstance(names, list) or len(names) != n:
        return ["loss" if i == 0 else f"out{i}" for i in range(n)]
    return [str(x) for x in names]


def build_train_step(module: Module, forward: str = "forward",
                     name: str = "train_step") -> Func:
    """The training-step function of `module` (not added to it); see the module docstring."""
    if not module.has_func(forward):
        raise error(f"autodiff needs a function @{forward} (the model's forward pass)")
    fwd = module.func(forward)
    loss_name = module.attrs.get("nf.loss")
    if loss_name is None:
        raise error(f"module @{module.name} has no nf.loss: the model needs a "
                    "'minimize <loss> with <optimizer>(...)' statement", fwd.loc)
    names = _result_names(fwd)
    if loss_name not in names:
        raise error(f"nf.loss names '{loss_name}' but @{forward} returns "
                    f"{', '.join(repr(n) for n in names)}", fwd.loc)
    spec = parse_optimizer(module.attrs.get("nf.optimizer", {"name": "sgd", "lr": 0.01}),
                           fwd.loc)
    f = fwd.clone(name)
    loss = f.ret.values[names.index(loss_name)]
    if not loss.dtype.is_float:
        raise error(f"the loss '{loss_name}' has type {loss.type}; it must be a float", fwd.loc)
    params = trainable_params(f)
    wanted = grad_inputs(f)
    if not params and not wanted:
        raise error(f"@{forward} has no trainable parameters to update", fwd.loc)
    bwd_ops, grads = reverse_mode(f, loss, params + wanted)
    input_grads = grads[len(params):]
    grads = grads[:len(params)]
    used = {a.name for a in f.args if a.name}
    upd_ops: list[Any] = []
    ub = UpdateBuilder(spec, upd_ops, fwd.loc)
    new_params = ub.run(params, grads, used)

    ret = f.ret
    rewriter = Rewriter()
    rewriter.insert_op_before(bwd_ops + upd_ops, ret)
    results = list(ret.values)
    res_names = list(names)
    inplace: dict[str, str] = {}
    for i, n in enumerate(names):
        if n.startswith(STATE_PREFIX):
            target = n[len(STATE_PREFIX):]
            if target not in used:
                raise error(f"@{forward} updates state '{target}' but has no argument of that "
                            "name", fwd.loc)
            inplace[str(i)] = target
    for p, new in zip(params, new_params, strict=True):
        inplace[str(len(results))] = p.name or ""
        results.append(new)
        res_names.append(f"param:{p.name}")
    for x, g in zip(wanted, input_grads, strict=True):
        results.append(g)
        res_names.append(f"{GRAD_PREFIX}{x.name}")
    for st in ub.states:
        assert st.new is not None
        f.args.append(st.arg)
        f.arg_attrs.append(st.attrs)
        inplace[str(len(results))] = st.arg.name or ""
        results.append(st.new)
        res_names.append(f"opt_state:{st.arg.name}")
    rewriter.update(ret, values=results)
    f.attrs["nf.results"] = res_names
    f.attrs["nf.inplace"] = inplace
    dce_func(f)
    return f


def needs_separate_eval(forward: Func) -> bool:
    """True when `forward` depends on the training flag: it draws random numbers (dropout)
    or updates state (batch-norm running statistics)."""
    if any(attrs.get("nf.role") == "rng" for attrs in forward.arg_attrs):
        return True
    return any(n.startswith(STATE_PREFIX) for n in _result_names(forward))


def eval_from_forward(forward: Func, name: str = "eval") -> Func:
    """A copy of `forward` without its state-update results."""
    f = forward.clone(name)
    names = _result_names(f)
    keep = [i for i, n in enumerate(names) if not n.startswith(STATE_PREFIX)]
    Rewriter().update(f.ret, values=[f.ret.values[i] for i in keep])
    f.attrs["nf.results"] = [names[i] for i in keep]
    dce_func(f)
    return f


def add_training_functions(module: Module) -> None:
    """Add `@train_step` (and `@eval` when the forward allows it) to `module`."""
    for fn in ("train_step",):
        if module.has_func(fn):
            raise error(f"module @{module.name} already has a function @{fn}")
    step = build_train_step(module)
    module.funcs.append(step)
    fwd = module.func("forward")
    if not module.has_func("eval") and not needs_separate_eval(fwd):
        module.funcs.append(eval_from_forward(fwd))


def build_training_module(path: str | Path, params: dict[str, Any] | None = None) -> Module:
    """Compile a model twice (training and evaluation) into one module with `@forward`,
    `@train_step` and `@eval`."""
    from nfc.frontend import compile_file

    module = compile_file(path, params=params, training=True)
    if not module.has_func("eval"):
        ev = compile_file(path, params=params, training=False)
        try:
            module.funcs.append(eval_from_forward(ev.func("forward")))
        except KeyError as exc:
            raise CompileError(error(f"{path}: no @forward in evaluation mode").diagnostics
                               ) from exc
    add_training_functions(module)
    return module
