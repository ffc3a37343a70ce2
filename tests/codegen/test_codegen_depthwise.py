"""Depthwise convolutions (groups == channels) and the loop template's `parallel_reduce` knob.

The forward, input-gradient and weight-gradient kernels of a depthwise convolution (as the
build pipeline produces them: `nfc.runtime.build`, im2col leaves them alone) are compiled
with their default schedules and with random valid ones and compared with the interpreter,
at odd sizes, stride 1 and 2, with and without padding. `parallel_reduce` is checked as a
schedule-space parameter: its validity rules, records written before it (no key, or another
`SCHEDULE_VERSION`), and that a chunked reduction does not depend on the thread count.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
from codegen_lib import check, compute, inputs_of, ld, random_inputs, tensor

from nfc.codegen.schedule import SCHEDULE_VERSION, Schedule
from nfc.codegen.space import (
    LoopSpace,
    loop_rule_problem,
    schedule_problem,
    schedule_space,
    template_problem,
)
from nfc.ir import ComputeOp, Load

PIPELINE = "im2col,training-functions,inline,canonicalize,cse,dce"

MODEL = """\
import std.nn

model dw(batch = 2, channels = 3, size = SIZE, classes = 4) {
  input  x: f32[batch, channels, size, size]
  input  y: i32[batch]
  param  k0: f32[channels, 1, 1, 1] = he_normal
  param  k: f32[channels, 1, 3, 3] = he_normal
  param  wo: f32[channels, classes] = glorot_uniform
  param  bo: f32[classes] = zeros
  h = depthwise_conv2d<stride = STRIDE, padding = PAD>(depthwise_conv2d(x, k0), k)
  logits = linear(global_avg_pool(h), wo, bo)
  loss = softmax_cross_entropy(logits, y)
  output logits
  minimize loss with sgd(lr = 0.1)
}
"""


def depthwise_kernels(tmp_path: Path, size: int, stride: int, pad: int
                      ) -> list[tuple[str, ComputeOp]]:
    """(role, compute) of the computes of the training step that read a 4-D tensor together
    with the 3 x 3 weight or make its gradient: the depthwise forward (`fwd`, also in the
    forward function), input gradient (`dx`) and weight gradient (`dw`)."""
    from nfc.runtime.build import build_module
    from nfc.runtime.tuning.kernels import collect_kernels

    src = tmp_path / "dw.nf"
    src.write_text(MODEL.replace("SIZE", str(size)).replace("STRIDE", str(stride))
                   .replace("PAD", str(pad)))
    mod, _ = build_module(src, pipeline=PIPELINE)
    forward = {k.key for k in collect_kernels(mod, ["forward"])}
    found = []
    for k in collect_kernels(mod, ["train_step"]):
        op = k.op
        if not isinstance(op, ComputeOp) or op.reduce != "sum" or not op.raxes:
            continue
        shapes = [tuple(x.tensor.type.shape) for x in op.body.walk() if isinstance(x, Load)]
        if any(len(s) == 4 for s in shapes) and (
                (3, 1, 3, 3) in shapes or tuple(op.result.type.shape) == (3, 1, 3, 3)):
            dw = tuple(op.result.type.shape) == (3, 1, 3, 3)
            found.append(("dw" if dw else "fwd" if k.key in forward else "dx", op))
    return found


@pytest.mark.parametrize("size, stride, pad", [(9, 1, 1), (11, 2, 1), (10, 2, 1), (9, 2, 0)])
def test_depthwise_kernels_match_the_interpreter(tmp_path, size, stride, pad):
    ops = depthwise_kernels(tmp_path, size, stride, pad)
    assert sorted(role for role, _ in ops) == ["dw", "dx", "fwd"]
    for _, op in ops:
        space = schedule_space(op)
        assert isinstance(space, LoopSpace)
        check(op)  # the default schedule
        rng = random.Random(size * 10 + stride)
        done = 0
        for _ in range(400):
            cfg = {k: rng.choice(v) for k, v in space.params.items()}
            if space.is_valid(cfg):
                check(op, space.to_schedule(cfg), seed=done)
                done += 1
                if done == 2:
                    break
        assert done == 2


def test_strided_window_gradient_default_unrolls_the_window(tmp_path):
    # the input gradient of a stride-2 depthwise convolution reads `(h + 1) // 2 - r_`:
    # plain lanes along w, the window axis read with w unrolled whole, h tiled
    ops = depthwise_kernels(tmp_path, 10, 2, 1)
    dx = next(op for role, op in ops if role == "dx")
    space = LoopSpace(dx)
    cfg = space.default()
    assert cfg["vec_axis"] == dx.dims[-1].name and cfg["vec_split"] == 1
    assert cfg["kunroll"] >= dx.raxes[-1].extent
    assert cfg["tile_axis"] == dx.dims[-2].name
    check(dx, space.to_schedule(cfg))


# ---------------------------------------------------------------------------------------------
# parallel_reduce as a knob


def column_sum(rows: int = 4099, cols: int = 16) -> ComputeOp:
    a = tensor("a", (rows, cols))
    return compute({"j": cols}, ld(a, "i", "j"), reduce="sum", raxes={"i": rows})


def test_parallel_reduce_is_a_loop_parameter_with_rules():
    op = column_sum()
    space = LoopSpace(op)
    assert space.params["parallel_reduce"] == [0, 8, 64]
    base = {**space.default(), "parallel": 1, "parallel_reduce": 8}
    assert space.is_valid(base)
    assert not space.is_valid({**base, "parallel": 0})
    assert not space.is_valid({**base, "parallel_reduce": 5})
    why = loop_rule_problem({**base, "parallel": 0}, lambda a: a == "j", True)
    assert "'parallel_reduce'" in why
    # a compute without reduction has nothing to split
    ew = compute({"j": 64}, ld(tensor("b", (64,)), "j"))
    assert "'parallel_reduce'" in loop_rule_problem(
        {**LoopSpace(ew).default(), "parallel": 1, "parallel_reduce": 8}, lambda a: True, False)
    # checks of schedules from outside
    assert schedule_problem(op, base) == ""
    assert "'parallel_reduce' = 5" in schedule_problem(op, {**base, "parallel_reduce": 5})
    canon = {**base, "vec_axis": "d0" if base["vec_axis"] else "", "tile_axis": ""}
    canon["tile"] = 1
    assert template_problem(canon) == ""
    assert "'parallel_reduce'" in template_problem({**canon, "parallel": 0})


def test_a_parameter_dict_without_parallel_reduce_takes_the_heuristic():
    op = column_sum(1 << 16, 4)  # a reduction that is the whole work: chunked by default
    space = LoopSpace(op)
    cfg = space.default()
    assert cfg["parallel"] == 1 and cfg["parallel_reduce"] > 0
    old = {k: v for k, v in cfg.items() if k != "parallel_reduce"}  # recorded before the knob
    assert space.is_valid(old) and schedule_problem(op, old) == ""
    assert space.to_schedule(old) == space.to_schedule(cfg)
    # parallel output loops instead, as a tuner may choose
    sched = space.to_schedule({**cfg, "parallel_reduce": 0})
    assert sched.parallel_reduce == 0


@pytest.mark.parametrize("chunks", [8, 64])
def test_chunked_reduction_matches_and_does_not_depend_on_threads(chunks):
    from nfc.codegen.jit import compile_kernel, get_num_threads, set_num_threads

    op = column_sum()
    space = LoopSpace(op)
    cfg = {**space.default(), "parallel": 1, "parallel_reduce": chunks}
    sched = space.to_schedule(cfg)
    assert sched.parallel_reduce == chunks and not sched.parallel
    check(op, sched)
    kernel = compile_kernel(op, sched)
    ins = random_inputs(inputs_of(op), 3)
    before = get_num_threads()
    try:
        outs = []
        for n in (1, 2):
            set_num_threads(n)
            outs.append(np.asarray(kernel(*ins)).copy())
    finally:
        set_num_threads(before)
    assert outs[0].tobytes() == outs[1].tobytes()


# ---------------------------------------------------------------------------------------------
# records of an older schedule version


def test_records_of_an_older_schedule_version_are_never_applied(tmp_path):
    from nfc.runtime.tuning.cache import TuningCache
    from nfc.runtime.tuning.category import default_category
    from nfc.runtime.tuning.kernels import canonical_compute, kernel_key, schedules_from_cache

    assert SCHEDULE_VERSION != "nfc-cpu-sched-2"
    op = canonical_compute(column_sum(1 << 16, 4))
    space = LoopSpace(op)
    cat = default_category()
    old_cat = {**cat, "schedule_space": "nfc-cpu-sched-2"}
    # an old record: a schedule that means something else now (no parallel_reduce key)
    old = {k: v for k, v in space.default().items() if k != "parallel_reduce"}
    old["parallel"] = 0
    with TuningCache(tmp_path / "t.sqlite") as cache:
        cache.put(old_cat, kernel_key(op), old, 1e-4)
        assert schedules_from_cache([op], cache, cat) == {}
        new = {**space.default(), "parallel_reduce": 8}
        cache.put(cat, kernel_key(op), new, 2e-4)
        assert schedules_from_cache([op], cache, cat) == {kernel_key(op): new}
    # an explicit schedule of the old version is refused with a message, not mis-applied
    d = {**Schedule().to_dict(), "version": "nfc-cpu-sched-2"}
    with pytest.raises(ValueError, match="version"):
        Schedule.from_dict(d)
    assert "version" in schedule_problem(op, d)
