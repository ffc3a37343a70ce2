"""std.nn ops used inside small models: random inputs, training switches, integer inputs."""

from __future__ import annotations

import numpy as np

from nfc.verifier import verify


def compile_and_run(src: str, inputs: dict[str, np.ndarray], training: bool = True,
                    params: dict | None = None) -> dict[str, np.ndarray]:
    from nfc.frontend import compile_source
    from nfc.interp import run
    module = compile_source(src, "model.nf", params=params, training=training)
    verify(module)
    func = module.func("forward")
    args = []
    for arg, attrs in zip(func.args, func.arg_attrs, strict=True):
        if attrs.get("nf.role") == "rng":
            args.append(np.array([11, 3], dtype=np.int64))
        else:
            args.append(inputs[arg.name])
    results = run(func, args, module=module)
    return dict(zip(func.attrs["nf.results"], results, strict=True))


DROPOUT = """
import std.nn
model m(batch = 64) {
  input  x: f32[batch, 32]
  random u: f32[batch, 32]
  h = x
  if training { h = dropout<p = 0.25>(x, u) }
  output h
}
"""


def test_dropout_with_in_graph_random_numbers(rng):
    x = (1.0 + rng.random((64, 32))).astype(np.float32)   # never zero
    h = compile_and_run(DROPOUT, {"x": x})["h"]
    dropped = h == 0
    assert 0.2 < dropped.mean() < 0.3                      # p = 0.25 of 2048 elements
    np.testing.assert_allclose(h[~dropped], x[~dropped] / 0.75, rtol=1e-6)
    # inference: the identity
    np.testing.assert_array_equal(compile_and_run(DROPOUT, {"x": x}, training=False)["h"], x)


def test_embedding_of_an_integer_input(rng):
    src = """
import std.nn
model m(batch = 5) {
  input ids: i32[batch]
  param E: f32[10, 4] = normal(0.0, 1.0)
  e = embedding(ids, E)
  output e
}
"""
    ids = np.array([9, 0, 3, 3, 7], dtype=np.int32)
    table = rng.standard_normal((10, 4)).astype(np.float32)
    e = compile_and_run(src, {"ids": ids, "E": table})["e"]
    np.testing.assert_array_equal(e, table[ids])


def test_flatten_agrees_with_builtin_reshape(rng):
    src = """
import std.nn
model m(batch = 2) {
  input x: f64[batch, 3, 4, 5]
  a = flatten(x)
  b = reshape<[batch, 60]>(x)
  c = transpose2d(a)
  d = transpose<[1, 0]>(b)
  output a, b, c, d
}
"""
    x = rng.standard_normal((2, 3, 4, 5))
    out = compile_and_run(src, {"x": x})
    np.testing.assert_array_equal(out["a"], x.reshape(2, 60))
    np.testing.assert_array_equal(out["a"], out["b"])
    np.testing.assert_array_equal(out["c"], out["d"])


def test_split_and_concat_round_trip(rng):
    src = """
import std.nn
model m(batch = 2) {
  input x: f64[batch, 6, 3, 3]
  lo = slice4d_axis1<start = 0, size = 2>(x)
  hi = slice4d_axis1<start = 2, size = 4>(x)
  y = concat4d_axis1(lo, hi)
  z = channel_shuffle<groups = 3>(channel_shuffle<groups = 2>(x))
  output y, z
}
"""
    x = rng.standard_normal((2, 6, 3, 3))
    out = compile_and_run(src, {"x": x})
    np.testing.assert_array_equal(out["y"], x)
    # shuffling with 2 then 3 groups of 6 channels is the inverse permutation pair
    np.testing.assert_array_equal(out["z"], x)


def test_running_statistics_update(rng):
    src = """
import std.nn
model m(batch = 4) {
  input  x: f64[batch, 3, 2, 2]
  param  g: f64[3] = ones
  param  b: f64[3] = zeros
  state  rm: f64[3] = zeros
  state  rv: f64[3] = ones
  if training {
    y, mean, var = batch_norm_train(x, g, b)
    update rm = 0.9 * rm + 0.1 * mean
    update rv = 0.9 * rv + 0.1 * var
  } else {
    y = batch_norm_eval(x, g, b, rm, rv)
  }
  output y
}
"""
    x = 2.0 + rng.standard_normal((4, 3, 2, 2))
    state = {"rm": np.zeros(3), "rv": np.ones(3), "g": np.ones(3), "b": np.zeros(3), "x": x}
    out = compile_and_run(src, state)
    np.testing.assert_allclose(out["state:rm"], 0.1 * x.mean((0, 2, 3)), rtol=1e-12)
    np.testing.assert_allclose(out["state:rv"], 0.9 + 0.1 * x.var((0, 2, 3)), rtol=1e-12)
    ev = compile_and_run(src, state, training=False)
    assert set(ev) == {"y"}
    np.testing.assert_allclose(ev["y"], x / np.sqrt(1 + 1e-5), rtol=1e-12)
