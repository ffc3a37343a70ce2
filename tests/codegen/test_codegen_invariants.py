"""Loop-invariant values computed before their loops, branchless selects over in-bounds loads
(nfc.codegen.llvm.hoist), and the loop template's defaults for batch-norm shaped computes:
the vectorized axis weighted by the size of what each load reads, reduction loops in the
layout's order, quarter vectors for 4-wide axes (nfc.codegen.space.LoopSpace)."""

from __future__ import annotations

import re

import numpy as np
from codegen_lib import check, compute, inputs_of, ld, random_inputs, tensor

from nfc.codegen.cpu import host_target
from nfc.codegen.jit import compile_kernel, emit_kernel, new_module, optimize
from nfc.codegen.schedule import Schedule, Split
from nfc.codegen.space import LoopSpace, default_schedule
from nfc.ir import Binary, Call, Const, Index, Select


def _bn_grad(n: int = 4, c: int = 8, h: int = 4, w: int = 4):
    """`dx = relu_mask(x) * dy * rsqrt(var[c] + eps) * g[c] + b[c]`: an elementwise nest with
    per-channel factors and a data-dependent mask."""
    x, dy = tensor("x", (n, c, h, w)), tensor("dy", (n, c, h, w))
    var, g, b = tensor("var", (c,)), tensor("g", (c,)), tensor("b", (c,))
    idx = ("n", "c", "h", "w")
    scale = Call("rsqrt", (ld(var, "c") + Const(1e-5),)) * ld(g, "c")
    body = Select(Binary(">", ld(x, *idx), Const(0.0)), ld(dy, *idx), Const(0.0)) * scale \
        + ld(b, "c")
    return compute({"n": n, "c": c, "h": h, "w": w}, body)


def _llvm(op, schedule) -> str:
    module = new_module("t", host_target())
    emit_kernel(module, "k", op, schedule)
    return str(optimize(module, host_target()))


def _scalar(op) -> Schedule:
    """Serial loops in the dims' order, no vectors (where the emitter's choices show)."""
    return Schedule(order=tuple(a.name for a in op.all_axes))


def test_invariant_square_root_leaves_the_inner_loops():
    op = _bn_grad()
    text = _llvm(op, _scalar(op))
    body = text[text.index("define"):]
    # one square root per channel, in a block before the loops over h and w: not in a block
    # that stores (before, LLVM recomputed it per element: stores may alias `var`)
    assert body.count("call float @llvm.sqrt.f32(") == 1
    blocks = re.split(r"\n(?=[\w.\"]+:)", body)
    at = next(b for b in blocks if "@llvm.sqrt.f32(" in b)
    assert "store " not in at
    check(op, _scalar(op))
    check(op)


def test_relu_mask_select_is_branchless_and_exact():
    op = _bn_grad()
    text = _llvm(op, _scalar(op))
    # the mask selects between two in-bounds values: no conditional branch on it
    assert "select i1" in text or "select <" in text
    fn = text[text.index("define"):]
    compares = len(re.findall(r"fcmp", fn))
    assert compares >= 1
    assert not re.search(r'label %"?[\w.]+\.if\b', fn)
    kernel = compile_kernel(op, _scalar(op))
    ins = random_inputs(inputs_of(op), 3, positive=True)
    ins[0] = ins[0] - np.float32(0.5)  # a mask with both values
    got = kernel(*ins)
    x, dy, var, g, b = ins
    want = np.where(x > 0, dy, 0) * (1 / np.sqrt(var + np.float32(1e-5)) * g)[None, :, None,
                                                                               None]
    want += b[None, :, None, None]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_padding_guard_still_protects_out_of_bounds_reads():
    # the loads of a padded window read outside the tensor when the guard is false: they
    # must stay guarded (a branch or a masked load), and the result match the interpreter
    x = tensor("x", (2, 7, 9))
    hh = Index("h") + Index("r") - 1
    ok = Binary("and", Binary("<=", Const(0), hh), Binary("<", hh, Const(7)))
    op = compute({"n": 2, "h": 7, "w": 9}, Select(ok, ld(x, "n", hh, "w"), Const(0.0)),
                 reduce="sum", raxes={"r": 3})
    check(op, _scalar(op))
    check(op)


def test_a_load_of_a_buffer_written_in_the_loop_is_not_hoisted():
    # `out[i] += x[i, k] * s[i]` with the k blocks outside the accumulator: the write-back
    # reads `out` in every k.0 iteration, which must see the previous block's sum
    x, s = tensor("x", (6, 40)), tensor("s", (6,))
    op = compute({"i": 6}, ld(x, "i", "k") * ld(s, "i"), reduce="sum", raxes={"k": 40})
    sched = Schedule(splits=(Split("k", (8,)),), order=("k.0", "i", "k.1"),
                     cache_write="i")
    check(op, sched)


def test_bn_output_vectorizes_along_the_image_not_the_channels():
    # batch norm's output: three per-channel loads contiguous in c against one activation
    # read and the store contiguous in w (vectorized along c: a gather and a scatter)
    x = tensor("x", (4, 16, 8, 32))
    var, g, b = tensor("var", (16,)), tensor("g", (16,)), tensor("b", (16,))
    body = ld(x, "n", "c", "h", "w") * Call("rsqrt", (ld(var, "c") + Const(1e-5),)) \
        * ld(g, "c") + ld(b, "c")
    op = compute({"n": 4, "c": 16, "h": 8, "w": 32}, body)
    cfg = LoopSpace(op).default()
    assert cfg["vec_axis"] == "w"
    check(op)


def test_channel_sums_run_in_the_layout_order():
    # autodiff's `sum [h, w, n] dy[n, c, h, w]`: the innermost reduction loop is w
    dy, x = tensor("dy", (4, 16, 4, 4)), tensor("x", (4, 16, 4, 4))
    idx = ("n", "c", "h", "w")
    op = compute({"c": 16}, ld(dy, *idx) * ld(x, *idx), reduce="sum",
                 raxes={"h": 4, "w": 4, "n": 4})
    space = LoopSpace(op)
    assert space.raxes == ["n", "h", "w"]
    sched = default_schedule(op)
    red = [lp.split(".")[0] for lp in sched.order if lp.split(".")[0] in ("n", "h", "w")]
    assert red.index("n") < red.index("h") < red.index("w")
    check(op)


def test_four_wide_axis_gets_a_quarter_vector():
    op = _bn_grad(n=4, c=32, h=4, w=4)
    space = LoopSpace(op)
    lanes = host_target().lanes(op.result.dtype)
    cfg = space.default()
    if lanes >= 8:  # AVX-512: a quarter of 16 lanes; AVX2: half of 8
        assert cfg["vec_axis"] == "w" and cfg["vec"] == 4
    check(op)
    # a 3-wide axis gets no partial quarter vector
    k = tensor("k", (8, 8, 3, 3))
    upd = compute({"a": 8, "b": 8, "r": 3, "s": 3},
                  ld(k, "a", "b", "r", "s") * Const(0.9))
    c3 = LoopSpace(upd).default()
    assert c3["vec"] == 1 or c3["vec"] >= lanes // 2
    check(upd)
