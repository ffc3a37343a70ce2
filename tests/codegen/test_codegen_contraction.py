"""Contractions over runs of axes (nfc.contraction) run on the GEMM template through their
flattened view: the roles the matcher finds, and compiled kernels (default and random schedules
of the view's space) against the interpreter, for the shapes a convolution over gathered columns
produces forward and backward."""

from __future__ import annotations

import random

import pytest
from codegen_lib import check, compute, ld, tensor

from nfc.codegen.lower import ScheduleError, schedule_view
from nfc.codegen.schedule import Schedule, Split
from nfc.codegen.space import GemmSpace, LoopSpace, default_schedule, match_gemm, schedule_space
from nfc.contraction import flatten, match_contraction


def conv_forward(n=2, o=16, c=8, r=3, y=10, x=12):
    """y[n, o, y, x] = sum_{c,r,s} w[o, c, r, s] * cols[n, c, r, s, y, x]."""
    w, cols = tensor("w", (o, c, r, r)), tensor("cols", (n, c, r, r, y, x))
    return compute({"n": n, "o": o, "y": y, "x": x},
                   ld(w, "o", "c", "r", "s") * ld(cols, "n", "c", "r", "s", "y", "x"),
                   reduce="sum", raxes={"c": c, "r": r, "s": r})


def conv_input_grad(n=2, o=16, c=8, r=3, y=10, x=12):
    """dcols[n, c, r, s, y, x] = sum_o w[o, c, r, s] * dy[n, o, y, x]."""
    w, dy = tensor("w", (o, c, r, r)), tensor("dy", (n, o, y, x))
    return compute({"n": n, "c": c, "r": r, "s": r, "y": y, "x": x},
                   ld(w, "o", "c", "r", "s") * ld(dy, "n", "o", "y", "x"),
                   reduce="sum", raxes={"o": o})


def conv_weight_grad(n=2, o=16, c=8, r=3, y=10, x=12):
    """dw[o, c, r, s] = sum_{n,y,x} dy[n, o, y, x] * cols[n, c, r, s, y, x]."""
    dy, cols = tensor("dy", (n, o, y, x)), tensor("cols", (n, c, r, r, y, x))
    return compute({"o": o, "c": c, "r": r, "s": r},
                   ld(dy, "n", "o", "y", "x") * ld(cols, "n", "c", "r", "s", "y", "x"),
                   reduce="sum", raxes={"n": n, "y": y, "x": x})


def test_roles_of_the_three_convolution_contractions():
    f = match_contraction(conv_forward())
    assert f is not None and (f.i, f.j, f.k, f.kouter, f.batch) == (
        ("o",), ("y", "x"), ("c", "r", "s"), (), ("n",))
    g = match_contraction(conv_input_grad())
    assert g is not None and (g.i, g.j, g.k, g.kouter, g.batch) == (
        ("c", "r", "s"), ("y", "x"), ("o",), (), ("n",))
    h = match_contraction(conv_weight_grad())
    assert h is not None and (h.i, h.j, h.k, h.kouter, h.batch) == (
        ("o",), ("c", "r", "s"), ("y", "x"), ("n",), ())
    assert h.b.tensor.name == "cols"  # the operand holding the output's last axis


def test_non_contractions_are_refused():
    a, b = tensor("a", (4, 5)), tensor("b", (5, 6))
    # a reduction axis that only one operand indexes
    assert match_contraction(compute({"i": 4}, ld(a, "i", "k") * ld(b, "k", "j"),
                                     reduce="sum", raxes={"k": 5, "j": 6})) is None
    # the output's last axis indexed by both operands (nothing to vectorize as a GEMM)
    c = tensor("c", (4, 5))
    assert match_contraction(compute({"i": 4}, ld(a, "i", "k") * ld(c, "i", "k"),
                                     reduce="sum", raxes={"k": 5})) is None
    # a max reduction, and a load with arithmetic in an index
    assert match_contraction(compute({"i": 4, "j": 6}, ld(a, "i", "k") * ld(b, "k", "j"),
                                     reduce="max", raxes={"k": 5})) is None


def test_flattened_view_shapes_and_names():
    view = flatten(conv_forward())
    assert view is not None
    m, n, k = view.names
    assert m == "o" and n != k and {n, k}.isdisjoint({"n", "o", "y", "x", "c", "r", "s"})
    assert view.op.result.shape == (2, 16, 120)
    shapes = sorted(v.shape for v in view.values.values())
    assert shapes == [(2, 16, 120), (2, 72, 120), (16, 72)]
    assert match_gemm(view.op) is not None
    # a plain GEMM needs no view
    a, b = tensor("a", (4, 5)), tensor("b", (5, 6))
    assert flatten(compute({"i": 4, "j": 6}, ld(a, "i", "k") * ld(b, "k", "j"),
                           reduce="sum", raxes={"k": 5})) is None


@pytest.mark.parametrize("make", [conv_forward, conv_input_grad, conv_weight_grad])
def test_default_schedule_is_the_gemm_template_and_matches(make):
    op = make()
    space = schedule_space(op)
    assert isinstance(space, GemmSpace)
    sched = default_schedule(op)
    assert schedule_view(op, sched) is not None  # lowered on the view
    check(op, sched, atol=1e-4)


