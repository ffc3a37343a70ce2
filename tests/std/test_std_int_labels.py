"""Integer dtype variables: std.nn labels and ids take i32 and i64 alike (PyTorch's labels are
i64), and nothing else."""

from __future__ import annotations

import numpy as np
import pytest

from nfc.diagnostics import CompileError
from nfc.ir import DType, TensorType

MLP = """
import std.nn
model mlp(batch = 16, features = 6, classes = 3) {
  input  x: f64[batch, features]
  input  y: LABEL[batch]
  input  ids: LABEL[batch]
  param  E: f64[5, features] = normal(0.0, 0.3)
  param  w: f64[features, classes] = normal(0.0, 0.3)
  param  b: f64[classes] = zeros
  h = x + embedding(ids, E)
  logits = linear(h, w, b)
  loss = softmax_cross_entropy(logits, y) + 0.1 * margin_loss(sigmoid(logits), y)
  minimize loss with sgd(lr = 0.5)
}
"""


def _train(label: str, steps: int = 5) -> list[float]:
    from nfc.frontend import compile_source
    from nfc.interp import run
    from nfc.passes.autodiff.train import add_training_functions

    module = compile_source(MLP.replace("LABEL", label), "mlp.nf")
    add_training_functions(module)
    step = module.func("train_step")
    rng = np.random.default_rng(7)
    dt = np.int32 if label == "i32" else np.int64
    data = {"x": rng.standard_normal((16, 6)), "y": rng.integers(0, 3, 16).astype(dt),
            "ids": rng.integers(0, 5, 16).astype(dt),
            "E": rng.normal(0.0, 0.3, (5, 6)), "w": rng.normal(0.0, 0.3, (6, 3)),
            "b": np.zeros(3)}
    assert step.arg("y").dtype is (DType.I32 if label == "i32" else DType.I64)
    args = {a.name: data[a.name] if a.name in data else np.zeros(a.shape, a.dtype.numpy)
            for a in step.args}
    inplace = {int(k): v for k, v in step.attrs["nf.inplace"].items()}
    losses = []
    for _ in range(steps):
        outs = run(step, args)
        losses.append(float(outs[0]))
        for i, name in inplace.items():
            args[name] = outs[i]
    return losses


def test_i32_and_i64_labels_train_identically():
    l32, l64 = _train("i32"), _train("i64")
    assert l32 == l64
    assert l32[-1] < l32[0]


@pytest.mark.parametrize("dt", [np.int32, np.int64])
def test_softmax_cross_entropy_labels_of_both_widths(std, close, rng, dt):
    logits = rng.standard_normal((5, 4))
    labels = rng.integers(0, 4, 5).astype(dt)
    (loss,) = std("softmax_cross_entropy", logits, labels)
    e = np.exp(logits - logits.max(1, keepdims=True))
    lp = np.log(e / e.sum(1, keepdims=True))
    close(loss, -lp[np.arange(5), labels].mean())


@pytest.mark.parametrize("dt", [np.int32, np.int64])
def test_embedding_ids_of_both_widths(std, close, rng, dt):
    E = rng.standard_normal((7, 3))
    ids = rng.integers(0, 7, (2, 4)).astype(dt)
    (y,) = std("embedding", ids, E)
    close(y, E[ids])


def test_float_labels_are_refused(std_compile):
    with pytest.raises(CompileError) as err:
        std_compile("softmax_cross_entropy",
                    [TensorType((4, 3), DType.F32), TensorType((4,), DType.F32)])
    assert ("argument 2 of 'softmax_cross_entropy' has dtype f32 but parameter 'labels' "
            "expects Int, an integer dtype (i32 or i64)") in str(err.value)


def test_integer_dtype_variable_in_a_user_op():
    from nfc.frontend import compile_source
    from nfc.interp import run

    src = """
op pick(x: T[N, C], idx: Int[N]) -> T[N] {
  y[n] = sum(c) (x[n, c] if idx[n] == c else 0.0)
}
op twice(a: Int[N], b: Int[N]) -> Int[N] {
  y[n] = a[n] + b[n]
}
model m {
  input x: f32[3, 4]
  input i: i64[3]
  input j: i64[3]
  p = pick(x, i)
  s = twice(i, j)
  output p, s
}
"""
    module = compile_source(src, "m.nf")
    f = module.func("forward")
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    i = np.array([3, 0, 2], np.int64)
    outs = run(f, {"x": x, "i": i, "j": i})
    np.testing.assert_array_equal(outs[0], x[np.arange(3), i])
    assert outs[1].dtype == np.int64
    np.testing.assert_array_equal(outs[1], 2 * i)
    # one integer dtype variable binds one dtype
    bad = src.replace("input j: i64[3]", "input j: i32[3]")
    with pytest.raises(CompileError) as err:
        compile_source(bad, "m.nf")
    assert "expects Int = i64 (bound by argument 1)" in str(err.value)
