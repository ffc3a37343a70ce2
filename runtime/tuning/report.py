"""The tuning report of `nfc tune`: per kernel, default time, best time, speedup and trials; a
table, JSON, a plot of best-so-far against trials, and the progress display while tuning.

Everything here is data about a finished (or interrupted) run; nothing measures anything.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

IMPLAUSIBLE_SPEEDUP = 100.0
"""A kernel speedup above this is not believed. The default schedules are the code
generator's heuristic choices (vectorized, register-tiled, parallel when large), so a tuned
schedule that beats one by two orders of magnitude is far likelier a disturbed measurement of
the default (a descheduled thread, a page-fault storm) than a real gain: such a kernel is
flagged in the table and left out of the step totals."""


def fmt_time(t: float | None) -> str:
    """`1.23 ms`-style text of seconds (`-` for unknown)."""
    if t is None or not math.isfinite(t):
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if t >= scale:
            return f"{t / scale:.3g} {unit}"
    return f"{t / 1e-9:.3g} ns"


def fmt_duration(seconds: float) -> str:
    """`2m05s`-style text of a wall-clock duration."""
    s = int(round(seconds))
    if s < 60:
        return f"{seconds:.1f}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


@dataclass(frozen=True)
class KernelReport:
    """The outcome for one distinct kernel."""

    key: str
    """The kernel's cache key (nfc.runtime.tuning.kernels.kernel_key)."""
    desc: str
    """What the kernel is (kind, sizes, operand types)."""
    count: int
    """Calls per step (identical kernels share one entry)."""
    share: float
    """Estimated fraction of the step's kernel time (default schedules), 0..1."""
    status: str
    """`tuned`, `cached` (nothing new measured), `heuristic`, `skipped` or `error`."""
    default_time: float | None = None
    """Median seconds of one call with the default schedule (None: not measured)."""
    best_time: float | None = None
    """Median seconds of one call with the chosen schedule."""
    speedup: float = 1.0
    """Default (or first correct candidate) over best time."""
    trials: int = 0
    """Candidates evaluated in this run (cache hits included)."""
    measured: int = 0
    """Candidates measured in this run (the rest came from the cache)."""
    failed: int = 0
    """Candidates that crashed, hung or computed a wrong result."""
    stop: str = ""
    """Why the search stopped (`trials`, `time`, `patience`, `exhausted`, `heuristic`)."""
    schedule: dict[str, Any] = field(default_factory=dict)
    """The chosen schedule (schedule-space parameters, canonical axis names)."""
    note: str = ""
    """Why a kernel was skipped or failed."""
    locs: tuple[str, ...] = ()
    """Source locations of its calls."""
    seconds: float = 0.0
    """Wall-clock seconds spent on this kernel."""
    history: tuple[float, ...] = ()
    """Best speedup so far after each trial (for the plot)."""
    rejected: int = 0
    """Winners of the search that lost to the default when re-measured (timing noise)."""
    confirmed: bool = False
    """The default and best times are medians of a side-by-side re-measurement (interleaved
    in one worker), not the search's single measurements."""

    @property
    def implausible(self) -> bool:
        """The speedup is beyond `IMPLAUSIBLE_SPEEDUP` (see there): not believed."""
        return self.best_time is not None and self.speedup > IMPLAUSIBLE_SPEEDUP


