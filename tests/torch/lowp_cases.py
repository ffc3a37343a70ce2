"""The ops the 16-bit (f16, bf16) tests of nfc's framework integrations load, the CPU code path
they run on, and the oracle they are checked against.

Oracle: the interpreter (nfc.interp) on the op's own IR in its 16-bit types, and the float64
reference with the error bound of the format (nfc.testing.run_bounded, probable mode: unit
roundoff 2^-11 for f16 and 2^-8 for bf16 per operation), as tests/codegen/test_lowp.py does
for single kernels. Gradients are checked the same way against the IR of the vector-Jacobian
product (nfc.runtime.native_op.vjp_func) of that function, which the interpreter runs with
the same 16-bit roundings; the float64 gradients are checked against finite differences by
the float64 tests beside these (test_torch_ops.py), so this checks the 16-bit code path.

Every case runs on the host's code path (AVX-512 BF16 `vdpbf16ps` where the CPU has it) and
on the AVX2 one (`NFC_CPU_FEATURES` switching AVX-512 off, as the CI of an AVX2-only machine
would see it): the `cpu_path` fixture.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from nfc.frontend import compile_op
from nfc.ir import DType, Func, TensorType
from nfc.runtime.native_op import NativeOp, vjp_func
from nfc.testing import assert_matches_oracle, bound_violations, run_bounded

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

#: What `NFC_CPU_FEATURES` appends to force the AVX2 path on an AVX-512 host.
AVX2_ONLY = "-avx512f,-avx512bw,-avx512dq,-avx512vl,-avx512bf16,-avx512vnni"

#: dtype name -> (IR dtype, numpy dtype of the arrays).
DTYPES = {"bf16": (DType.BF16, np.dtype(ml_dtypes.bfloat16)),
          "f16": (DType.F16, np.dtype(np.float16))}


@dataclass(frozen=True)
class Case:
    """One op: its source, compile-time parameters and argument shapes."""

    name: str
    source: str | Path
    op: str
    params: dict[str, Any]
    shapes: tuple[tuple[int, ...], ...]


CASES = [
    # a GEMM with a bias, large enough for the GEMM micro-kernel (on AVX-512 BF16 its bf16
    # forward and gradients run on vdpbf16ps: test_bf16_gemm_uses_vdpbf16ps...)
    Case("linear", "std.nn", "linear", {}, ((64, 128), (128, 64), (64,))),
    # a padded convolution: im2col, then a GEMM with guarded loads
    Case("conv2d", "std.nn", "conv2d", {"padding": 1}, ((2, 4, 6, 6), (8, 4, 3, 3))),
    # a matmul and a chain of exp/sigmoid/tanh, two results
    Case("lltm_cell", ROOT / "examples" / "models" / "lltm.nf", "lltm_cell", {},
         ((3, 4), (3, 5), (3, 5), (9, 15), (15,))),
    # mixed precision: 16-bit operands, an f32 result (and f32 upstream gradients)
    Case("matmul_f32", HERE / "lowp_mixed.nf", "matmul_f32", {}, ((64, 128), (128, 64))),
]


@pytest.fixture(params=["native", "avx2"])
def cpu_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Build for the host's features, or for the AVX2 subset (`NFC_CPU_FEATURES`); the
    process-wide host target is recomputed both ways."""
    from nfc.codegen.cpu import host_target

    host_target.cache_clear()
    if request.param == "native":
        if not host_target().has("avx512bf16"):
            pytest.skip("no AVX-512 BF16 on this CPU (the avx2 case covers it)")
    else:
        extra = ",".join(x for x in (os.environ.get("NFC_CPU_FEATURES"), AVX2_ONLY) if x)
        monkeypatch.setenv("NFC_CPU_FEATURES", extra)
        host_target.cache_clear()
        assert not host_target().has("avx512f")
    yield request.param
    host_target.cache_clear()  # monkeypatch restores the environment after this


def arguments(case: Case, npdt: np.dtype, seed: int) -> list[np.ndarray]:
    """Uniform values in [-1, 1) rounded to the format."""
    rng = np.random.default_rng(seed)
    return [rng.uniform(-1, 1, s).astype(npdt) for s in case.shapes]


def upstream(shapes_dtypes: list[tuple[tuple[int, ...], np.dtype]], seed: int
             ) -> list[np.ndarray]:
    """Upstream gradients in [-1, 1), one per float result, in its dtype."""
    rng = np.random.default_rng(seed)
    return [rng.uniform(-1, 1, s).astype(dt) for s, dt in shapes_dtypes]


def ir_function(case: Case, dt: DType, wrt: tuple[int, ...] | None = None) -> Func:
    """The op's IR for 16-bit arguments (before any pass), or its vjp w.r.t. `wrt`."""
    native = NativeOp(case.source, case.op, case.params)
    types = [TensorType(s, dt) for s in case.shapes]
    func = compile_op(native.path, case.op, types, native.signature.cvals).funcs[0]
    return func if wrt is None else vjp_func(func, wrt)


def _interp(a: np.ndarray) -> np.ndarray:
    """The interpreter holds bf16 values in float32 arrays."""
    a = np.asarray(a)
    return a.astype(np.float32) if a.dtype == ml_dtypes.bfloat16 else a


def check(func: Func, inputs: list[np.ndarray], got: list[Any], what: str) -> None:
    """`got` (the op's results) against the interpreter and the 16-bit error bound; and the
    check has power: each float result, negated, would be caught (so a wrong sign or a
    swapped gradient cannot hide under a loose bound)."""
    ins = [_interp(a) for a in inputs]
    outs = [_interp(a) for a in got]
    assert_matches_oracle(func, ins, outs, probable=True)
    for k, ((v, e), g) in enumerate(zip(run_bounded(func, ins, probable=True), outs,
                                        strict=True)):
        if g.dtype.kind == "f" and np.abs(v).max() > 0:
            bad, _ = bound_violations(-g, v, e)
            assert bad.any(), f"{what}: result {k}'s bound cannot tell it from its negation"

