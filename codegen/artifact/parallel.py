"""Object code for several LLVM modules at once, in worker processes.

llvmlite serialises LLVM work behind one process-wide lock, so compiling an artifact's kernels
on several cores takes several processes (TOOLCHAIN.md). The artifact builder splits its
kernels into independent modules; `emit_objects` compiles the first in this process and the
others in `python -c` workers fed the LLVM IR text on stdin (plain subprocesses rather than
multiprocessing, which would re-import the caller's `__main__`). The result is the same object
code as a sequential build: each module is optimised on its own either way.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence

from nfc.codegen.cpu import CpuTarget

_WORKER = "from nfc.codegen.artifact.parallel import worker; worker()"


def default_jobs() -> int:
    """Worker count: `NFC_COMPILE_JOBS`, else the usable cores (at most 4)."""
    env = os.environ.get("NFC_COMPILE_JOBS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    return max(1, min(4, cores))


def worker() -> None:
    """Read `{"target": ...}` from argv[1] and LLVM IR from stdin; write the object to stdout."""
    from nfc.codegen.native import emit_object

    spec = json.loads(sys.argv[1])
    target = CpuTarget(spec["cpu"], spec["features"], spec["triple"])
    text = sys.stdin.read()
    sys.stdout.buffer.write(emit_object(text, target))
    sys.stdout.buffer.flush()


def emit_objects(texts: Sequence[str], target: CpuTarget, jobs: int) -> list[bytes]:
    """Object code of each LLVM IR text, `jobs` at a time (this process does one)."""
    from nfc.codegen.native import LinkError, emit_object

    if jobs <= 1 or len(texts) <= 1:
        return [emit_object(t, target) for t in texts]
    spec = json.dumps({"cpu": target.cpu, "features": target.features, "triple": target.triple})
    out: list[bytes] = []
    pending = list(texts)
    while pending:
        batch, pending = pending[:jobs], pending[jobs:]
        procs = [subprocess.Popen([sys.executable, "-c", _WORKER, spec], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                 for _ in batch[1:]]
        try:
            for p, text in zip(procs, batch[1:], strict=True):
                assert p.stdin is not None
                p.stdin.write(text.encode())
                p.stdin.close()
            first = emit_object(batch[0], target)
            rest = []
            for p in procs:
                assert p.stdout is not None and p.stderr is not None
                obj = p.stdout.read()
                err = p.stderr.read()
                if p.wait() != 0:
                    raise LinkError(f"a compile worker failed:\n{err.decode(errors='replace')}")
                rest.append(obj)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        out += [first, *rest]
    return out
