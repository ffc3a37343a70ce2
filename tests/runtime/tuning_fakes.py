"""Deterministic stand-ins for tuning tests: a schedule space with a known optimum and a
cost model used as the measurement (no timing noise, no processes)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from nfc.runtime.tuning.model import Measurement, Status, canonical_json

CATEGORY = {"backend": "llvm", "device": "Test CPU 9000", "features": ["avx2", "fma"],
            "cores": 2, "schedule_space": "1"}
"""The category tests treat as 'this machine'."""
OTHER_CPU = {**CATEGORY, "device": "Other CPU 1", "features": ["sse2"]}
"""Another machine's category."""
OTHER_VERSION = {**CATEGORY, "schedule_space": "2"}
"""This machine under another schedule-space version."""


class FakeSpace:
    """384 combinations, those with a * b > 40 invalid; the optimum is a=5, b=3, c=y, d=0."""

    params: dict[str, list[Any]] = {"a": list(range(1, 9)), "b": list(range(1, 9)),
                                    "c": ["x", "y", "z"], "d": [0, 1]}

    def default(self) -> dict[str, Any]:
        """A deliberately poor but valid schedule."""
        return {"a": 1, "b": 8, "c": "x", "d": 1}

    def is_valid(self, cfg: Mapping[str, Any]) -> bool:
        """Large a*b are illegal."""
        return cfg["a"] * cfg["b"] <= 40


def cost(cfg: Mapping[str, Any]) -> float:
    """Seconds the fake kernel takes; interactions make it more than a sum of parts."""
    a, b, c, d = cfg["a"], cfg["b"], cfg["c"], cfg["d"]
    return 1e-3 * (1 + (a - 5) ** 2 + 0.5 * (b - 3) ** 2 + {"x": 1, "y": 0, "z": 2}[c]
                   + d * (1 + a % 3))


class FakeMeasure:
    """Measures by the cost model, recording every call; optionally failing some schedules,
    sleeping, or appending each schedule to a log file before measuring it."""

    def __init__(self, fail: Any = None, sleep: float = 0.0, log: str | None = None) -> None:
        self.calls: list[str] = []
        self.fail, self.sleep, self.log = fail, sleep, log

    def __call__(self, cfg: dict[str, Any]) -> Measurement:
        text = canonical_json(cfg)
        self.calls.append(text)
        if self.log:
            with open(self.log, "a", encoding="utf-8") as fp:
                fp.write(text + "\n")
        if self.sleep:
            time.sleep(self.sleep)
        if self.fail is not None and self.fail(cfg):
            return Measurement(Status.FAILED, error="injected")
        return Measurement(Status.OK, cost(cfg), 0.0, workspace=64 * cfg["a"])
