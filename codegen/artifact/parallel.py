"""Object code for an artifact's kernels, in this process and in worker processes at once.

llvmlite serialises LLVM work behind one process-wide lock and building LLVM IR is Python, so
using several cores takes several processes. Each kernel is compiled on its own
(one LLVM module, one object: what the object cache stores). `compile_jobs` starts `workers`
plain `python -c` subprocesses (not multiprocessing, which would re-import the caller's
`__main__`), gives them the biggest kernels first, at most `DEPTH` at a time each, and compiles
the smallest ones itself meanwhile, so neither side waits while work is left; at the end it
takes back a job still queued behind another in a worker rather than wait for it.

A job is data: the kernel's IR text (`nfc.codegen.kernel_spec.kernel_spec`), its schedule as a dict
and the symbol to define. A worker parses, lowers, emits, optimises and writes
`<dir>/<symbol>.o`, then answers one JSON line; the local side emits from the loop IR it
already has. The object code is the same either way. A job a worker fails on is compiled
locally, where the error surfaces with its real type; a worker that dies hands its jobs back.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from nfc.codegen.cpu import CpuTarget
from nfc.codegen.loops import Stmt, stmt_cost

_WORKER = "from nfc.codegen.artifact.parallel import worker; worker()"
#: Jobs queued per worker (one compiling, one waiting in its pipe).
DEPTH = 2
#: Fewer estimated cost units than this (about 20 small kernels) are not worth a worker
#: process (its start-up costs about half a second of CPU).
PARALLEL_MIN_COST = 4000.0


def default_jobs() -> int:
    """Processes compiling kernels: `NFC_COMPILE_JOBS`, else the usable cores (at most 4)."""
    env = os.environ.get("NFC_COMPILE_JOBS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    return max(1, min(4, cores))


@dataclass(frozen=True)
class KernelJob:
    """One kernel to compile (see the module docstring)."""

    symbol: str
    spec: str
    """IR text of a function holding the kernel op (`kernel_spec(op)["ir"]`)."""
    schedule: dict[str, Any] | None
    """The schedule as a dict (`to_dict()`), None for the default."""
    cost: float
    """Estimated effort (`loop_cost`); only orders the work."""


def loop_cost(s: Stmt) -> float:
    """Roughly the LLVM instructions a loop nest emits (`nfc.codegen.loops.stmt_cost`)."""
    return stmt_cost(s)


def hide(module: Any, symbol: str) -> None:
    """Make `symbol` hidden: linkable between the library's objects, not exported from it."""
    module.get_global(symbol).linkage = "hidden"


def compile_text(text: str, target: CpuTarget, options: dict[str, int | bool] | None = None
                 ) -> tuple[bytes, dict[str, float]]:
    """Optimise LLVM IR text (pipeline `options`, default the kernels') and emit an object;
    CPU seconds of both steps."""
    from nfc.codegen.cpu import target_machine
    from nfc.codegen.jit import optimize

    t0 = time.process_time()
    ref = optimize(text, target, options=options)
    t1 = time.process_time()
    obj = target_machine(target).emit_object(ref)
    return obj, {"llvm_opt": t1 - t0, "codegen": time.process_time() - t1}


def _build(job: dict[str, Any], target: CpuTarget) -> tuple[bytes, dict[str, float]]:
    """What a worker does for one job: IR text to object code."""
    from nfc.codegen.jit import emit_kernel, new_module
    from nfc.codegen.kernel_spec import load_op

    t0 = time.process_time()
    op = load_op({"ir": job["spec"]})
    module = new_module(job["symbol"], target)
    emit_kernel(module, job["symbol"], op, job["schedule"], target=target)
    hide(module, job["symbol"])
    text = str(module)
    t_emit = time.process_time() - t0
    obj, times = compile_text(text, target)
    return obj, {"emit": t_emit, **times}


def worker() -> None:
    """Serve jobs: argv[1] is `{"target": ..., "dir": ...}`; stdin JSON lines, one per job;
    for each, write `<dir>/<symbol>.o` and answer `{"symbol", "ok"|"error", "times"}`."""
    spec = json.loads(sys.argv[1])
    target = CpuTarget(spec["cpu"], spec["features"], spec["triple"])
    out_dir = spec["dir"]
    for line in sys.stdin:
        if not line.strip():
            continue
        job = json.loads(line)
        reply: dict[str, Any] = {"symbol": job["symbol"]}
        try:
            obj, times = _build(job, target)
            path = os.path.join(out_dir, job["symbol"] + ".o")
            with open(path, "wb") as f:
                f.write(obj)
            reply.update(ok=path, times=times)
        except Exception as exc:  # noqa: BLE001 - reported; the parent compiles it itself
            reply["error"] = f"{type(exc).__name__}: {exc}"
        reply["cpu"] = time.process_time()  # this process so far, start-up included
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