@dataclass(frozen=True)
class TuneReport:
    """The outcome of tuning one model."""

    model: str
    """The model file."""
    functions: tuple[str, ...]
    """The functions whose kernels were tuned (normally `train_step`)."""
    db: str
    """The tuning cache file."""
    category_id: str
    """Hash of the category the records were written under."""
    mode: str
    """`full`, `fast` or `heuristic`."""
    order: str
    """How kernels were ranked: `profile` (measured default schedules) or `cost` (FLOP/byte
    roofline estimate)."""
    seconds: float
    """Wall-clock seconds of the whole run."""
    kernels: tuple[KernelReport, ...]
    """One entry per distinct kernel, most expensive first."""
    interrupted: bool = False
    """The run was stopped (Ctrl-C) before every kernel was tuned; rerun to continue."""
    step_default: float | None = None
    """Measured step time with default schedules (`--compare-step`)."""
    step_tuned: float | None = None
    """Measured step time with the tuned schedules (`--compare-step`)."""

    def estimated_step(self) -> tuple[float, float] | None:
        """(default, tuned) sum of count x time over the kernels with both times known and
        a believable speedup (`KernelReport.implausible` ones are left out)."""
        pairs = [(k.count * k.default_time, k.count * k.best_time) for k in self.kernels
                 if k.default_time is not None and k.best_time is not None
                 and not k.implausible]
        if not pairs:
            return None
        return sum(p[0] for p in pairs), sum(p[1] for p in pairs)

    @property
    def measured(self) -> int:
        """Candidates measured in this run, over all kernels."""
        return sum(k.measured for k in self.kernels)

    def to_json(self) -> dict[str, Any]:
        """The report as JSON-able data (`--report out.json`)."""
        data = asdict(self)
        for k, d in zip(self.kernels, data["kernels"], strict=True):
            d["implausible"] = k.implausible
        est = self.estimated_step()
        data["estimated_step"] = None if est is None else {"default": est[0], "tuned": est[1]}
        data["measured"] = self.measured
        return data

    def write_json(self, path: str | Path) -> None:
        """Write `to_json()` to `path`."""
        Path(path).write_text(json.dumps(self.to_json(), indent=1, allow_nan=False,
                                         default=_json_default) + "\n", encoding="utf-8")

    def table(self) -> str:
        """The per-kernel table and totals, as text."""
        head = (f"{'#':>3} {'share':>6} {'calls':>5} {'default':>9} {'best':>9} {'speedup':>8} "
                f"{'trials':>11}  kernel")
        lines = [head]
        for n, k in enumerate(self.kernels, 1):
            trials = f"{k.trials} ({k.measured} new)" if k.trials else "-"
            speed = f"{k.speedup:.2f}x" if k.best_time is not None else "-"
            if k.implausible:
                speed = f"{k.speedup:.0f}x?"
            elif k.best_time is not None and k.measured and not k.confirmed and \
                    k.speedup > 1:
                speed += "*"
            text = f"{k.desc}  [{k.status}: {k.note}]" if k.note else k.desc
            lines.append(f"{n:>3} {100 * k.share:>5.1f}% {k.count:>5} {fmt_time(k.default_time):>9}"
                         f" {fmt_time(k.best_time):>9} {speed:>8} {trials:>11}  {text}")
        lines.append(self.summary())
        return "\n".join(lines)

    def summary(self) -> str:
        """The closing lines: what was done and the estimated and measured step times."""
        done = sum(1 for k in self.kernels if k.status in ("tuned", "cached"))
        fails = sum(k.failed for k in self.kernels)
        text = (f"{done} of {len(self.kernels)} kernels tuned ({self.mode} mode, kernels "
                f"ranked by {self.order}) in {fmt_duration(self.seconds)}: {self.measured} "
                f"candidates measured, {fails} failed; cache {self.db}")
        odd = [k for k in self.kernels if k.implausible]
        if odd:
            text += (f"\n{len(odd)} kernel(s) show an implausible speedup (marked ?, over "
                     f"{IMPLAUSIBLE_SPEEDUP:g}x): most likely a disturbed measurement of the "
                     "default; left out of the totals (rerun with --confirm on a quiet "
                     "machine)")
        if any(k.best_time is not None and k.measured and not k.confirmed and k.speedup > 1
               and not k.implausible for k in self.kernels):
            text += ("\n* single measurements from the search, not confirmed side by side "
                     "(--confirm 0, or the winner was not re-measured)")
        rejected = sum(k.rejected for k in self.kernels)
        if rejected:
            text += (f"\n{rejected} search winner(s) were slower than the default when "
                     "re-measured and were set aside (is the machine busy?)")
        est = self.estimated_step()
        if est is not None and est[1] > 0:
            text += (f"\nkernel time per step (sum of count x time of the tuned kernels): "
                     f"{fmt_time(est[0])} -> {fmt_time(est[1])} ({est[0] / est[1]:.2f}x)")
        if self.step_default is not None and self.step_tuned:
            text += (f"\nmeasured step time: {fmt_time(self.step_default)} default -> "
                     f"{fmt_time(self.step_tuned)} tuned "
                     f"({self.step_default / self.step_tuned:.2f}x)")
        if self.interrupted:
            text += "\ninterrupted: rerun the same command to continue where it stopped"
        return text


def _json_default(obj: object) -> Any:
    item = getattr(obj, "item", None)
    if callable(item):
        return item()
    raise TypeError(f"{type(obj).__name__} is not JSON-serialisable")


