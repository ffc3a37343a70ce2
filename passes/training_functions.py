"""The `training-functions` pass: the functions a model library exports, made from the
frontend's `@forward` (the step of the build pipeline between `im2col` and the cleanup).

    Before:  nf.func @forward(...)                      [+ @eval, compiled with training off]
             module attributes {nf.loss = "loss", nf.optimizer = {name = "sgd", lr = 0.1}}
    After:   nf.func @forward, + @train_step (autodiff and the optimizer update), + @eval

A model that minimizes a loss with an optimizer gets `@train_step` and, when its forward does
not depend on the training flag, `@eval` (nfc.passes.autodiff.train.add_training_functions,
what the `autodiff` pass runs). A model without a loss gets `@eval` only. An `@eval` already
there (the frontend compiles one with `training` false for models with dropout or batch-norm
statistics) is kept. A module without `@forward` (IR given as it is) is left alone. Column
gathers the `im2col` pass marked implicit are then substituted into the GEMMs that read them
(nfc.passes.im2col.implicit_columns).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from nfc.ir import Module
from nfc.passmanager import Context, ModulePass

__all__ = ["TrainingFunctions"]


@dataclass(frozen=True)
class TrainingFunctions(ModulePass):
    """Add `@train_step` (when the model minimizes a loss) and `@eval` to a model's module.

    Before:  nf.func @forward(%x {nf.role = "input"}, %w {nf.role = "param"}) -> (loss, ...)
             module attributes {nf.loss = "loss", nf.optimizer = {name = "sgd", lr = 0.1}}
    After:   + nf.func @train_step(...), + nf.func @eval (a copy of @forward) unless there
    """

    name: ClassVar[str] = "training-functions"

    def apply(self, ctx: Context, module: Module) -> None:
        """Add the functions (see the module docstring)."""
        from nfc.passes.autodiff.train import add_training_functions, eval_from_forward

        if not module.has_func("forward"):
            return
        if module.attrs.get("nf.loss") is not None and \
                module.attrs.get("nf.optimizer") is not None:
            add_training_functions(module)
        elif not module.has_func("eval"):
            module.funcs.append(eval_from_forward(module.func("forward")))
        from nfc.passes.im2col import implicit_columns

        for func in module.funcs:  # the gradients exist: implicit columns go into their GEMMs
            implicit_columns(func)
