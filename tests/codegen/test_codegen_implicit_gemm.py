"""Implicit-GEMM convolutions (`im2col{implicit=true}`, nfc.contraction `GatherView`,
nfc.codegen.lowering.packing): the forward and weight-gradient GEMMs read the im2col columns
as a gather from the image, packed into panels (or read in place), never stored.

Checked: each implicit GEMM of a training step (strided, padded, dilated, 1 x 1 and capsule
shaped convolutions, forward and weight gradient) against the interpreter under the default
schedule and under every orientation and packing of the GEMM template; bit for bit against
the same GEMM over stored columns (the same schedule reads the same values in the same order);
the step's buffers (no columns left for implicit convolutions); and whole training steps,
compiled, bit for bit against the materialised build. Run again on the AVX2 path with
NFC_CPU_FEATURES=-avx512f,... (the micro-kernel and panel widths change)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from codegen_lib import assert_matches, inputs_of, random_inputs

from nfc.codegen.jit import compile_kernel, lower_kernel
from nfc.codegen.loops import print_loops
from nfc.codegen.space import GemmSpace, default_schedule, match_gemm, schedule_space
from nfc.contraction import GatherView, flatten, match_contraction, widened_load
from nfc.interp import run as interp_run
from nfc.ir import Axis, Binary, ComputeOp, Func, Load, TensorType
from nfc.runtime.build import build_module

MODEL = """
import std.nn

op capsules<stride: int = 2>(x: T[N, C, H, W], k: T[P, D, C, KH, KW])
    -> T[N, P, (H - KH) // stride + 1, (W - KW) // stride + 1, D] {
  y[n, p, i, j, d] = sum(c, r, s) x[n, c, i * stride + r, j * stride + s] * k[p, d, c, r, s]
}

