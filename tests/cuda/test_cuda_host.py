"""The generated CUDA C itself, compiled by the host C++ compiler with a CUDA shim and run on
CPU threads (nfc.codegen.cuda.hostrun), against the interpreter: checks what the simulator
cannot, the renderer's text (precedence, conversions, helpers such as the philox port)."""

from __future__ import annotations

import numpy as np
import pytest
from cuda_lib import case_programs, inputs_of, random_inputs, reference

from nfc.codegen.cuda.hostrun import build_host, host_compiler, run_host

PROGRAMS = case_programs()
pytestmark = pytest.mark.skipif(host_compiler() is None, reason="no host C++ compiler")


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    return build_host([k for _, _, p, _, _ in PROGRAMS for k in p.kernels],
                      tmp_path_factory.mktemp("host"))


@pytest.mark.parametrize("case", PROGRAMS, ids=[c[0] for c in PROGRAMS])
def test_generated_cuda_c_matches_the_interpreter(case, library):
    name, op, program, positive, precision = case
    ins = random_inputs(inputs_of(op), 1, positive=positive, ints=(0, 13))
    if name.startswith("gather"):
        ins[1] = np.random.default_rng(2).integers(0, 50, ins[1].shape).astype(np.int32)
    got = run_host(program, ins, library)
    want = reference(op, ins)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        if precision == "fma":
            np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-5)
        else:  # Tensor-core precisions: see test_cuda_sim for the exact bound
            np.testing.assert_allclose(g.astype(np.float64), w, rtol=3e-2, atol=3e-2)
