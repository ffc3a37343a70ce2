"""Every kind of compute, compiled with its default schedule, matches the interpreter."""

from __future__ import annotations

import numpy as np
import pytest
from codegen_lib import F32, F64, I1, I32, check, compute, ld, matmul, reference, tensor

from nfc.codegen.jit import compile_kernel
from nfc.codegen.space import SMALL_GEMM_WORK, GemmSpace, schedule_space
from nfc.ir import Binary, Call, Cast, Const, Index, Select, Unary


@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("shape", [(37, 29), (8, 64), (1, 5)])
def test_elementwise(dtype, shape):
    x, y = tensor("x", shape, dtype), tensor("y", shape, dtype)
    body = ld(x, "i", "j") * ld(y, "i", "j") + ld(x, "i", "j") - Const(1.5)
    check(compute({"i": shape[0], "j": shape[1]}, body, dtype))


def test_broadcast_bias_and_scalar():
    x, b, s = tensor("x", (33, 70)), tensor("b", (70,)), tensor("s", ())
    body = (ld(x, "n", "j") + ld(b, "j")) * Load0(s)
    check(compute({"n": 33, "j": 70}, body))


def Load0(v):  # noqa: N802 - reads like the IR
    return ld(v)


@pytest.mark.parametrize("reduce", ["sum", "max", "min", "prod"])
def test_reduce_last_axis(reduce):
    x = tensor("x", (19, 45))
    body = ld(x, "n", "k") if reduce != "prod" else Const(1.0) + ld(x, "n", "k") * Const(0.01)
    check(compute({"n": 19}, body, reduce=reduce, raxes={"k": 45}))


@pytest.mark.parametrize("reduce", ["sum", "max", "min"])
def test_reduce_first_axis(reduce):
    x = tensor("x", (45, 37))
    check(compute({"j": 37}, ld(x, "n", "j"), reduce=reduce, raxes={"n": 45}))


def test_reduce_to_scalar_f64():
    x = tensor("x", (300,), F64)
    check(compute({}, ld(x, "k") * ld(x, "k"), F64, reduce="sum", raxes={"k": 300}))


def test_reduce_two_axes():
    x = tensor("x", (6, 20, 9))
    check(compute({"c": 20}, ld(x, "n", "c", "h"), reduce="sum", raxes={"n": 6, "h": 9}))


@pytest.mark.parametrize("m,n,k", [(64, 64, 64), (37, 29, 45), (1, 10, 33), (130, 17, 300)])
def test_gemm_f32(m, n, k):
    op = matmul(m, n, k)
    check(op, atol=1e-4 * np.sqrt(k))
    if m * n * k < SMALL_GEMM_WORK:  # the default is the loop template: the GEMM one too
        space = schedule_space(op)
        assert isinstance(space, GemmSpace)
        check(op, space.default(), atol=1e-4 * np.sqrt(k))


@pytest.mark.parametrize("dtype", [F64, I32])
def test_gemm_f64_and_i32(dtype):
    check(matmul(45, 23, 70, dtype))


def test_gemm_transposed_and_batched():
    a, b = tensor("a", (30, 20)), tensor("b", (30, 17))  # dW = A^T B
    check(compute({"i": 20, "j": 17}, ld(a, "n", "i") * ld(b, "n", "j"), reduce="sum",
                  raxes={"n": 30}), atol=1e-4)
    x, w = tensor("x", (3, 11, 13)), tensor("w", (3, 13, 19))
    check(compute({"b": 3, "i": 11, "j": 19}, ld(x, "b", "i", "k") * ld(w, "b", "k", "j"),
                  reduce="sum", raxes={"k": 13}), atol=1e-4)


def test_gemm_output_transposed():
    a, b = tensor("a", (21, 13)), tensor("b", (13, 9))
    # out[j, i]: the contiguous output axis comes from A, roles swap
    check(compute({"j": 9, "i": 21}, ld(a, "i", "k") * ld(b, "k", "j"), reduce="sum",
                  raxes={"k": 13}), atol=1e-4)


def test_conv2d_with_padding_guards():
    n, c, h, w, o, r = 2, 3, 12, 13, 4, 3
    x, k = tensor("x", (n, c, h, w)), tensor("k", (o, c, r, r))
    hh = Binary("-", Binary("+", Index("p"), Index("r")), Const(1))
    ww = Binary("-", Binary("+", Index("q"), Index("s")), Const(1))
    inside = Binary("and", Binary("and", Binary("<=", Const(0), hh), Binary("<", hh, Const(h))),
                    Binary("and", Binary("<=", Const(0), ww), Binary("<", ww, Const(w))))
    body = Select(inside, ld(x, "b", "c", hh, ww), Const(0.0)) * ld(k, "o", "c", "r", "s")
    check(compute({"b": n, "o": o, "p": h, "q": w}, body, reduce="sum",
                  raxes={"c": c, "r": r, "s": r}), atol=1e-4)


def test_reshape_floordiv_mod():
    x = tensor("x", (6, 35))
    flat = Binary("+", Binary("*", Index("a"), Const(21)), Index("b"))
    body = ld(x, Binary("//", flat, Const(35)), Binary("%", flat, Const(35)))
    check(compute({"a": 10, "b": 21}, body))


