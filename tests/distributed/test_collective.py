"""The collective hook of the native step and gradient compression, in one process (no MPI:
a fake communicator), and the data-parallel pass on the IR."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from nfc.passes.data_parallel import data_parallel_func, gradient_cut
from nfc.runtime.distributed.collective import decode, encode, from_bf16, to_bf16
from nfc.testing import assert_close_f64

HERE = Path(__file__).parent
MLP = str(HERE / "mlp64.nf")


class ScaleComm:
    """A communicator of `size` ranks whose sum gives `factor` x this rank's buffer (every
    rank holding the same gradient, scaled): the step then sees factor/size x its gradient."""

    rank = 0

    def __init__(self, size: int, factor: float) -> None:
        self.size = size
        self.factor = factor
        self.calls = 0

    def allreduce_sum(self, buf: np.ndarray) -> None:
        self.calls += 1
        buf *= self.factor

    def allgather(self, buf: np.ndarray, out: np.ndarray) -> None:
        self.calls += 1
        out[:] = buf


def _model(pipeline_extra: bool, lr: float):
    from nfc.runtime.build import compile_model, pipeline_for
    from nfc.runtime.distributed import DistOptions, with_data_parallel
    from nfc.runtime.loader import load

    text = pipeline_for(MLP)
    if pipeline_extra:
        text = with_data_parallel(text, DistOptions(bucket_kb=1))
    built = compile_model(MLP, settings=["batch=8", f"opt.lr={lr}", "opt.momentum=0.0"],
                          pipeline=text)
    m = load(built.path)
    m.init(0)
    return m


def _steps(m, n: int = 3, features: int = 64) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    f = m.functions["train_step"]
    dtype = f.inputs[0].dtype
    for s in range(n):
        x = rng.standard_normal((8, features)).astype(dtype)
        f(rng=(0, s), x=x, y=rng.integers(0, 10, 8).astype(np.int32))
    return {k: v.copy() for k, v in m.tensors.items()}


@pytest.mark.parametrize("overlap", [True, False])
def test_step_calls_the_collective_between_backward_and_update(overlap: bool) -> None:
    from nfc.runtime.distributed.collective import Collective

    dp = _model(True, 0.1)
    init = {k: v.copy() for k, v in dp.tensors.items()}
    assert len(dp.metadata["functions"]["train_step"]["collectives"]) >= 2  # bucket-kb=1
    # no collective registered: the step copies the gradients (plain SGD, lr 0.1)
    plain = _steps(dp)
    ref = _steps(_model(False, 0.1))
    for k in ref:
        assert_close_f64(plain[k], ref[k], k, scale=float(np.abs(ref[k] - init[k]).max()))
    # every gradient tripled and averaged over 2 ranks: SGD with lr 0.15
    comm = ScaleComm(2, 3.0)
    dp2 = _model(True, 0.1)
    coll = Collective(dp2, comm, overlap=overlap)  # type: ignore[arg-type]
    try:
        got = _steps(dp2)
        coll.check()
    finally:
        coll.close()
    assert comm.calls == 3 * len(coll.buckets)
    ref = _steps(_model(False, 0.15))
    for k in ref:
        assert_close_f64(got[k], ref[k], k, scale=float(np.abs(ref[k] - init[k]).max()))


def test_bf16_rounds_to_nearest_even() -> None:
    x = np.array([1.0, 1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8, -2.5, 3.0e38, 1e-40],
                 np.float32)
    got = from_bf16(to_bf16(x))
    # 1 + 2^-8 is halfway between 1 and 1 + 2^-7: to even (1); 1 + 3x2^-8: up to 1 + 2^-6
    assert got.tolist()[:4] == [1.0, 1.0, 1.0 + 2.0 ** -6, -2.5]
    rel = np.abs(got - x) / np.maximum(np.abs(x), 1e-30)
    assert rel[4] <= 2.0 ** -8


@pytest.mark.parametrize("kind", ["fp16", "bf16"])
def test_error_feedback_loses_nothing(kind: str) -> None:
    """Over many steps, what was sent plus the final residual is the sum of the gradients
    (up to f32 rounding); sending the codes without feedback drifts by far more."""
    rng = np.random.default_rng(0)
    residual = np.zeros(1000, np.float32)
    sent = np.zeros(1000, np.float64)
    naive = np.zeros(1000, np.float64)
    total = np.zeros(1000, np.float64)
    for _ in range(200):
        g = (1e-3 + rng.standard_normal(1000) * 1e-5).astype(np.float32)
        x = g + residual
        code = encode(x, kind)
        residual = x - decode(code, kind)
        sent += decode(code, kind)
        naive += decode(encode(g, kind), kind)
        total += g
    scale = np.abs(total).max()
    fed = np.abs(sent + residual - total).max()
    assert fed <= 200 * 2.0 ** -23 * scale
    assert np.abs(sent - total).max() <= 2.0 ** -7 * 1e-3 * 2  # one rounding of one step
    assert np.abs(naive - total).max() > 10 * np.abs(sent - total).max()


def test_pass_places_one_allreduce_per_bucket_before_the_update() -> None:
    from nfc.ir import AllReduceOp
    from nfc.runtime.build import frontend_module, run_pipeline

    module = frontend_module(MLP, {"batch": 8})
    run_pipeline(module, "training-functions")
    f = module.func("train_step")
    grads = gradient_cut(f)
    assert len(grads) == 4  # w1, b1, w2, b2
    assert data_parallel_func(f, 1) == 4  # 1-byte buckets: one per gradient
    ops = f.body.ops
    ars = [op for op in ops if isinstance(op, AllReduceOp)]
    assert len(ars) == 4
    for op in ars:
        g = op.values[0]
        assert ops.index(op) == ops.index(g.owner) + 1  # right after the producer
        assert all(u is op or u.attrs.get("nf.phase") != "update" for u in g.uses)
        assert all(u.attrs.get("nf.phase") == "update" for u in op.results[0].uses)


TINY32 = """\
import std.nn

