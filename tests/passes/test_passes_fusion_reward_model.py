"""Two rules of the reward's cost model that mirror the CPU backend: only transcendental
functions run at the elementwise rate (arithmetic at the peak), and a stage is a parallel
region only when the emitter keeps its loop parallel (enough estimated work)."""

from __future__ import annotations

import pytest

from nfc.irparser import parse_module
from nfc.passes.fusion.device import DEFAULT_DEVICE, DeviceParams
from nfc.passes.fusion.reward import CostModel, transcendental_share

T = "tensor<256x256xf32>"
SRC = f"""
nf.func @f(%x: {T}, %b: tensor<256xf32>) -> ({T}, {T}, {T}, {T}) {{
  %add = nf.compute [i: 256, j: 256] (%x[i, j] + %b[j]) : {T}
  %ex = nf.compute [i: 256, j: 256] (exp(%x[i, j]) * 2.0) : {T}
  %mm = nf.compute [i: 256, j: 256] sum [k: 256] (%x[i, k] * %x[k, j]) : {T}
  %rl = nf.compute [i: 256, j: 256] (max(%add[i, j], 0.0)) : {T}
  nf.return %add, %ex, %mm, %rl : {T}, {T}, {T}, {T}
}}
"""

@pytest.fixture
def ops():
    f = parse_module(SRC, "m.nfir").func("f")
    return {op.result.name: op for op in f.body.ops if op.results}


def _cost(model, *members):
    return model.group(list(members), {id(m.result) for m in members})


def test_transcendental_share(ops):
    assert transcendental_share(ops["add"].body) == 0.0
    assert transcendental_share(ops["rl"].body) == 0.0  # max is one instruction
    assert transcendental_share(ops["ex"].body) == pytest.approx(0.5)  # exp, then * 2.0


def test_only_transcendentals_run_at_the_elementwise_rate(ops):
    model = CostModel(DEFAULT_DEVICE)
    add, ex = _cost(model, ops["add"]), _cost(model, ops["ex"])
    assert add.flops == 256 * 256 and add.elementwise_flops == 0.0
    assert ex.flops == 2 * 256 * 256 and ex.elementwise_flops == 256 * 256
    # an add is priced at the peak: far cheaper than the exp stage of the same size
    dev = DEFAULT_DEVICE
    assert add.seconds(dev) - add.bytes / (dev.bandwidth_gbs * 1e9) < 1e-6
    # inlining the add into the relu: the recomputed add is arithmetic too
    fused = model.group([ops["add"], ops["rl"]], {id(ops["rl"].result)})
    assert fused.flops == 2 * 256 * 256 and fused.elementwise_flops == 0.0


def test_a_region_needs_enough_work(ops):
    model = CostModel(DEFAULT_DEVICE)
    # 65536 points of an add: marked parallel by the schedule, serial by the emitter
    assert _cost(model, ops["add"]).regions == 0
    assert _cost(model, ops["mm"]).regions == 1  # 16 M points of multiply-adds
    eager = CostModel(DeviceParams(parallel_min_work=0))  # the rule before the emitter's
    assert _cost(eager, ops["add"]).regions == 1
    wide = CostModel(DeviceParams(parallel_min_work=10_000, vector_lanes=16))
    assert _cost(wide, ops["add"]).regions == 1  # 65536 x (1 + a few nodes) / 16 lanes
    assert _cost(CostModel(DeviceParams(parallel_min_work=30_000, vector_lanes=16)),
                 ops["add"]).regions == 0
