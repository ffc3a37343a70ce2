"""std.nn `mse` at any rank (0 to 4) against numpy, with gradients against finite
differences, and its shape diagnostics."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import nfc.std
from nfc.diagnostics import CompileError
from nfc.ir import DType, TensorType

STD_NN = Path(nfc.std.__file__).parent / "nn.nf"
SHAPES = [(), (5,), (3, 4), (2, 3, 4), (2, 1, 3, 2)]


def _compile(shape_a, shape_b=None):
    from nfc.frontend import compile_op

    types = [TensorType(shape_a, DType.F64), TensorType(shape_b or shape_a, DType.F64)]
    return compile_op(str(STD_NN), "mse", types)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"rank{len(s)}")
def test_mse_any_rank(gradcheck, rng, shape):
    from nfc.interp import run

    module = _compile(shape)
    f = module.func("mse")
    a, b = rng.standard_normal(shape), rng.standard_normal(shape)
    (loss,) = run(f, [a, b], module=module)
    np.testing.assert_allclose(loss, np.mean((a - b) ** 2), rtol=1e-12)
    gradcheck(f, {"a": a, "b": b}, ["a", "b"], module=module)


def test_mse_1d(rng):
    from nfc.frontend import compile_op
    from nfc.interp import run

    a, b = rng.standard_normal(7), rng.standard_normal(7)
    m = compile_op(str(STD_NN), "mse_1d", [TensorType((7,), DType.F64)] * 2)
    np.testing.assert_allclose(run(m.funcs[0], [a, b], module=m)[0], np.mean((a - b) ** 2))


@pytest.mark.parametrize("shape_b", [(3, 5), (4, 3), (12,)])
def test_mse_needs_equal_shapes(shape_b):
    with pytest.raises(CompileError) as err:
        _compile((3, 4), shape_b)
    dims = ", ".join(map(str, shape_b))
    assert (f"error: leading dimensions of argument 2 of 'mse' are [{dims}] ('...' of "
            f"f64[{dims}]) but '...' = [3, 4] was bound by argument 1") in str(err.value)