class PlotUnavailable(Exception):
    """matplotlib is not installed."""


def check_plotting() -> None:
    """Raise PlotUnavailable (with the fix) when matplotlib cannot be imported."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise PlotUnavailable("--plot needs matplotlib, which is not installed "
                              "(pip install matplotlib, or pip install 'nfc[plot]')") from None


def write_plot(report: TuneReport, path: str | Path, *, top: int = 12) -> None:
    """A PNG of the best speedup so far against trials, one line per kernel (the `top` most
    expensive that were measured)."""
    check_plotting()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    shown = [k for k in report.kernels if k.history][:top]
    for k in shown:
        xs = range(1, len(k.history) + 1)
        ax.step(list(xs), list(k.history), where="post",
                label=f"{100 * k.share:.0f}% {k.desc[:48]}")
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("trial")
    ax.set_ylabel("best speedup so far (x default)")
    ax.set_title(f"nfc tune {Path(report.model).name} ({report.mode} mode)")
    if shown:
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------
# progress while tuning


class Progress:
    """Shows kernel, trial and best speedup so far: a tqdm bar on a terminal when tqdm is
    installed, else a line per kernel and one every few seconds. `quiet` shows nothing."""

    def __init__(self, n_kernels: int, trials: int | None, *, quiet: bool = False,
                 stream: TextIO | None = None, bar: bool | None = None,
                 interval: float = 5.0) -> None:
        self.n, self.trials, self.quiet = n_kernels, trials, quiet
        self.stream = stream or sys.stderr
        self.interval = interval
        use_bar = self.stream.isatty() if bar is None else bar
        self._tqdm: Callable[..., Any] | None = None
        if use_bar and not quiet:
            try:
                from tqdm import tqdm

                self._tqdm = tqdm
            except ImportError:
                self._tqdm = None
        self._bar: Any = None
        self._index = 0
        self._desc = ""
        self._last = 0.0

    def begin(self, n_kernels: int) -> None:
        """The run will tune `n_kernels` kernels."""
        self.n = n_kernels

    def write(self, text: str) -> None:
        """Print a line without breaking the bar."""
        if self.quiet:
            return
        if self._bar is not None:
            self._bar.write(text, file=self.stream)
        else:
            print(text, file=self.stream, flush=True)

    def start(self, index: int, desc: str, share: float) -> None:
        """A kernel's tuning begins."""
        self._index, self._desc = index, desc
        label = f"[{index}/{self.n}] {desc[:40]}"
        if self.quiet:
            return
        if self._tqdm is not None:
            self._bar = self._tqdm(total=self.trials, desc=label, leave=False, unit="trial",
                                   file=self.stream, dynamic_ncols=True)
        else:
            self.write(f"{label} ({100 * share:.1f}% of the step)")
            self._last = time.monotonic()

    def trial(self, kernel: str, trial: int, speedup: float) -> None:
        """After every evaluated candidate (the search's progress callback)."""
        if self.quiet:
            return
        if self._bar is not None:
            self._bar.set_postfix_str(f"best x{speedup:.2f}", refresh=False)
            self._bar.update(trial - self._bar.n)
        elif time.monotonic() - self._last >= self.interval:
            self._last = time.monotonic()
            total = f"/{self.trials}" if self.trials else ""
            self.write(f"  trial {trial}{total}, best x{speedup:.2f}")

    def done(self, k: KernelReport) -> None:
        """A kernel is finished."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if k.status in ("tuned", "cached"):
            speed = f"{k.speedup:.0f}x, implausible" if k.implausible else f"{k.speedup:.2f}x"
            line = (f"[{self._index}/{self.n}] {k.desc[:48]}: {fmt_time(k.default_time)} -> "
                    f"{fmt_time(k.best_time)} ({speed}, {k.trials} trials, "
                    f"{k.measured} new)")
        else:
            line = f"[{self._index}/{self.n}] {k.desc[:48]}: {k.status}" + (
                f" ({k.note})" if k.note else "")
        self.write(line)


def speedup_history(trace: Sequence[tuple[int, float]]) -> tuple[float, ...]:
    """Best speedup after each trial from (trial, speedup) progress events."""
    out: list[float] = []
    for trial, s in trace:
        while len(out) < trial - 1:
            out.append(out[-1] if out else 1.0)
        if len(out) < trial:
            out.append(s)
        else:
            out[trial - 1] = s
    return tuple(out)
