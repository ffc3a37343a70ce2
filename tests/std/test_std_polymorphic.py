"""Rank-polymorphic std.nn ops (`x: T[..., D]`) against numpy at ranks 1 to 4, and their
gradients against central differences at ranks 3 and 4 (rank 2 is tests/autodiff's)."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest

from nfc.ir import DType, TensorType

_erf = np.vectorize(math.erf)


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _layer_norm(x: np.ndarray, g: np.ndarray, b: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * g + b


def _squash(x: np.ndarray, eps: float = 1e-7) -> np.ndarray:
    n2 = (x * x).sum(axis=-1, keepdims=True)
    return x * n2 / (1.0 + n2) / np.sqrt(n2 + eps)


#: ops of one tensor argument and their numpy references (on the last axis)
UNARY = {
    "relu": (lambda x: np.maximum(x, 0.0)),
    "leaky_relu": (lambda x: np.where(x > 0, x, 0.01 * x)),
    "elu": (lambda x: np.where(x > 0, x, np.expm1(x))),
    "gelu": (lambda x: 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))),
    "sigmoid": (lambda x: 1.0 / (1.0 + np.exp(-x))),
    "tanh": np.tanh,
    "softmax": _softmax,
    "log_softmax": (lambda x: np.log(_softmax(x))),
    "squash": _squash,
    "capsule_length": (lambda x: np.sqrt((x * x).sum(axis=-1) + 1e-7)),
}

SHAPES = [(5,), (3, 5), (2, 3, 4), (2, 2, 3, 4)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"rank{len(s)}")
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_any_rank(std, close, rng, name, shape):
    x = 2 * rng.standard_normal(shape)
    (y,) = std(name, x)
    close(y, UNARY[name](x))


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"rank{len(s)}")
def test_layer_norm_any_rank(std, close, rng, shape):
    d = shape[-1]
    x, g, b = rng.standard_normal(shape), rng.standard_normal(d), rng.standard_normal(d)
    (y,) = std("layer_norm", x, g, b, params={"eps": 1e-3})
    close(y, _layer_norm(x, g, b, 1e-3))


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"rank{len(s)}")
def test_bias_add_and_dropout_any_rank(std, close, rng, shape):
    x, b, u = rng.standard_normal(shape), rng.standard_normal(shape[-1]), rng.random(shape)
    (y,) = std("bias_add", x, b)
    close(y, x + b)
    (y,) = std("dropout", x, u, params={"p": 0.25})
    close(y, np.where(u >= 0.25, x / 0.75, 0.0))


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"rank{len(s)}")
def test_linear_any_rank(std, close, rng, shape):
    x, w, b = rng.standard_normal(shape), rng.standard_normal((shape[-1], 3)), \
        rng.standard_normal(3)
    (y,) = std("linear", x, w, b)
    close(y, x @ w + b)
    (y,) = std("linear_nobias", x, w)
    close(y, x @ w)


@pytest.mark.parametrize("shape", [(), (4,), (2, 3), (2, 2, 3)], ids=lambda s: f"rank{len(s)}")
def test_embedding_any_rank(std, close, rng, shape):
    ids = rng.integers(0, 5, shape).astype(np.int32)
    table = rng.standard_normal((5, 3))
    (y,) = std("embedding", ids, table)
    close(y, table[ids])


def test_rank_specific_names_still_work(std, close, rng):
    x, u = rng.standard_normal((2, 3, 2, 2)), rng.random((2, 3, 2, 2))
    (a,) = std("relu_4d", x)
    (b,) = std("relu", x)
    close(a, b)
    (a,) = std("dropout_4d", x, u, params={"p": 0.5})
    (b,) = std("dropout", x, u, params={"p": 0.5})
    close(a, b)


def test_polymorphic_ops_keep_the_rank2_ir(std_compile):
    # a rank-2 call prints as before the ops became polymorphic: the one leading index is `n`
    from nfc.printer import print_module

    m = std_compile("softmax", [TensorType((3, 4), DType.F32)])
    text = print_module(m)
    assert "%m = nf.compute [n: 3] max [c: 4] (%x[n, c])" in text
    assert "%y = nf.compute [n: 3, c: 4] (%e[n, c] / %s[n])" in text


# ---- gradients ------------------------------------------------------------------------------

def _gradcheck():  # noqa: ANN202 - the helper of tests/autodiff, loaded by path
    path = Path(__file__).resolve().parents[1] / "autodiff" / "conftest.py"
    spec = importlib.util.spec_from_file_location("_autodiff_helpers", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.gradcheck


GRAD_CASES = [
    # name, shapes of the float arguments (u: uniform), params
    ("softmax", [(2, 3, 4)], {}),
    ("log_softmax", [(2, 1, 2, 3)], {}),
    ("layer_norm", [(2, 2, 4), (4,), (4,)], {}),
    ("layer_norm", [(1, 2, 2, 3), (3,), (3,)], {}),
    ("gelu", [(2, 3, 2)], {}),
    ("relu", [(2, 2, 3)], {}),
    ("leaky_relu", [(2, 2, 1, 3)], {"alpha": 0.1}),
    ("elu", [(2, 3, 2)], {}),
    ("sigmoid", [(2, 1, 2, 2)], {}),
    ("tanh", [(3, 2, 2)], {}),
    ("dropout", [(2, 3, 2), ("u", (2, 3, 2))], {"p": 0.3}),
    ("bias_add", [(2, 2, 2, 3), (3,)], {}),
    ("linear", [(2, 3, 4), (4, 2), (2,)], {}),
    ("squash", [(2, 2, 1, 3)], {}),
    ("capsule_length", [(2, 3, 4)], {}),
]


@pytest.mark.parametrize("case", GRAD_CASES,
                         ids=[f"{c[0]}-rank{len(c[1][0])}" for c in GRAD_CASES])
def test_polymorphic_gradients(rng, case):
    import nfc.std
    from nfc.frontend import compile_op

    name, specs, params = case
    arrays = [rng.random(s[1]) if isinstance(s[0], str) else rng.standard_normal(s)
              for s in specs]
    module = compile_op(Path(nfc.std.__file__).parent / "nn.nf", name,
                        [TensorType(a.shape, DType.F64) for a in arrays], params)
    func = module.func(name)
    inputs = {a.name: x for a, x in zip(func.args, arrays, strict=True)}
    wrt = [a.name for a, s in zip(func.args, specs, strict=True) if not isinstance(s[0], str)]
    _gradcheck()(func, inputs, wrt, module=module, elementwise=0)


# ---- losses, matmul and bmm over leading dimensions -----------------------------------------

def _ce(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    flat, lab = logits.reshape(-1, logits.shape[-1]), labels.reshape(-1)
    e = np.exp(flat - flat.max(axis=-1, keepdims=True))
    lp = np.log(e / e.sum(axis=-1, keepdims=True))
    return np.array(-lp[np.arange(len(lab)), lab].mean())


def _margin(lengths: np.ndarray, labels: np.ndarray, m_pos: float = 0.9, m_neg: float = 0.1,
            lam: float = 0.5) -> np.ndarray:
    k = lengths.shape[-1]
    onehot = np.eye(k)[labels]
    per = (onehot * np.clip(m_pos - lengths, 0, None) ** 2
           + lam * (1 - onehot) * np.clip(lengths - m_neg, 0, None) ** 2)
    return np.array(per.sum() / max(labels.size, 1))


LOSS_SHAPES = [(5,), (3, 5), (2, 3, 5), (2, 2, 3, 4)]


@pytest.mark.parametrize("label_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("shape", LOSS_SHAPES, ids=lambda s: f"rank{len(s)}")
def test_softmax_cross_entropy_any_rank(std, close, rng, shape, label_dtype):
    logits = 2 * rng.standard_normal(shape)
    labels = rng.integers(0, shape[-1], shape[:-1]).astype(label_dtype)
    (loss,) = std("softmax_cross_entropy", logits, labels)
    assert loss.shape == ()
    close(loss, _ce(logits, labels))


@pytest.mark.parametrize("shape", LOSS_SHAPES, ids=lambda s: f"rank{len(s)}")
def test_margin_loss_any_rank(std, close, rng, shape):
    lengths = rng.random(shape)
    labels = rng.integers(0, shape[-1], shape[:-1]).astype(np.int32)
    (loss,) = std("margin_loss", lengths, labels)
    close(loss, _margin(lengths, labels))
    params = {"m_pos": 0.8, "m_neg": 0.2, "lam": 0.25}
    (loss,) = std("margin_loss", lengths, labels, params=params)
    close(loss, _margin(lengths, labels, **params))


@pytest.mark.parametrize("lead", [(), (2,), (2, 3)], ids=lambda s: f"batch{len(s)}")
def test_matmul_and_bmm_any_rank(std, close, rng, lead):
    a, w = rng.standard_normal((*lead, 3, 4)), rng.standard_normal((4, 2))
    (y,) = std("matmul", a, w)
    close(y, a @ w)
    b = rng.standard_normal((*lead, 4, 5))
    (y,) = std("bmm", a, b)
    close(y, np.matmul(a, b))


@pytest.mark.parametrize(("name", "other"), [("softmax_cross_entropy", "softmax_cross_entropy_2d"),
                                             ("margin_loss", "margin_loss_2d")])
def test_rank2_losses_are_the_2d_op(std_compile, name, other):
    # the reshapes of a rank-2 call are the identity, which is no copy at all
    from nfc.printer import print_func

    types = [TensorType((3, 4), DType.F32), TensorType((3,), DType.I32)]
    ours = print_func(std_compile(name, types).func(name), locs=False)
    theirs = print_func(std_compile(other, types).func(other), locs=False)
    assert ours.replace(f"@{name}", "@f") == theirs.replace(f"@{other}", "@f")


def test_matmul_rank2_ir_is_unchanged(std_compile):
    from nfc.printer import print_module

    text = print_module(std_compile("matmul", [TensorType((3, 4), DType.F32),
                                               TensorType((4, 2), DType.F32)]))
    assert "nf.compute [n: 3, m: 2] sum [k: 4] (%a[n, k] * %b[k, m])" in text, text


def test_labels_must_match_the_leading_dimensions(std_compile):
    from nfc.diagnostics import CompileError

    with pytest.raises(CompileError, match=r"'\.\.\.' = \[2, 3\] was bound by argument 1"):
        std_compile("softmax_cross_entropy", [TensorType((2, 3, 5), DType.F32),
                                              TensorType((3, 2), DType.I32)])


LOSS_GRAD_CASES = [
    # name, float shapes, int labels shape (None: no labels), params
    ("softmax_cross_entropy", [(2, 3, 4)], (2, 3), {}),
    ("softmax_cross_entropy", [(4,)], (), {}),
    ("margin_loss", [(2, 2, 3)], (2, 2), {"lam": 0.25}),
    ("matmul", [(2, 3, 4), (4, 2)], None, {}),
    ("bmm", [(2, 2, 3, 4), (2, 2, 4, 2)], None, {}),
]


@pytest.mark.parametrize("case", LOSS_GRAD_CASES,
                         ids=[f"{c[0]}-rank{len(c[1][0])}" for c in LOSS_GRAD_CASES])
def test_loss_and_product_gradients_any_rank(rng, case):
    import nfc.std
    from nfc.frontend import compile_op

    name, shapes, labels, params = case
    arrays = [rng.random(s) if name == "margin_loss" else rng.standard_normal(s)
              for s in shapes]
    types = [TensorType(a.shape, DType.F64) for a in arrays]
    if labels is not None:
        arrays.append(rng.integers(0, shapes[0][-1], labels).astype(np.int32))
        types.append(TensorType(labels, DType.I32))
    module = compile_op(Path(nfc.std.__file__).parent / "nn.nf", name, types, params)
    func = module.func(name)
    inputs = {a.name: x for a, x in zip(func.args, arrays, strict=True)}
    wrt = [a.name for a in func.args[:len(shapes)]]
    _gradcheck()(func, inputs, wrt, module=module, elementwise=0)