class _Worker:
    def __init__(self, target: CpuTarget, out_dir: str) -> None:
        arg = json.dumps({"cpu": target.cpu, "features": target.features,
                          "triple": target.triple, "dir": out_dir})
        self.proc = subprocess.Popen([sys.executable, "-c", _WORKER, arg], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.pending: dict[str, KernelJob] = {}
        self.buf = b""
        self.alive = True
        self.cpu = 0.0

    def send(self, job: KernelJob) -> bool:
        line = json.dumps({"symbol": job.symbol, "spec": job.spec, "schedule": job.schedule})
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(line.encode() + b"\n")
            self.proc.stdin.flush()
        except OSError:
            self.alive = False
            return False
        self.pending[job.symbol] = job
        return True

    def fileno(self) -> int:
        assert self.proc.stdout is not None
        return self.proc.stdout.fileno()

    def read_replies(self) -> list[dict[str, Any]]:
        """Complete reply lines available now (call when select says readable)."""
        chunk = os.read(self.fileno(), 1 << 16)
        if not chunk:
            self.alive = False
            return []
        self.buf += chunk
        *lines, self.buf = self.buf.split(b"\n")
        return [json.loads(x) for x in lines if x.strip()]

    def close(self) -> None:
        """End the worker: at end of input when it is idle, killed when it still works on
        a job that was taken back (its result is not needed)."""
        if self.pending:
            self.proc.kill()
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def compile_jobs(jobs: Sequence[KernelJob], local: Callable[[KernelJob], bytes],
                 target: CpuTarget, processes: int, stats: dict[str, Any], *,
                 before: Sequence[Callable[[], None]] = ()) -> dict[str, bytes]:
    """Object code of every job by symbol: `local(job)` in this process, the rest in
    `processes - 1` workers (none when the work is small). `before` runs here first (once
    the workers are starting). Adds CPU seconds by phase and job counts to `stats`."""
    order = sorted(jobs, key=lambda j: -j.cost)  # workers take from the front, we from the back
    nworkers = max(0, processes - 1)
    if sum(j.cost for j in jobs) < PARALLEL_MIN_COST or len(jobs) < 4:
        nworkers = 0
    out: dict[str, bytes] = {}
    if nworkers == 0:
        for fn in before:
            fn()
        t0 = time.process_time()
        for job in order:
            out[job.symbol] = local(job)
        stats["local_jobs"] = stats.get("local_jobs", 0) + len(order)
        stats["local_cpu"] = stats.get("local_cpu", 0.0) + time.process_time() - t0
        return out
    with tempfile.TemporaryDirectory(prefix="nfc-objs-") as tmp:
        workers = [_Worker(target, tmp) for _ in range(nworkers)]
        try:
            for w in workers:  # queue their first jobs: they start compiling once imported
                while w.alive and len(w.pending) < DEPTH and order and w.send(order[0]):
                    order.pop(0)
            for fn in before:
                fn()
            _run(order, local, workers, out, stats)
        finally:
            for w in workers:
                w.close()
    return out


def _add_times(stats: dict[str, Any], times: dict[str, float]) -> None:
    for k, v in times.items():
        stats[k] = stats.get(k, 0.0) + float(v)


def _take_reply(w: _Worker, reply: dict[str, Any], out: dict[str, bytes],
                stats: dict[str, Any], here: Callable[[KernelJob], None]) -> None:
    """A worker's answer for a job: its object code, or (on an error) the job compiled here,
    so that a real error surfaces with its type."""
    job = w.pending.pop(reply["symbol"])
    w.cpu = max(w.cpu, float(reply.get("cpu", 0.0)))
    if job.symbol in out:  # we took it back meanwhile
        return
    if "ok" in reply:
        with open(reply["ok"], "rb") as f:
            out[job.symbol] = f.read()
        _add_times(stats, reply.get("times", {}))
        stats["worker_jobs"] = stats.get("worker_jobs", 0) + 1
    else:
        stats.setdefault("worker_errors", []).append(reply.get("error"))
        here(job)


def _run(order: list[KernelJob], local: Callable[[KernelJob], bytes], workers: list[_Worker],
         out: dict[str, bytes], stats: dict[str, Any]) -> None:
    queue = list(order)
    head = 0  # queue[head:] is left; workers take at head, we take at the end

    def here(job: KernelJob) -> None:
        t0 = time.process_time()
        out[job.symbol] = local(job)
        stats["local_jobs"] = stats.get("local_jobs", 0) + 1
        stats["local_cpu"] = stats.get("local_cpu", 0.0) + time.process_time() - t0

    def collect(timeout: float | None) -> None:
        live = [w for w in workers if w.alive and w.pending]
        if not live:
            return
        ready, _, _ = select.select(live, [], [], timeout)
        for w in ready:
            for reply in w.read_replies():
                _take_reply(w, reply, out, stats, here)
            if not w.alive:  # died: its jobs come back to us
                for job in w.pending.values():
                    if job.symbol not in out:
                        here(job)
                w.pending.clear()

    def undone(w: _Worker) -> list[KernelJob]:
        return [j for j in w.pending.values() if j.symbol not in out]

    while head < len(queue) or any(undone(w) for w in workers):
        for w in workers:
            while w.alive and len(w.pending) < DEPTH and head < len(queue):
                if not w.send(queue[head]):
                    break
                head += 1
        collect(0.0)
        if head < len(queue):
            here(queue.pop())
            continue
        # nothing left to hand out: take back a job still waiting behind another in a
        # worker's pipe rather than idle (the worker's answer for it is then ignored)
        waiting = [undone(w)[-1] for w in workers if w.alive and len(undone(w)) >= 2]
        if waiting:
            here(waiting[0])
        elif any(undone(w) and w.alive for w in workers):
            collect(None)  # block until a worker answers
        else:
            for w in workers:  # dead workers with jobs: handled by collect, but be safe
                for job in undone(w):
                    here(job)
                w.pending.clear()
    stats["worker_cpu"] = stats.get("worker_cpu", 0.0) + sum(w.cpu for w in workers)
