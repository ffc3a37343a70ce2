"""nfc.jax: `.nf` ops as JAX functions (pure_callback + custom_vjp with nfc's backward),
against jnp formulations of the same ops under jax.grad and jax.jit, in float64."""

from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="jax is not installed (optional test dependency)")
import jax.numpy as jnp  # noqa: E402

import nfc.jax  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
EPS = float(np.finfo(np.float64).eps)


def _capsule_conv(a, k):  # noqa: ANN001, ANN202
    kh, kw = k.shape[2], k.shape[3]
    ho, wo = (a.shape[2] - kh) // 2 + 1, (a.shape[3] - kw) // 2 + 1
    win = jnp.stack([jnp.stack([a[:, :, r:r + 2 * ho - 1:2, s:s + 2 * wo - 1:2]
                                for s in range(kw)], -1) for r in range(kh)], -2)
    return jnp.einsum("bcpqitrs,ocrstj->bopqij", win, k)       # win: [B,C,Ho,Wo,P,P,KH,KW]


def _lltm(x, h, c, w, b):  # noqa: ANN001, ANN202
    g = jnp.concatenate([h, x], 1) @ w + b
    gi, go, gz = jnp.split(g, 3, axis=1)
    c2 = c + jax.nn.elu(gz) * jax.nn.sigmoid(gi)
    return jnp.tanh(c2) * jax.nn.sigmoid(go), c2


def _milstm(x, h, c, w, u, alpha, beta1, beta2, b):  # noqa: ANN001, ANN202
    wx, uh = x @ w, h @ u
    z = alpha * wx * uh + beta1 * uh + beta2 * wx + b
    zi, zf, zg, zo = jnp.split(z, 4, axis=1)
    c2 = jax.nn.sigmoid(zf) * c + jax.nn.sigmoid(zi) * jnp.tanh(zg)
    return jax.nn.sigmoid(zo) * jnp.tanh(c2), c2


def _depth2space(x, r=2):  # noqa: ANN001, ANN202
    n, c, h, w = x.shape
    y = x.reshape(n, c // (r * r), r, r, h, w).transpose(0, 1, 4, 2, 5, 3)
    return y.reshape(n, c // (r * r), h * r, w * r)


def _shuffle(x, g=3):  # noqa: ANN001, ANN202
    n, c, h, w = x.shape
    return x.reshape(n, g, c // g, h, w).transpose(0, 2, 1, 3, 4).reshape(n, c, h, w)


CASES = [
    # (id, source, op, params, shapes, jnp formulation, roundings per element)
    ("capsule_conv", "std.nn", "capsule_conv", {"stride": 2},
     [(2, 2, 5, 5, 2, 2), (3, 2, 3, 3, 2, 2)], _capsule_conv, 36),
    ("lltm_cell", ROOT / "examples/models/lltm.nf", "lltm_cell", {},
     [(3, 4), (3, 5), (3, 5), (9, 15), (15,)], _lltm, 25),
    ("milstm_cell", ROOT / "examples/milstm.nf", "milstm_cell", {},
     [(3, 4), (3, 5), (3, 5), (4, 20), (5, 20), (20,), (20,), (20,), (20,)], _milstm, 30),
    ("depth2space", "std.nn", "depth2space", {"r": 2}, [(2, 8, 3, 3)], _depth2space, 0),
    ("channel_shuffle", "std.nn", "channel_shuffle", {"groups": 3}, [(2, 6, 3, 2)], _shuffle, 0),
]


@pytest.fixture(autouse=True)
def x64():  # noqa: ANN201
    with jax.enable_x64(True):
        yield


def _tuple(x):  # noqa: ANN001, ANN202
    return x if isinstance(x, tuple) else (x,)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_value_and_grad_match_jnp_under_jit(case) -> None:  # noqa: ANN001
    _, source, name, params, shapes, ref, depth = case
    op = nfc.jax.load_op(source, name, params)
    rng = np.random.default_rng(0)
    args = [jnp.asarray(rng.uniform(-1, 1, s)) for s in shapes]
    ws = [jnp.asarray(rng.uniform(0, 1, o.shape)) for o in _tuple(ref(*args))]

    def loss(f):  # noqa: ANN001, ANN202
        # a weighted sum of every output, so each output's cotangent is a random array
        return lambda *a: sum((o * w).sum() for o, w in zip(_tuple(f(*a)), ws, strict=True))

    argnums = tuple(range(len(args)))
    v1, g1 = jax.jit(jax.value_and_grad(loss(op), argnums=argnums))(*args)
    v2, g2 = jax.value_and_grad(loss(ref), argnums=argnums)(*args)
    # values in [-1, 1): each element rounds `depth` times relative to sums of at most
    # `n_terms` products of magnitude <= 20 (the MI-LSTM's alpha * wx * uh); the weighted sum
    # over n_out elements adds that many roundings
    n_out = sum(int(np.prod(o.shape)) for o in _tuple(ref(*args)))
    tol = 2 * (depth + n_out) * EPS * 20 * n_out
    assert abs(float(v1 - v2)) <= tol
    for a, b in zip(g1, g2, strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype
        assert float(jnp.abs(a - b).max()) <= tol


def test_integer_inputs_take_no_gradient() -> None:
    op = nfc.jax.load_op("std.nn", "margin_loss")
    lengths = jnp.asarray(np.random.default_rng(1).uniform(0, 1, (4, 3)))
    labels = jnp.asarray([0, 2, 1, 2], jnp.int32)
    onehot = jax.nn.one_hot(labels, 3)

    def ref(x):  # noqa: ANN001, ANN202
        return (onehot * jax.nn.relu(0.9 - x) ** 2
                + 0.5 * (1 - onehot) * jax.nn.relu(x - 0.1) ** 2).sum() / 4

    g1 = jax.grad(lambda x: op(x, labels))(lengths)
    g2 = jax.grad(ref)(lengths)
    assert float(jnp.abs(g1 - g2).max()) <= 48 * EPS


def test_vmap_runs_the_op_per_element() -> None:
    op = nfc.jax.load_op("std.nn", "depth2space", {"r": 2})
    x = jnp.asarray(np.random.default_rng(2).uniform(-1, 1, (3, 1, 8, 2, 2)))
    got = jax.vmap(op)(x)
    assert got.shape == (3, 1, 2, 4, 4)
    assert bool(jnp.all(got == jax.vmap(_depth2space)(x)))


def test_shape_the_signature_refuses_fails_at_trace_time() -> None:
    op = nfc.jax.load_op("std.nn", "depth2space", {"r": 2})
    with pytest.raises(nfc.jax.OpError, match=r"6 is not a multiple of 4"):
        jax.jit(op)(jnp.zeros((1, 6, 2, 2)))
