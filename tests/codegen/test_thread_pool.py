"""nfc's thread pool (nfc.codegen.llvm.threadpool): the caller never waits for a helper that
has not joined, late helpers leave a closed region alone, results are the same bits on 1 and
2 threads and with either backend (`NFC_THREADS_BACKEND=nfc|gomp`), and many regions in a row
(with delayed helpers and two calling threads) neither deadlock nor go wrong.

No timing: who ran what is read from the pool's counters (`thread_pool_stats`), and a delayed
helper is made by the test hook (`hold_thread_pool`), not by sleeping. The backend is read
once per process, so comparisons across backends run in subprocesses (with a timeout, so that
a deadlock fails instead of hanging the suite).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from codegen_lib import assert_matches, compute, inputs_of, ld, matmul, random_inputs, tensor

from nfc.codegen.jit import (
    compile_kernel,
    get_num_threads,
    hold_thread_pool,
    set_num_threads,
    thread_pool_stats,
)
from nfc.codegen.schedule import Schedule
from nfc.ir import Const

HERE = Path(__file__).resolve().parent


@pytest.fixture
def two_threads():
    old = get_num_threads()
    set_num_threads(2)
    yield
    hold_thread_pool(False)
    set_num_threads(old)


def _scale_kernel(n: int):
    """`out[i] = 2 x[i] + 1`, every call a region (no serial path, no back-off)."""
    from nfc.codegen.devbench import always_parallel

    x = tensor("x", (n,))
    op = compute({"i": n}, ld(x, "i") * Const(2.0) + Const(1.0))
    with always_parallel():
        return op, compile_kernel(op, Schedule(parallel=("i",)))


def _delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before[k] for k in before}


def test_caller_finishes_a_region_without_a_late_helper(two_threads):
    op, k = _scale_kernel(4096)
    ins = random_inputs(inputs_of(op), seed=1)
    def seen() -> int:  # regions the helper has seen (joined, or found closed)
        return thread_pool_stats()["joins"] + thread_pool_stats()["late"]

    # until the helper is up (a new thread may start after the first regions are over)
    first, deadline = seen(), time.monotonic() + 120
    while seen() == first and time.monotonic() < deadline:
        assert_matches(op, ins, [k(*ins)])
        time.sleep(0.001)
    assert thread_pool_stats()["started"] >= 1 and seen() > first
    hold_thread_pool(True)  # helpers are woken but cannot join: the caller must finish alone
    before = thread_pool_stats()
    out = k(*ins)
    held = _delta(before, thread_pool_stats())
    assert held["regions"] == 1 and held["helpers"] == 0 and held["joins"] == 0
    assert held["caller"] == 8  # all chunks (4 per thread) ran on the caller
    assert_matches(op, ins, [out])
    hold_thread_pool(False)  # the helper wakes, finds the region closed and goes back
    deadline = time.monotonic() + 120
    while thread_pool_stats()["late"] == before["late"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert thread_pool_stats()["late"] > before["late"]
    before = thread_pool_stats()
    for seed in range(20):  # and the pool still works: every chunk run once, by someone
        ins = random_inputs(inputs_of(op), seed=seed)
        assert_matches(op, ins, [k(*ins)])
    d = _delta(before, thread_pool_stats())
    assert d["regions"] == 20 and d["caller"] + d["helpers"] == 20 * 8


_STRESS = r"""
import json, sys, threading
import numpy as np
sys.path.insert(0, sys.argv[1])
from codegen_lib import compute, ld, tensor
from nfc.codegen.devbench import always_parallel
from nfc.codegen.jit import compile_kernel, hold_thread_pool, set_num_threads, thread_pool_stats
from nfc.codegen.schedule import Schedule
from nfc.ir import Const
n = 256
x = tensor("x", (n,))
op = compute({"i": n}, ld(x, "i") * Const(2.0) + Const(1.0))
with always_parallel():
    k = compile_kernel(op, Schedule(parallel=("i",)))
set_num_threads(2)
xs = np.arange(n, dtype=np.float32)
want = xs * np.float32(2) + np.float32(1)
out = np.empty(n, np.float32)
bad = 0
for r in range(int(sys.argv[2])):
    if r % 97 == 0:
        hold_thread_pool(r % 194 == 0)  # held now and then: late helpers
    out[:] = np.nan
    k.run([out], [xs])
    bad += not np.array_equal(out, want)
hold_thread_pool(False)
single = thread_pool_stats()
errors = []
def caller(seed):  # two threads calling at once: one owns the pool, the other runs alone
    o = np.empty(n, np.float32)
    for _ in range(int(sys.argv[3])):
        o[:] = np.nan
        k.run([o], [xs])
        if not np.array_equal(o, want):
            errors.append(seed)
ts = [threading.Thread(target=caller, args=(s,)) for s in range(2)]
for t in ts: t.start()
for t in ts: t.join()
print(json.dumps({"bad": bad, "errors": len(errors), "single": single}))
"""


def test_many_regions_neither_deadlock_nor_go_wrong():
    regions = int(os.environ.get("NFC_POOL_STRESS", "10000"))
    proc = subprocess.run([sys.executable, "-c", _STRESS, str(HERE), str(regions), "1000"],
                          capture_output=True, text=True, timeout=900,
                          env={**os.environ, "NFC_THREADS_BACKEND": "nfc"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["bad"] == 0 and got["errors"] == 0
    s = got["single"]
    assert s["regions"] == regions and s["caller"] + s["helpers"] == 8 * regions


_BACKEND = r"""
import sys
import numpy as np
sys.path.insert(0, sys.argv[1])
from codegen_lib import inputs_of, matmul, random_inputs
from nfc.codegen.devbench import always_parallel
from nfc.codegen.jit import compile_kernel, set_num_threads, thread_pool_stats
op = matmul(256, 192, 128)
with always_parallel():
    k = compile_kernel(op)
ins = random_inputs(inputs_of(op), seed=3)
for t in (1, 2):
    set_num_threads(t)
    for _ in range(5):
        np.save(sys.argv[2] + f"_{t}.npy", k(*ins))
print(thread_pool_stats()["regions"])
"""


def test_results_the_same_bits_with_either_backend(tmp_path):
    """A matmul on 1 and 2 threads under each backend: four equal arrays (chunk k is always
    the same iterations), and the pool ran the regions only under `nfc`."""
    outs = {}
    for be in ("nfc", "gomp"):
        stem = str(tmp_path / be)
        proc = subprocess.run([sys.executable, "-c", _BACKEND, str(HERE), stem],
                              capture_output=True, text=True, timeout=600,
                              env={**os.environ, "NFC_THREADS_BACKEND": be})
        assert proc.returncode == 0, proc.stderr[-3000:]
        pooled = int(proc.stdout.strip().splitlines()[-1])
        assert (pooled > 0) == (be == "nfc"), (be, pooled)
        for t in (1, 2):
            outs[be, t] = np.load(f"{stem}_{t}.npy")
    ref = outs["nfc", 1]
    for key, arr in outs.items():
        np.testing.assert_array_equal(arr, ref, err_msg=str(key))
    op = matmul(256, 192, 128)
    assert_matches(op, random_inputs(inputs_of(op), seed=3), [ref])
