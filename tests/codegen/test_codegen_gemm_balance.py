"""Parallel GEMMs without batch loops split over B's panels when their M blocks would split
unevenly over two threads (nfc.codegen.gemm_space, `GemmSpace._panels_balance`): the LSTM LM's
gate GEMM (M = 16: blocks of 12 and 4 rows) and SC-RNN's input projection (M = 64: 36 and 28).
The panel loop runs outermost and in parallel; each output's sum over k keeps its order, so
the kernel's results are bit for bit the M-parallel schedule's, on one thread and on two.
Checked against the interpreter; the same assertions hold on the AVX2 path (6 x 16 tiles)."""

from __future__ import annotations

import numpy as np
import pytest
from codegen_lib import check, compute, inputs_of, ld, random_inputs, tensor

from nfc.codegen.jit import compile_kernel, get_num_threads, set_num_threads
from nfc.codegen.space import GemmSpace, schedule_space


def gemm(m: int, k: int, n: int):
    a, b = tensor("a", (m, k)), tensor("b", (k, n))
    return compute({"i": m, "j": n}, ld(a, "i", "kk") * ld(b, "kk", "j"), reduce="sum",
                   raxes={"kk": k})


@pytest.mark.parametrize("shape", [(16, 320, 1024), (64, 784, 128)])
def test_uneven_row_blocks_run_in_parallel_over_panels_with_the_same_sums(shape):
    op = gemm(*shape)
    space = schedule_space(op)
    assert isinstance(space, GemmSpace)
    cfg = space.default()
    assert cfg["swap"] == 0 and cfg["parallel"] == 1
    assert cfg["jouter"] == 1  # the panels, not the 2 uneven M blocks, are the parallel loop
    sched = space.to_schedule(cfg)
    assert sched.parallel == ("j.0",) and sched.order[0] == "j.0"
    rows = space.to_schedule({**cfg, "jouter": 0})
    assert rows.parallel == ("i.0",)
    ins = random_inputs(inputs_of(op), seed=7)
    got, before = {}, get_num_threads()
    try:
        for threads in (1, 2):
            set_num_threads(threads)
            got[threads] = compile_kernel(op, sched)(*ins)
            assert np.array_equal(got[threads], compile_kernel(op, rows)(*ins))
    finally:
        set_num_threads(before)
    assert np.array_equal(got[1], got[2])
    check(op, sched, inputs=ins)


@pytest.mark.parametrize("shape", [(512, 256, 256), (784, 64, 128)])
def test_even_row_blocks_stay_parallel_over_rows(shape):
    # many M blocks share out evenly (0.516 or 0.505 of the rows to the busier thread against
    # 0.5 of the columns): the former schedule
    cfg = schedule_space(gemm(*shape)).default()
    assert cfg["parallel"] == 1 and cfg["jouter"] == 0


def test_the_rule_compares_the_busier_threads_share():
    balance = GemmSpace._panels_balance
    assert balance(16, 1024, 6, 2, 64)  # rows 12 of 16 vs 8 of 16 panels
    assert balance(64, 128, 6, 6, 64)  # rows 36 of 64 vs 1 of 2 panels
    assert not balance(64, 64, 6, 6, 64)  # one panel: nothing to share
    assert not balance(64, 784, 6, 6, 64)  # 7 of 13 panels (0.571) vs 36 of 64 rows (0.5625)


def test_the_default_schedules_are_part_of_the_kernel_cache_key():
    # a kernel with the default schedule is cached under the code generator's fingerprint:
    # without the GEMM template's module in it, a changed default rule would reuse objects
    # compiled with the former one
    from nfc.codegen.artifact.kcache import CODEGEN_MODULES

    assert GemmSpace.__module__ in CODEGEN_MODULES
