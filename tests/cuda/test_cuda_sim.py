"""The GPU lowering, executed by the simulator, against the interpreter; and the simulator's
race, bounds and divergence checks on deliberately broken kernels."""

from __future__ import annotations

import numpy as np
import pytest
from cuda_lib import (
    UNIT,
    case_programs,
    drop_barrier,
    inputs_of,
    matmul,
    random_inputs,
    reference,
    softmax,
    tensor,
    with_body,
)

from nfc.codegen.cuda.lower import lower_program
from nfc.codegen.cuda.schedule import ElementwiseSchedule, GemmSchedule, ReduceSchedule
from nfc.codegen.cuda.sim import (
    BoundsError,
    DivergenceError,
    RaceError,
    SimError,
    simulate,
)
from nfc.codegen.loops import Barrier, BufLoad, For, If, LoopKind, Seq, Stmt, Store
from nfc.ir import Binary, ComputeOp, Const, DType, Index

PROGRAMS = case_programs()


@pytest.mark.parametrize("case", PROGRAMS, ids=[c[0] for c in PROGRAMS])
def test_simulated_kernels_match_the_interpreter(case):
    name, op, program, positive, precision = case
    ins = random_inputs(inputs_of(op), 1, positive=positive, ints=(0, 13))
    if name.startswith("gather"):  # indices into a 50-row table
        ins[1] = np.random.default_rng(2).integers(0, 50, ins[1].shape).astype(np.int32)
    got = simulate(program, ins)
    want = reference(op, ins)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        if precision == "fma":
            # f32 FMA in another summation order: a few units of f32 rounding
            np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-5)
            continue
        # Tensor Cores: every product carries up to 2u of relative error from rounding its
        # inputs to the precision's unit roundoff u, the interpreter's own f16/bf16 products
        # one more u, f32 sums about K * 2^-24 each side, an f16/bf16 output one rounding on
        # each side: |got - want| <= (3u + K 2^-23) sum_k |a_k b_k| + 2 u_out |want|
        single = op if isinstance(op, ComputeOp) else op[-1]
        k = int(np.prod([a.extent for a in single.raxes]))
        mag = np.abs(reference(op, [np.abs(x) for x in ins])[0].astype(np.float64))
        u, u_out = UNIT[precision], UNIT.get(single.result.dtype.value, 0.0)
        want64 = w.astype(np.float64)
        bound = (3 * u + k * 2.0**-23) * mag * 1.01 + 2 * u_out * np.abs(want64) + 1e-30
        err = np.abs(g.astype(np.float64) - want64)
        assert (err <= bound).all(), f"max excess {np.max(err - bound)}"
        # the typical error is of the order of u * sqrt(K) of the magnitudes
        assert np.mean(err) <= u * np.sqrt(k) * np.mean(mag)


def test_block_order_and_waves_do_not_change_results():
    op = matmul(70, 50, 40)
    p = lower_program(op, GemmSchedule("fma", 32, 32, 8, 2, 2))
    ins = random_inputs(inputs_of(op), 3)
    (base,) = simulate(p, ins)
    for order, wave in (("shuffled", 1), ("reversed", 2), ("shuffled", None)):
        (got,) = simulate(p, ins, order=order, wave_blocks=wave, seed=7)
        np.testing.assert_array_equal(got, base)


def test_group_runs_stage_by_stage_through_temporaries():
    p = lower_program(softmax(), name="softmax")
    # exp is inlined into its two consumers: max, sum, normalise
    assert [k.kind for k in p.kernels] == ["reduce", "reduce", "elementwise"]
    assert [b.name for b in p.temps] == ["m", "s"]


# ---------------------------------------------------------------------------------------------
# broken kernels are reported


def _sum_rows():
    x = tensor("x", (10, 37))
    from cuda_lib import compute, ld

    return compute({"i": 10}, ld(x, "i", "j"), reduce="sum", raxes={"j": 37})


