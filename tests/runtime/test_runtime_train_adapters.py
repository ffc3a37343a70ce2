"""Data adapters of `nfc train`: reading a model's inputs, `--data auto`, and fitting digits,
text and synthetic data to flat, image, sequence, token and language-model inputs."""

from __future__ import annotations

import numpy as np
import pytest

from nfc.frontend import compile_source
from nfc.runtime import adapters
from nfc.runtime.adapters import ModelInputs, choose, load_for, resize_images
from nfc.runtime.data import DataError, InputSpec, digits, text_ids

F32, I32 = np.dtype(np.float32), np.dtype(np.int32)


def mi(x: tuple[int, ...], y: tuple[int, ...] | None = None, *, xdt=F32, classes: int = 10,
       vocab: int | None = None, xname: str = "x", yname: str = "y") -> ModelInputs:
    ys = InputSpec(yname, y if y is not None else x[:1], I32)
    return ModelInputs(InputSpec(xname, x, np.dtype(xdt)), ys, classes, vocab)


def test_auto_picks_data_by_kind():
    cases = {
        mi((16, 784)): ("flat", "digits"),
        mi((16, 64)): ("flat", "digits"),
        mi((16, 100)): ("flat", "digits"),              # 10x10
        mi((16, 99)): ("flat", "synthetic"),            # not an image
        mi((8, 3, 32, 32)): ("image", "digits"),
        mi((8, 1, 28, 28)): ("image", "digits"),
        mi((8, 8, 784)): ("sequence", "digits"),
        mi((8, 2, 3, 4, 5)): ("tensor", "synthetic"),
        mi((4, 32), (4, 32), xdt=I32, vocab=128, classes=128): ("lm", "text"),
        mi((4, 32), (4,), xdt=I32, vocab=128, classes=2): ("tokens", "text"),
    }
    for m, (kind, data) in cases.items():
        assert (m.kind, choose(m)) == (kind, data), m.describe()


def test_digits_fit_flat_image_and_sequence_inputs():
    base = digits()
    flat = load_for("digits", mi((16, 784)))
    assert flat.x_train.shape == (1437, 784) and flat.x_train.dtype == np.float32
    assert flat.x_test.shape == (360, 784) and flat.y_train.dtype == np.int32
    assert np.array_equal(flat.y_train, base.y_train)
    # bilinear upscaling keeps the range and roughly the mean brightness
    assert flat.x_train.min() >= 0.0 and flat.x_train.max() <= 1.0
    assert abs(float(flat.x_train.mean()) - float(base.x_train.mean())) < 0.03
    img = load_for("digits", mi((8, 3, 32, 32)))
    assert img.x_train.shape == (1437, 3, 32, 32)
    assert np.array_equal(img.x_train[:, 0], img.x_train[:, 2])  # channels replicated
    assert "32x32" in img.note and "3 channels" in img.note
    same = load_for("digits", mi((8, 1, 8, 8)))
    assert np.array_equal(same.x_train.reshape(-1, 64), base.x_train)
    seq = load_for("digits", mi((8, 8, 784)))
    assert seq.x_train.shape == (1437, 8, 784)
    # rows as a sequence: step t is row t of the digit, stretched along the features
    assert np.allclose(seq.x_train[:, :, ::98].mean(), base.x_train.mean(), atol=0.03)


def test_fewer_model_classes_keep_those_digits():
    d = load_for("digits", mi((8, 4, 8), classes=4))
    assert d.x_train.shape[1:] == (4, 8) and set(np.unique(d.y_train)) == {0, 1, 2, 3}
    assert set(np.unique(d.y_test)) == {0, 1, 2, 3} and "classes 0-3" in d.note


def test_resize_nearest_and_bilinear():
    g = np.random.default_rng(0)
    imgs = g.random((3, 8, 8)).astype(np.float32)
    near = resize_images(imgs, 16, 16, "nearest")
    assert np.array_equal(near, np.repeat(np.repeat(imgs, 2, axis=1), 2, axis=2))
    assert np.array_equal(resize_images(imgs, 8, 8, "bilinear"), imgs)
    const = resize_images(np.full((1, 8, 8), 0.25, np.float32), 28, 28)
    assert np.allclose(const, 0.25)
    lin = resize_images(np.tile(np.arange(8, dtype=np.float32), (1, 8, 1)), 8, 16)
    assert np.all(np.diff(lin[0, 0]) >= 0) and lin[0, 0, 0] == 0 and lin[0, 0, -1] == 7
    d = load_for("digits", mi((4, 1, 16, 16)), resize="nearest")
    assert np.array_equal(d.x_train[:, 0, ::2, ::2].reshape(-1, 64), digits().x_train)


def test_text_targets_are_the_inputs_shifted_by_one():
    m = mi((4, 32), (4, 32), xdt=I32, vocab=40, classes=40, xname="ids", yname="targets")
    d = load_for("auto", m)
    assert d.name == "text" and d.x_train.dtype == np.int32 and d.y_train.dtype == np.int32
    assert d.x_train.shape[1:] == (32,) and d.y_train.shape == d.x_train.shape
    assert np.array_equal(d.x_train[:, 1:], d.y_train[:, :-1])
    assert np.array_equal(d.y_train[:-1, -1], d.x_train[1:, 0])  # windows are contiguous
    assert d.x_train.max() < 40 and d.y_train.max() < 40 and d.x_train.min() >= 0
    ids = text_ids(40)
    assert np.array_equal(np.concatenate([d.x_train[0], d.y_train[0, -1:]]), ids[:33])
    assert len(d.x_test) > 100


