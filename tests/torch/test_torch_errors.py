"""Calls an op's `.nf` signature does not allow are clear errors, never wrong results."""

import pytest

pytest.importorskip("torch.library")  # without PyTorch, `torch` would be this folder
import torch  # noqa: E402

import nfc.torch  # noqa: E402
from nfc.torch import OpError  # noqa: E402


@pytest.fixture(scope="module")
def d2s():  # noqa: ANN201
    return nfc.torch.load_op("std.nn", "depth2space", {"r": 2})


@pytest.fixture(scope="module")
def caps():  # noqa: ANN201
    return nfc.torch.load_op("std.nn", "capsule_conv", {"stride": 2})


def test_shape_the_signature_refuses(d2s) -> None:  # noqa: ANN001
    with pytest.raises(OpError, match=r"x: T\[N, C \* r \* r, H, W\].*has size 6, but "
                                      r"parameter 'x' needs C \* r \* r with r = 2: 6 is not a "
                                      r"multiple of 4"):
        d2s(torch.rand(1, 6, 2, 2))


def test_wrong_rank(d2s) -> None:  # noqa: ANN001
    with pytest.raises(OpError, match=r"has rank 3 \(f32\[4, 2, 2\]\) but parameter 'x' "
                                      r"expects rank 4"):
        d2s(torch.rand(4, 2, 2))


def test_result_with_no_elements(caps) -> None:  # noqa: ANN001
    """H = 2 < KH = 3: the declared result size (H - KH) // stride + 1 is 0."""
    with pytest.raises(OpError, match=r"would have shape \[1, 3, 0, 2, 2, 2\].*every size "
                                      r"must be positive"):
        caps(torch.rand(1, 2, 2, 5, 2, 2), torch.rand(3, 2, 3, 3, 2, 2))


def test_sizes_that_disagree(caps) -> None:  # noqa: ANN001
    with pytest.raises(OpError, match=r"shape mismatch for argument 2 of 'capsule_conv'"):
        caps(torch.rand(1, 2, 5, 5, 2, 2), torch.rand(3, 4, 3, 3, 2, 2))


def test_dtypes_that_disagree(caps) -> None:  # noqa: ANN001
    with pytest.raises(OpError, match=r"argument 2 of 'capsule_conv' has dtype f64 but "
                                      r"parameter 'K' expects T = f32"):
        caps(torch.rand(1, 2, 5, 5, 2, 2), torch.rand(3, 2, 3, 3, 2, 2, dtype=torch.float64))


def test_fixed_dtype_of_the_signature(tmp_path) -> None:  # noqa: ANN001
    """`labels: i32[N]` refuses torch's default int64: never converted behind the user's back."""
    src = tmp_path / "pick.nf"
    src.write_text("op pick(x: T[N, K], labels: i32[N]) -> T[N] {\n"
                   "  y[n] = sum(k) (x[n, k] if labels[n] == k else 0.0)\n}\n")
    op = nfc.torch.load_op(src, "pick")
    with pytest.raises(OpError, match=r"has dtype i64 but parameter 'labels' expects i32"):
        op(torch.rand(4, 3), torch.zeros(4, dtype=torch.int64))
    got = op(torch.arange(12.0).view(4, 3), torch.tensor([0, 2, 1, 0], dtype=torch.int32))
    assert got.tolist() == [0.0, 5.0, 7.0, 9.0]


def test_unsupported_dtype_is_refused(d2s) -> None:  # noqa: ANN001
    """16-bit floats compile (tests/torch/test_lowp_ops.py); 16-bit integers do not."""
    with pytest.raises(OpError, match=r"torch.int16, which nfc does not compile; use "
                                      r"torch.float32, float64, float16, bfloat16"):
        d2s(torch.zeros(1, 4, 2, 2, dtype=torch.int16))


def test_argument_count(d2s) -> None:  # noqa: ANN001
    with pytest.raises(OpError, match=r"depth2space takes 1 tensors \(x\), got 2"):
        d2s(torch.rand(1, 4, 2, 2), torch.rand(1, 4, 2, 2))


def test_not_a_tensor(d2s) -> None:  # noqa: ANN001
    """The schema says Tensor: PyTorch's dispatcher refuses anything else."""
    with pytest.raises(RuntimeError, match=r"Expected a value of type 'Tensor' for argument "
                                           r"'x' but instead found type 'list'"):
        d2s([[1.0]])


def test_shape_error_while_tracing_names_the_signature(d2s) -> None:  # noqa: ANN001
    """The fake implementation checks the signature too: torch.compile reports the same error
    (dynamo wraps it in its own exception type)."""
    f = torch.compile(lambda x: d2s(x) * 2, fullgraph=True, backend="aot_eager")
    with pytest.raises(Exception, match=r"6 is not a multiple of 4"):
        f(torch.rand(1, 6, 2, 2))


def test_loading_errors() -> None:
    with pytest.raises(OpError, match=r"no op named 'depth2spce'.*depth2space"):
        nfc.torch.load_op("std.nn", "depth2spce")
    with pytest.raises(OpError, match=r"needs its compile-time parameter 'r: int'"):
        nfc.torch.load_op("std.nn", "depth2space")
    with pytest.raises(OpError, match=r"has no compile-time parameter 'rr' \(it has: r: int\)"):
        nfc.torch.load_op("std.nn", "depth2space", {"rr": 2})
    with pytest.raises(OpError, match=r"no such .nf file: 'missing.nf'"):
        nfc.torch.load_op("missing.nf", "f")


def test_syntax_error_in_the_file(tmp_path) -> None:  # noqa: ANN001
    bad = tmp_path / "bad.nf"
    bad.write_text("op f(x: T[N]) -> T[N] {\n  y[n] = x[n] +\n}\n")
    with pytest.raises(OpError, match=r"cannot load op 'f' from .*bad.nf"):
        nfc.torch.load_op(bad, "f")


def test_body_error_at_these_sizes_is_a_compile_error(tmp_path) -> None:  # noqa: ANN001
    """The signature allows the call; the body reads out of bounds at these sizes: the
    frontend's bounds proof says where, before anything runs."""
    src = tmp_path / "shift.nf"
    src.write_text("op shift<s: int>(x: T[N]) -> T[N] {\n  y[n] = x[n + s]\n}\n")
    op = nfc.torch.load_op(src, "shift", {"s": 1})
    with pytest.raises(OpError, match=r"cannot compile shift for argument types f32\[5\]"
                                      r"(.|\n)*access 'x' dimension 0 can reach 5"):
        op(torch.rand(5))
