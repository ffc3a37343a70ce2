"""swap-operands: narrow contractions computed transposed; numerics unchanged (interpreter)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from passes_testlib import apply, computes

from nfc.interp import run
from nfc.passes.swap_operands import SwapOperands
from nfc.runtime.build import build_module

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_mlp_digits_forward_and_train_step() -> None:
    pipeline = "im2col,training-functions,inline,canonicalize,cse,dce"
    before, _ = build_module(EXAMPLES / "mlp_digits.nf", pipeline=pipeline)
    after, _ = build_module(EXAMPLES / "mlp_digits.nf", pipeline=pipeline)
    apply(after, SwapOperands())
    # the classifier (64 x 10) and its weight gradient (64 x 10 over the batch) are swapped
    swapped = [c for c in computes(after, "train_step")
               if c.reduce == "sum" and len(c.dims) == 2 and c.dims[0].extent == 10
               and c.dims[1].extent > 10]
    assert len(swapped) >= 2
    apply(after, SwapOperands())  # a second run changes nothing more
    assert len(computes(after, "train_step")) == len(computes(
        apply(build_module(EXAMPLES / "mlp_digits.nf", pipeline=pipeline)[0], SwapOperands()),
        "train_step"))
    rng = np.random.default_rng(0)
    for name in ("forward", "train_step"):
        f = before.func(name)
        inputs = [rng.standard_normal(a.shape).astype(a.dtype.numpy) if a.dtype.is_float
                  else rng.integers(0, 10, a.shape).astype(a.dtype.numpy) for a in f.args]
        want = run(f, inputs, module=before)
        got = run(after.func(name), inputs, module=after)
        for w, g in zip(want, got, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