model convs(batch = 2) {
  input  x: f32[batch, 3, 11, 11]
  input  y: i32[batch]
  param  k1: f32[8, 3, 3, 3] = he_normal
  param  k2: f32[8, 8, 3, 3] = he_normal
  param  k3: f32[5, 8, 1, 1] = he_normal
  param  kp: f32[2, 4, 5, 2, 2] = normal(0.0, 0.1)
  param  w8: f32[32, 4] = glorot_uniform
  param  b: f32[4] = zeros
  h1 = relu_4d(conv2d<stride = 2, padding = 1>(x, k1))     # 8 x 6 x 6
  h2 = relu_4d(conv2d<padding = 2, dilation = 2>(h1, k2))  # 8 x 6 x 6
  h3 = conv2d<stride = 2>(h2, k3)                          # 5 x 3 x 3, a strided 1 x 1
  u = capsules<stride = 1>(h3, kp)                         # [batch, 2, 2, 2, 4]
  loss = softmax_cross_entropy(linear(reshape<[batch, 32]>(u), w8, b), y)
  minimize loss with sgd(lr = 0.1, momentum = 0.9)
}
"""


def _source(tmp_path: Path) -> Path:
    p = tmp_path / "convs.nf"
    p.write_text(MODEL, encoding="utf-8")
    return p


BASE = "training-functions,inline,canonicalize,cse,dce"


@pytest.fixture(scope="module")
def step_ops(tmp_path_factory):
    src = _source(tmp_path_factory.mktemp("implicit"))
    module, _ = build_module(str(src), {}, {}, f"im2col{{implicit=true}},{BASE}")
    func = module.func("train_step")
    ops = [op for op in func.body.ops if isinstance(op, ComputeOp)
           and op.attrs.get("nf.implicit") and op.reduce == "sum"]
    return src, module, ops


def test_the_forward_and_weight_gradients_are_implicit(step_ops):
    _, module, ops = step_ops
    func = module.func("train_step")
    # every column gather went into its GEMMs (none is stored)...
    assert not [op for op in func.body.ops if isinstance(op, ComputeOp)
                and op.attrs.get("nf.im2col")]
    # ...4 forward convolutions and their 4 weight gradients, each a GEMM with a gather
    assert len(ops) == 8
    for op in ops:
        assert match_contraction(op) is None  # not a plain contraction any more
        view = flatten(op, implicit=True)
        assert view is not None and [v for v in view.op.operands
                                     if isinstance(v, GatherView)]
        assert match_gemm(view.op) is not None
    # the input gradients keep their column GEMM
    assert any(op.result.name and op.result.name.endswith("_cols")
               for op in func.body.ops if isinstance(op, ComputeOp))


def _configs(op):
    space = schedule_space(op)
    assert isinstance(space, GemmSpace)
    base = space.default()
    seen = []
    for swap, pa, pb in ((0, 0, 0), (0, 1, 1), (1, 0, 0), (1, 1, 1)):
        cfg = {**base, "swap": swap, "pack_a": pa, "pack_b": pb, "kc": 16, "ku": 1,
               "mc_tiles": 1}
        if space.is_valid(cfg):
            seen.append(space.to_schedule(cfg))
    return seen


def test_implicit_gemms_match_the_interpreter_under_every_packing(step_ops):
    _, _, ops = step_ops
    for n, op in enumerate(ops):
        ins = random_inputs(inputs_of(op), seed=n)
        for sched in [default_schedule(op), *_configs(op)]:
            got = compile_kernel(op, sched)(*ins)
            assert_matches(op, ins, [got])


def _materialised(op: ComputeOp) -> tuple[ComputeOp, ComputeOp]:
    """(the column gather of implicit GEMM `op`, the GEMM over the stored columns)."""
    c = match_contraction(op, implicit=True)
    assert c is not None
    ld = c.a if isinstance(c.a.tensor, GatherView) else c.b
    gv = ld.tensor
    assert isinstance(gv, GatherView)
    ext = {a.name: a.extent for a in op.all_axes}
    cols = ComputeOp(TensorType(gv.shape, gv.dtype),
                     tuple(Axis(n, ext[n]) for n in gv.names), gv.expr, name="cols")
    body = op.body
    assert isinstance(body, Binary)
    plain = c.b if ld is c.a else c.a
    stored = Load(cols.result, ld.indices)
    new_body = Binary("*", body.a, stored) if widened_load(body.a) is plain else Binary(
        "*", stored, body.b)
    gemm = ComputeOp(op.result.type, op.dims, new_body, reduce="sum", raxes=op.raxes,
                     name="gemm")
    return cols, gemm


def _run_ops(ops: list[ComputeOp], feeds: dict[int, np.ndarray]) -> np.ndarray:
    out = None
    for op in ops:
        out = compile_kernel(op)(*[feeds[id(v)] for v in inputs_of(op)])
        feeds[id(op.result)] = out
    assert out is not None
    return out


def test_implicit_gemms_equal_stored_columns_bit_for_bit(step_ops):
    # the GEMM template's schedules (the default, and packed both ways) on the same view
    # shapes: the same values summed in the same order. (Below `SMALL_GEMM_WORK` the default
    # is the loop template's, which schedules the direct form and the stored columns apart.)
    _, _, ops = step_ops
    for n, op in enumerate(ops):
        cols, gemm = _materialised(op)
        assert match_contraction(gemm) is not None
        space, stored_space = schedule_space(op), schedule_space(gemm)
        # the same GEMM, except that a gather read as the vector operand is always packed
        mine, theirs = space.default(), stored_space.default()
        assert {**mine, "pack_b": 0} == {**theirs, "pack_b": 0}
        ins = random_inputs(inputs_of(op), seed=10 + n)
        feeds = {id(v): a for v, a in zip(inputs_of(op), ins, strict=True)}
        stored = _run_ops([cols], feeds)
        pairs = [(space.to_schedule(mine), stored_space.to_schedule(theirs)),
                 (_configs(op)[1], _configs(op)[1])]
        for sched, stored_sched in pairs:
            ref = compile_kernel(gemm, stored_sched)(
                *[stored if v is cols.result else feeds[id(v)] for v in inputs_of(gemm)])
            got = compile_kernel(op, sched)(*ins)
            assert np.array_equal(got, ref), f"op {n}: {np.max(np.abs(got - ref))}"


def test_the_panels_are_filled_from_the_image(step_ops):
    _, _, ops = step_ops
    packed = 0
    for op in ops:
        space = schedule_space(op)
        sched = space.to_schedule(space.default())
        info = lower_kernel(op, sched)
        text = print_loops(info.loops)
        view = flatten(op, implicit=True)
        assert view is not None
        n = next(k for k, v in enumerate(view.op.operands) if isinstance(v, GatherView))
        if any(p.operand == n for p in sched.pack):
            packed += 1
            assert "_view_pack" in text  # panels of the view, filled by loads of the image
        assert "cols" not in text
    assert packed >= 4


def _grouped(guard: bool) -> ComputeOp:
    """A grouped convolution marked implicit by hand: the group is a batch axis of both."""
    from nfc.irparser import parse_module

    pad = "select(1 <= 2 * i + r and 2 * i + r < 8 and 1 <= 2 * j + s and 2 * j + s < 8, " \
          "%x[n, g, c, 2 * i + r - 1, 2 * j + s - 1], 0.0)" if guard else \
          "%x[n, g, c, 2 * i + r, 2 * j + s]"
    side = 4 if guard else 3
    text = (f"nf.func @f(%x: tensor<2x3x4x7x7xf32>, %k: tensor<3x5x4x3x3xf32>) -> "
            f"(tensor<2x3x5x{side}x{side}xf32>) {{\n"
            f"  %y = nf.compute [n: 2, g: 3, o: 5, i: {side}, j: {side}] "
            f"sum [c: 4, r: 3, s: 3] ({pad} * %k[g, o, c, r, s]) {{nf.implicit = true}} : "
            f"tensor<2x3x5x{side}x{side}xf32>\n"
            f"  nf.return %y : tensor<2x3x5x{side}x{side}xf32>\n}}\n")
    func = parse_module(text, "grouped.nfir").funcs[0]
    return next(op for op in func.body.ops if isinstance(op, ComputeOp))


@pytest.mark.parametrize("guard", [False, True], ids=["strided", "strided-padded"])
def test_grouped_convolutions_as_implicit_gemms(guard):
    op = _grouped(guard)
    view = flatten(op, implicit=True)
    assert view is not None and "g" in match_gemm(view.op).batch
    ins = random_inputs(inputs_of(op), seed=5)
    for sched in [default_schedule(op), *_configs(op)]:
        assert_matches(op, ins, [compile_kernel(op, sched)(*ins)])


def test_an_unmarked_direct_convolution_keeps_the_loop_template():
    op = _grouped(True)
    op.attrs = {}
    assert flatten(op, implicit=True) is None
    assert schedule_space(op).kind != "gemm"


def test_interpreter_agrees_on_the_rewritten_step(step_ops):
    # the IR after the substitution computes what the materialised IR does (float64)
    src, module, _ = step_ops
    ref, _ = build_module(str(src), {}, {}, f"im2col{{implicit=false}},{BASE}")
    rng = np.random.default_rng(0)
    feeds = {}
    for a in module.func("train_step").args:
        if a.dtype.is_int:
            feeds[a.name] = rng.integers(0, 4, a.shape).astype(a.dtype.numpy)
        else:
            feeds[a.name] = rng.standard_normal(a.shape).astype(a.dtype.numpy)

    def run(m, func: Func):
        return interp_run(func, {a.name: feeds[a.name] for a in func.args}, module=m)
    got = run(module, module.func("train_step"))
    want = run(ref, ref.func("train_step"))
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)


def test_a_canonicalized_one_channel_convolution_is_gathered():
    # after a cleanup, LeNet-5's first convolution reads `%x[n, 0, ...]` and `%k1[o, 0, r, s]`
    # (canonicalize drops the 1-channel axis): still gathered into columns, the weight kept
    from nfc.runtime.build import frontend_module, run_pipeline

    root = Path(__file__).resolve().parents[2]
    module = frontend_module(root / "examples" / "lenet5.nf")
    run_pipeline(module, "inline,canonicalize,im2col")
    fwd = module.func("forward")
    cols = [op for op in fwd.body.ops if isinstance(op, ComputeOp) and op.attrs.get("nf.im2col")]
    assert len(cols) == 2  # the image's and the pooled map's, not the weight's
    assert not any(ld.tensor.name == "k1" for c in cols for ld in c.body.walk()
                   if isinstance(ld, Load))
    gemms = [op for op in fwd.body.ops if isinstance(op, ComputeOp)
             and any(v is c.result for c in cols for v in op.operands)]
    assert len(gemms) == 2 and all(match_contraction(g) is not None for g in gemms)


def test_the_step_plan_keeps_no_columns(step_ops):
    # the artifact's memory plan: the materialised build saves every convolution's columns
    # for its weight gradient; the implicit one saves none and plans a smaller arena
    from nfc.codegen.artifact import build_artifact

    src, module, _ = step_ops
    stored, _ = build_module(str(src), {}, {}, f"im2col{{implicit=false}},{BASE},fuse")
    implicit, _ = build_module(str(src), {}, {}, f"im2col{{implicit=true}},{BASE},fuse")
    reports = [build_artifact(m, functions=["train_step"]).plans["train_step"].memory_report()
               for m in (stored, implicit)]
    cols = sum(op.result.type.nbytes for op in stored.func("train_step").body.walk()
               if isinstance(op, ComputeOp) and op.attrs.get("nf.im2col"))
    assert cols > 0
    before, after = reports[0].saved, reports[1].saved  # saved bytes by source location
    # what is no longer saved is exactly the columns (the images they gather are saved
    # instead where the weight gradient needs them: far smaller)
    assert sum(b for k, b in before.items() if k not in after) == cols
    assert reports[1].saved_total < reports[0].saved_total
    assert reports[1].total < reports[0].total
