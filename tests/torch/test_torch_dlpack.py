"""Zero-copy: tensors reach nfc's native code by DLPack, in nfc.torch and in nfc.load."""

import numpy as np
import pytest

pytest.importorskip("torch.library")  # without PyTorch, `torch` would be this folder
import torch  # noqa: E402

import nfc  # noqa: E402
import nfc.torch  # noqa: E402


def test_op_inputs_and_outputs_share_memory_with_the_tensors() -> None:
    """The arrays the native function receives are the tensors' own memory, and the result
    tensor is the array the native function wrote (no copy in either direction)."""
    op = nfc.torch.load_op("std.nn", "capsule_conv", {"stride": 2})
    seen: list[tuple[list[int], list[int]]] = []
    run = op.native.run

    def spy(fn, arrays, out):  # noqa: ANN001, ANN202
        seen.append(([a.ctypes.data for a in arrays], [o.ctypes.data for o in out]))
        return run(fn, arrays, out)

    op.native.run = spy
    try:
        a = torch.rand(2, 2, 5, 5, 2, 2)  # no gradient: the backward computes dk only
        k = torch.rand(3, 2, 3, 3, 2, 2, requires_grad=True)
        y = op(a, k)
        (g,) = torch.autograd.grad(y, k, torch.ones_like(y))
    finally:
        del op.native.run
    (fwd_in, fwd_out), (bwd_in, bwd_out) = seen
    assert fwd_in == [a.data_ptr(), k.data_ptr()]
    assert fwd_out == [y.data_ptr()]
    assert bwd_in[:2] == [a.data_ptr(), k.data_ptr()]  # the saved inputs, as they are
    assert bwd_out == [g.data_ptr()]


def test_non_contiguous_input_is_refused_or_copied_when_asked() -> None:
    x = torch.rand(2, 3, 3, 8).transpose(1, 3)  # [2, 8, 3, 3], not contiguous
    strict = nfc.torch.load_op("std.nn", "depth2space", {"r": 2})
    with pytest.raises(nfc.torch.OpError, match=r"argument 'x' is not C-contiguous.*copy=True"):
        strict(x)
    copying = nfc.torch.load_op("std.nn", "depth2space", {"r": 2}, copy=True)
    assert torch.equal(copying(x), torch.nn.functional.pixel_shuffle(x, 2))


@pytest.fixture(scope="module")
def scale_model(tmp_path_factory):  # noqa: ANN001, ANN201
    """A compiled model with an input, a parameter and a result."""
    from nfc.runtime.build import compile_model

    d = tmp_path_factory.mktemp("dlpack")
    src = d / "scale.nf"
    src.write_text("model scale(n = 6) {\n  input x: f32[n]\n  param w: f32[n] = ones\n"
                   "  y[i] = x[i] * w[i] + 1.0\n  output y\n}\n")
    built = compile_model(src, str(d / "scale.so"))
    m = nfc.load(built.path)
    m.init(seed=0)
    return m


def test_nfc_load_takes_torch_tensors_by_dlpack(scale_model) -> None:  # noqa: ANN001
    fn = scale_model.forward
    x = torch.arange(6, dtype=torch.float32)
    out = fn(x)
    slot = fn._slots["x"]
    assert fn._argv[slot] == x.data_ptr()  # the native call read the tensor's memory
    assert np.array_equal(out["y"], np.arange(6, dtype=np.float32) + 1)


def test_nfc_load_writes_into_torch_out_tensors_and_returns_dlpack_arrays(scale_model) -> None:  # noqa: ANN001, E501
    fn = scale_model.forward
    x = np.full(6, 2.0, np.float32)
    y = torch.empty(6)
    res = fn(x, out={"y": y})
    assert torch.equal(y, torch.full((6,), 3.0))
    assert res["y"].ctypes.data == y.data_ptr()
    fresh = fn(x)["y"]
    as_tensor = torch.from_dlpack(fresh)  # numpy results are DLPack arrays themselves
    assert as_tensor.data_ptr() == fresh.ctypes.data


def test_nfc_load_names_a_tensor_that_requires_grad(scale_model) -> None:  # noqa: ANN001
    from nfc.runtime.loader import ArtifactError

    x = torch.ones(6, requires_grad=True)
    with pytest.raises(ArtifactError, match=r"forward: input 'x': cannot take a Tensor through "
                                            r"DLPack.*detach"):
        scale_model.forward(x)
