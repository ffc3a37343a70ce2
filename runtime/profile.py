"""Per-kernel profiles of native steps: a table and a Chrome trace.

A profiled artifact (`nfc compile --profile`, or `nfc train --profile`) stamps CLOCK_MONOTONIC
around every kernel call of a step (nfc.codegen.artifact.assemble); after each call the runtime
copies the stamps out (`Function.profile_events()`) into a `Profiler`. FLOPs and bytes per
kernel come from the artifact's metadata, counted at build time by nfc.cost (compulsory
traffic: every tensor read once plus the result written), so GFLOP/s and GB/s are what the
kernel achieved against that count.

The Chrome trace (open it in chrome://tracing or https://ui.perfetto.dev) has one row for the
steps and one for the kernels, with each kernel's label, FLOPs and bytes as arguments.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class KernelRow:
    """One kernel's totals over the profiled steps."""

    label: str
    calls: int
    total_ms: float
    percent: float
    gflops: float
    gbytes: float


class Profiler:
    """Collects the kernel stamps of the steps of one function."""

    def __init__(self, kernels: Sequence[Mapping[str, Any]], max_trace_steps: int = 50) -> None:
        self.kernels = list(kernels)
        self.totals = np.zeros(len(self.kernels), dtype=np.float64)  # ns
        self.calls = 0
        self.step_ns = 0.0
        self.max_trace_steps = max_trace_steps
        self.trace: list[tuple[int, np.ndarray]] = []

    def add(self, events: np.ndarray, step: int) -> None:
        """Record one call's (kernels, 2) start/end stamps in ns."""
        if len(events) == 0 or len(self.kernels) == 0:
            return
        ev = events[:len(self.kernels)]
        self.totals += ev[:, 1] - ev[:, 0]
        self.step_ns += float(ev[-1, 1] - ev[0, 0])
        self.calls += 1
        if len(self.trace) < self.max_trace_steps:
            self.trace.append((step, ev.copy()))

    def rows(self) -> list[KernelRow]:
        """Per-kernel totals, slowest first."""
        out = []
        all_ns = float(self.totals.sum()) or 1.0
        for k, ns in zip(self.kernels, self.totals, strict=True):
            secs = ns * 1e-9
            calls = self.calls
            out.append(KernelRow(
                str(k.get("label", k.get("symbol"))), calls, ns * 1e-6, 100.0 * ns / all_ns,
                float(k.get("flops", 0)) * calls / secs * 1e-9 if secs > 0 else 0.0,
                float(k.get("bytes", 0)) * calls / secs * 1e-9 if secs > 0 else 0.0))
        return sorted(out, key=lambda r: -r.total_ms)

    def table(self, top: int = 25) -> str:
        """The per-kernel table as text."""
        rows = self.rows()
        lines = [f"{'calls':>6} {'total ms':>9} {'% step':>7} {'GFLOP/s':>8} {'GB/s':>7}  kernel"]
        for r in rows[:top]:
            lines.append(f"{r.calls:>6} {r.total_ms:>9.3f} {r.percent:>6.1f}% {r.gflops:>8.2f} "
                         f"{r.gbytes:>7.2f}  {r.label}")
        if len(rows) > top:
            rest = rows[top:]
            lines.append(f"{'':>6} {sum(r.total_ms for r in rest):>9.3f} "
                         f"{sum(r.percent for r in rest):>6.1f}%  (other {len(rest)} kernels)")
        if self.calls:
            kern_ms = float(self.totals.sum()) * 1e-6 / self.calls
            step_ms = self.step_ns * 1e-6 / self.calls
            lines.append(f"{self.calls} steps: {kern_ms:.3f} ms in kernels per step, "
                         f"{step_ms:.3f} ms from the first kernel's start to the last's end")
        return "\n".join(lines)

    def chrome_trace(self) -> dict[str, Any]:
        """The recorded steps as a Chrome trace-event JSON object."""
        events: list[dict[str, Any]] = [
            {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "nfc"}},
            {"name": "thread_name", "ph": "M", "pid": 1, "tid": 1, "args": {"name": "steps"}},
            {"name": "thread_name", "ph": "M", "pid": 1, "tid": 2, "args": {"name": "kernels"}}]
        if not self.trace:
            return {"traceEvents": events, "displayTimeUnit": "ms"}
        t0 = int(self.trace[0][1][0, 0])
        for step, ev in self.trace:
            start, end = int(ev[0, 0]), int(ev[-1, 1])
            events.append({"name": f"step {step}", "ph": "X", "pid": 1, "tid": 1,
                           "ts": (start - t0) / 1e3, "dur": (end - start) / 1e3})
            for k, (a, b) in zip(self.kernels, ev, strict=True):
                events.append({"name": str(k.get("label", k.get("symbol"))), "ph": "X",
                               "pid": 1, "tid": 2, "ts": (int(a) - t0) / 1e3,
                               "dur": (int(b) - int(a)) / 1e3,
                               "args": {"symbol": k.get("symbol"), "flops": k.get("flops"),
                                        "bytes": k.get("bytes")}})
        return {"traceEvents": events, "displayTimeUnit": "ms"}

    def write_trace(self, path: str | os.PathLike[str]) -> None:
        """Write the Chrome trace JSON to `path`."""
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(self.chrome_trace(), fh)
