"""The numpy interpreter (nfc.interp) against direct numpy formulations."""

from __future__ import annotations

import math

import numpy as np
import pytest

from nfc import interp
from nfc.interp import InterpError, erf, run
from nfc.ir import (
    Axis,
    Binary,
    Block,
    Call,
    CallOp,
    Cast,
    ComputeOp,
    Const,
    DType,
    Expr,
    Func,
    Index,
    KernelOp,
    Load,
    Module,
    ReturnOp,
    Select,
    TensorType,
    Value,
    YieldOp,
    lift,
)
from nfc.philox import philox_uniform

n, c, h, w, r, s, i, j, k = (Index(x) for x in "nchwrsijk")
RNG = np.random.default_rng(1234)


def arg(name: str, shape: tuple[int, ...], dt: DType = DType.F32) -> Value:
    return Value(TensorType(shape, dt), name)


def compute(name: str, body: Expr, dims: dict[str, int], raxes: dict[str, int] | None = None,
            dt: DType = DType.F32, reduce: str = "sum") -> ComputeOp:
    d = tuple(Axis(a, e) for a, e in dims.items())
    ra = tuple(Axis(a, e) for a, e in (raxes or {}).items())
    return ComputeOp(TensorType(tuple(dims.values()), dt), d, body,
                     reduce=reduce if ra else None, raxes=ra, name=name)


def func(name: str, args: list[Value], *ops, ret=None) -> Func:
    ops = list(ops)
    values = ret if ret is not None else [ops[-1].results[0]]
    return Func(name, args, Block(ops + [ReturnOp(values)]))


def data(shape, dt: DType = DType.F32) -> np.ndarray:
    return RNG.standard_normal(shape).astype(dt.numpy)


def tol(dt: DType) -> dict[str, float]:
    return {"rtol": 1e-5, "atol": 1e-5} if dt == DType.F32 else {"rtol": 1e-12, "atol": 1e-12}


def lt(a, b) -> Expr: return Binary("<", lift(a), lift(b))
def le(a, b) -> Expr: return Binary("<=", lift(a), lift(b))
def both(a, b) -> Expr: return Binary("and", a, b)


def matmul(dt: DType, m: int = 16, kk: int = 32, nn: int = 8) -> Func:
    x, y = arg("x", (m, kk), dt), arg("y", (kk, nn), dt)
    op = compute("z", Load(x, (i, k)) * Load(y, (k, j)), {"i": m, "j": nn}, {"k": kk}, dt)
    return func("mm", [x, y], op)


@pytest.mark.parametrize("dt", [DType.F32, DType.F64])
def test_matmul(dt):
    a, b = data((16, 32), dt), data((32, 8), dt)
    (z,) = run(matmul(dt), [a, b])
    assert z.dtype == dt.numpy and z.shape == (16, 8)
    np.testing.assert_allclose(z, a @ b, **tol(dt))


def conv2d(dt: DType, pad: int = 1) -> Func:
    x, wt = arg("x", (2, 3, 7, 6), dt), arg("w", (4, 3, 3, 3), dt)
    hh, ww = h + r - pad, w + s - pad
    g = both(both(le(0, hh), lt(hh, 7)), both(le(0, ww), lt(ww, 6)))
    body = Select(g, Load(x, (n, c, hh, ww)), Const(0.0)) * Load(wt, (Index("o"), c, r, s))
    op = compute("y", body, {"n": 2, "o": 4, "h": 7, "w": 6}, {"c": 3, "r": 3, "s": 3}, dt)
    return func("conv", [x, wt], op)


def conv_ref(x: np.ndarray, wt: np.ndarray, pad: int = 1) -> np.ndarray:
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    nb, _, hh, ww = x.shape
    out = np.zeros((nb, wt.shape[0], hh, ww), dtype=np.float64)
    for rr in range(3):
        for ss in range(3):
            out += np.einsum("nchw,oc->nohw", xp[:, :, rr:rr + hh, ss:ss + ww],
                             wt[:, :, rr, ss].astype(np.float64))
    return out


@pytest.mark.parametrize("dt", [DType.F32, DType.F64])
def test_conv_with_padding_guards(dt):
    x, wt = data((2, 3, 7, 6), dt), data((4, 3, 3, 3), dt)
    (y,) = run(conv2d(dt), {"x": x, "w": wt})
    assert y.dtype == dt.numpy
    np.testing.assert_allclose(y, conv_ref(x, wt), **tol(dt))


