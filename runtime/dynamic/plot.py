"""`nfc train --plot-steps FILE.png`: the step time over a run, from its `--metrics` lines
(`step` events carry `step_ms`; dynamic mode's `swap` events mark where a library changed)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np


def read_step_times(metrics: str) -> tuple[list[int], list[float], list[dict[str, Any]]]:
    """(steps, step times in ms, swap events) of a metrics file (malformed lines skipped)."""
    steps: list[int] = []
    ms: list[float] = []
    swaps: list[dict[str, Any]] = []
    for line in Path(metrics).read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(rec, dict):
            continue
        if rec.get("event") == "step" and "step_ms" in rec:
            steps.append(int(rec["step"]))
            ms.append(float(rec["step_ms"]))
        elif rec.get("event") == "swap":
            swaps.append(rec)
    return steps, ms, swaps


def rolling_median(values: list[float], window: int) -> np.ndarray:
    """The median of each value and the `window - 1` before it (fewer at the start)."""
    v = np.asarray(values, dtype=np.float64)
    return np.array([np.median(v[max(0, i - window + 1):i + 1]) for i in range(len(v))])


def plot_step_times(metrics: str, path: str, title: str = "nfc train: step time") -> None:
    """A PNG of every step's time (faint), its running median, and a line at each swap."""
    from nfc.runtime.train import TrainError

    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise TrainError("--plot-steps needs matplotlib: pip install matplotlib") from None
    steps, ms, swaps = read_step_times(metrics)
    fig, ax = plt.subplots(figsize=(7, 4))
    if steps:
        ax.plot(steps, ms, lw=0.5, color="tab:blue", alpha=0.35, label="step")
        window = max(1, min(50, len(ms) // 20))
        ax.plot(steps, rolling_median(ms, window), lw=1.2, color="tab:blue",
                label=f"median of {window}")
        lo, hi = np.percentile(ms, 1), np.percentile(ms, 99)
        ax.set_ylim(max(0.0, lo * 0.8), hi * 1.2)
    for n, s in enumerate(swaps):
        ax.axvline(s["step"], color="tab:red", lw=0.8, ls="--",
                   label="swap" if n == 0 else None)
    ax.set_xlabel("step")
    ax.set_ylabel("step time (ms)")
    ax.set_title(title)
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