def test_transpose_gather_store():
    x = tensor("x", (23, 17))
    check(compute({"i": 17, "j": 23}, ld(x, "j", "i")))


def test_select_relu_and_compare():
    x = tensor("x", (31, 40))
    relu = Select(Binary(">", ld(x, "i", "j"), Const(0.0)), ld(x, "i", "j"), Const(0.0))
    check(compute({"i": 31, "j": 40}, relu))
    check(compute({"i": 31, "j": 40}, Binary("<", ld(x, "i", "j"), Const(0.25)), I1))


@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("fn", ["exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "erf", "abs"])
def test_unary_intrinsics(fn, dtype):
    x = tensor("x", (13, 37), dtype)
    positive = fn in ("log", "sqrt", "rsqrt")
    arg = ld(x, "i", "j") if positive else ld(x, "i", "j") * Const(3.0)
    check(compute({"i": 13, "j": 37}, Call(fn, (arg,)), dtype), positive=positive)


def test_exp_log_extremes():
    x = tensor("x", (64,))
    vals = np.array([-200, -104, -103, -90, -87.5, -20, -1e-3, 0, 1e-6, 1, 20, 80, 88.5, 88.7,
                     89, 100, np.inf, -np.inf] + [0.5] * 46, np.float32)
    check(compute({"i": 64}, Call("exp", (ld(x, "i"),))), inputs=[vals], atol=1e-37)
    pos = np.array([1e-30, 1e-10, 1e-3, 0.5, 0.7071, 0.7072, 1, 2, 1e10, 3e38, np.inf, 0.0]
                   + [1.5] * 52, np.float32)
    check(compute({"i": 64}, Call("log", (ld(x, "i"),))), inputs=[pos])
    big = np.linspace(-12, 12, 64).astype(np.float32)
    check(compute({"i": 64}, Call("tanh", (ld(x, "i"),))), inputs=[big])
    check(compute({"i": 64}, Call("erf", (ld(x, "i"),))), inputs=[big])
    check(compute({"i": 64}, Call("sigmoid", (ld(x, "i"),))), inputs=[big * 10])


@pytest.mark.parametrize("fn", ["max", "min", "pow"])
def test_binary_intrinsics(fn):
    x, y = tensor("x", (9, 21)), tensor("y", (9, 21))
    a = ld(x, "i", "j")
    b = ld(y, "i", "j")
    if fn == "pow":
        check(compute({"i": 9, "j": 21}, Call("pow", (a, b))), positive=True)
        for e in (2.0, 3.0, 0.5, -1.0, 2.5):
            check(compute({"i": 9, "j": 21}, Call("pow", (a, Const(e)))), positive=True)
    else:
        check(compute({"i": 9, "j": 21}, Call(fn, (a, b))))


def test_philox_bit_exact():
    rng = tensor("rng", (2,), DTypeI64())
    key = Binary("+", ld(rng, Const(0)), Const(17))
    ctr = Binary("+", Binary("*", ld(rng, Const(1)), Const(333)),
                 Binary("+", Binary("*", Index("i"), Const(37)), Index("j")))
    for dt in (F32, F64):
        op = compute({"i": 9, "j": 37}, Call("philox", (key, ctr)), dt)
        kernel = compile_kernel(op)
        for seed in ([5, 7], [-3, 2**40 + 11], [2**62, -(2**35)]):
            ins = [np.array(seed, np.int64)]
            np.testing.assert_array_equal(kernel(*ins), reference(op, ins)[0])


def DTypeI64():  # noqa: N802
    from nfc.ir import DType

    return DType.I64


def test_integer_arithmetic():
    x, y = tensor("x", (17, 19), I32), tensor("y", (17, 19), I32)
    a, b = ld(x, "i", "j"), ld(y, "i", "j")
    nz = Select(Binary("==", b, Const(0)), Const(3), b)
    body = Binary("+", Binary("*", a, Const(3)), Binary("//", a, nz))
    check(compute({"i": 17, "j": 19}, body, I32))
    check(compute({"i": 17, "j": 19}, Binary("%", a, nz), I32))
    check(compute({"i": 17, "j": 19}, Call("max", (a, Unary("neg", b))), I32))
    check(compute({"i": 17}, a, I32, reduce="sum", raxes={"j": 19}))
    check(compute({"i": 17}, a, I32, reduce="max", raxes={"j": 19}))


def test_casts_and_index_arithmetic():
    x = tensor("x", (12, 30))
    body = Cast(I32, ld(x, "i", "j") * Const(4.0))
    check(compute({"i": 12, "j": 30}, body, I32))
    xi = tensor("xi", (12, 30), I32)
    body = Cast(F32, ld(xi, "i", "j")) * Const(0.5) + Cast(F32, Index("j") - Index("i"))
    check(compute({"i": 12, "j": 30}, body))


def test_bool_inputs():
    m, x = tensor("m", (20, 33), I1), tensor("x", (20, 33))
    check(compute({"i": 20, "j": 33}, Select(ld(m, "i", "j"), ld(x, "i", "j"), Const(-1.0))))
    check(compute({"i": 20, "j": 33}, Unary("not", ld(m, "i", "j")), I1))
