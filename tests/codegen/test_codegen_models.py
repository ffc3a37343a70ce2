"""Every compute of real training steps (frontend + autodiff), compiled together into one
LLVM module with default schedules, matches the interpreter within the error bound of each
compute (codegen_lib.assert_matches)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from codegen_lib import assert_matches, random_inputs

from nfc.codegen.jit import compile_kernels
from nfc.ir import ComputeOp

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize("name", ["mlp.nf", "capsule.nf"])
def test_training_step_computes(name):
    from nfc.frontend import compile_file
    from nfc.passmanager import PassManager, get_pass

    module = compile_file(EXAMPLES / name)
    PassManager([get_pass("autodiff")()], verify=False).run(module)
    ops = [op for op in module.func("train_step").walk() if isinstance(op, ComputeOp)]
    assert ops
    for op, kernel in zip(ops, compile_kernels(ops), strict=True):
        ins = random_inputs(kernel.info.inputs, 1, positive=True)
        for n, v in enumerate(kernel.info.inputs):
            if v.dtype.is_int:  # labels and rng words: small non-negative values
                ins[n] = np.abs(ins[n]) % 2
        assert_matches(op, ins, [kernel(*ins)])
