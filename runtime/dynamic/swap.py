"""The training loop's step with a replaceable library.

The model's persistent tensors are numpy arrays owned by the running `Model`; a library's
step only reads and writes them through the pointers it is called with. So replacing the
library is: load the (verified, compatible) candidate, point a `Function` of it at the running
model's tensors and at the same bound input and rng buffers, and call that one from the next
step on. Nothing is copied; the old library stays loaded (a step of it may be referenced by a
caller) until the run ends.

Per-kernel times (the execution side's reports to the explorer): a library may have a
*profiled twin* (`attach_profiled`): the same kernels and schedules built with the
artifact's per-kernel clock stamps (`nfc compile --profile`), sharing the running model's
tensors and the step's input buffers. A sampled step (`sample(n)`) runs the twin instead of
the library (the same code computes the same numbers; the stamps only read the clock around
each kernel call) and keeps its kernels' times (`samples`); the other steps run the plain
library, so they pay nothing for the reporting.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from nfc.runtime.dynamic.compat import incompatibility
from nfc.runtime.loader import ArtifactError, Bound, Function, Model, load


def load_sharing(path: str, model: Model, *, profiled: bool = False) -> Model:
    """The library at `path` loaded as a `Model` whose functions work on `model`'s tensors.
    Raises ArtifactError when it cannot replace `model` (compat.incompatibility; `profiled`:
    a profiled build may stand in for a plain one)."""
    other = load(path)
    why = incompatibility(model.metadata, other.metadata, ignore_profile=profiled)
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
        self._twin: Bound | None = None
        self._twin_for: str | None = None
        self._sample = 0
        self.samples: list[np.ndarray] = []
        """Seconds of each kernel call (plan order) of the sampled steps since the library
        (or its twin) last changed."""
        self.delay: dict[int, float] = {}
        """Tests: seconds added to kernel call k's time in a sampled step's record (a
        kernel made slow through the indirection; the step itself is unchanged)."""

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

    @property
    def profiled(self) -> bool:
        """Whether the running library has a profiled twin (its steps can be sampled)."""
        return self._twin is not None and self._twin_for == self.path

    def kernels(self) -> list[dict]:
        """The running step's kernel calls (plan order, the library's metadata)."""
        return list(self._bound.fn.meta["kernels"])

    @property
    def sampling(self) -> bool:
        """Steps asked for by `sample` are still to run."""
        return self._sample > 0 and self.profiled

    def set_threads(self, n: int) -> None:
        """The thread count of the running library (and of its twin)."""
        self._bound.fn.model.set_num_threads(n)
        if self._twin is not None:
            self._twin.fn.model.set_num_threads(n)

    def sample(self, n: int = 1) -> None:
        """Run the next `n` steps on the profiled twin and record their kernel times."""
        self._sample = max(self._sample, n)

    def __call__(self) -> dict[str, np.ndarray]:
        if self._sample and self.profiled:
            assert self._twin is not None
            self._sample -= 1
            twin = self._twin
            twin.rng[:] = self._bound.rng
            out = twin()
            ev = twin.fn.profile_events()[:len(twin.fn.meta["kernels"])]
            secs = (ev[:, 1] - ev[:, 0]).astype(np.float64) * 1e-9
            for k, extra in self.delay.items():
                if 0 <= k < len(secs):
                    secs[k] += extra
            self.samples.append(secs)
            self.model.step += 1  # the twin's model is another Model
            return out
        out = self._bound()
        if self._bound.fn.model is not self.model:
            self.model.step += 1  # the running model counts steps, whichever library ran it
        return out

    def attach_profiled(self, library: str, path: str) -> bool:
        """Use the profiled build at `path` as the twin of the library at `library` (when that
        one runs: now or after a later swap). False (and no twin) when `library` is not
        running or the twin's kernels are not the running library's (another build)."""
        if library != self.path:
            return False
        new = load_sharing(path, self.model, profiled=True)
        if not new.metadata.get("profile"):
            return False
        # the symbols name each kernel's code (computation, types, schedule); the labels'
        # source paths may be spelled differently
        mine = [k["symbol"] for k in self.kernels()]
        theirs = [k["symbol"] for k in new.metadata["functions"][self.function]["kernels"]]
        if mine != theirs:
            return False
        running = self._bound.fn
        new.set_num_threads(running.model.get_num_threads())
        twin = new.functions[self.function].bind(self.inputs)
        if twin.fn.meta["arena_bytes"] <= running.meta["arena_bytes"]:
            # the running step's arena (the same plan: warm in the caches, no second block
            # touched for the first time in a sampled step); steps never overlap
            twin.share_arena(running)
        self._twin = twin
        self._twin_for = library
        self.libraries.append(new)
        self.samples = []
        return True

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
        self.samples = []
        self._sample = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._bound, name)