@pytest.mark.parametrize("n", [0, 3])
def test_block_reduction_without_a_barrier_is_a_race(n):
    op = _sum_rows()
    p = with_body(lower_program(op, ReduceSchedule("block", 128, False), name="tree"),
                  lambda s: drop_barrier(s, n))
    with pytest.raises(RaceError, match=r"kernel 'tree': shared-memory race on 'red' element "
                       r"\d+ of block \d+: thread \d+ reads what thread \d+ wrote"):
        simulate(p, random_inputs(inputs_of(op)))


@pytest.mark.parametrize("precision,n,scope,what", [
    ("fma", 0, "block", "reads what"),            # tiles read before all threads stored
    ("fma", 1, "block", "writes what thread"),    # next tiles stored while others still read
    ("f16", 0, "block", "loads a fragment over"),
    ("f16", 1, "block", "writes what thread"),
    ("f16", 0, "warp", "reads what"),             # epilogue scratch read before the store ends
    ("f16", 1, "warp", "writes what thread"),
])
def test_gemm_without_a_barrier_is_a_race(precision, n, scope, what):
    dt = DType.F16 if precision == "f16" else DType.F32
    op = matmul(40, 40, 40, dt)
    p = with_body(lower_program(op, name="mm"), lambda s: drop_barrier(s, n, scope))
    with pytest.raises(RaceError, match=what):
        simulate(p, random_inputs(inputs_of(op)))


def _map_stores(s: Stmt, fn) -> Stmt:
    from nfc.codegen.loops import Allocate

    if isinstance(s, Seq):
        return Seq(tuple(_map_stores(c, fn) for c in s.body))
    if isinstance(s, For):
        return For(s.var, s.extent, s.kind, _map_stores(s.body, fn))
    if isinstance(s, If):
        return If(s.cond, _map_stores(s.then, fn))
    if isinstance(s, Allocate):
        return Allocate(s.buffer, _map_stores(s.body, fn))
    return fn(s) if isinstance(s, Store) else s


def test_out_of_range_global_index_is_an_error():
    op = _sum_rows()
    p = lower_program(op, ReduceSchedule("thread", 32), name="rows")

    def shift(s: Store) -> Store:  # read x[i, j + 1]: past the end for j = 36
        if s.reduce is None or not isinstance(s.value, BufLoad):
            return s
        i, j = s.value.indices
        return Store(s.buffer, s.indices, BufLoad(s.value.buffer, (i, j + Const(1))), s.reduce)
    with pytest.raises(BoundsError, match=r"kernel 'rows': read of global buffer 'x' \[10, 37\] "
                       r"with index 37 in dimension 1 by thread \d+ of block 0"):
        simulate(with_body(p, lambda s: _map_stores(s, shift)), random_inputs(inputs_of(op)))


def test_barrier_in_divergent_code_is_an_error():
    op = _sum_rows()
    p = lower_program(op, ReduceSchedule("block", 64, True), name="div")

    def guard(s: Stmt) -> Stmt:
        if isinstance(s, Seq):
            return Seq(tuple(If(Binary("<", Index("tx"), Const(16)), c) if isinstance(c, Barrier)
                             else guard(c) for c in s.body))
        if isinstance(s, For):
            return For(s.var, s.extent, s.kind, guard(s.body))
        from nfc.codegen.loops import Allocate

        if isinstance(s, Allocate):
            return Allocate(s.buffer, guard(s.body))
        return s
    with pytest.raises(DivergenceError, match=r"__syncthreads\(\) reached by 16 of 64 threads "
                       r"of block \d+"):
        simulate(with_body(p, guard), random_inputs(inputs_of(op)))


def test_unwritten_output_elements_are_reported():
    op = _sum_rows()
    p = lower_program(op, ElementwiseSchedule() if op.reduce is None else
                      ReduceSchedule("thread", 32), name="partial")

    def half(s: Stmt) -> Stmt:  # the thread loop covers only the first 16 threads
        if isinstance(s, For) and s.kind is LoopKind.THREAD_X:
            return For(s.var, s.extent, s.kind,
                       If(Binary("<", Index(s.var), Const(5)), s.body))
        if isinstance(s, For):
            return For(s.var, s.extent, s.kind, half(s.body))
        return s
    with pytest.raises(SimError, match="leaves 5 of 10 elements of 'out' unwritten"):
        simulate(with_body(p, half), random_inputs(inputs_of(op)))
