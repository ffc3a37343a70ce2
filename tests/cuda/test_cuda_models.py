"""Every compute of real models through the CUDA backend: lowered with default GPU schedules,
rendered, compiled by NVRTC for sm_80 and sm_90, simulated (the training step also run as CUDA
C on CPU threads) and compared with the interpreter. Forward functions of three examples at
reduced sizes, and one whole fused training step."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from nfc.codegen.cuda.hostrun import build_host, host_compiler, run_host
from nfc.codegen.cuda.lower import lower_program
from nfc.codegen.cuda.program import compile_program
from nfc.codegen.cuda.sim import simulate
from nfc.codegen.lower import group_of
from nfc.interp import run as interp_run
from nfc.ir import Block, ComputeOp, Func, KernelOp, ReturnOp

#: NVRTC is optional (the 'cuda' extra); lowering and simulating are tested without it.
HAVE_NVRTC = importlib.util.find_spec("cuda.bindings") is not None
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _module(name: str, params: dict[str, int], fuse: bool):
    from nfc.runtime.build import DEFAULT_PIPELINE, model_module, run_pipeline

    m = model_module(EXAMPLES / name, params, {})
    run_pipeline(m, DEFAULT_PIPELINE)
    if fuse:
        run_pipeline(m, "fuse")
    return m


def _inputs(values, rng):
    out = []
    for v in values:
        if v.dtype.value == "i1":
            out.append(rng.random(v.shape) < 0.5)
        elif v.dtype.is_int:  # labels, indices, random words: small and non-negative
            out.append(rng.integers(0, 4, v.shape).astype(v.dtype.numpy))
        else:
            out.append(rng.uniform(0.1, 1.0, v.shape).astype(v.dtype.numpy))
    return out


@pytest.mark.parametrize("name,params,func,fuse,host", [
    ("mlp.nf", {"batch": 4}, "forward", False, False),
    ("lenet5.nf", {"batch": 2}, "forward", False, False),
    ("lstm_cell.nf", {"batch": 2}, "forward", False, False),
    ("mlp.nf", {"batch": 4}, "train_step", True, True),
], ids=["mlp", "lenet5", "lstm_cell", "mlp-train-step-fused"])
def test_every_compute_compiles_and_simulates(name, params, func, fuse, host, tmp_path):
    """Every kernel compiles within the limits and agrees with the interpreter."""
    module = _module(name, params, fuse)
    ops = [op for op in module.func(func).body.ops if isinstance(op, ComputeOp | KernelOp)]
    programs = [lower_program(op, name=f"k{n}") for n, op in enumerate(ops)]
    kernels = [k for p in programs for k in p.kernels]
    kinds = {k.kind for k in kernels}
    assert {"gemm", "elementwise", "reduce"} <= kinds
    if HAVE_NVRTC:
        for arch in ("sm_80", "sm_90"):
            compiled = compile_program(kernels, arch)  # resources checked
            assert set(compiled.resources) == {k.func.name for k in kernels}
    lib = build_host(kernels, tmp_path) if host and host_compiler() else None
    rng = np.random.default_rng(0)
    for op, p in zip(ops, programs, strict=True):
        _, _, ins = group_of(op)
        arrays = _inputs(ins, rng)
        want = interp_run(Func("f", list(ins), Block([op, ReturnOp(list(op.results))])), arrays)
        results = [simulate(p, arrays)]
        if lib is not None:
            results.append(run_host(p, arrays, lib))
        for got in results:
            for g, w in zip(got, want, strict=True):
                if g.dtype.kind == "f":
                    np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5, err_msg=p.name)
                else:
                    np.testing.assert_array_equal(g, w, err_msg=p.name)
