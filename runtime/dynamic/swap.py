"""The training loop's step with a replaceable library.

The model's persistent tensors are numpy arrays owned by the running `Model`; a library's
step only reads and writes them through the pointers it is called with. So replacing the
library is: load the (verified, compatible) candidate, point a `Function` of it at the running
model's tensors and at the same bound input and rng buffers, and call that one from the next
step on. Nothing is copied; the old library stays loaded (a step of it may be referenced by a
caller) until the run ends.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from nfc.runtime.dynamic.compat import incompatibility
from nfc.runtime.loader import ArtifactError, Bound, Function, Model, load


def load_sharing(path: str, model: Model) -> Model:
    """The library at `path` loaded as a `Model` whose functions work on `model`'s tensors.
    Raises ArtifactError when it cannot replace `model` (compat.incompatibility)."""
    other = load(path)
    why = incompatibility(model.metadata, other.metadata)
    if why is not None:
        raise ArtifactError(f"'{path}' cannot replace the running library: {why}")
    other.tensors = model.tensors  # share: the steps update the running model's arrays
    other.functions = {name: Function(other, name, fm)
                       for name, fm in other.metadata["functions"].items()}
    other.seed, other.step = model.seed, model.step
    return other


class SwappableStep:
    """Stands in for `Function.bind()`'s `Bound` in the training loop (`inputs`, `rng`, `fn`,
    call) and can switch to another library between calls (`swap`)."""

    def __init__(self, model: Model, bound: Bound, function: str = "train_step") -> None:
        self.model = model
        self.function = function
        self._bound = bound
        self.inputs: dict[str, np.ndarray] = bound.inputs
        self.libraries: list[Model] = [model]
        self.swaps: list[tuple[int, str]] = []
        """(step, library path) of each swap."""

    @property
    def rng(self) -> np.ndarray:
        return self._bound.rng

    @property
    def fn(self) -> Function:
        """The function called now (for `profile_events`)."""
        return self._bound.fn

    @property
    def path(self) -> str:
        """The library whose step runs now."""
        return self._bound.fn.model.path

    def __call__(self) -> dict[str, np.ndarray]:
        out = self._bound()
        if self._bound.fn.model is not self.model:
            self.model.step += 1  # the running model counts steps, whichever library ran it
        return out

    def swap(self, path: str, threads: int | None = None) -> None:
        """Run the step of the library at `path` from the next call on (same buffers)."""
        new = load_sharing(path, self.model)
        if threads is not None:
            new.set_num_threads(threads)
        fn = new.functions[self.function]
        bound = fn.bind(self.inputs)
        bound.rng[:] = self._bound.rng
        self._bound = bound
        self.libraries.append(new)
        self.swaps.append((self.model.step, path))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._bound, name)