def test_unguarded_read_raises_with_location():
    x = arg("x", (5,))
    op = compute("y", Load(x, (i - 1,)), {"i": 5})
    with pytest.raises(InterpError, match=r"%x.*dimension 0 index -1 is outside \[0, 4\] at i=0"):
        run(func("f", [x], op), [data(5)])


def test_untaken_branch_may_read_out_of_bounds():
    x = arg("x", (5,))
    op = compute("y", Select(lt(i, 5), Load(x, (i,)), Load(x, (i + 10,))), {"i": 5})
    a = data(5)
    np.testing.assert_array_equal(run(func("f", [x], op), [a])[0], a)


def test_reshape_with_floordiv_and_mod():
    x = arg("x", (6, 4))
    op = compute("y", Load(x, ((i * 8 + j) // 4, (i * 8 + j) % 4)), {"i": 3, "j": 8})
    a = data((6, 4))
    np.testing.assert_array_equal(run(func("f", [x], op), [a])[0], a.reshape(3, 8))


@pytest.mark.parametrize("dt", [DType.F32, DType.F64])
def test_softmax_in_four_computes(dt):
    x = arg("x", (5, 11), dt)
    m = compute("m", Load(x, (i, k)), {"i": 5}, {"k": 11}, dt, reduce="max")
    e = compute("e", Call("exp", (Load(x, (i, j)) - Load(m.result, (i,)),)), {"i": 5, "j": 11},
                dt=dt)
    sm = compute("s", Load(e.result, (i, k)), {"i": 5}, {"k": 11}, dt)
    y = compute("y", Load(e.result, (i, j)) / Load(sm.result, (i,)), {"i": 5, "j": 11}, dt=dt)
    a = data((5, 11), dt) * 5
    (out,) = run(func("softmax", [x], m, e, sm, y), [a])
    ref = np.exp(a - a.max(1, keepdims=True))
    np.testing.assert_allclose(out, ref / ref.sum(1, keepdims=True), **tol(dt))


@pytest.mark.parametrize(("red", "ref"), [("max", np.max), ("min", np.min), ("prod", np.prod),
                                          ("sum", np.sum)])
def test_reductions(red, ref):
    x = arg("x", (4, 6, 5), DType.F64)
    op = compute("y", Load(x, (i, k, j)), {"i": 4, "j": 5}, {"k": 6}, DType.F64, reduce=red)
    a = data((4, 6, 5), DType.F64) - 3.0
    np.testing.assert_allclose(run(func("f", [x], op), [a])[0], ref(a, axis=1), rtol=1e-13)


@pytest.mark.parametrize("limit", [1, 7, 64, 1000])
@pytest.mark.parametrize("red", ["sum", "max", "prod"])
def test_chunking_gives_the_same_result(monkeypatch, limit, red):
    # big reduction, small output: chunks cut reduction axes and accumulate partial results
    x = arg("x", (3, 4, 10), DType.F64)
    op = compute("y", Load(x, (i, k, Index("l"))) * 0.5, {"i": 3}, {"k": 4, "l": 10},
                 DType.F64, reduce=red)
    f = func("f", [x], op)
    a = data((3, 4, 10), DType.F64)
    want = run(f, [a])[0]
    monkeypatch.setattr(interp, "CHUNK_ELEMENTS", limit)
    np.testing.assert_allclose(run(f, [a])[0], want, rtol=1e-13)
    ref = {"sum": np.sum, "max": np.max, "prod": np.prod}[red]
    np.testing.assert_allclose(want, ref((a * 0.5).reshape(3, -1), axis=1), rtol=1e-13)


def test_chunked_matmul(monkeypatch):
    monkeypatch.setattr(interp, "CHUNK_ELEMENTS", 100)
    a, b = data((16, 32), DType.F64), data((32, 8), DType.F64)
    np.testing.assert_allclose(run(matmul(DType.F64), [a, b])[0], a @ b, rtol=1e-12)


def test_philox_compute_matches_reference():
    rng = arg("rng", (2,), DType.I64)
    key = Load(rng, (Const(0),)) + 7
    ctr = Load(rng, (Const(1),)) * 12 + i * 4 + j
    u = compute("u", Call("philox", (key, ctr)), {"i": 3, "j": 4})
    drop = compute("d", Select(lt(Load(u.result, (i, j)), 0.5), Const(0.0), Const(2.0)),
                   {"i": 3, "j": 4})
    seeds = np.array([11, 5], dtype=np.int64)
    uu, dd = run(func("f", [rng], u, drop, ret=[u.result, drop.result]), [seeds])
    ref = philox_uniform(np.int64(18), 60 + np.arange(12)).astype(np.float32).reshape(3, 4)
    assert uu.dtype == np.float32
    np.testing.assert_array_equal(uu, ref)
    np.testing.assert_array_equal(dd, np.where(ref < 0.5, 0.0, 2.0))


def test_call_and_kernel():
    x = arg("x", (4,), DType.F64)
    gx = arg("gx", (4,), DType.F64)
    g_op = compute("sq", Load(gx, (i,)) * Load(gx, (i,)), {"i": 4}, dt=DType.F64)
    g = func("g", [gx], g_op)
    call = CallOp("g", [x], [TensorType((4,), DType.F64)], names=["c"])
    k1 = compute("k1", Load(call.results[0], (i,)) + 1.0, {"i": 4}, dt=DType.F64)
    k2 = compute("k2", Load(k1.result, (i,)) * Load(x, (i,)), {"i": 4}, dt=DType.F64)
    kern = KernelOp(Block([k1, k2, YieldOp([k1.result, k2.result])]), names=["a", "b"])
    tot = compute("t", Load(kern.results[1], (k,)), {}, {"k": 4}, dt=DType.F64)
    f = func("f", [x], call, kern, tot, ret=[kern.results[0], tot.result, x])
    mod = Module("m", [g, f])
    a = data(4, DType.F64)
    out = run(f, [a], module=mod)
    np.testing.assert_allclose(out[0], a * a + 1)
    np.testing.assert_allclose(out[1], np.sum((a * a + 1) * a))
    assert out[1].shape == ()
    np.testing.assert_array_equal(out[2], a)
    assert out[2] is not a  # a returned argument is copied
    with pytest.raises(InterpError, match="@g"):
        run(f, [a])


def test_input_checking_names_the_argument():
    f = matmul(DType.F32)
    a, b = data((16, 32)), data((32, 8))
    with pytest.raises(ValueError, match="'%y'.*shape"):
        run(f, [a, b.T])
    with pytest.raises(ValueError, match="'%x'.*dtype float64"):
        run(f, [a.astype(np.float64), b])
    with pytest.raises(ValueError, match="missing argument '%y'"):
        run(f, {"x": a})
    with pytest.raises(ValueError, match="no argument named q"):
        run(f, {"x": a, "y": b, "q": b})
    with pytest.raises(ValueError, match="takes 2 arguments, 1 given"):
        run(f, [a])


def test_integer_floor_semantics_and_errors():
    x = arg("x", (7,), DType.I32)
    q = compute("q", Load(x, (i,)) // 3, {"i": 7}, dt=DType.I32)
    m = compute("m", Load(x, (i,)) % -3, {"i": 7}, dt=DType.I32)
    a = np.array([-7, -3, -1, 0, 1, 5, 9], dtype=np.int32)
    qq, mm = run(func("f", [x], q, m, ret=[q.result, m.result]), [a])
    assert qq.dtype == np.int32
    assert qq.tolist() == [v // 3 for v in a.tolist()]
    assert mm.tolist() == [v % -3 for v in a.tolist()]
    bad = compute("d", Load(x, (i,)) / 2, {"i": 7}, dt=DType.I32)
    with pytest.raises(InterpError, match="'/' on integers"):
        run(func("f", [x], bad), [a])
    zero = compute("z", Const(10) // Load(x, (i,)), {"i": 7}, dt=DType.I32)
    with pytest.raises(InterpError, match="division by zero at i=3"):
        run(func("f", [x], zero), [a])


def test_weak_literals_and_index_variables_follow_typed_operands():
    x = arg("x", (4,), DType.F32)
    op = compute("y", Load(x, (i,)) * 0.1 + i, {"i": 4})
    a = np.ones(4, np.float32)
    (y,) = run(func("f", [x], op), [a])
    assert y.dtype == np.float32
    np.testing.assert_array_equal(y, a * np.float32(0.1) + np.arange(4, dtype=np.float32))
    weak = compute("y", Cast(DType.F32, i) * 0.5 + i // 2, {"i": 4})
    assert run(func("f", [x], weak), [a])[0].tolist() == [0.0, 0.5, 2.0, 2.5]
    ix = arg("ix", (4,), DType.I32)
    bad = compute("y", Load(ix, (i,)) * 0.5, {"i": 4}, dt=DType.I32)
    with pytest.raises(InterpError, match="float"):
        run(func("f", [ix], bad), [np.zeros(4, np.int32)])


INTRINSICS = [
    ("exp", np.exp), ("log", np.log), ("sqrt", np.sqrt), ("rsqrt", lambda v: 1 / np.sqrt(v)),
    ("tanh", np.tanh), ("sigmoid", lambda v: 1 / (1 + np.exp(-v))), ("abs", np.abs),
    ("erf", np.vectorize(math.erf)),
]


@pytest.mark.parametrize(("fn", "ref"), INTRINSICS)
@pytest.mark.parametrize("dt", [DType.F32, DType.F64])
def test_unary_intrinsics(fn, ref, dt):
    x = arg("x", (50,), dt)
    op = compute("y", Call(fn, (Load(x, (i,)),)), {"i": 50}, dt=dt)
    a = (np.abs(data(50, DType.F64)) * 3 + 0.01).astype(dt.numpy)
    if fn in ("tanh", "sigmoid", "abs", "erf"):
        a = a - np.asarray(4.0, dt.numpy)
    (y,) = run(func("f", [x], op), [a])
    assert y.dtype == dt.numpy
    np.testing.assert_allclose(y, ref(a.astype(np.float64)),
                               rtol=2e-6 if dt == DType.F32 else 1e-14)


def test_binary_intrinsics():
    x, y = arg("x", (20,), DType.F64), arg("y", (20,), DType.F64)
    xl, yl = Load(x, (i,)), Load(y, (i,))
    ops = [compute(fn, Call(fn, (xl, yl)), {"i": 20}, dt=DType.F64) for fn in ("max", "min")]
    ops.append(compute("pow", Call("pow", (Call("abs", (xl,)), yl)), {"i": 20}, dt=DType.F64))
    a, b = data(20, DType.F64), data(20, DType.F64)
    mx, mn, pw = run(func("f", [x, y], *ops, ret=[o.result for o in ops]), [a, b])
    np.testing.assert_array_equal(mx, np.maximum(a, b))
    np.testing.assert_array_equal(mn, np.minimum(a, b))
    np.testing.assert_allclose(pw, np.abs(a) ** b, rtol=1e-14)


def test_erf_accuracy_against_math_erf():
    xs = np.concatenate([np.linspace(-7, 7, 40001), RNG.uniform(-1e-4, 1e-4, 1000),
                         [0.0, -0.0, 1e-310, 5.9, 6.0, 1e300, -np.inf, np.inf]])
    got = erf(xs)
    want = np.array([math.erf(v) for v in xs])
    nz = want != 0
    assert np.max(np.abs(got[nz] - want[nz]) / np.abs(want[nz])) <= 1e-15
    assert got[~nz].tolist() == [0.0] * int((~nz).sum())
    assert np.signbit(erf(-0.0)) and np.isnan(erf(np.nan))


def test_bf16_results_are_rounded():
    x = arg("x", (3,), DType.BF16)
    op = compute("y", Load(x, (i,)) * 3.0, {"i": 3}, dt=DType.BF16)
    a = np.array([1.0, 1.00390625, 1 / 3], dtype=np.float32)  # 1 + 2^-8 is not a bf16
    (y,) = run(func("f", [x], op), [a])
    assert y.dtype == np.float32
    assert y.tolist() == [3.0, 3.0, 1.0]


def test_f16_sum_accumulates_in_f32():
    x = arg("x", (4096,), DType.F16)
    op = compute("y", Load(x, (k,)), {}, {"k": 4096}, dt=DType.F16)
    a = np.full(4096, 0.1, dtype=np.float16)
    (y,) = run(func("f", [x], op), [a])
    assert y.dtype == np.float16
    assert abs(float(y) - 4096 * float(np.float16(0.1))) < 1.0


def test_embedding_gather_checks_ids_at_run_time():
    emb, ids = arg("E", (10, 3)), arg("ids", (4,), DType.I32)
    op = compute("y", Load(emb, (Load(ids, (n,)), j)), {"n": 4, "j": 3})
    f = func("f", [emb, ids], op)
    table = data((10, 3))
    np.testing.assert_array_equal(run(f, [table, np.array([1, 9, 0, 1], np.int32)])[0],
                                  table[[1, 9, 0, 1]])
    with pytest.raises(InterpError, match="dimension 0 index 10 is outside"):
        run(f, [table, np.array([1, 10, 0, 1], np.int32)])
