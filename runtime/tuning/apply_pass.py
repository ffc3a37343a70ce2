"""The `apply-tuning` pass: kernels take the schedules `nfc tune` measured on this machine.

It is the step of the build pipeline between the cleanup and `fuse` (nfc.runtime.build), so
the kernels it looks up are exactly those `nfc tune` measured (the tuner builds the pipeline
up to this pass), and computes that `fuse` then groups into a kernel keep their schedules. It
lives in the runtime because the tuning cache does; it is registered like every other pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from nfc.ir import Module
from nfc.passmanager import Context, ModulePass

__all__ = ["ApplyTuning"]


@dataclass(frozen=True)
class ApplyTuning(ModulePass):
    """Give kernels their tuned schedules from the tuning cache (`nf.schedule` attributes).

    Before:  %y = nf.compute [i: 64, j: 128] sum [k: 256] (%x[i, k] * %w[k, j]) ...
    After:   %y = nf.compute [i: 64, j: 128] sum [k: 256] (...) {nf.schedule = {...}}
             (for every kernel whose structural key the cache holds a valid record of, for
             this machine's category; other kernels keep their default schedules)

    A damaged or unreadable cache is not used (a warning on stderr) and changes nothing. The
    one-line summary (`tuning cache: 3 of 5 kernels found ...`) is left in
    `ctx.remarks["apply-tuning"]` for the driver to print.
    """

    name: ClassVar[str] = "apply-tuning"
    db: str = ""
    """The tuning cache file (empty: $NFC_CACHE_DIR/tuning.sqlite or ~/.cache/nfc)."""
    reproducible: bool = False
    """Use only schedules whose results are bitwise reproducible."""
    overwrite: bool = False
    """Replace schedules already given in the IR (by default they are kept)."""

    def apply(self, ctx: Context, module: Module) -> None:
        """Attach the cached schedules; record the summary."""
        from nfc.runtime.tuning.kernels import apply_cached_schedules

        use = apply_cached_schedules(module, db=self.db or None,
                                     reproducible=self.reproducible, overwrite=self.overwrite)
        ctx.remarks[self.name] = use.message()
