"""The `autodiff` pass class (registered as `nfc.passes.autodiff:Autodiff`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from nfc.ir import Module
from nfc.passmanager import Context, ModulePass


@dataclass(frozen=True)
class Autodiff(ModulePass):
    """Build the training graph of a model.

    Before:  nf.func @forward(%x {nf.role = "input"}, %w {nf.role = "param"}) -> (loss, ...)
             module attributes {nf.loss = "loss", nf.optimizer = {name = "sgd", lr = 0.1}}
    After:   + nf.func @train_step(%x, %w, <optimizer state>) -> (loss, ..., %w_new, ...)
                 attributes {nf.inplace = {"2": "w", ...}}
             + nf.func @eval (a copy of @forward) when @forward does not depend on training
    Gradient computes are gather-form (no scatter, no atomics) and carry
    `{nf.phase = "backward"}`; optimizer computes carry `{nf.phase = "update"}`.
    """

    name: ClassVar[str] = "autodiff"

    def apply(self, ctx: Context, module: Module) -> None:
        """Add `@train_step` (and `@eval` when possible) to `module`."""
        from nfc.passes.autodiff.train import add_training_functions

        add_training_functions(module)

