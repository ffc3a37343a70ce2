"""Plain JAX twins of nfc's benchmark models (the same models as benchmarks/torch_models.py).

Each model is a pure function

    forward(params, state, inputs, cfg, training) -> (loss, outputs, new_state)

over dicts keyed by the `.nf` names (parameters, running statistics, inputs), with the `.nf`
model's params in `cfg` (defaults in `MODELS[name].defaults`). The parameter values come from
the caller as numpy arrays (from nfc's initializers or from the PyTorch twin), so all three
implementations start from the same numbers. `make_train_step` builds the jitted training step:
forward, loss, gradients, and the model's SGD (PyTorch's formula: buf = momentum * buf + g;
p -= lr * buf):

    step = make_train_step("mlp3", {"batch": 4})
    params, state, buffers, loss = step(params, state, buffers, inputs)

Nothing here imports nfc or torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

Tree = dict[str, Any]


@dataclass(frozen=True)
class JaxModel:
    """A model: its forward function, default model params and optimizer."""

    forward: Callable[..., tuple[Any, Tree, Tree]]
    defaults: dict[str, Any]
    lr: float
    momentum: float = 0.0


# ------------------------------------------------------------------------------------------------
# building blocks (std.nn semantics)

def conv2d(x, k, stride: int = 1, padding: int = 0, groups: int = 1):
    """Cross-correlation, NCHW x OIHW (std.nn conv2d)."""
    return jax.lax.conv_general_dilated(x, k, (stride, stride), [(padding, padding)] * 2,
                                        dimension_numbers=("NCHW", "OIHW", "NCHW"),
                                        feature_group_count=groups)


def max_pool2d(x, size: int, stride: int):
    """Max pooling without padding."""
    return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 1, size, size),
                                 (1, 1, stride, stride), "VALID")


def cross_entropy(logits, labels):
    """Mean softmax cross-entropy of integer labels."""
    lp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(lp, labels[:, None], axis=1))


def squash(x, eps: float = 1e-7):
    """std.nn squash over the last axis."""
    n2 = jnp.sum(x * x, -1, keepdims=True)
    return x * (n2 / (1.0 + n2)) * jax.lax.rsqrt(n2 + eps)


def capsule_length(x, eps: float = 1e-7):
    """sqrt(|x|^2 + eps) over the last axis."""
    return jnp.sqrt(jnp.sum(x * x, -1) + eps)


def margin_loss(lengths, labels, m_pos: float = 0.9, m_neg: float = 0.1, lam: float = 0.5):
    """std.nn margin_loss, mean over the batch."""
    t = jax.nn.one_hot(labels, lengths.shape[1], dtype=lengths.dtype)
    hi = jnp.maximum(m_pos - lengths, 0.0)
    lo = jnp.maximum(lengths - m_neg, 0.0)
    return jnp.sum(t * hi * hi + lam * (1 - t) * lo * lo) / lengths.shape[0]


def batch_norm(x, p: Tree, state: Tree, new_state: Tree, g: str, b: str, m: str, v: str,
               training: bool, unbiased: bool = True):
    """Batch norm over N, H, W; in training the running statistics move towards the batch
    statistics (momentum 0.1; the variance unbiased as in PyTorch unless `unbiased` is off)."""
    shape = (1, -1, 1, 1)
    if not training:
        return ((x - state[m].reshape(shape)) * jax.lax.rsqrt(state[v].reshape(shape) + 1e-5)
                * p[g].reshape(shape) + p[b].reshape(shape))
    mean = jnp.mean(x, (0, 2, 3))
    var = jnp.mean((x - mean.reshape(shape)) ** 2, (0, 2, 3))
    count = x.shape[0] * x.shape[2] * x.shape[3]
    run_var = var * count / (count - 1) if unbiased else var
    new_state[m] = 0.9 * state[m] + 0.1 * jax.lax.stop_gradient(mean)
    new_state[v] = 0.9 * state[v] + 0.1 * jax.lax.stop_gradient(run_var)
    return ((x - mean.reshape(shape)) * jax.lax.rsqrt(var.reshape(shape) + 1e-5)
            * p[g].reshape(shape) + p[b].reshape(shape))


def lstm_gates(z, c):
    """The LSTM update from gate pre-activations z = [i, f, g, o]."""
    i, f, g, o = jnp.split(z, 4, axis=1)
    c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
    return jax.nn.sigmoid(o) * jnp.tanh(c), c


# ------------------------------------------------------------------------------------------------
# the models (see the .nf files and benchmarks/torch_models.py)

def mlp3(p, s, x, cfg, training):
    """examples/mlp.nf."""
    h1 = jax.nn.relu(x["x"] @ p["w1"] + p["b1"])
    h2 = jax.nn.relu(h1 @ p["w2"] + p["b2"])
    logits = h2 @ p["w3"] + p["b3"]
    return cross_entropy(logits, x["y"]), {"logits": logits}, {}


def lenet5(p, s, x, cfg, training):
    """examples/lenet5.nf."""
    a1 = jax.nn.relu(conv2d(x["x"], p["k1"], padding=2) + p["c1"].reshape(1, -1, 1, 1))
    a2 = jax.nn.relu(conv2d(max_pool2d(a1, 2, 2), p["k2"]) + p["c2"].reshape(1, -1, 1, 1))
    flat = max_pool2d(a2, 2, 2).reshape(a2.shape[0], -1)
    h3 = jax.nn.relu(flat @ p["w3"] + p["b3"])
    h4 = jax.nn.relu(h3 @ p["w4"] + p["b4"])
    logits = h4 @ p["w5"] + p["b5"]
    return cross_entropy(logits, x["y"]), {"logits": logits}, {}


def resnet18(p, s, x, cfg, training):
    """examples/models/resnet18.nf."""
    ns: Tree = {}

    def bn(z, pre):
        return batch_norm(z, p, s, ns, pre + "_g", pre + "_b", pre + "_m", pre + "_v", training)

    h = jax.nn.relu(bn(conv2d(x["x"], p["stem_k"], padding=1), "stem"))
    for stage in range(4):
        for blk in "ab":
            pre = f"s{stage + 1}{blk}"
            down = blk == "a" and stage > 0
            stride = 2 if down else 1
            a = jax.nn.relu(bn(conv2d(h, p[pre + "_k1"], stride, 1), pre + "_1"))
            z = bn(conv2d(a, p[pre + "_k2"], 1, 1), pre + "_2")
            sc = bn(conv2d(h, p[pre + "_kd"], 2), pre + "_d") if down else h
            h = jax.nn.relu(z + sc)
    logits = jnp.mean(h, (2, 3)) @ p["fc_w"] + p["fc_b"]
    return cross_entropy(logits, x["y"]), {"logits": logits}, ns


def squeezenet(p, s, x, cfg, training):
    """examples/models/squeezenet.nf."""
    def conv_relu(z, k, b, padding=0, stride=1):
        return jax.nn.relu(conv2d(z, p[k], stride, padding) + p[b].reshape(1, -1, 1, 1))

    def fire(z, f):
        sq = conv_relu(z, f + "_ks", f + "_bs")
        return jnp.concatenate([conv_relu(sq, f + "_k1", f + "_b1"),
                                conv_relu(sq, f + "_k3", f + "_b3", padding=1)], axis=1)

    h = max_pool2d(conv_relu(x["x"], "k0", "b0", stride=2), 3, 2)
    h = max_pool2d(fire(fire(h, "f2"), "f3"), 3, 2)
    h = fire(fire(h, "f4"), "f5")
    logits = jnp.mean(conv_relu(h, "k10", "b10"), (2, 3))
    return cross_entropy(logits, x["y"]), {"logits": logits}, {}


def lstm_lm(p, s, x, cfg, training):
    """examples/models/lstm_lm.nf."""
    ids, targets = x["ids"], x["targets"]
    n, steps = ids.shape
    h = jnp.zeros((n, cfg["hidden"]), p["w"].dtype)
    c = jnp.zeros_like(h)
    total = 0.0
    for t in range(steps):
        h, c = lstm_gates(jnp.concatenate([p["emb"][ids[:, t]], h], 1) @ p["w"] + p["b"], c)
        total = total + cross_entropy(h @ p["wo"] + p["bo"], targets[:, t])
    return total / steps, {}, {}


def capsnet(p, s, x, cfg, training):
    """examples/models/capsnet.nf."""
    h = jax.nn.relu(conv2d(x["x"], p["k1"]) + p["b1"].reshape(1, -1, 1, 1))
    types, pdim = p["kp"].shape[:2]
    kp = p["kp"].reshape((types * pdim,) + p["kp"].shape[2:])
    caps = conv2d(h, kp, stride=2) + p["bp"].reshape(1, -1, 1, 1)
    n, _, gh, gw = caps.shape
    caps = caps.reshape(n, types, pdim, gh, gw).transpose(0, 1, 3, 4, 2)
    u = squash(caps.reshape(n, types * gh * gw, pdim))
    uhat = jnp.einsum("ijed,nid->nije", p["wd"], u)
    blog = jnp.zeros(uhat.shape[:3], uhat.dtype)
    for _ in range(cfg["rounds"]):
        v = squash(jnp.einsum("nij,nije->nje", jax.nn.softmax(blog, axis=2), uhat))
        blog = blog + jnp.einsum("nije,nje->nij", uhat, v)
    lengths = capsule_length(v)
    return margin_loss(lengths, x["y"]), {"lengths": lengths}, {}


def capsule_conv(a, k, stride: int = 2):
    """std.nn capsule_conv."""
    kh, kw = k.shape[2:4]
    ho = (a.shape[2] - kh) // stride + 1
    wo = (a.shape[3] - kw) // stride + 1
    out = 0.0
    for r in range(kh):
        for q in range(kw):
            win = a[:, :, r:r + stride * (ho - 1) + 1:stride, q:q + stride * (wo - 1) + 1:stride]
            out = out + jnp.einsum("bcpqit,octj->bopqij", win, k[:, :, r, q])
    return out


def matrix_capsule(p, s, x, cfg, training):
    """examples/capsule.nf."""
    n = x["x"].shape[0]
    a0 = jax.nn.relu(conv2d(x["x"], p["k0"]) + p["c0"].reshape(1, -1, 1, 1))
    p0 = a0.reshape(n, 2, 16, 10, 10).transpose(0, 1, 3, 4, 2).reshape(n, 2, 10, 10, 4, 4)
    u1 = squash(capsule_conv(p0, p["k1"]).reshape(n, 64, 16))
    v2 = squash((u1.reshape(n, 1024) @ p["w2"]).reshape(n, cfg["classes"], 16))
    lengths = capsule_length(v2)
    return margin_loss(lengths, x["y"]), {"lengths": lengths}, {}


def shufflenet_unit(p, s, x, cfg, training):
    """examples/shufflenet_unit.nf (its running variance uses the biased batch variance)."""
    ns: Tree = {}
    g = cfg["groups"]

    def bn(z, i):
        return batch_norm(z, p, s, ns, f"g{i}", f"s{i}", f"m{i}", f"v{i}", training,
                          unbiased=False)

    h = jax.nn.relu(conv2d(x["x"], p["k0"], 2, 1))
    a1 = jax.nn.relu(bn(conv2d(h, p["k1"], groups=g), 1))
    n, c, hh, ww = a1.shape
    shuffled = a1.reshape(n, g, c // g, hh, ww).transpose(0, 2, 1, 3, 4).reshape(n, c, hh, ww)
    a2 = bn(conv2d(shuffled, p["k2"], 1, 1, groups=c), 2)
    a3 = bn(conv2d(a2, p["k3"], groups=g), 3)
    logits = jnp.mean(jax.nn.relu(a3 + h), (2, 3)) @ p["wo"] + p["bo"]
    return cross_entropy(logits, x["y"]), {"logits": logits}, ns


def mobilenet(p, s, x, cfg, training):
    """examples/models/mobilenet.nf."""
    ns: Tree = {}

    def bn(z, g, b, m, v):
        return batch_norm(z, p, s, ns, g, b, m, v, training)

    h = jax.nn.relu(bn(conv2d(x["x"], p["k0"], 2, 1), "g0", "b0", "m0", "v0"))
    for i, stride in ((1, 1), (2, 2)):
        kd = p[f"d{i}_k"]
        d, q = f"d{i}", f"p{i}"
        h = jax.nn.relu(bn(conv2d(h, kd, stride, 1, groups=kd.shape[0]),
                           d + "_g", d + "_b", d + "_m", d + "_v"))
        h = jax.nn.relu(bn(conv2d(h, p[q + "_k"]), q + "_g", q + "_b", q + "_m", q + "_v"))
    logits = jnp.mean(h, (2, 3)) @ p["fc_w"] + p["fc_b"]
    return cross_entropy(logits, x["y"]), {"logits": logits}, ns


def _classify(p, h, y):
    logits = h @ p["wo"] + p["bo"]
    return cross_entropy(logits, y), {"logits": logits}, {}


def mi_lstm(p, s, x, cfg, training):
    """examples/models/mi_lstm.nf."""
    xs = x["x"]
    h = jnp.zeros((xs.shape[0], cfg["hidden"]), xs.dtype)
    c = jnp.zeros_like(h)
    for t in range(xs.shape[1]):
        h, c = lstm_gates((xs[:, t] @ p["w"]) * (h @ p["u"]) + p["b"], c)
    return _classify(p, h, x["y"])


def sc_rnn(p, s, x, cfg, training):
    """examples/models/sc_rnn.nf."""
    xs, alpha = x["x"], 0.95
    h = jnp.zeros((xs.shape[0], cfg["hidden"]), xs.dtype)
    st = jnp.zeros((xs.shape[0], cfg["context"]), xs.dtype)
    for t in range(xs.shape[1]):
        st = (1 - alpha) * (xs[:, t] @ p["bw"]) + alpha * st
        h = jax.nn.sigmoid(st @ p["p"] + xs[:, t] @ p["a"] + h @ p["r"])
    logits = h @ p["wu"] + p["bo"] + st @ p["wv"]
    return cross_entropy(logits, x["y"]), {"logits": logits}, {}


def sublstm(p, s, x, cfg, training):
    """examples/models/sublstm.nf."""
    xs = x["x"]
    h = jnp.zeros((xs.shape[0], cfg["hidden"]), xs.dtype)
    c = jnp.zeros_like(h)
    for t in range(xs.shape[1]):
        i, f, z, o = jnp.split(jax.nn.sigmoid(jnp.concatenate([xs[:, t], h], 1) @ p["w"]
                                              + p["b"]), 4, axis=1)
        c = f * c + z - i
        h = jax.nn.sigmoid(c) - o
    return _classify(p, h, x["y"])


def lltm(p, s, x, cfg, training):
    """examples/models/lltm.nf."""
    xs = x["x"]
    h = jnp.zeros((xs.shape[0], cfg["state_size"]), xs.dtype)
    c = jnp.zeros_like(h)
    for t in range(xs.shape[1]):
        gi, go, gz = jnp.split(jnp.concatenate([h, xs[:, t]], 1) @ p["w"] + p["b"], 3, axis=1)
        c = c + jax.nn.elu(gz) * jax.nn.sigmoid(gi)
        h = jnp.tanh(c) * jax.nn.sigmoid(go)
    return _classify(p, h, x["y"])


def _layer_norm(z, g, b, eps: float = 1e-12):
    mu = jnp.mean(z, -1, keepdims=True)
    var = jnp.mean((z - mu) ** 2, -1, keepdims=True)
    return (z - mu) * jax.lax.rsqrt(var + eps) * g + b


def bert(p, s, x, cfg, training):
    """examples/models/bert.nf."""
    ids = x["ids"]
    d, heads = cfg["hidden"], cfg["heads"]
    n, sq = ids.shape
    h = _layer_norm(p["tok"][ids] + p["pos"], p["ln_g"], p["ln_b"])
    for i in range(cfg["layers"]):
        q, k, v = ((h @ p[w][i] + p[b][i]).reshape(n, sq, heads, d // heads).transpose(0, 2, 1, 3)
                   for w, b in (("wq", "bq"), ("wk", "bk"), ("wv", "bv")))
        prob = jax.nn.softmax(q @ k.transpose(0, 1, 3, 2) / math.sqrt(d // heads), axis=-1)
        ctx = (prob @ v).transpose(0, 2, 1, 3).reshape(n, sq, d)
        a = _layer_norm(h + ctx @ p["wo"][i] + p["bo"][i], p["g1"][i], p["b1"][i])
        f = jax.nn.gelu(a @ p["w1"][i] + p["c1"][i], approximate=False) @ p["w2"][i] + p["c2"][i]
        h = _layer_norm(a + f, p["g2"][i], p["b2"][i])
    pooled = jnp.tanh(h[:, 0] @ p["wp"] + p["bp"])
    logits = pooled @ p["wc"] + p["bc"]
    return cross_entropy(logits, x["y"]), {"logits": logits}, {}


#: Every model by benchmark name (the keys of torch_models.TWINS).
MODELS: dict[str, JaxModel] = {
    "mlp3": JaxModel(mlp3, {"batch": 256, "inputs": 784, "hidden1": 256, "hidden2": 128,
                            "classes": 10}, 0.1, 0.9),
    "lenet5": JaxModel(lenet5, {"batch": 64, "classes": 10}, 0.01, 0.9),
    "resnet18": JaxModel(resnet18, {"batch": 16, "image": 32, "width": 16, "classes": 10},
                         0.05, 0.9),
    "squeezenet": JaxModel(squeezenet, {"batch": 16, "image": 32, "squeeze": 16,
                                        "classes": 10}, 0.01, 0.9),
    "lstm_lm": JaxModel(lstm_lm, {"batch": 16, "steps": 32, "vocab": 128, "embed": 64,
                                  "hidden": 256}, 1.0),
    "capsnet": JaxModel(capsnet, {"batch": 16, "image": 28, "kernel": 9, "channels": 256,
                                  "types": 32, "pdim": 8, "ddim": 16, "classes": 10,
                                  "rounds": 3}, 0.01, 0.9),
    "matrix_capsule": JaxModel(matrix_capsule, {"batch": 16, "classes": 10}, 0.01, 0.9),
    "shufflenet_unit": JaxModel(shufflenet_unit, {"batch": 8, "groups": 2, "channels": 16,
                                                  "classes": 10}, 0.05, 0.9),
    "mobilenet": JaxModel(mobilenet, {"batch": 16, "image": 32, "width": 32, "classes": 10},
                          0.05, 0.9),
    "mi_lstm": JaxModel(mi_lstm, {"batch": 64, "steps": 8, "inputs": 784, "hidden": 1024,
                                  "classes": 10}, 0.1),
    "sc_rnn": JaxModel(sc_rnn, {"batch": 64, "steps": 8, "inputs": 784, "hidden": 128,
                                "context": 64, "classes": 10}, 0.1),
    "sublstm": JaxModel(sublstm, {"batch": 64, "steps": 8, "inputs": 784, "hidden": 128,
                                  "classes": 10}, 0.1),
    "lltm": JaxModel(lltm, {"batch": 64, "steps": 8, "inputs": 784, "state_size": 128,
                            "classes": 10}, 0.1),
    "bert": JaxModel(bert, {"batch": 8, "seq": 32, "vocab": 128, "hidden": 64, "heads": 4,
                            "ffn": 256, "layers": 2, "classes": 2}, 0.1, 0.9),
}


def make_forward(name: str, cfg: dict[str, Any] | None = None, training: bool = True):
    """The jitted `forward(params, state, inputs) -> (loss, outputs, new_state)`."""
    spec = MODELS[name]
    full = {**spec.defaults, **(cfg or {})}
    return jax.jit(lambda p, s, x: spec.forward(p, s, x, full, training))


def make_train_step(name: str, cfg: dict[str, Any] | None = None):
    """The jitted SGD step `(params, state, buffers, inputs) -> (params, state, buffers, loss)`.

    `buffers` holds the momentum buffers by parameter name (zeros to start; ignored without
    momentum)."""
    spec = MODELS[name]
    full = {**spec.defaults, **(cfg or {})}

    def loss_fn(p, s, x):
        loss, _, new_state = spec.forward(p, s, x, full, True)
        return loss, new_state

    def step(p, s, buf, x):
        (loss, new_state), grads = jax.value_and_grad(loss_fn, has_aux=True)(p, s, x)
        if spec.momentum:
            buf = {k: spec.momentum * buf[k] + grads[k] for k in p}
            upd = buf
        else:
            upd = grads
        p = {k: p[k] - spec.lr * upd[k] for k in p}
        return p, {**s, **new_state}, buf, loss

    return jax.jit(step)
