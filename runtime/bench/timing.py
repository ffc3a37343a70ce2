"""How a step is timed and a process's memory measured, in every framework's process alike.

benchmarks/run_baseline.py carries a copy of `measure` (it must run without nfc installed);
tests/runtime/test_bench_cli.py checks that the two stay the same protocol.
"""

from __future__ import annotations

import os
import resource
import statistics
import time
from collections.abc import Callable
from typing import Any


def peak_rss_mb() -> float:
    """High-water mark of this process's resident set, in MB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def current_rss_mb() -> float:
    """Resident set size now, in MB (from /proc; the peak where that is unavailable)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return peak_rss_mb()


def measure(step: Callable[[], Any], min_time: float, min_steps: int, warmup: float
            ) -> dict[str, Any]:
    """Time `step` (which must finish its work before returning its loss): the first call
    alone, then warm-up calls for `warmup` seconds (at least 1), then single calls until
    `min_time` seconds and `min_steps` calls were timed. The median is the step time; the
    process CPU time per step is kept beside it because on a shared machine it measures the
    code rather than the scheduler."""
    t0 = time.perf_counter()
    first_loss = float(step())
    first = time.perf_counter() - t0
    end = time.perf_counter() + warmup
    n_warm = 0
    while n_warm < 1 or time.perf_counter() < end:
        step()
        n_warm += 1
    times: list[float] = []
    cpu0 = time.process_time()
    wall0 = time.perf_counter()
    while len(times) < min_steps or sum(times) < min_time:
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    cpu = time.process_time() - cpu0
    wall = time.perf_counter() - wall0
    med = statistics.median(times)
    return {"step_ms": med * 1e3, "min_ms": min(times) * 1e3, "mean_ms": wall / len(times) * 1e3,
            "cpu_ms": cpu / len(times) * 1e3, "steps": len(times), "warmup_steps": n_warm,
            "first_step_s": first, "first_loss": first_loss,
            "compile_s": max(first - med, 0.0)}
