"""f16 and bf16 through NativeOp and nfc.torch: forward and backward (autograd) of `.nf` ops
whose signature admits 16-bit floats, against the interpreter at the 16-bit error bound, on
the AVX-512 BF16 path and the forced AVX2 path (lowp_cases.py says how). nfc.jax's twin is
test_lowp_jax.py."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
from lowp_cases import CASES, DTYPES, Case, arguments, check, cpu_path, ir_function, upstream

from nfc.runtime.native_op import NativeOp, OpError

__all__ = ["cpu_path"]  # the fixture, imported for pytest

# torch.library, not torch: without PyTorch, `import torch` finds tests/torch (a namespace)
pytest.importorskip("torch.library")
import ml_dtypes  # noqa: E402
import torch  # noqa: E402

import nfc.torch  # noqa: E402

_TORCH = {"bf16": torch.bfloat16, "f16": torch.float16}


def _to_torch(a: np.ndarray) -> torch.Tensor:
    """A 16-bit numpy array as a tensor of the same bits."""
    if a.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(a.copy())


def _to_numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def _float_results(native: NativeOp, args: list[np.ndarray]
                   ) -> list[tuple[tuple[int, ...], np.dtype]]:
    from nfc.runtime.loader import numpy_dtype

    res = native.signature.result_types([a.shape for a in args],
                                        [native.types_of(args)[i].dtype
                                         for i in range(len(args))])
    return [(s, numpy_dtype(dt.value)) for s, dt in res if dt.is_float]


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_native_op_forward_and_vjp(case: Case, dtype: str, cpu_path: str) -> None:
    dt, npdt = DTYPES[dtype]
    op = NativeOp(case.source, case.op, case.params)
    args = arguments(case, npdt, seed=1)
    got = op(*args)
    assert all(g.dtype == r for g, (_, r) in zip(got, _float_results(op, args), strict=True))
    check(ir_function(case, dt), args, got, f"{case.name} forward")
    wrt = tuple(range(len(args)))
    ups = upstream(_float_results(op, args), seed=2)
    grads = op.vjp(args, ups, wrt)
    assert [g.dtype for g in grads] == [npdt] * len(args)
    check(ir_function(case, dt, wrt), [*args, *ups], grads, f"{case.name} vjp")


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_torch_forward_and_autograd(case: Case, dtype: str, cpu_path: str) -> None:
    """Tensors of torch.float16 / torch.bfloat16 in, results and autograd gradients of the
    same dtypes out, equal to what the native op computes and within the bound."""
    dt, npdt = DTYPES[dtype]
    op = nfc.torch.load_op(case.source, case.op, case.params)
    args = arguments(case, npdt, seed=3)
    ts = [_to_torch(a).requires_grad_() for a in args]
    outs = op(*ts)
    outs = outs if isinstance(outs, tuple) else (outs,)
    floats = _float_results(op.native, args)
    assert [o.dtype for o in outs] == [_TORCH[dtype] if r == npdt else torch.float32
                                       for _, r in floats]
    check(ir_function(case, dt), args, [_to_numpy(o) for o in outs], f"{case.name} forward")
    ups = upstream(floats, seed=4)
    grads = torch.autograd.grad(outs, ts, [_to_torch(u) for u in ups])
    assert all(g.dtype == _TORCH[dtype] and g.shape == t.shape
               for g, t in zip(grads, ts, strict=True))
    wrt = tuple(range(len(args)))
    check(ir_function(case, dt, wrt), [*args, *ups], [_to_numpy(g) for g in grads],
          f"{case.name} autograd")


def test_torch_bf16_subset_of_gradients_and_noncontiguous(cpu_path: str) -> None:
    """Only the inputs that require grad get one (a backward compiled for them), and a
    non-contiguous bf16 tensor is refused by name (or copied with copy=True), as f32 ones."""
    case = CASES[0]
    dt, npdt = DTYPES["bf16"]
    args = arguments(case, npdt, seed=5)
    x, w, b = (_to_torch(a) for a in args)
    w.requires_grad_()
    op = nfc.torch.load_op(case.source, case.op, case.params)
    y = op(x, w, b)
    ups = upstream([(tuple(y.shape), npdt)], seed=6)
    (dw,) = torch.autograd.grad(y, (w,), _to_torch(ups[0]))
    check(ir_function(case, dt, (1,)), [*args, *ups], [_to_numpy(dw)], "linear dw")
    wt = _to_torch(np.ascontiguousarray(args[1].T)).t()
    assert not wt.is_contiguous()
    with pytest.raises(OpError, match="argument 'w' is not C-contiguous"):
        op(x, wt, b)
    copying = nfc.torch.load_op(case.source, case.op, case.params, copy=True)
    assert torch.equal(copying(x, wt, b).view(torch.int16), y.detach().view(torch.int16))


def test_torch_mixed_16_bit_dtypes_are_refused() -> None:
    """T binds one dtype: an f16 and a bf16 argument are a located OpError, not a crash."""
    op = nfc.torch.load_op("std.nn", "matmul", {})
    a = torch.ones(2, 3, dtype=torch.float16)
    b = torch.ones(3, 4, dtype=torch.bfloat16)
    with pytest.raises(OpError, match="matmul"):
        op(a, b)


def test_bf16_gemm_uses_vdpbf16ps_only_on_the_native_path(cpu_path: str) -> None:
    """The two paths are different code: the host's bf16 GEMM (forward and vjp) has
    `vdpbf16ps`, the AVX2 one none (it widens the operands and uses FMAs)."""
    objdump = shutil.which("objdump") or shutil.which("llvm-objdump")
    if objdump is None:
        pytest.skip("no objdump")
    case = CASES[0]
    op = NativeOp(case.source, case.op, case.params)
    args = arguments(case, DTYPES["bf16"][1], seed=7)
    types = op.types_of(args)
    for fn in (op.forward_function(types), op.backward_function(types, (0, 1, 2))):
        text = subprocess.run([objdump, "-d", "--no-show-raw-insn", fn.model.path],
                              capture_output=True, text=True, check=True).stdout
        assert ("vdpbf16ps" in text) == (cpu_path == "native"), fn.name


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_opcheck_16_bit(dtype: str) -> None:
    """torch.library.opcheck on 16-bit tensors: schema, fake implementation (result dtypes
    from the signature), autograd registration and AOT dispatch."""
    case = CASES[2]  # lltm_cell
    op = nfc.torch.load_op(case.source, case.op, case.params)
    args = [_to_torch(a).requires_grad_() for a in arguments(case, DTYPES[dtype][1], seed=8)]
    torch.library.opcheck(op.op, args)


def test_signature_spelling_out_bf16(cpu_path: str) -> None:
    """An op declaring `bf16` operands runs on bfloat16 tensors (within the bound, its
    gradients in bf16) and refuses float16 ones with an OpError naming the argument."""
    case = Case("matmul_bf16_f32", CASES[3].source, "matmul_bf16_f32", {},
                ((16, 32), (32, 24)))
    dt, npdt = DTYPES["bf16"]
    op = nfc.torch.load_op(case.source, case.op, case.params)
    args = arguments(case, npdt, seed=9)
    ts = [_to_torch(a).requires_grad_() for a in args]
    y = op(*ts)
    assert y.dtype == torch.float32
    check(ir_function(case, dt), args, [_to_numpy(y)], "matmul_bf16_f32")
    dy = upstream([(tuple(y.shape), np.dtype(np.float32))], seed=10)
    grads = torch.autograd.grad(y, ts, _to_torch(dy[0]))
    assert all(g.dtype == torch.bfloat16 for g in grads)
    check(ir_function(case, dt, (0, 1)), [*args, *dy], [_to_numpy(g) for g in grads],
          "matmul_bf16_f32 vjp")
    with pytest.raises(OpError, match=r"has dtype f16 but parameter 'a' expects bf16"):
        op(ts[0].detach().half(), ts[1].detach())
