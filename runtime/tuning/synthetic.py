"""A synthetic kernel and schedule space for exercising the tuner without a code generator.

The kernel is a blocked matrix product whose cost depends on the schedule (`block` columns at
a time, `reps` redundant passes); `fault` injects the ways a real generated kernel can go
wrong: raise, crash the process, exit, hang, or compute a wrong result.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

BUILDER = "nfc.runtime.tuning.synthetic:build"
"""Import path of the synthetic builder, for a `measure.Task`."""
REFERENCE = "nfc.runtime.tuning.synthetic:reference"
"""Import path of the synthetic reference."""

FAULTS = ("none", "raise", "crash", "exit", "hang", "wrong")
"""Injectable faults: none, an exception, SIGSEGV, `os._exit(3)`, an endless loop, a +1 error."""


def make_spec(n: int = 32) -> dict[str, Any]:
    """The spec of an `n`-by-`n` matrix product."""
    return {"n": n, "inputs": [{"shape": [n, n], "dtype": "float32"},
                               {"shape": [n, n], "dtype": "float32"}]}


def build(spec: Mapping[str, Any], schedule: Mapping[str, Any]) -> Any:
    """The kernel for one schedule: `{"block": int, "reps": int, "fault": str}`."""
    n, block = int(spec["n"]), int(schedule.get("block", spec["n"]))
    reps, fault = int(schedule.get("reps", 1)), schedule.get("fault", "none")
    if fault == "build-hang":
        while True:
            time.sleep(0.05)

    def run(inputs: list[np.ndarray]) -> list[np.ndarray]:
        a, b = inputs
        if fault == "raise":
            raise RuntimeError("injected failure")
        if fault == "crash":
            os.kill(os.getpid(), signal.SIGSEGV)
        if fault == "exit":
            os._exit(3)
        if fault == "hang":
            while True:
                time.sleep(0.05)
        out = np.empty((a.shape[0], b.shape[1]), dtype=a.dtype)
        for _ in range(reps):
            for j in range(0, n, block):
                out[:, j:j + block] = a @ b[:, j:j + block]
        return [out + 1 if fault == "wrong" else out]

    run.workspace_bytes = block * n * 4  # type: ignore[attr-defined]
    return run


def reference(spec: Mapping[str, Any]) -> Any:
    """The reference kernel: a plain matrix product."""
    def run(inputs: list[np.ndarray]) -> list[np.ndarray]:
        return [inputs[0] @ inputs[1]]
    return run


class SyntheticSpace:
    """A schedule space for the synthetic kernel; `faults` are the fault values searched."""

    def __init__(self, n: int = 32, blocks: tuple[int, ...] = (4, 8, 16, 32),
                 reps: tuple[int, ...] = (1, 2, 3), faults: tuple[str, ...] = ("none",)) -> None:
        self.n = n
        self.params: dict[str, list[Any]] = {"block": list(blocks), "reps": list(reps),
                                             "fault": list(faults)}
        """Every parameter with its candidate values."""

    def default(self) -> dict[str, Any]:
        """A middling schedule: the second block size, the most repetitions, no fault."""
        return {"block": self.params["block"][min(1, len(self.params["block"]) - 1)],
                "reps": max(self.params["reps"]), "fault": "none"}

    def is_valid(self, cfg: Mapping[str, Any]) -> bool:
        """Blocks must divide the matrix size."""
        return self.n % int(cfg["block"]) == 0


def cost(cfg: Mapping[str, Any]) -> float:
    """A deterministic cost model of the synthetic kernel (seconds), for searches that should
    not depend on timing noise: fewer passes and mid-sized blocks are cheaper."""
    block, reps = int(cfg["block"]), int(cfg["reps"])
    return 1e-3 * reps * (1 + abs(block - 8) / 8)
