"""Finite-difference gradient checks of every std.nn op (float64, through the interpreter)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import nfc.std
from nfc.ir import DType, TensorType

STD_NN = str(Path(nfc.std.__file__).parent / "nn.nf")

F, INT = "f", "i"

# name, [(kind, shape)], params, extra input generator per int arg
CASES: list[tuple[str, list[tuple[str, tuple[int, ...]]], dict]] = [
    ("matmul", [(F, (3, 4)), (F, (4, 5))], {}),
    ("bmm", [(F, (2, 3, 4)), (F, (2, 4, 2))], {}),
    ("linear", [(F, (3, 4)), (F, (4, 5)), (F, (5,))], {}),
    ("linear_nobias", [(F, (3, 4)), (F, (4, 5))], {}),
    ("bias_add", [(F, (3, 4)), (F, (4,))], {}),
    ("bias_add_nchw", [(F, (2, 3, 2, 2)), (F, (3,))], {}),
    ("conv2d", [(F, (1, 2, 5, 5)), (F, (3, 2, 3, 3))], {}),
    ("conv2d", [(F, (2, 4, 7, 7)), (F, (4, 2, 3, 3))],
     {"stride": 2, "padding": 1, "dilation": 2, "groups": 2}),
    ("depthwise_conv2d", [(F, (1, 3, 6, 6)), (F, (3, 1, 3, 3))], {"stride": 2, "padding": 1}),
    ("max_pool2d", [(F, (1, 2, 6, 6))], {"size": 2, "stride": 2}),
    ("max_pool2d", [(F, (1, 2, 7, 7))], {"size": 3, "stride": 2, "padding": 1}),
    ("avg_pool2d", [(F, (1, 2, 7, 7))], {"size": 3, "stride": 2, "padding": 1}),
    ("global_avg_pool", [(F, (2, 3, 3, 2))], {}),
    ("relu", [(F, (3, 5))], {}),
    ("relu_4d", [(F, (1, 2, 3, 3))], {}),
    ("leaky_relu", [(F, (3, 5))], {"alpha": 0.1}),
    ("elu", [(F, (3, 5))], {}),
    ("gelu", [(F, (3, 5))], {}),
    ("sigmoid", [(F, (3, 5))], {}),
    ("tanh", [(F, (3, 5))], {}),
    ("softmax", [(F, (3, 5))], {}),
    ("log_softmax", [(F, (3, 5))], {}),
    ("softmax_cross_entropy", [(F, (4, 5)), (INT, (4,))], {}),
    ("softmax_cross_entropy_2d", [(F, (4, 5)), (INT, (4,))], {}),
    ("mse", [(F, (3, 4)), (F, (3, 4))], {}),
    ("mse_1d", [(F, (5,)), (F, (5,))], {}),
    ("layer_norm", [(F, (3, 6)), (F, (6,)), (F, (6,))], {}),
    ("batch_norm_train", [(F, (3, 2, 2, 2)), (F, (2,)), (F, (2,))], {}),
    ("batch_norm_eval", [(F, (2, 2, 2, 2)), (F, (2,)), (F, (2,)), (F, (2,)), ("pos", (2,))],
     {}),
    ("batch_norm1d_train", [(F, (5, 3)), (F, (3,)), (F, (3,))], {}),
    ("batch_norm1d_eval", [(F, (4, 3)), (F, (3,)), (F, (3,)), (F, (3,)), ("pos", (3,))], {}),
    ("dropout", [(F, (4, 5)), ("u", (4, 5))], {"p": 0.3}),
    ("dropout_4d", [(F, (2, 2, 2, 3)), ("u", (2, 2, 2, 3))], {"p": 0.5}),
    ("transpose2d", [(F, (3, 4))], {}),
    ("flatten", [(F, (2, 3, 2, 2))], {}),
    ("concat2d_axis0", [(F, (2, 3)), (F, (3, 3))], {}),
    ("concat2d_axis1", [(F, (2, 3)), (F, (2, 2))], {}),
    ("concat4d_axis0", [(F, (1, 2, 2, 2)), (F, (2, 2, 2, 2))], {}),
    ("concat4d_axis1", [(F, (1, 2, 2, 2)), (F, (1, 1, 2, 2))], {}),
    ("concat4d_axis2", [(F, (1, 2, 2, 2)), (F, (1, 2, 3, 2))], {}),
    ("concat4d_axis3", [(F, (1, 2, 2, 2)), (F, (1, 2, 2, 1))], {}),
    ("slice2d_axis0", [(F, (5, 3))], {"start": 1, "size": 3}),
    ("slice2d_axis1", [(F, (3, 5))], {"start": 2, "size": 2}),
    ("slice4d_axis0", [(F, (3, 2, 2, 2))], {"start": 1, "size": 2}),
    ("slice4d_axis1", [(F, (1, 4, 2, 2))], {"start": 1, "size": 2}),
    ("slice4d_axis2", [(F, (1, 2, 4, 2))], {"start": 2, "size": 2}),
    ("slice4d_axis3", [(F, (1, 2, 2, 4))], {"start": 0, "size": 3}),
    ("pad2d", [(F, (1, 2, 3, 3))], {"p": 2}),
    ("depth2space", [(F, (1, 8, 2, 3))], {"r": 2}),
    ("depth2space_crd", [(F, (1, 8, 2, 3))], {"r": 2}),
    ("depth2space_dcr", [(F, (1, 8, 2, 3))], {"r": 2}),
    ("space2depth", [(F, (1, 2, 4, 6))], {"r": 2}),
    ("channel_shuffle", [(F, (1, 6, 2, 2))], {"groups": 3}),
    ("embedding", [(INT, (5,)), (F, (4, 3))], {}),
    ("capsule_conv", [(F, (1, 2, 5, 5, 2, 2)), (F, (2, 2, 3, 3, 2, 2))], {}),
    ("squash", [(F, (2, 3, 4))], {}),
    ("capsule_length", [(F, (2, 3, 4))], {}),
    ("margin_loss", [("len", (4, 3)), (INT, (4,))], {}),
    ("margin_loss_2d", [("len", (4, 3)), (INT, (4,))], {}),
    ("lstm_cell", [(F, (2, 3)), (F, (2, 4)), (F, (2, 4)), (F, (7, 16)), (F, (16,))], {}),
]


def _ident(case):
    name, _, params = case
    return name + "".join(f"-{k}{v}" for k, v in params.items())


def _arrays(rng, spec):
    out = []
    for kind, shape in spec:
        if kind == F:
            out.append(rng.standard_normal(shape))
        elif kind == "pos":
            out.append(rng.uniform(0.5, 1.5, shape))
        elif kind == "u":
            out.append(rng.random(shape))
        elif kind == "len":
            out.append(rng.uniform(0.0, 1.0, shape))
        else:
            out.append(rng.integers(0, 3, shape).astype(np.int32))
    return out


def test_every_std_op_is_covered():
    import re

    text = Path(STD_NN).read_text()
    ops = set(re.findall(r"^op (\w+)", text, re.M))
    assert ops <= {c[0] for c in CASES}, sorted(ops - {c[0] for c in CASES})


@pytest.mark.parametrize("case", CASES, ids=_ident)
def test_std_op_gradient(gradcheck, rng, case):
    from nfc.frontend import compile_op

    name, spec, params = case
    arrays = _arrays(rng, spec)
    types = [TensorType(a.shape, DType.F64 if a.dtype == np.float64 else DType.I32)
             for a in arrays]
    module = compile_op(STD_NN, name, types, params)
    func = module.func(name)
    inputs = {a.name: x for a, x in zip(func.args, arrays, strict=True)}
    wrt = [a.name for a, (kind, _) in zip(func.args, spec, strict=True)
           if kind in (F, "len")]
    gradcheck(func, inputs, wrt, module=module, elementwise=0)