def test_text_classification_keeps_ids_and_labels_apart():
    d = load_for("text", mi((4, 16), (4,), xdt=I32, vocab=128, classes=2, xname="ids"))
    assert d.x_train.shape[1:] == (16,) and d.y_train.shape == (len(d.x_train),)
    assert d.x_train.max() > 50 and set(np.unique(d.y_train)) == {0, 1}
    onehot = load_for("text", mi((4, 5, 12)))  # a float sequence takes characters one-hot
    assert onehot.x_train.shape[1:] == (5, 12)
    assert np.array_equal(onehot.x_train.sum(axis=2), np.ones((len(onehot.x_train), 5)))


def test_synthetic_is_deterministic_and_learnable():
    m = mi((16, 3, 4))
    a, b = load_for("synthetic", m), load_for("synthetic", m)
    assert np.array_equal(a.x_train, b.x_train) and np.array_equal(a.y_test, b.y_test)
    assert a.x_train.shape[1:] == (3, 4) and len(set(a.y_train.tolist())) == 10
    # a linear teacher: nearest class centroid already beats chance by far
    xs, xt = a.x_train.reshape(len(a.x_train), -1), a.x_test.reshape(len(a.x_test), -1)
    cent = np.stack([xs[a.y_train == c].mean(axis=0) for c in range(10)])
    pred = np.argmax(xt @ cent.T - 0.5 * (cent * cent).sum(axis=1), axis=1)
    assert np.mean(pred == a.y_test) > 0.4
    lm = load_for("synthetic", mi((4, 12), (4, 12), xdt=I32, vocab=20, classes=20))
    assert np.array_equal(lm.x_train[:, 1:], lm.y_train[:, :-1])
    # the chain's successor is predictable: the most common next token is right ~80%
    table = np.zeros((20, 20), int)
    np.add.at(table, (lm.x_train.ravel(), lm.y_train.ravel()), 1)
    assert np.mean(table.argmax(axis=1)[lm.x_test] == lm.y_test) > 0.7
    tok = load_for("synthetic", mi((4, 6), xdt=I32, vocab=9, classes=3))
    assert tok.x_train.max() < 9 and set(np.unique(tok.y_train)) == {0, 1, 2}


def test_impossible_fits_are_clear_errors():
    with pytest.raises(DataError, match="takes i32 token ids; use --data text"):
        load_for("digits", mi((4, 16), xdt=I32, vocab=30))
    with pytest.raises(DataError, match="--set inputs=64"):
        load_for("digits", mi((8, 99)))
    with pytest.raises(DataError, match="cannot tell the range of the token ids"):
        load_for("text", mi((4, 16), (4, 16), xdt=I32, classes=30))
    with pytest.raises(DataError, match="one label per sample"):
        load_for("digits", mi((4, 64), (4, 3)))
    with pytest.raises(DataError, match="unknown data set 'imagenet'"):
        load_for("imagenet", mi((4, 64)))
    with pytest.raises(DataError, match="unknown resize mode"):
        load_for("digits", mi((4, 64)), resize="cubic")
    with pytest.raises(DataError, match="besides 'x' and 'y'"):
        adapters.split_inputs([InputSpec("x", (2, 3), F32), InputSpec("y", (2,), I32),
                               InputSpec("mask", (2, 3), F32)])


_LM = """
import std.nn
model lm(batch = 2, steps = 3, vocab = 11, hidden = 4, classes = 7) {
  input  tokens: i32[batch, steps]
  input  next: i32[batch, steps]
  param  emb: f32[vocab, hidden] = normal(0.0, 0.1)
  param  w: f32[hidden, classes] = glorot_uniform
  total[] = 0.0
  for t in 0..steps {
    x_t[n] = tokens[n, t]
    y_t[n] = next[n, t]
    total = total + softmax_cross_entropy(linear_nobias(embedding(x_t, emb), w), y_t)
  }
  loss = total / steps
  minimize loss with sgd(lr = 0.1)
}
"""


def test_input_ranges_come_from_the_ir():
    module = compile_source(_LM, "lm.nf")
    assert adapters.input_ranges(module.func("forward")) == {"tokens": 11, "next": 7}


def test_model_inputs_from_metadata_alone():
    def arg(name, shape, dtype, role="input"):
        return {"name": name, "shape": shape, "dtype": dtype, "role": role}
    meta = {"functions": {"train_step": {
        "args": [arg("ids", [4, 8], "i32"), arg("targets", [4, 8], "i32"),
                 arg("emb", [50, 16], "f32", "param")], "results": []}},
        "tensors": [{"name": "emb", "role": "param", "shape": [50, 16]}]}
    m = adapters.model_inputs(meta)
    assert (m.x.name, m.y.name, m.kind, m.vocab, m.classes) == ("ids", "targets", "lm", 50, 50)
    meta["functions"]["eval"] = {"args": [], "results": [
        {"name": "logits", "shape": [4, 3]}]}
    meta["functions"]["train_step"]["args"][1]["shape"] = [4]
    m = adapters.model_inputs(meta)
    assert (m.kind, m.classes, m.vocab) == ("tokens", 3, 50)
