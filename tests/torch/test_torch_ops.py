"""nfc.torch ops against PyTorch formulations: values, gradcheck in float64, opcheck.

Six ops (capsule convolution, a capsule layer with squash, depth-to-space, channel shuffle,
the MI-LSTM and LLTM cells) are loaded from `.nf` files; forward and backward run as native
code compiled by nfc (the backward derived by the autodiff pass).
"""

import pytest

# torch.library, not torch: without PyTorch, `import torch` finds this folder (a namespace)
pytest.importorskip("torch.library")
import torch  # noqa: E402
from nfc_torch_cases import CASES, Case, tolerance  # noqa: E402

import nfc.torch  # noqa: E402


def _load(case: Case):  # noqa: ANN202
    return nfc.torch.load_op(case.source, case.op, case.params)


def _as_tuple(x):  # noqa: ANN001, ANN202
    return x if isinstance(x, tuple) else (x,)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
def test_forward_matches_pytorch(case: Case, dtype: torch.dtype) -> None:
    op = _load(case)
    args = case.args(dtype, seed=1)
    got = _as_tuple(op(*args))
    want = _as_tuple(case.ref(*args))
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype == dtype
        if case.exact:
            assert torch.equal(g, w)
        else:
            tol = tolerance(case, dtype, case.magnitude(*[a.double() for a in args]))
            err = float((g.double() - w.double()).abs().max())
            assert err <= tol, f"{case.name}: max error {err:.3g} > {tol:.3g}"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_gradcheck_float64(case: Case) -> None:
    """Finite differences against nfc's derived backward, every input requiring grad."""
    op = _load(case)
    args = case.args(torch.float64, seed=2, grad=True)
    assert torch.autograd.gradcheck(op, args, eps=1e-6, atol=1e-8, rtol=1e-6)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_backward_matches_pytorch_autograd(case: Case) -> None:
    """The same gradients as autograd through the PyTorch formulation, for a random upstream
    gradient and for a subset of inputs (the backward compiled for that subset only)."""
    op = _load(case)
    args = case.args(torch.float64, seed=3, grad=True)
    outs = _as_tuple(op(*args))
    g = torch.Generator().manual_seed(4)
    ups = [torch.rand(o.shape, generator=g, dtype=torch.float64) for o in outs]
    wrt = args[::2]  # every other input: the others get no gradient computed at all
    got = torch.autograd.grad(outs, wrt, ups)
    want = torch.autograd.grad(_as_tuple(case.ref(*args)), wrt, ups)
    # upstream values lie in [0, 1) and every output's derivative is bounded by the same
    # magnitudes as the forward, so the forward's tolerance bounds these sums as well, scaled
    # by the number of outputs each input reaches (at most all of them)
    n_out = sum(o.numel() for o in outs)
    for a, b in zip(got, want, strict=True):
        assert a.shape == b.shape
        if case.exact:
            assert torch.equal(a, b)
        else:
            scale = case.magnitude(*[x.detach() for x in args])
            tol = n_out * tolerance(case, torch.float64, scale)
            assert float((a - b).abs().max()) <= tol


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_opcheck(case: Case) -> None:
    """torch.library.opcheck: the schema, the autograd registration, the fake (meta)
    implementation against the real one, and AOT dispatch with dynamic shapes (fake tensors
    with symbolic sizes, shaped by the .nf signature)."""
    op = _load(case)
    args = case.args(torch.float64, seed=5, grad=True)
    result = torch.library.opcheck(op.op, args)
    assert set(result.values()) == {"SUCCESS"}, result


def test_integer_input_gets_no_gradient() -> None:
    """margin_loss(lengths: T[N, K], labels: Int[N]): gradients flow to the lengths only."""
    op = nfc.torch.load_op("std.nn", "margin_loss")
    lengths = torch.rand(4, 3, dtype=torch.float64, requires_grad=True)
    labels = torch.tensor([0, 2, 1, 2], dtype=torch.int32)
    loss = op(lengths, labels)
    assert loss.shape == ()
    onehot = torch.nn.functional.one_hot(labels.long(), 3).double()
    want = (onehot * torch.relu(0.9 - lengths) ** 2
            + 0.5 * (1 - onehot) * torch.relu(lengths - 0.1) ** 2).sum() / 4
    assert abs(float((loss - want).detach())) <= 24 * torch.finfo(torch.float64).eps
    assert torch.autograd.gradcheck(lambda x: op(x, labels), (lengths,))


def test_one_compile_per_shape_and_dtype() -> None:
    """Shapes within the signature compile once each (kept in memory), then are reused."""
    op = nfc.torch.load_op("std.nn", "depth2space", {"r": 3})
    before = op.native.builds
    for n, h in [(1, 2), (2, 3), (1, 2), (2, 3)]:
        x = torch.rand(n, 18, h, h)
        assert torch.equal(op(x), torch.nn.functional.pixel_shuffle(x, 3))
    assert op.native.builds - before == 2
    op(torch.rand(1, 18, 2, 2, dtype=torch.float64))
    assert op.native.builds - before == 3


def test_load_op_returns_one_operator_per_op_and_parameters() -> None:
    a = nfc.torch.load_op("std.nn", "depth2space", {"r": 2})
    b = nfc.torch.load_op("std.nn", "depth2space", {"r": 2})
    c = nfc.torch.load_op("std.nn", "depth2space", {"r": 4})
    assert a is b and a.op is b.op
    assert c.qualname != a.qualname
    assert a.qualname.startswith("nfc::depth2space_")
    namespace, name = a.qualname.split("::")
    assert getattr(getattr(torch.ops, namespace), name).default is not None


def test_nfc_torch_is_the_runtime_package() -> None:
    """`import nfc.torch` is `nfc.runtime.torch`: one module under two names."""
    import nfc
    import nfc.runtime.torch

    assert nfc.torch is nfc.runtime.torch
    assert nfc.torch.__spec__.name == "nfc.runtime.torch"
