"""examples/torch_capsule: the worked example runs, and nfc's gradient IR is what the docs say."""

import importlib.util
import sys

import pytest

pytest.importorskip("torch.library")  # without PyTorch, `torch` would be this folder
import torch  # noqa: E402
from nfc_torch_cases import CAPSULE_NF, EXAMPLES  # noqa: E402

from nfc.ir import ComputeOp, DType, TensorType  # noqa: E402
from nfc.runtime.native_op import NativeOp  # noqa: E402


def _example():  # noqa: ANN202
    path = EXAMPLES / "torch_capsule" / "train.py"
    spec = importlib.util.spec_from_file_location("torch_capsule_train", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_the_example_trains(capsys) -> None:  # noqa: ANN001
    train = _example()
    history = train.main(["--epochs", "2", "--steps", "4", "--check"])
    out = capsys.readouterr().out
    assert "check: nfc layer vs PyTorch primitives" in out
    diff = float(out.split("largest difference ")[1].split()[0])
    assert diff <= 1e-12  # float64; the layer's sums have a few hundred terms
    assert len(history) == 2 and history[1] < history[0]


def test_backward_of_a_linear_op_does_not_recompute_the_forward() -> None:
    """The vjp of capsule convolution reads only the inputs and the upstream gradient: the
    forward contraction (`%y`) is dead after differentiation and removed; what remains of the
    forward phase is im2col's gather of A's windows, which the weight gradient reads."""
    op = NativeOp("std.nn", "capsule_conv", {"stride": 2})
    types = (TensorType((2, 2, 5, 5, 2, 2), DType.F32), TensorType((3, 2, 3, 3, 2, 2), DType.F32))
    module = op.compile_module(types, (0, 1))
    (func,) = module.funcs
    assert func.attrs["nf.results"] == ["d_A", "d_K"]
    assert [a.name for a in func.args] == ["A", "K", "d_out0"]
    computes = [o for o in func.walk() if isinstance(o, ComputeOp)]
    forward = [o for o in computes if o.attrs.get("nf.phase") != "backward"]
    assert all(o.attrs.get("nf.im2col") and o.reduce is None for o in forward)
    assert "y" not in {o.result.name for o in computes}


def test_backward_of_a_cell_recomputes_what_it_reads() -> None:
    """The LLTM cell's gradient needs the gates: the vjp recomputes them (forward phase)."""
    op = NativeOp(EXAMPLES / "models" / "lltm.nf", "lltm_cell")
    types = tuple(TensorType(s, DType.F64) for s in [(3, 4), (3, 5), (3, 5), (9, 15), (15,)])
    module = op.compile_module(types, (3,))
    (func,) = module.funcs
    assert func.attrs["nf.results"] == ["d_w"]
    assert [a.name for a in func.args][-2:] == ["d_out0", "d_out1"]
    computes = [o for o in func.walk() if isinstance(o, ComputeOp)]
    assert any(o.attrs.get("nf.phase") != "backward" for o in computes)


def test_capsule_nf_is_the_layer_the_docs_describe() -> None:
    op = NativeOp(CAPSULE_NF, "capsule_layer")
    assert op.signature.describe().startswith("capsule_layer(A: T[B, C, H, W, P, P], K: ")
    (shape, dtype), = op.signature.result_types([(4, 2, 10, 10, 4, 4), (4, 2, 3, 3, 4, 4)],
                                               [DType.F32, DType.F32])
    assert shape == (4, 4, 4, 4, 4, 4) and dtype == DType.F32
    assert torch is not None
