"""The driver runtime: on a machine without an NVIDIA driver, a clear "no NVIDIA driver" error;
on one with a GPU (scripts/gpu_check.sh), kernels run and match the interpreter."""

from __future__ import annotations

import numpy as np
import pytest
from cuda_lib import case_programs, inputs_of, random_inputs, reference

pytest.importorskip("cuda.bindings.driver", reason="cuda-python (the 'cuda' extra) is not "
                    "installed")

from nfc.codegen.cuda.driver import Device, NoDriverError, run_program  # noqa: E402
from nfc.codegen.cuda.program import compile_program  # noqa: E402


def _device() -> Device | None:
    try:
        return Device()
    except NoDriverError:
        return None


DEVICE = _device()


@pytest.mark.skipif(DEVICE is not None, reason="this machine has an NVIDIA driver and a GPU")
def test_no_driver_is_reported_clearly():
    with pytest.raises(NoDriverError, match=r"^no NVIDIA driver: cuInit could not load the "
                       r"driver library"):
        Device()


@pytest.mark.skipif(DEVICE is None, reason="no NVIDIA driver on this machine (the GPU check "
                    "runs in scripts/gpu_check.sh on a machine with one)")
@pytest.mark.parametrize("case", case_programs(), ids=lambda c: c[0])
def test_kernels_on_the_device_match_the_interpreter(case):
    assert DEVICE is not None
    name, op, program, positive, precision = case
    ins = random_inputs(inputs_of(op), 1, positive=positive, ints=(0, 13))
    if name.startswith("gather"):
        ins[1] = np.random.default_rng(2).integers(0, 50, ins[1].shape).astype(np.int32)
    arch = DEVICE.arch if DEVICE.arch in ("sm_80", "sm_90") else "sm_80"
    got = run_program(DEVICE, program, compile_program(program, arch), ins)
    want = reference(op, ins)
    tol = 2e-5 if precision == "fma" else 3e-2
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g.astype(np.float64), w, rtol=tol, atol=tol)