@pytest.mark.parametrize("make", [conv_forward, conv_input_grad, conv_weight_grad])
def test_random_schedules_of_the_view_match(make):
    op = make(n=3, o=13, c=5, r=3, y=7, x=9)  # nothing divides the blocks evenly
    space = schedule_space(op)
    rng = random.Random(11)
    done = 0
    for _ in range(400):
        cfg = {k: rng.choice(v) for k, v in space.params.items()}
        if space.is_valid(cfg):
            check(op, space.to_schedule(cfg), atol=1e-4)
            done += 1
        if done == 4:
            break
    assert done == 4


def test_small_contractions_keep_the_loop_template_on_the_original_axes():
    op = conv_forward(n=1, o=4, c=2, r=1, y=3, x=4)
    sched = default_schedule(op)
    assert schedule_view(op, sched) is None
    assert isinstance(LoopSpace(op), LoopSpace)
    check(op, sched, atol=1e-5)


def test_a_schedule_naming_unknown_axes_is_refused():
    op = conv_forward()
    with pytest.raises(ScheduleError, match="unknown axes"):
        schedule_view(op, Schedule(splits=(Split("nope", (4,)),)))


def test_guard_split_into_uniform_branch_and_lane_mask():
    # select(u and l, load, 0): u (same for all lanes) becomes a branch, l a load mask
    from nfc.ir import Binary, Const, Index, Select

    x = tensor("x", (6, 12))
    i, j = Index("i"), Index("j")
    cond = Binary("and", Binary("and", Binary(">=", i, Const(2)),
                                Binary(">=", Binary("+", j, i), Const(4))),
                  Binary("<", j, Const(9)))
    op = compute({"i": 6, "j": 10}, Select(cond, ld(x, "i", Binary("+", j, Const(2))),
                                           Const(0.0)))
    check(op, Schedule(splits=(Split("j", (8,)),), order=("i", "j.0", "j.1"),
                       vectorize="j.1"), atol=0)
    check(op, default_schedule(op), atol=0)


def test_residue_split_vectorizes_stride_two_window_gradients():
    # out[n, w] = sum_s select(w % 2 <= s, dy[n, w // 2 - s] (in range), 0): reads w only
    # through w // 2 and w % 2, as the gradient of a stride-2 window does
    from nfc.codegen.space import LoopSpace
    from nfc.ir import Binary, Const, Index, Select

    # w wider than one block of lanes (a narrower one is vectorized plainly with the window
    # unrolled: test_codegen_depthwise.py)
    dy = tensor("dy", (3, 34))
    w, s = Index("w"), Index("s")
    q = Binary("-", Binary("//", w, Const(2)), s)
    cond = Binary("and", Binary("and", Binary("<=", Const(0), q), Binary("<", q, Const(34))),
                  Binary("<=", Binary("%", w, Const(2)), s))
    op = compute({"n": 3, "w": 67}, Select(cond, ld(dy, "n", q), Const(0.0)),
                 reduce="sum", raxes={"s": 2})
    space = schedule_space(op)
    assert isinstance(space, LoopSpace)
    cfg = space.default()
    assert cfg["vec_axis"] == "w" and cfg["vec_split"] == 2
    sched = space.to_schedule(cfg)
    assert sched.order.index("w.2") < sched.order.index("w.1") == len(sched.order) - 1
    check(op, sched, atol=1e-6)
    check(op, space.to_schedule({**cfg, "vec_split": 1}), atol=1e-6)


def test_reordered_loops_of_a_reduction_axis_are_refused():
    op = conv_weight_grad()
    sched = Schedule(splits=(Split("n", (1,)),),
                     order=("o", "c", "r", "s", "n.1", "n.0", "y", "x"))
    with pytest.raises(ScheduleError, match="outer to inner"):
        check(op, sched)


def test_residue_split_with_a_padding_offset_and_index_simplification():
    # reads through (w + 1) // 2 and (w + 1) % 2 (a padded stride-2 window's gradient)
    from nfc.codegen.space import LoopSpace
    from nfc.ir import Binary, Const, Index, Select
    from nfc.simplify import simplify_divisions as simplify_index

    q, p = Index("q"), Index("p")
    x = Binary("+", Binary("+", Binary("*", Const(2), q), p), Const(1))
    got = simplify_index(Binary("//", x, Const(2)), {"q": (0, 7), "p": (0, 1)})
    assert "q" in {e.name for e in got.walk() if isinstance(e, Index)}
    assert isinstance(got, Binary) and got.op == "+"  # q + (p + 1) // 2
    rem = simplify_index(Binary("%", x, Const(2)), {"q": (0, 7), "p": (0, 1)})
    assert "q" not in {e.name for e in rem.walk() if isinstance(e, Index)}

    dy, k = tensor("dy", (2, 33)), tensor("k", (3,))
    w, s = Index("w"), Index("s")
    h = Binary("-", Binary("//", Binary("+", w, Const(1)), Const(2)), s)
    tap = Binary("+", Binary("*", Const(2), s), Binary("%", Binary("+", w, Const(1)), Const(2)))
    cond = Binary("and", Binary("and", Binary("<=", Const(0), h), Binary("<", h, Const(33))),
                  Binary("<", tap, Const(3)))
    op = compute({"n": 2, "w": 65}, Select(cond, ld(dy, "n", h) * ld(k, tap), Const(0.0)),
                 reduce="sum", raxes={"s": 2})
    space = schedule_space(op)
    assert isinstance(space, LoopSpace)
    cfg = space.default()
    assert cfg["vec_split"] == 2
    check(op, space.to_schedule(cfg), atol=1e-6)
