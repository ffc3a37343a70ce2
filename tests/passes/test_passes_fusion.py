"""The `fuse` pass: the cost model, the reward's sign, legality, the recorded decisions, and
numeric equality of fused training steps in the interpreter."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
from fusion_testlib import SMALL_MLP, kernel_count, step_inputs, top_graph, train_module
from passes_testlib import apply, check_pass, text

from nfc.cost import compute_cost
from nfc.interp import run
from nfc.ir import CallOp, ComputeOp, KernelOp
from nfc.irparser import parse_module
from nfc.passes.fusion import FUSION_ATTR, Fuse
from nfc.passes.fusion.device import DEFAULT_DEVICE, DeviceParams
from nfc.passes.fusion.reward import CostModel, gemm_like
from nfc.passmanager import build_pipeline, get_pass

EPILOGUE = """
nf.func @forward(%x: tensor<64x128xf32>, %w: tensor<128x64xf32>, %b: tensor<64xf32>)
    -> (tensor<64x64xf32>) {
  %mm = nf.compute [n: 64, m: 64] sum [k: 128] (%x[n, k] * %w[k, m]) : tensor<64x64xf32>
  %y = nf.compute [n: 64, m: 64] (%mm[n, m] + %b[m]) : tensor<64x64xf32>
  %r = nf.compute [n: 64, m: 64] (max(%y[n, m], 0.0)) : tensor<64x64xf32>
  nf.return %r : tensor<64x64xf32>
}
"""


def _ops(module, func="forward"):
    return [op for op in module.func(func).body.ops if isinstance(op, ComputeOp)]


def test_registered_and_options():
    assert get_pass("fuse") is Fuse
    (p,) = build_pipeline("fuse{bandwidth-gbs=30,region-us=0.5,recompute=false,max-ops=8}")
    assert isinstance(p, Fuse) and not p.recompute and p.max_ops == 8
    dev = p.device()
    assert dev.bandwidth_gbs == 30.0 and dev.region_us == 0.5
    assert dev.peak_gflops == DEFAULT_DEVICE.peak_gflops
    assert Fuse().device() == DEFAULT_DEVICE
    assert "bandwidth-gbs=15.0" in DEFAULT_DEVICE.pipeline_options()


def test_singleton_cost_is_nfc_cost():
    m = parse_module(EPILOGUE)
    model = CostModel(DEFAULT_DEVICE)
    for op in _ops(m):
        c = model.group([op], {id(op.result)})
        ref = compute_cost(op)
        assert (c.bytes, c.flops, c.kernels) == (ref.bytes, ref.flops, 1)


def test_epilogue_cost_and_reward():
    m = parse_module(EPILOGUE)
    mm, y, r = _ops(m)
    model = CostModel(DEFAULT_DEVICE)
    whole = model.group([mm, y, r], {id(r.result)})
    # %y is inlined into the relu, %mm stays a stage in cache: inputs + the relu only
    assert whole.bytes == 64 * 128 * 4 + 128 * 64 * 4 + 64 * 4 + 64 * 64 * 4
    assert whole.flops == compute_cost(mm).flops + compute_cost(y).flops + compute_cost(r).flops
    # with a tiny cache the GEMM result goes through DRAM: written and read back
    small = CostModel(DeviceParams(cache_kib=1)).group([mm, y, r], {id(r.result)})
    assert small.bytes == whole.bytes + 2 * 64 * 64 * 4
    after = apply(parse_module(EPILOGUE), Fuse())
    (k,) = after.func("forward").body.ops[:-1]
    assert isinstance(k, KernelOp) and len(k.results) == 1
    info = k.attrs[FUSION_ATTR]
    # two intermediates (16 KiB each) neither written nor read again; two launches saved
    assert info["bytes_saved"] == 4 * 64 * 64 * 4 and info["launches_saved"] == 2
    assert info["flops_saved"] == 0 and info["recomputed"] == 0
    assert info["reward_us"] == pytest.approx(
        4 * 64 * 64 * 4 / 15e3 + 2 * DEFAULT_DEVICE.launch_us, abs=1e-3)


RECOMPUTE_HEAVY = """
nf.func @forward(%b: tensor<256xf32>, %y: tensor<4096x256xf32>) -> (tensor<4096xf32>) {
  %p = nf.compute [k: 256] (exp(%b[k]) * 2.0) : tensor<256xf32>
  %q = nf.compute [n: 4096] sum [k: 256] (%p[k] * %y[n, k]) : tensor<4096xf32>
  nf.return %q : tensor<4096xf32>
}
"""


def test_negative_reward_rejected():
    """Inlining %p into the reduction recomputes exp 4096 times: more FLOPs than the 1 KiB it
    saves, so the merge is priced negative and not taken."""
    m = parse_module(RECOMPUTE_HEAVY)
    p, q = _ops(m)
    model = CostModel(DEFAULT_DEVICE)
    dev = DEFAULT_DEVICE
    apart = (model.group([p], {id(p.result)}).seconds(dev)
             + model.group([q], {id(q.result)}).seconds(dev))
    merged = model.group([p, q], {id(q.result)})
    assert merged.flops == compute_cost(q).flops + 4096 * 256 * 2  # exp and * per read
    assert apart - merged.seconds(dev) < 0
    after = apply(parse_module(RECOMPUTE_HEAVY), Fuse())
    assert kernel_count(after.func("forward")) == (2, 0)
    # where launches are dear, the same merge pays
    after = apply(parse_module(RECOMPUTE_HEAVY), Fuse(launch_us=2000.0))
    assert kernel_count(after.func("forward")) == (1, 1)


def test_gemm_rule_mirrors_codegen():
    from nfc.codegen.space import match_gemm

    m = train_module("mlp.nf", SMALL_MLP)
    ops = [op for op in m.func("train_step").walk() if isinstance(op, ComputeOp)]
    assert any(gemm_like(op) for op in ops)
    for op in ops:
        assert gemm_like(op) == (match_gemm(op) is not None), text(m)


def test_parallel_work_mirrors_codegen():
    from nfc.codegen.space import PARALLEL_WORK

    assert DEFAULT_DEVICE.parallel_work == PARALLEL_WORK


def test_fixed_ops_untouched_and_idempotent():
    src = """
