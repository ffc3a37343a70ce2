"""Synchronised batch norm (`data-parallel{bn=sync}`) without MPI: the batch statistics found
and all-reduced in the IR, the step of one process unchanged by them, and R ranks emulated in
lockstep by the numpy interpreter (each `nf.allreduce` the mean of the ranks' operands):
2 ranks x B/2 compute the step of 1 x B, and the adjoint all-reduces give the gradient of the
global loss (central finite differences). The 2-rank MPI run is in test_data_parallel.py."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pytest

from nfc.ir import AllReduceOp, Func, Module, ReturnOp
from nfc.testing import assert_close_f64

HERE = Path(__file__).parent
BN = str(HERE / "bn64.nf")
B = 16


def _module(batch: int, pipeline: str) -> Module:
    from nfc.runtime.build import frontend_module, run_pipeline

    module = frontend_module(BN, {"batch": batch})
    run_pipeline(module, pipeline)
    return module


def _step(batch: int, bn: str) -> Func:
    return _module(batch, f"im2col,training-functions,data-parallel{{bn={bn}}}"
                   ).func("train_step")


def _collectives(func: Func) -> list[str]:
    return [str(op.attrs.get("nf.collective")) for op in func.body.ops
            if isinstance(op, AllReduceOp)]


def _data(seed: int = 0) -> dict[str, np.ndarray]:
    """A batch of B samples and parameters away from their initial values (so no gradient
    vanishes by symmetry)."""
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((B, 1, 8, 8)) * 2.0 + 0.5,
            "y": rng.integers(0, 10, B).astype(np.int32),
            "k1": rng.standard_normal((4, 1, 3, 3)) * 0.5,
            "g1": 1.0 + 0.3 * rng.standard_normal(4), "b1": 0.3 * rng.standard_normal(4),
            "m1": 0.1 * rng.standard_normal(4), "v1": 1.0 + 0.1 * rng.random(4),
            "w2": 0.2 * rng.standard_normal((144, 10)), "b2": 0.1 * rng.standard_normal(10)}


def _shards(data: Mapping[str, np.ndarray], ranks: int) -> list[dict[str, np.ndarray]]:
    n = B // ranks
    return [{k: (v[r * n:(r + 1) * n] if k in ("x", "y") else v) for k, v in data.items()}
            for r in range(ranks)]


def _run_ranks(func: Func, inputs: Sequence[Mapping[str, np.ndarray]],
               local: str = "") -> list[list[np.ndarray]]:
    """`func` on every rank's inputs in lockstep with the interpreter; an `nf.allreduce`
    gives every rank the mean of the ranks' operands (what the MPI collective computes),
    except those whose `nf.collective` is `local` (each rank keeps its operand)."""
    from nfc.interp import _bind, _get, _run_op  # the interpreter, one op at a time

    envs = [{id(a): arr for a, arr in zip(func.args, _bind(func, dict(inp)), strict=True)}
            for inp in inputs]
    for op in func.body.ops:
        if isinstance(op, ReturnOp):
            return [[_get(env, v, op).copy() for v in op.values] for env in envs]
        if isinstance(op, AllReduceOp) and op.attrs.get("nf.collective") != local:
            for v, r in zip(op.values, op.results, strict=True):
                mean = sum(_get(env, v, op) for env in envs) / len(envs)
                for env in envs:
                    env[id(r)] = np.array(mean)
        else:
            for env in envs:
                _run_op(op, env, None)
    raise AssertionError("no nf.return")


def _named(func: Func, outs: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
    return dict(zip(func.attrs["nf.results"], outs, strict=True))


def test_the_batch_statistics_are_all_reduced_before_autodiff() -> None:
    step = _step(B, "sync")
    # the per-channel sum and the sum of squared deviations of batch_norm_train, their two
    # adjoints, the gradients (one bucket at the default size) and the running statistics
    assert sorted(_collectives(step)) == sorted(["batch-stats"] * 2 +
                                                ["batch-stats-grad"] * 2 +
                                                ["gradients", "state"])
    stats = [op for op in step.body.ops if isinstance(op, AllReduceOp)
             and op.attrs["nf.collective"] == "batch-stats"]
    for op in stats:  # each right after the sum over the batch it averages
        (v,) = op.values
        assert step.body.ops.index(op) == step.body.ops.index(v.owner) + 1
        assert [ax.name for ax in v.owner.raxes] == ["n", "h", "w"]
    # bn=local: only the gradients; @forward and @eval never all-reduce (evaluation is local)
    assert _collectives(_step(B, "local")) == ["gradients"]
    module = _module(B, "im2col,training-functions,data-parallel{bn=sync}")
    for name in ("forward", "eval"):
        assert not _collectives(module.func(name)), name


def test_the_loss_and_per_sample_reductions_are_no_batch_statistics() -> None:
    from nfc.passes.data_parallel import batch_statistics

    fwd = _module(B, "im2col").func("forward")
    found = batch_statistics(fwd)
    assert len(found) == 2
    # the loss sums over the batch too, but nothing per sample reads it
    loss = fwd.ret.values[0]
    assert loss.owner not in found
    assert any(op.reduce == "sum" and "n" in [a.name for a in op.raxes]
               for op in fwd.body.ops if op not in found and hasattr(op, "raxes"))


def test_one_process_sync_equals_local() -> None:
    """In one process every all-reduce is a copy: the steps are the same, bit for bit."""
    data = _data()
    sync, local = _step(B, "sync"), _step(B, "local")
    got = _named(sync, _run_ranks(sync, [data])[0])
    ref = _named(local, _run_ranks(local, [data])[0])
    assert set(got) == set(ref)
    for k in ref:
        assert np.array_equal(got[k], ref[k]), k


def test_two_emulated_ranks_sync_equal_one_process() -> None:
    data = _data()
    one = _step(B, "local")
    ref = _named(one, _run_ranks(one, [data])[0])
    sync, local = _step(B // 2, "sync"), _step(B // 2, "local")
    for bn, func in (("sync", sync), ("local", local)):
        ranks = [_named(func, o) for o in _run_ranks(func, _shards(data, 2))]
        for k in ref:
            if not (k.startswith("param:") or k.startswith("state:")):
                continue
            name = k.split(":", 1)[1]
            moved = float(np.abs(ref[k] - data[name]).max())
            assert moved > 1e-3, k
            if bn == "sync":  # every rank holds the global batch's step
                for r in ranks:
                    assert_close_f64(r[k], ref[k], f"sync {k}", scale=moved)
            else:  # the test can fail: per-rank statistics give another step
                ok = np.abs(ranks[0][k] - ref[k]).max() <= 1e-6 * moved
                assert not ok or k == "param:b2", f"local {k} matches the global step"
        if bn == "local":
            assert np.abs(ranks[0]["param:k1"] - ref["param:k1"]).max() > 1e-6


@pytest.mark.parametrize("wrt", ["g1", "k1"])
def test_allreduce_adjoint_is_the_gradient_of_the_global_loss(wrt: str) -> None:
    """The forward with all-reduced batch statistics on 2 emulated ranks; the global loss is
    the mean of the ranks' losses; the mean of the ranks' gradients (autodiff with the adjoint
    all-reduces) equals its central finite differences. The statistics depend on the
    convolution k1, not on the scale g1: only k1's gradient has the adjoint all-reduces."""
    from nfc.passes.autodiff.graph import grad_func
    from nfc.passes.data_parallel import sync_batch_statistics

    fwd = _module(B // 2, "im2col").func("forward").clone("f")
    assert sync_batch_statistics(fwd) == 2
    g = grad_func(fwd, [wrt])
    assert _collectives(g).count("batch-stats-grad") == (2 if wrt == "k1" else 0)
    data = _data(1)
    keep = {a.name for a in fwd.args}
    shards = [{k: v for k, v in s.items() if k in keep} for s in _shards(data, 2)]
    sym = sum(o[1] for o in _run_ranks(g, shards)) / 2

    def loss(x: np.ndarray) -> float:
        outs = _run_ranks(fwd, [dict(s, **{wrt: x}) for s in shards])
        return float(sum(o[0] for o in outs) / 2)

    rng = np.random.default_rng(2)
    x0 = data[wrt]
    dirs = [rng.standard_normal(x0.shape) for _ in range(3)]
    dirs += [np.eye(x0.size)[i].reshape(x0.shape) for i in range(min(x0.size, 8))]
    eps = 1e-6
    for d in dirs:
        num = (loss(x0 + eps * d) - loss(x0 - eps * d)) / (2 * eps)
        ana = float(np.sum(sym * d))
        err = abs(num - ana) / max(abs(num), abs(ana), 1e-3)
        assert err <= 1e-6, f"d{wrt}: finite differences {num!r}, autodiff {ana!r}"
    if wrt != "k1":
        return
    # without the adjoint all-reduces (each rank its own adjoint) the gradient is wrong
    wrong = sum(o[1] for o in _run_ranks(g, shards, local="batch-stats-grad")) / 2
    assert np.abs(wrong - sym).max() > 1e-6 * np.abs(sym).max()



def test_native_library_with_sync_bn_trains_as_the_plain_one() -> None:
    """The compiled step of `bn=sync` without a registered collective (one process: every
    all-reduce, batch statistics and adjoints included, copies) trains as the plain library."""
    from nfc.runtime.build import compile_model, pipeline_for
    from nfc.runtime.distributed import DistOptions, with_data_parallel
    from nfc.runtime.loader import load

    def steps(pipeline: str) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], object]:
        m = load(compile_model(BN, settings=[f"batch={B}"], pipeline=pipeline).path)
        m.init(0)
        init = {k: v.copy() for k, v in m.tensors.items()}
        data = _data(3)
        rng = np.random.default_rng(4)
        f = m.functions["train_step"]
        for _ in range(3):
            f(x=data["x"] + 0.1 * rng.standard_normal(data["x"].shape), y=data["y"])
        return init, {k: v.copy() for k, v in m.tensors.items()}, m

    plain = pipeline_for(BN)
    init, ref, _ = steps(plain)
    _, got, m = steps(with_data_parallel(plain, DistOptions(bn="sync")))
    whats = [c["what"] for c in m.metadata["functions"]["train_step"]["collectives"]]
    assert sorted(whats) == sorted(["batch-stats"] * 2 + ["batch-stats-grad"] * 2 +
                                   ["gradients", "state"])
    for k in ref:
        moved = float(np.abs(ref[k] - init[k]).max())
        assert moved > 1e-3, k
        assert_close_f64(got[k], ref[k], k, scale=moved)
