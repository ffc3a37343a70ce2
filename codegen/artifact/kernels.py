"""The distinct kernels of an artifact: deduplicated, lowered once, compiled or taken from the
object cache.

`KernelSet.add(op, schedule)` names a kernel by its key (nfc.codegen.artifact.kcache): the
first op with a key is lowered to loop IR (cheap, and needed for the memory plan's workspace
sizes and `--emit=loops`); every later op with the same key reuses that kernel's symbol with its
own buffers. `objects()` then produces one object per distinct kernel: from the cache when it
has the key, else emitted and compiled (in parallel, nfc.codegen.artifact.parallel) and stored.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from nfc.codegen.artifact.kcache import ObjectCache, kernel_key, kernel_symbol
from nfc.codegen.artifact.parallel import KernelJob, compile_jobs, compile_text, hide, loop_cost
from nfc.codegen.cpu import CpuTarget
from nfc.codegen.jit import KernelInfo, emit_lowered, lower_kernel, new_module, resolve_schedule
from nfc.codegen.lower import group_of
from nfc.ir import ComputeOp, KernelOp


@dataclass
class KernelEntry:
    """One distinct kernel: its key, the first op that has it, its schedule and loop IR."""

    key: str
    op: ComputeOp | KernelOp
    schedule: dict[str, Any] | None
    info: KernelInfo
    uses: int = 1


class KernelSet:
    """The distinct kernels of one artifact, by symbol, in first-use order."""

    def __init__(self, target: CpuTarget, cache: ObjectCache | None) -> None:
        self.target = target
        self.cache = cache
        self.entries: dict[str, KernelEntry] = {}
        self.stats: dict[str, Any] = {"lower": 0.0}

    def add(self, op: ComputeOp | KernelOp, schedule: Any) -> tuple[str, KernelInfo]:
        """The symbol of `op`'s kernel and its buffer layout for `op`'s own values. Raises
        ScheduleError when the schedule does not fit."""
        t0 = time.process_time()
        try:
            resolved = resolve_schedule(op, schedule, self.target)
            key = kernel_key(op, resolved, self.target)
            sym = kernel_symbol(key)
            entry = self.entries.get(sym)
            if entry is not None:
                entry.uses += 1
                _, outs, ins = group_of(op)
                return sym, KernelInfo(sym, entry.info.loops, tuple(outs), tuple(ins))
            info = lower_kernel(op, resolved, name=sym, target=self.target)
            self.entries[sym] = KernelEntry(
                key, op, None if resolved is None else resolved.to_dict(), info)
            return sym, info
        finally:
            self.stats["lower"] += time.process_time() - t0

    def module(self, symbol: str) -> Any:
        """A fresh llvmlite module defining the kernel `symbol` (hidden)."""
        entry = self.entries[symbol]
        module = new_module(symbol, self.target)
        emit_lowered(module, entry.info, target=self.target)
        hide(module, symbol)
        return module

    def _local(self, job: KernelJob) -> bytes:
        t0 = time.process_time()
        text = str(self.module(job.symbol))
        self.stats["emit"] = self.stats.get("emit", 0.0) + time.process_time() - t0
        obj, times = compile_text(text, self.target)
        for k, v in times.items():
            self.stats[k] = self.stats.get(k, 0.0) + v
        return obj

    def objects(self, processes: int, *, refresh: bool = False,
                before: Sequence[Callable[[], None]] = ()) -> list[bytes | str]:
        """Object code (bytes) or cached object paths of every kernel, in symbol order.
        `refresh` ignores (and overwrites) cached objects. `before` runs in this process once
        workers are started (the entry module's compilation overlaps theirs)."""
        from nfc.codegen.tuning import kernel_spec

        hits: dict[str, str] = {}
        jobs: list[KernelJob] = []
        for sym, e in self.entries.items():
            path = self.cache.get(e.key) if self.cache is not None and not refresh else None
            if path is not None:
                hits[sym] = str(path)
            else:
                jobs.append(KernelJob(sym, kernel_spec(e.op)["ir"], e.schedule,
                                      loop_cost(e.info.loops.body)))
        compiled = compile_jobs(jobs, self._local, self.target, processes, self.stats,
                                before=before)
        if self.cache is not None:
            for job in jobs:
                self.cache.put(self.entries[job.symbol].key, compiled[job.symbol])
        self.stats.update(distinct=len(self.entries), cache_hits=len(hits),
                          cache_misses=len(jobs))
        return [hits[s] if s in hits else compiled[s] for s in self.entries]