nf.func @g(%x: tensor<16xf32>) -> (tensor<16xf32>) {
  %a = nf.compute [i: 16] (%x[i] * 3.0) : tensor<16xf32>
  nf.return %a : tensor<16xf32>
}
nf.func @forward(%x: tensor<16xf32>) -> (tensor<16xf32>) {
  %a = nf.compute [i: 16] (exp(%x[i])) : tensor<16xf32>
  %c = nf.call @g(%a) : (tensor<16xf32>) -> (tensor<16xf32>)
  %b = nf.compute [i: 16] (%a[i] + 1.0) : tensor<16xf32>
  %d = nf.compute [i: 16] (%b[i] * %c[i]) : tensor<16xf32>
  nf.return %d : tensor<16xf32>
}
"""
    once = check_pass(src, Fuse())
    f = once.func("forward")
    assert sum(isinstance(op, CallOp) for op in f.body.ops) == 1
    first = text(once)
    assert text(apply(once, Fuse())) == first


@pytest.mark.parametrize("name,params", [("mlp.nf", SMALL_MLP), ("lstm_cell.nf", None)])
@pytest.mark.parametrize("recompute", [False, True])
def test_training_step_equal_in_interpreter(name, params, recompute):
    before = train_module(name, params)
    after = train_module(name, params)
    apply(after, Fuse(recompute=recompute))
    f0, f1 = before.func("train_step"), after.func("train_step")
    n0, _ = kernel_count(f0)
    n1, k1 = kernel_count(f1)
    assert k1 >= 1 and n1 < n0 / 3, (n0, n1)
    assert nx.is_directed_acyclic_graph(top_graph(f1))
    # every compute of the step is in exactly one kernel (copies are marked recomputations)
    orig = {id(op) for op in f0.body.ops if isinstance(op, ComputeOp)}
    after_ops = [op for op in f1.walk() if isinstance(op, ComputeOp)]
    if not recompute:
        assert len(after_ops) == len(orig)
    assert not any(op.attrs.get("nf.recompute") for op in after_ops) or recompute
    ins = step_inputs(f0)
    for want, got in zip(run(f0, ins, module=before), run(f1, ins, module=after), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_backward_reader_yielded_in_mlp():
    """Forward activations the backward reads from another kernel are kernel results."""
    m = train_module("mlp.nf", SMALL_MLP)
    apply(m, Fuse(recompute=False, max_ops=6))
    f = m.func("train_step")
    yielded = {}  # id(kernel result) -> the compute it yields
    for k in f.body.ops:
        if isinstance(k, KernelOp):
            for r, v in zip(k.results, k.body.ops[-1].operands, strict=True):
                yielded[id(r)] = v.owner
    crossing = set()
    for op in f.walk():
        if isinstance(op, ComputeOp) and op.attrs.get("nf.phase") == "backward":
            for v in op.operands:
                src = yielded.get(id(v))
                if isinstance(src, ComputeOp) and "nf.phase" not in src.attrs:
                    crossing.add(src.result.name)
    assert crossing, text(m)
