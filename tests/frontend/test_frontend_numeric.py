"""Compiled programs run through the numpy interpreter and agree with numpy."""

from __future__ import annotations

import numpy as np

from nfc.frontend import compile_op, compile_source
from nfc.interp import run
from nfc.ir import DType, TensorType
from nfc.verifier import verify

RNG = np.random.default_rng(7)


def forward(src: str, inputs: dict[str, np.ndarray], **kw: object) -> list[np.ndarray]:
    m = compile_source(src, "num.nf", **kw)  # type: ignore[arg-type]
    verify(m)
    return run(m.func("forward"), inputs)


def f32(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def test_linear_relu_and_broadcasting() -> None:
    src = """
op linear(x: T[N, K], w: T[K, M], b: T[M]) -> T[N, M] {
  out[n, m] = (sum(k) x[n, k] * w[k, m]) + b[m]
}
model m {
  input x: f32[3, 5]
  input w: f32[5, 4]
  input b: f32[4]
  h = linear(x, w, b)
  y = max(h, 0.0) * 0.5 + b
  output y
}"""
    x, w, b = f32(3, 5), f32(5, 4), f32(4)
    (y,) = forward(src, {"x": x, "w": w, "b": b})
    np.testing.assert_allclose(y, np.maximum(x @ w + b, 0) * 0.5 + b, rtol=1e-5)


def test_pad_guard_and_explicit_offset_range() -> None:
    src = """
op pad2d<p: int>(x: T[N, C, H, W]) -> T[N, C, H + 2*p, W + 2*p] {
  y[n, c, h, w] = x[n, c, h - p, w - p] if p <= h < H + p and p <= w < W + p else 0.0
}
model m {
  input x: f32[2, 3, 4, 5]
  y = pad2d<p = 2>(x)
  s[n, c, h] = sum(w in 1..4) x[n, c, h, w]
  output y, s
}"""
    x = f32(2, 3, 4, 5)
    y, s = forward(src, {"x": x})
    np.testing.assert_array_equal(y, np.pad(x, ((0, 0), (0, 0), (2, 2), (2, 2))))
    np.testing.assert_allclose(s, x[..., 1:4].sum(-1), rtol=1e-5)


def test_multi_output_batch_norm_and_softmax_cross_entropy() -> None:
    src = """
op bn(x: T[N, C]) -> (y: T[N, C], mean: T[C], var: T[C]) {
  mean[c] = (sum(n) x[n, c]) / N
  var[c]  = (sum(n) (x[n, c] - mean[c]) * (x[n, c] - mean[c])) / N
  y[n, c] = (x[n, c] - mean[c]) * rsqrt(var[c] + 1e-5)
}
op xent(logits: T[N, K], labels: i32[N]) -> T[] {
  m[n] = max(k) logits[n, k]
  lse[n] = log(sum(k) exp(logits[n, k] - m[n])) + m[n]
  loss = (sum(n) lse[n] - logits[n, labels[n]]) / N
}
model m {
  input x: f32[6, 4]
  input labels: i32[6]
  y, mean, var = bn(x)
  loss = xent(y, labels)
  output mean
  minimize loss with sgd(lr = 0.1)
}"""
    x = f32(6, 4)
    labels = RNG.integers(0, 4, 6).astype(np.int32)
    loss, mean = forward(src, {"x": x, "labels": labels})
    yy = (x - x.mean(0)) / np.sqrt(x.var(0) + 1e-5)
    lse = np.log(np.exp(yy - yy.max(1, keepdims=True)).sum(1)) + yy.max(1)
    np.testing.assert_allclose(loss, (lse - yy[np.arange(6), labels]).mean(), rtol=1e-4)
    np.testing.assert_allclose(mean, x.mean(0), rtol=1e-5, atol=1e-6)


def test_reshape_transpose_and_unrolled_loop() -> None:
    src = """
model m(steps = 3) {
  input x: f32[2, 3, 4]
  t = transpose<[2, 0, 1]>(x)
  r = reshape<[4, -1]>(t)
  h = r
  for i in 0..steps { h = tanh(h) + f32(i) }
  output t, r, h
}"""
    x = f32(2, 3, 4)
    t, r, h = forward(src, {"x": x})
    np.testing.assert_array_equal(t, x.transpose(2, 0, 1))
    np.testing.assert_array_equal(r, x.transpose(2, 0, 1).reshape(4, -1))
    expect = r
    for i in range(3):
        expect = np.tanh(expect) + i
    np.testing.assert_allclose(h, expect, rtol=1e-5)


def test_hoisted_reduction_keeps_its_guard() -> None:
    # the nested max reads x[i - 1, k], only valid where i >= 1: the hoisted compute is guarded
    src = """
model m {
  input x: f32[5, 3]
  y[i in 0..5] = (max(k) x[i - 1, k]) if i >= 1 else -1.0
  output y
}"""
    x = f32(5, 3)
    (y,) = forward(src, {"x": x})
    np.testing.assert_allclose(y, np.concatenate([[-1.0], x.max(1)[:4]]), rtol=1e-6)


def test_training_flag_and_state_update() -> None:
    src = """
model m {
  input x: f32[4]
  state s: f32[4] = zeros
  y = x * 2.0 if training else x
  if training { update s = 0.5 * s + x }
  output y
}"""
    x, s = f32(4), f32(4)
    y, s2 = forward(src, {"x": x, "s": s})
    np.testing.assert_allclose(y, 2 * x)
    np.testing.assert_allclose(s2, 0.5 * s + x, rtol=1e-6)
    m = compile_source(src, "t.nf", training=False)
    assert m.func("forward").attrs["nf.results"] == ["y"]


def test_random_is_uniform_and_deterministic() -> None:
    src = """
model m {
  random u: f32[64, 32]
  random v: f32[64, 32]
  output u, v
}"""
    rng = np.array([3, 1], np.int64)
    u, v = forward(src, {"rng": rng})
    assert u.dtype == np.float32 and u.min() >= 0.0 and u.max() < 1.0
    assert abs(float(u.mean()) - 0.5) < 0.05
    assert not np.array_equal(u, v)
    u2, _ = forward(src, {"rng": rng})
    np.testing.assert_array_equal(u, u2)


def test_compile_op_runs_a_single_op() -> None:
    src = """
op scale<k: float = 2.0>(x: T[N]) -> T[N] {
  y[n] = x[n] * k
}"""
    m = compile_op(src, "scale", [TensorType((5,), DType.F64)], {"k": 3})
    f = m.func("scale")
    x = RNG.standard_normal(5)
    (y,) = run(f, [x])
    assert y.dtype == np.float64
    np.testing.assert_allclose(y, 3 * x)


def test_stdlib_ops_through_compile_op() -> None:
    from pathlib import Path

    nn = Path(__file__).resolve().parents[2] / "nfc" / "std" / "nn.nf"
    m = compile_op(nn, "matmul", [TensorType((3, 4), DType.F32), TensorType((4, 2), DType.F32)])
    a, b = f32(3, 4), f32(4, 2)
    (y,) = run(m.func("matmul"), [a, b])
    np.testing.assert_allclose(y, a @ b, rtol=1e-5)


def test_op_ending_in_a_loop_and_compile_time_if() -> None:
    src = """
op repeat<k: int, double: bool = false>(x: T[N]) -> T[N] {
  y = x
  for i in 0..k {
    if double { y = y * 2.0 } else { y = y + 1.0 }
  }
}
model m {
  input x: f32[3]
  a = repeat<k = 3>(x)
  b = repeat<k = 2, double = true>(x)
  output a, b
}"""
    x = f32(3)
    a, b = forward(src, {"x": x})
    np.testing.assert_allclose(a, x + 3, rtol=1e-6)
    np.testing.assert_allclose(b, x * 4, rtol=1e-6)
