"""Finite-difference checks of the derivative rules of the intrinsics added as rows of the
operator table (`softplus`, `log1p`, `expm1`, `atan2`, `isfinite`), in float64."""

from __future__ import annotations

import numpy as np
import pytest

BODIES = {
    "softplus": "softplus(%x[i] * 3.0) * %w[i]",
    "log1p": "log1p(%x[i] * %x[i]) + log1p(%w[i] * 0.5)",
    "expm1": "expm1(%x[i] * %w[i]) + expm1(1.0e-6 * %x[i])",
    "atan2": "atan2(%x[i], %w[i]) + atan2(%w[i] - 1.5, %x[i])",
    "isfinite": "select(isfinite(log(%x[i])), log(%x[i]), %w[i] * %w[i])",
    "mixed": "softplus(atan2(%x[i], 1.0 + %w[i] * %w[i])) * expm1(log1p(%w[i] * %w[i]))",
}


@pytest.mark.parametrize("name", list(BODIES))
def test_gradients(name, gradcheck, parse, rng):
    text = f"""
nf.func @f(%x: tensor<12xf64>, %w: tensor<12xf64>) -> (tensor<12xf64>) {{
  %y = nf.compute [i: 12] ({BODIES[name]}) : tensor<12xf64>
  nf.return %y : tensor<12xf64>
}}
"""
    f = parse(text).func("f")
    x = rng.standard_normal(12) * 2
    if name == "isfinite":
        x[::3] = -np.abs(x[::3])  # log of a negative number is NaN: the other branch
        x[np.abs(x) < 1e-3] = 0.5  # keep the points away from the kink at 0
    gradcheck(f, {"x": x, "w": rng.standard_normal(12)}, ["x", "w"], rtol=1e-5)


def test_isfinite_has_no_gradient_of_its_own(parse):
    from nfc.passes.autodiff.exprgrad import derivative

    f = parse("""
nf.func @f(%x: tensor<3xf64>) -> (tensor<3xi1>) {
  %y = nf.compute [i: 3] (isfinite(%x[i] * 2.0)) : tensor<3xi1>
  nf.return %y : tensor<3xi1>
}
""").func("f")
    op = f.body.ops[0]
    problems: list[str] = []
    load = next(iter(op.operands))
    from nfc.ir import Load, loads

    target = next(ld for ld in loads(op.body) if isinstance(ld, Load) and ld.tensor is load)
    assert derivative(op.body, target, problems) is None and problems == []
