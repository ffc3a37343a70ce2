"""The float constants `inf` and `nan`: typing, compile-time folding, the IR text, masked
reductions, and compiled code (LLVM) agreeing with the interpreter."""

from __future__ import annotations

import math

import numpy as np
import pytest

from nfc.diagnostics import CompileError

MASKS = """
model m {
  input x: f32[4, 5]
  input lim: f32[4]
  y[i, j] = x[i, j] if x[i, j] < lim[i] else -inf
  mx[i] = max(j) (x[i, j] if j <= i else -inf)
  mn[i] = min(j) (x[i, j] if j > 1 else inf)
  q[i] = nan if lim[i] > 100.0 else 1.0
  z = full<[2], -inf>
  w[i] = 2 * inf + lim[i]
  output y, mx, mn, q, z, w
}
"""


def _expected(x: np.ndarray, lim: np.ndarray) -> list[np.ndarray]:
    tri = np.arange(5)[None, :] <= np.arange(4)[:, None]
    return [np.where(x < lim[:, None], x, -np.inf),
            np.where(tri, x, -np.inf).max(1),
            x[:, 2:].min(1),
            np.where(lim > 100, np.nan, 1.0),
            np.full(2, -np.inf),
            np.full(4, np.inf)]


def _data() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    return {"x": rng.standard_normal((4, 5)).astype(np.float32),
            "lim": np.array([0.0, 1.0, -5.0, 200.0], np.float32)}


def test_inf_nan_in_the_interpreter():
    from nfc.frontend import compile_source
    from nfc.interp import run

    module = compile_source(MASKS, "m.nf")
    data = _data()
    outs = run(module.func("forward"), data)
    for got, want in zip(outs, _expected(**data), strict=True):
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, want.astype(np.float32))


def test_inf_nan_print_and_parse_back():
    from nfc.frontend import compile_source
    from nfc.irparser import parse_module
    from nfc.printer import print_module

    text = print_module(compile_source(MASKS, "m.nf"))
    assert "select(j <= i, %x[i, j], -inf)" in text
    assert "select(%lim[i] > 100.0, nan, 1.0)" in text
    assert print_module(parse_module(text, "m.mlir")) == text


def test_llvm_emits_inf_nan_constants_like_the_interpreter():
    from nfc.codegen.jit import compile_kernels
    from nfc.frontend import compile_source
    from nfc.interp import run
    from nfc.ir import ComputeOp

    f = compile_source(MASKS, "m.nf").func("forward")
    data = _data()
    want = run(f, data)
    ops = [op for op in f.walk() if isinstance(op, ComputeOp)]
    values: dict[str, np.ndarray] = dict(data)
    got = {}
    for op, kernel in zip(ops, compile_kernels(ops), strict=True):
        r = kernel(*(values[v.name] for v in kernel.info.inputs))
        values[op.result.name] = got[op.result.name] = np.asarray(r)
    for name, w in zip(f.attrs["nf.results"], want, strict=True):
        np.testing.assert_array_equal(got[name], w, err_msg=name)


def test_max_pool_padding_is_minus_inf_and_unchanged_for_finite_inputs(std_nn_src):
    from nfc.frontend import compile_op
    from nfc.interp import run
    from nfc.ir import DType, TensorType

    assert "else -inf)" in std_nn_src and "3.0e38" not in std_nn_src
    x = -1e30 * np.abs(np.random.default_rng(0).standard_normal((1, 1, 3, 3)))
    m = compile_op(std_nn_src, "max_pool2d", [TensorType(x.shape, DType.F64)],
                   {"size": 2, "stride": 1, "padding": 1})
    (y,) = run(m.funcs[0], [x], module=m)
    p = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
    want = np.array([[[[p[0, 0, i:i + 2, j:j + 2].max() for j in range(4)]
                       for i in range(4)]]])
    np.testing.assert_array_equal(y, want)


@pytest.fixture
def std_nn_src() -> str:
    from nfc.frontend.imports import std_dir

    return (std_dir() / "nn.nf").read_text()


@pytest.mark.parametrize("body,msg", [
    ("y[i] = x[i] + i32(inf)", "cannot convert inf to i32"),
    ("y[i] = x[i] * (1e308 * 10.0)", "compile-time value is not finite"),
    ("y[i] = x[i] + Inf", "unknown name 'Inf'; did you mean 'inf'?"),
])
def test_inf_errors(body, msg):
    from nfc.frontend import compile_source

    src = f"model m {{\n  input x: f32[3]\n  {body}\n  output y\n}}\n"
    with pytest.raises(CompileError) as err:
        compile_source(src, "m.nf")
    assert "m.nf:3:" in str(err.value) and msg in str(err.value)


def test_op_cannot_be_named_inf():
    from nfc.frontend import compile_source

    with pytest.raises(CompileError) as err:
        compile_source("op inf(x: T[N]) -> T[N] { y[n] = x[n] }\n", "m.nf")
    assert "m.nf:1:1: error: op 'inf' would hide the builtin of the same name" in str(err.value)


def test_compile_time_inf_arithmetic():
    from nfc.frontend import compile_source
    from nfc.interp import run

    src = """
model m(lo = -inf) {
  input x: f64[3]
  big = inf
  y[i] = max(x[i], lo) + (0.0 if big > 1e308 else 1.0)
  output y
}
"""
    f = compile_source(src, "m.nf").func("forward")
    x = np.array([1.0, -math.inf, 2.0])
    np.testing.assert_array_equal(run(f, {"x": x})[0], x)
