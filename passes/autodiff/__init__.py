"""The `autodiff` pass: expression-level symbolic gradients chained by reverse mode.

Modules:
- `intlinalg`: Hermite normal form, integer solving, echelon lattice bases;
- `qa`: quasi-affine index expressions with range-aware simplification;
- `indexsolve`: inverting an access `A[f(x, r)]` into reduction axes, substitutions, guards;
- `exprgrad`: symbolic derivatives of compute bodies and gather-form gradient computes;
- `graph`: reverse mode over a function (`reverse_mode`, `grad_func`);
- `optim`, `train`: optimizers and the `@train_step` / `@eval` functions.

See docs/autodiff.md for the algorithm, a worked example and how to stop gradients.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Autodiff"]


def __getattr__(name: str) -> Any:
    # Lazy, so that the solver modules import without the pass manager (and stay light).
    if name == "Autodiff":
        from nfc.passes.autodiff.pass_autodiff import Autodiff

        return Autodiff
    raise AttributeError(name)
