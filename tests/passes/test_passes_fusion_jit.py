"""Fused training steps compiled by the CPU backend, one kernel per `nf.kernel` group, match
the interpreter running the unfused step (the oracle)."""

from __future__ import annotations

import pytest
from fusion_testlib import SMALL_MLP, jit_step, kernel_count, step_inputs, train_module
from passes_testlib import apply

from nfc.ir import ComputeOp, KernelOp
from nfc.passes.fusion import Fuse
from nfc.printer import print_module
from nfc.testing import assert_matches_oracle


@pytest.mark.parametrize("name,params", [("mlp.nf", SMALL_MLP), ("lstm_cell.nf", None)])
def test_fused_step_through_jit(name, params):
    ref = train_module(name, params)
    fused = apply(train_module(name, params), Fuse())
    f0, f1 = ref.func("train_step"), fused.func("train_step")
    n, k = kernel_count(f1)
    assert k >= 1 and n < kernel_count(f0)[0]
    # the groups hold several stages each, some with producers the backend inlines
    sizes = [len(op.body.ops) - 1 for op in f1.body.ops if isinstance(op, KernelOp)]
    assert max(sizes) >= 3
    step, nkernels = jit_step(f1)
    assert nkernels == n
    for seed in range(2):
        ins = step_inputs(f0, seed)
        # within the float32 error bound of the unfused step (nfc.testing), not a fixed rtol
        assert_matches_oracle(f0, ins, step(ins), module=ref)


def test_recomputed_copy_through_jit():
    """A group with a recomputed copy (nf.recompute) compiles and computes the same."""
    src = train_module("mlp.nf", {**SMALL_MLP, "batch": 256, "hidden1": 256})
    fused = apply(train_module("mlp.nf", {**SMALL_MLP, "batch": 256, "hidden1": 256}),
                  Fuse(functions="train_step"))
    f0, f1 = src.func("train_step"), fused.func("train_step")
    copies = [op for op in f1.walk()
              if isinstance(op, ComputeOp) and op.attrs.get("nf.recompute")]
    assert copies, "expected the bias add of layer 1 to be recomputed in the backward"
    step, _ = jit_step(f1)
    ins = step_inputs(f0)
    assert_matches_oracle(f0, ins, step(ins), module=src)


def _steps(func_module, **opts):
    """The (index, verdict) of every step `fuse{explain}` records on the module."""
    from nfc.ir import Func
    from nfc.passes.fusion import fuse_func
    from nfc.passes.fusion.partition import Options
    from nfc.passes.fusion.reward import CostModel

    out, steps = [], [0]
    for f in func_module.funcs:
        if isinstance(f, Func) and f.name == "train_step":
            decisions: list = []
            fuse_func(f, CostModel(Fuse().device()), Options(explain=True, **opts), decisions,
                      steps)
            out += [(d.index, d.verdict, d.kind) for d in decisions]
    return out


def test_vetoed_and_forced_steps_through_jit():
    """`fuse{veto=N}` and `fuse{force=N}` give other legal partitions of the same step: the
    vetoed step is not taken, the forced one is, and both compute what the unfused step
    computes."""
    params = SMALL_MLP
    ref = train_module("mlp.nf", params)
    f0 = ref.func("train_step")
    steps = _steps(train_module("mlp.nf", params))
    take = next(i for i, v, _ in steps if v == "take")
    reject = next(i for i, v, _ in steps if v == "reject")
    for opt, want in (({"veto": take}, "veto"), ({"force": reject}, "force")):
        assert (opt[next(iter(opt))], want) in {(i, v) for i, v, _ in _steps(
            train_module("mlp.nf", params), **opt)}
        fused = apply(train_module("mlp.nf", params), Fuse(functions="train_step", **opt))
        f1 = fused.func("train_step")
        step, _ = jit_step(f1)
        ins = step_inputs(f0, 0)
        assert_matches_oracle(f0, ins, step(ins), module=ref)
    base = apply(train_module("mlp.nf", params), Fuse(functions="train_step"))
    vetoed = apply(train_module("mlp.nf", params), Fuse(functions="train_step", veto=take))
    assert print_module(base) != print_module(vetoed)