model tiny32(batch = 8) {
  input  x: f32[batch, 64]
  input  y: i32[batch]
  param  w: f32[64, 10] = glorot_uniform
  param  b: f32[10] = zeros
  logits = linear(x, w, b)
  loss = softmax_cross_entropy(logits, y)
  output logits
  minimize loss with sgd(lr = 0.1)
}
"""


@pytest.mark.parametrize("kind", ["fp16", "bf16"])
def test_compressed_collective_sends_rounded_gradients_with_feedback(tmp_path: Path,
                                                                     kind: str) -> None:
    """Every rank holding the same gradient: the compressed mean is the 16-bit rounding of
    (gradient + residual), so the parameters stay within a few roundings of the exact run,
    differ from it (something was rounded), and the residual holds what was not sent."""
    from nfc.runtime.build import compile_model, pipeline_for
    from nfc.runtime.distributed import DistOptions, with_data_parallel
    from nfc.runtime.distributed.collective import Collective
    from nfc.runtime.loader import load

    src = tmp_path / "tiny32.nf"
    src.write_text(TINY32)
    text = with_data_parallel(pipeline_for(src), DistOptions(bucket_kb=1, compress=kind))
    exact = load(compile_model(src, pipeline=pipeline_for(src)).path)
    exact.init(0)
    dp = load(compile_model(src, pipeline=text).path)
    dp.init(0)
    init = {k: v.copy() for k, v in dp.tensors.items()}
    assert all(c["compress"] == kind
               for c in dp.metadata["functions"]["train_step"]["collectives"])
    comm = ScaleComm(2, 1.0)
    coll = Collective(dp, comm)  # type: ignore[arg-type]
    try:
        got = _steps(dp, 5, features=64)
        coll.check()
    finally:
        coll.close()
    ref = _steps(exact, 5, features=64)
    unit = 2.0 ** -11 if kind == "fp16" else 2.0 ** -8
    for k in ref:
        moved = float(np.abs(ref[k] - init[k]).max())
        diff = float(np.abs(got[k] - ref[k]).max())
        assert diff <= 5 * 2 * unit * moved, (k, diff, moved)
    assert any(np.abs(got[k] - ref[k]).max() > 0 for k in ref)
    assert all(b.residual is not None and np.abs(b.residual).max() > 0 for b in coll.buckets)
