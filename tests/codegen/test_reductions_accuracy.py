"""Large reductions are accurate, parallel and deterministic (docs/codegen.md, "Reductions:
blocked, parallel, invariant factors").

A float32 sum of n terms into one accumulator has an error that grows with n (1e-4 to 1e-2
relative at 6e6 terms, the bias of adding small terms to a large sum); blocked summation
bounds it by a block's error, like numpy's pairwise sum. Each result is checked against the
float64 interpreter (the same computes built in f64 and run by nfc.interp) at `RTOL` of the
sum of the absolute values of the terms (for positive terms: of the result), with the
reduction alone and with its producers fused into it, on 1 and 2 threads; the 2-thread result
must equal the 1-thread one bit for bit (the chunks of a parallel reduction do not depend on
the thread count). Max, min and an argmax stay exact.

By default the reductions have 10^6 terms (and one model's loss a batch of 2^20 rows);
NFC_REDUCTION_LONG=1 adds the 10^7-term cases (about 20 s on two cores).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from codegen_lib import F32, F64, I32, I64, check, compute, ld, tensor

from nfc.codegen.jit import compile_kernel, get_num_threads, set_num_threads
from nfc.codegen.lower import lower
from nfc.codegen.space import default_schedule
from nfc.interp import run as interp_run
from nfc.ir import Binary, Block, Call, ComputeOp, Const, Func, Index, ReturnOp, Select, Value

LONG = os.environ.get("NFC_REDUCTION_LONG") == "1"
SIZES = [10**6, *([10**7] if LONG else [])]
#: Relative error allowed against the float64 result (the issue's target for 1e7 terms).
RTOL = 1e-6


@pytest.fixture
def threads():
    """Restores the thread count a test changes."""
    before = get_num_threads()
    yield set_num_threads
    set_num_threads(before)


def _data(n: int, kind: str, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind == "positive":  # no cancellation: relative accuracy of the sum is meaningful
        return rng.uniform(0.5, 1.5, n).astype(np.float32)
    return rng.standard_normal(n).astype(np.float32)


def _program(name: str, n: int, dt) -> tuple[list[Value], list[ComputeOp]]:
    """Inputs and computes (the last one the result) of a reduction of `n` terms."""
    x = tensor("x", (n,), dt)
    if name == "sum":
        return [x], [compute({}, ld(x, "k"), dt, reduce="sum", raxes={"k": n})]
    if name == "mean":  # the division by n in the summed body, applied once to the sum
        return [x], [compute({}, Binary("/", ld(x, "k"), Const(float(n))), dt, reduce="sum",
                             raxes={"k": n})]
    if name == "sumsq":  # the difference a producer, fused into the sum or not
        y = tensor("y", (n,), dt)
        d = compute({"k": n}, Binary("-", ld(x, "k"), ld(y, "k")), dt, name="d")
        sq = Binary("*", ld(d.result, "k"), ld(d.result, "k"))
        return [x, y], [d, compute({}, sq, dt, reduce="sum", raxes={"k": n})]
    if name == "mse3d":  # a [n/1e4, 100, 100] tensor flattened by reshape, as std.nn's mse
        shape = (n // 10**4, 100, 100)
        x3, y3 = tensor("x", shape, dt), tensor("y", shape, dt)
        k = Index("k")
        idx = (Binary("//", k, Const(10**4)), Binary("%", Binary("//", k, Const(100)),
                                                     Const(100)), Binary("%", k, Const(100)))
        fx = compute({"k": n}, ld(x3, *idx), dt, name="fx")
        fy = compute({"k": n}, ld(y3, *idx), dt, name="fy")
        diff = Binary("-", ld(fx.result, "k"), ld(fy.result, "k"))
        s = compute({}, Binary("*", diff, diff), dt, reduce="sum", raxes={"k": n})
        mean = compute({}, Binary("/", ld(s.result), Const(float(n))), dt, name="mse")
        return [x3, y3], [fx, fy, s, mean]
    raise AssertionError(name)


def _run_native(ops: list[ComputeOp], inputs: list[Value], arrays: list[np.ndarray],
                fused: bool) -> np.ndarray:
    """The result of `ops` compiled as one fused kernel (producers inlined), or one kernel
    per compute with the intermediates materialised."""
    if fused:
        return np.asarray(compile_kernel(ops)(*arrays))
    env = {id(v): a for v, a in zip(inputs, arrays, strict=True)}
    for op in ops:
        kernel = compile_kernel(op)
        env[id(op.result)] = np.asarray(kernel(*[env[id(v)] for v in op.operands]))
    return env[id(ops[-1].result)]


def _reference(name: str, n: int, arrays: list[np.ndarray]) -> tuple[float, float]:
    """(result, sum of |terms|) by the float64 interpreter."""
    inputs, ops = _program(name, n, F64)
    wide = [a.astype(np.float64) for a in arrays]
    func = Func("f", inputs, Block([*ops, ReturnOp([ops[-1].result])]))
    ref = float(np.asarray(interp_run(func, wide)[0]))
    if name == "sumsq" or name == "mse3d":
        scale = abs(ref)  # squares: positive terms
    else:
        scale = float(np.abs(wide[0]).sum()) / (n if name == "mean" else 1)
    return ref, scale


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
@pytest.mark.parametrize("name,data", [("sum", "positive"), ("sum", "normal"),
                                       ("mean", "positive"), ("sumsq", "normal"),
                                       ("mse3d", "normal")])
def test_large_sum_within_1e6_of_float64(name, data, fused, n, threads):
    inputs, ops = _program(name, n, F32)
    arrays = [_data(n, data, seed).reshape(v.shape) for seed, v in enumerate(inputs)]
    ref, scale = _reference(name, n, arrays)
    got = {}
    for t in (1, 2):
        threads(t)
        got[t] = _run_native(ops, inputs, arrays, fused)
        err = abs(float(got[t]) - ref)
        assert err <= RTOL * scale, (name, data, t, float(got[t]), ref, err / scale)
    assert got[1].tobytes() == got[2].tobytes()  # the same chunks whatever the threads


def test_full_reduction_is_parallel_blocked_and_divides_once():
    # the structure the accuracy and speed come from: per-chunk partials in a parallel loop,
    # a float64 second-level accumulator flushed per block, the division applied to the sum
    from nfc.codegen.loops import For, LoopKind, Store, print_loops

    _, ops = _program("mean", 10**6, F32)
    f = lower(ops[0], default_schedule(ops[0]))
    loops = [s for s in f.body.walk() if isinstance(s, For)]
    assert any(s.kind is LoopKind.PARALLEL for s in loops), print_loops(f)
    stores = [s for s in f.body.walk() if isinstance(s, Store)]
    wide = [s for s in stores if s.buffer.dtype is F64 and s.reduce == "sum"]
    assert wide, print_loops(f)
    divides = [s for s in stores
               if any(isinstance(e, Binary) and e.op == "/" for e in s.value.walk())]
    assert len(divides) == 1 and divides[0].buffer.name == "out", print_loops(f)
    # blocks: no f32 accumulator element adds more than BLOCK_MIN terms in a row
    from nfc.codegen.lowering.reductions import BLOCK_MIN

    def resets(s, buf) -> bool:
        return any(isinstance(x, Store) and x.buffer == buf and x.reduce is None
                   for x in s.walk())

    def runs(s, path=()):
        """Per f32 reducing store: the serial iterations between resets of its accumulator
        (up to the closest enclosing statement that also resets it, in another branch)."""
        if isinstance(s, Store) and s.reduce == "sum" and s.buffer.dtype is F32:
            n, child = 1, s
            for anc in reversed(path):
                if any(c is not child and resets(c, s.buffer) for c in anc.children()):
                    break
                if isinstance(anc, For) and anc.kind is LoopKind.SERIAL:
                    c = anc.const_extent
                    n *= c if c is not None else _extent_bound(anc.extent)
                child = anc
            yield n
        for ch in s.children():
            yield from runs(ch, (*path, s))
    assert 1 < max(runs(f.body)) <= BLOCK_MIN, print_loops(f)
    # on one thread too (31,250 vectors in a row without blocks)
    from nfc.codegen.schedule import replace

    f = lower(ops[0], replace(default_schedule(ops[0]), parallel_reduce=0))
    assert 1 < max(runs(f.body)) <= BLOCK_MIN, print_loops(f)


def _extent_bound(e) -> int:
    """The largest value of a loop extent `min(c, ...)`."""
    assert isinstance(e, Call) and e.fn == "min" and isinstance(e.args[0], Const), e
    return int(e.args[0].value)


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
def test_max_min_argmax_stay_exact(fused, threads):
    n = 10**6
    x = tensor("x", (n,), F32)
    mx = compute({}, ld(x, "k"), F32, reduce="max", raxes={"k": n}, name="mx")
    mn = compute({}, ld(x, "k"), F32, reduce="min", raxes={"k": n}, name="mn")
    # argmax: the first index holding the maximum
    first = Select(Binary("==", ld(x, "k"), ld(mx.result)), Index("k"), Const(n))
    am = compute({}, first, I64, reduce="min", raxes={"k": n}, name="am")
    arr = _data(n, "normal", 3)
    arr[[10, n // 2, n - 7]] = arr.max() + 1.0  # ties: the first one wins
    for t in (1, 2):
        threads(t)
        assert float(_run_native([mx], [x], [arr], fused)) == arr.max()
        assert float(_run_native([mn], [x], [arr], fused)) == arr.min()
        assert int(_run_native([mx, am], [x], [arr], fused)) == int(np.argmax(arr)) == 10



MODEL = """
import std.nn
model regression(batch = 1048576, inputs = 8) {
  input  x: f32[batch, inputs]
  input  y: f32[batch]
  param  w: f32[inputs, 1] = glorot_uniform
  p = linear_nobias(x, w)
  loss = mse(p, reshape<[-1, 1]>(y))
  output loss
  minimize loss with sgd(lr = 0.1)
}
"""


@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "unfused"])
def test_model_loss_over_a_big_batch(fuse, tmp_path, monkeypatch):
    # the mean squared error of 2^20 rows (std.nn's mse: a reshape, then a sum divided by
    # the count), built like `nfc compile` with and without fusion, on 1 and 2 threads,
    # against the model's float64 twin run by the interpreter
    pytest.importorskip("nfc.runtime.build", reason="the CPU backend is not available")
    from nfc.runtime.build import build_library, frontend_module, pipeline_for, run_pipeline
    from nfc.runtime.loader import load
    from nfc.testing import widen

    monkeypatch.setenv("NFC_CACHE_DIR", str(tmp_path / "cache"))
    src = tmp_path / "regression.nf"
    src.write_text(MODEL)
    module = frontend_module(src, {})
    wide = widen(module)
    run_pipeline(module, pipeline_for(src, tuning=False, fuse=fuse))
    model = load(build_library(module, str(tmp_path / "m.so"), use_cache=False).path)
    model.init(0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1 << 20, 8)).astype(np.float32)
    y = rng.standard_normal(1 << 20).astype(np.float32)
    w = model.params["w"].astype(np.float64)
    fwd = wide.func("forward")
    ref = float(np.asarray(interp_run(fwd, {"x": x.astype(np.float64), "y": y.astype(np.float64),
                                            "w": w}, module=wide)[0]))
    got = {}
    for t in (1, 2):
        model.set_num_threads(t)
        got[t] = float(model.forward(x=x, y=y)["loss"])
        assert abs(got[t] - ref) <= RTOL * ref, (t, got[t], ref)
    assert got[1] == got[2]


def _small_reductions() -> list[ComputeOp]:
    """Reductions with ragged blocks, tiles, output-dependent factors and other kinds."""
    y = tensor("y", (37, 2049))
    z, g = tensor("z", (5, 300, 7)), tensor("g", (7,))
    xi = tensor("xi", (5000,), I32)
    x3, k = tensor("x3", (7, 13, 11)), Index("k")  # flattened by an inlined reshape, ragged
    flat = ld(x3, Binary("//", k, Const(143)), Binary("%", Binary("//", k, Const(11)),
                                                       Const(13)), Binary("%", k, Const(11)))
    return [
        compute({"i": 37}, Binary("/", ld(y, "i", "k"), Const(7.0)), reduce="sum",
                raxes={"k": 2049}),
        compute({"j": 2049}, ld(y, "i", "j"), reduce="sum", raxes={"i": 37}),
        compute({"c": 7}, Binary("*", ld(z, "n", "h", "c"), ld(g, "c")), reduce="sum",
                raxes={"n": 5, "h": 300}),
        compute({}, ld(z, "n", "h", "c"), reduce="max", raxes={"n": 5, "h": 300, "c": 7}),
        compute({}, ld(xi, "k"), I32, reduce="sum", raxes={"k": 5000}),
        compute({}, Binary("*", flat, flat), reduce="sum", raxes={"k": 1001}),
    ]


@pytest.mark.parametrize("chunks", [0, 3, 64])
@pytest.mark.parametrize("n", range(6))
def test_blocked_and_chunked_schedules_match_the_interpreter(n, chunks, threads):
    # any reduction kind under the default schedule, cut into `chunks` parallel chunks
    from nfc.codegen.schedule import replace

    op = _small_reductions()[n]
    sched = default_schedule(op)
    if chunks:
        sched = replace(sched, parallel=(), parallel_reduce=chunks)
    threads(2)
    check(op, sched, seed=n)


def test_parallel_reduce_schedule_round_trips():
    from nfc.codegen.schedule import Schedule, replace

    _, ops = _program("sum", 10**6, F32)
    sched = default_schedule(ops[0])
    assert sched.parallel_reduce > 0 and not sched.parallel
    assert Schedule.from_dict(sched.to_dict()) == sched
    # left out of the dict when unset, so schedules (and kernel keys) without it stay as they were
    assert "parallel_reduce" not in replace(sched, parallel_reduce=0).to_dict()
