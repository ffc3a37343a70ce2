"""nfc.runtime.sum_orders: the float sums of a module are followed into a copy (the reference
build) and through `remat`'s clones, so an option build can take each sum's schedule from the
build without the option (docs/memory.md, "Sum orders of an option build"; the end-to-end
check is tests/runtime/test_runtime_remat_bits.py)."""

from __future__ import annotations

from nfc.irparser import parse_module
from nfc.passes.remat import recomputed_from, rematerialize
from nfc.runtime.sum_orders import SumTracker, copy_module

SRC = """
nf.func @train_step(%x: tensor<16xf32>, %w: tensor<16x16xf32>) -> (tensor<16x16xf32>) {
  %r = nf.compute [i: 16, j: 16] sum [k: 4] (%x[i] * %w[i, j] * 0.5) : tensor<16x16xf32>
  %s = nf.compute [] sum [i: 16, j: 16] (%r[i, j]) : tensor<f32>
  %m = nf.compute [] max [i: 16] (%x[i]) : tensor<f32>
  %g = nf.compute [i: 16, j: 16] (%r[i, j] * %s[] * %m[])
      {nf.phase = "backward"} : tensor<16x16xf32>
  nf.return %g : tensor<16x16xf32>
}
"""


def _ops(module):
    return {op.results[0].name: op for op in module.func("train_step").body.ops
            if len(op.results) == 1}


def test_float_sums_are_tracked_into_a_copy():
    module = parse_module(SRC, "t.nfir")
    tracker = SumTracker.of(module)
    ops = _ops(module)
    assert tracker.number(ops["r"].result) == 0 and tracker.number(ops["s"].result) == 1
    assert tracker.number(ops["m"].result) is None  # a max adds nothing: its order is exact
    ref, mapping = copy_module(module)
    twins = tracker.mapped(mapping)
    rops = _ops(ref)
    assert rops["r"] is not ops["r"]
    assert twins.number(rops["r"].result) == 0 and twins.number(rops["s"].result) == 1
    assert twins.number(ops["r"].result) is None  # the original is not the copy's


def test_a_recomputed_sum_counts_as_the_sum_it_recomputes():
    module = parse_module(SRC, "t.nfir")
    func = module.func("train_step")
    tracker = SumTracker.of(module)
    r = _ops(module)["r"].result
    clone = rematerialize(func, r)[-1]
    assert clone.result is not r and clone.attrs.get("nf.remat")
    assert recomputed_from(clone.result) is r and recomputed_from(r) is r
    assert tracker.number(clone.result) == 0
