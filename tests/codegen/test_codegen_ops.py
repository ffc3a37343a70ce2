"""The intrinsics added as rows of the operator table, compiled: against the interpreter, and
their accuracy against float64 numpy (in units of the last place) over wide ranges and the
special values, in vector loops (with tails) and scalar code."""

from __future__ import annotations

import numpy as np
import pytest
from codegen_lib import F32, F64, I1, compute, ld, reference, tensor

from nfc.codegen.jit import compile_kernel
from nfc.ir import Binary, Call, Const, Select

#: Largest error of the f32 results in ulps of the result: the inline exp/log of
#: nfc.codegen.llvm.intrinsics are a few ulp, and log1p/expm1/softplus add a division and an
#: addition on top (measured: at most 2.4 ulp over 200,000 points); atan2 is libm's.
ULPS = {"softplus": 4, "log1p": 4, "expm1": 4, "atan2": 2}
ULPS_F64 = {"softplus": 4, "log1p": 2, "expm1": 2, "atan2": 2}


def _values(dtype, fn: str) -> np.ndarray:
    rng = np.random.default_rng(11)
    tiny = [0.0, -0.0, 1e-30, -1e-30, 1e-7, -1e-7, 1e-4, -1e-4, 2.0 ** -24, -(2.0 ** -24)]
    wide = np.concatenate([rng.uniform(-1, 1, 300), rng.standard_normal(300) * 10,
                           np.sign(rng.standard_normal(200)) * 10 ** rng.uniform(-12, 2, 200)])
    big = [30.0, -30.0, 87.0, -87.0, 89.0, -89.0, 100.0, -104.0, 200.0, -200.0, 3e38, -3e38]
    special = [np.inf, -np.inf, np.nan]
    if fn == "log1p":
        wide = np.abs(wide) - 0.5  # mostly inside the domain, some points below -1
        special += [-1.0, -1.0 + 2.0 ** -23, -0.999, 1e30]
    return np.concatenate([tiny, wide, big, special]).astype(dtype.numpy)


def _reference(fn: str, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        return {"softplus": lambda: np.logaddexp(0.0, x), "log1p": lambda: np.log1p(x),
                "expm1": lambda: np.expm1(x), "atan2": lambda: np.arctan2(x, y)}[fn]()


def _ulps(got: np.ndarray, want64: np.ndarray, dtype) -> np.ndarray:
    """|got - want| in units of the last place of the result's dtype (0 where both agree on
    inf/NaN, inf where only one is)."""
    nt = dtype.numpy
    with np.errstate(all="ignore"):
        want = want64.astype(nt)
        ulp = np.spacing(np.abs(want).astype(nt)).astype(np.float64)
        ulp = np.maximum(ulp, np.finfo(nt).smallest_subnormal)
        err = np.abs(got.astype(np.float64) - want64) / ulp
    same = (np.isnan(got) & np.isnan(want)) | ((got == want) & ~np.isnan(want))
    return np.where(same, 0.0, np.where(np.isfinite(want) & np.isfinite(got), err, np.inf))


@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("fn", ["softplus", "log1p", "expm1", "atan2"])
def test_accuracy(fn: str, dtype) -> None:
    x = _values(dtype, fn)
    n = len(x)
    y = np.roll(x, 7)[::-1].copy()
    a, b = tensor("a", (n,), dtype), tensor("b", (n,), dtype)
    args = (ld(a, "i"), ld(b, "i")) if fn == "atan2" else (ld(a, "i"),)
    op = compute({"i": n}, Call(fn, args), dtype)
    ins = [x, y] if fn == "atan2" else [x]
    got = compile_kernel(op)(*ins)
    want = _reference(fn, x.astype(np.float64), y.astype(np.float64))
    err = _ulps(got, want, dtype)
    limit = (ULPS if dtype is F32 else ULPS_F64)[fn]
    worst = int(np.argmax(err))
    at = f"{x[worst]!r}, {y[worst]!r}" if fn == "atan2" else repr(x[worst])
    assert err.max() <= limit, (f"{fn}({at}) = {got[worst]!r}, want {want[worst]!r}: "
                                f"{err.max():.1f} ulp")
    (interp,) = reference(op, ins)  # the interpreter (numpy in the dtype) within the same bound
    assert _ulps(got, interp.astype(np.float64), dtype).max() <= limit + 2


@pytest.mark.parametrize("dtype", [F32, F64])
def test_isfinite_in_a_select(dtype) -> None:
    x = np.array([1.0, -2.0, 0.0, np.inf, -np.inf, np.nan, 3e38, 5.0, 1e-30, -0.0, 7.0],
                 dtype.numpy)
    a = tensor("a", (11,), dtype)
    guarded = Select(Call("isfinite", (Call("log", (ld(a, "i"),)),)),
                     Call("log", (ld(a, "i"),)), Const(-1.0))
    flag = compute({"i": 11}, Call("isfinite", (ld(a, "i"),)), I1)
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(compile_kernel(flag)(x), np.isfinite(x))
        got = compile_kernel(compute({"i": 11}, guarded, dtype))(x)
        np.testing.assert_allclose(got, reference(compute({"i": 11}, guarded, dtype), [x])[0],
                                   rtol=1e-6)
    assert np.all(np.isfinite(got))


@pytest.mark.parametrize("shape", [(5, 3), (3, 37), (1, 1)])
def test_2d_vector_and_tail_code(shape) -> None:
    """Vector bodies, their tails and scalar code compute the same as the interpreter."""
    x, y = tensor("x", shape), tensor("y", shape)
    xa, ya = ld(x, "i", "j"), ld(y, "i", "j")
    body = Binary("+", Call("softplus", (xa,)), Binary(
        "*", Call("atan2", (xa, ya)), Call("expm1", (Call("log1p", (Binary("*", ya, ya),)),))))
    body = Select(Call("isfinite", (body,)), body, Const(0.0))
    op = compute({"i": shape[0], "j": shape[1]}, body)
    rng = np.random.default_rng(5)
    ins = [rng.standard_normal(shape).astype(np.float32) * 3,
           rng.standard_normal(shape).astype(np.float32)]
    got = compile_kernel(op)(*ins)
    np.testing.assert_allclose(got, reference(op, ins)[0], rtol=1e-5, atol=1e-6)
