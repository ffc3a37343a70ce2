"""Convolution kernels on the GEMM template: 1 x 1 windows whose window axes canonicalization
made constant (a squeezed contraction), the swapped orientation for weight gradients (tensor
swapping inside the schedule), unpacked B for short M, the micro-kernel chosen per GEMM shape,
and the schedule checks that accept records without the newer parameters. Every kernel is
compared with the interpreter."""

from __future__ import annotations

import random

import pytest
from codegen_lib import check, compute, ld, tensor

from nfc.codegen.lower import schedule_view
from nfc.codegen.space import (
    GEMM_DEFAULTS,
    GemmSpace,
    LoopSpace,
    default_schedule,
    schedule_problem,
    schedule_space,
    template_problem,
)
from nfc.contraction import flatten, match_contraction
from nfc.ir import Const


def pointwise_conv(n=2, o=24, c=20, y=5, x=6):
    """y[n, o, i, j] = sum_c cols[n, c, 0, 0, i, j] * w[o, c, 0, 0] (a 1 x 1 window after
    canonicalization: the window axes are gone, their dimensions indexed by 0)."""
    cols, w = tensor("cols", (n, c, 1, 1, y, x)), tensor("w", (o, c, 1, 1))
    zero = Const(0)
    return compute({"n": n, "o": o, "i": y, "j": x},
                   ld(cols, "n", "c", zero, zero, "i", "j") * ld(w, "o", "c", zero, zero),
                   reduce="sum", raxes={"c": c})


def weight_grad(n=2, o=16, c=6, r=3, y=10, x=12):
    """dw[o, c, r, s] = sum_{n,y,x} dy[n, o, y, x] * cols[n, c, r, s, y, x]: both operands
    are contiguous along the reduction, B's j (c, r, s) is not its last dimension."""
    dy, cols = tensor("dy", (n, o, y, x)), tensor("cols", (n, c, r, r, y, x))
    return compute({"o": o, "c": c, "r": r, "s": r},
                   ld(dy, "n", "o", "y", "x") * ld(cols, "n", "c", "r", "s", "y", "x"),
                   reduce="sum", raxes={"n": n, "y": y, "x": x})


def matmul(m, n, k):
    a, b = tensor("a", (m, k)), tensor("b", (k, n))
    return compute({"i": m, "j": n}, ld(a, "i", "k") * ld(b, "k", "j"), reduce="sum",
                   raxes={"k": k})


def test_constant_zero_indices_of_unit_dimensions_are_a_squeezed_contraction():
    op = pointwise_conv(n=3, o=256, c=36, y=8, x=9)  # M large enough to pack B
    c = match_contraction(op)
    assert c is not None and c.squeezed and not c.is_gemm
    view = flatten(op)
    assert view is not None
    shapes = sorted(tuple(v.type.shape) for v in view.op.operands)
    assert shapes == [(3, 36, 72), (256, 36)]  # the unit dimensions dropped
    space = schedule_space(op)
    assert isinstance(space, GemmSpace)
    sched = default_schedule(op)
    assert sched.pack and schedule_view(op, sched) is not None
    check(op, sched)


def test_a_constant_index_of_a_wider_dimension_is_no_contraction():
    cols, w = tensor("cols", (2, 4, 3, 5)), tensor("w", (6, 4))
    op = compute({"n": 2, "o": 6, "j": 5}, ld(cols, "n", "c", Const(1), "j") * ld(w, "o", "c"),
                 reduce="sum", raxes={"c": 4})
    assert match_contraction(op) is None


def test_loop_schedules_of_a_squeezed_contraction_keep_the_original_axes():
    op = pointwise_conv(n=1, o=4, c=3, y=2, x=3)
    sched = LoopSpace(op).to_schedule(LoopSpace(op).default())
    assert schedule_view(op, sched) is None
    check(op, sched)


def test_weight_gradient_is_swapped_and_matches():
    op = weight_grad()
    space = schedule_space(op)
    assert isinstance(space, GemmSpace)
    cfg = space.default()
    assert cfg["swap"] == 1 and cfg["pack_a"] == 0
    sched = space.to_schedule(cfg)
    # the lanes run along o (the output's first axis): the packed operand is dy
    packed = {p.operand for p in sched.pack}
    assert packed == {space.p.a}
    check(op, sched)
    check(op, space.to_schedule({**cfg, "swap": 0, "pack_b": 1}))


def test_forward_contraction_is_not_swapped():
    a = tensor("w", (32, 27))
    cols = tensor("cols", (2, 27, 100))
    op = compute({"n": 2, "o": 32, "p": 100}, ld(a, "o", "k") * ld(cols, "n", "k", "p"),
                 reduce="sum", raxes={"k": 27})
    assert schedule_space(op).default()["swap"] == 0


@pytest.mark.parametrize("m", [8, 12])
def test_short_m_leaves_b_unpacked_and_matches(m):
    op = matmul(m, 128, 70)
    space = schedule_space(op)
    cfg = space.default()
    assert cfg["pack_b"] == 0
    sched = space.to_schedule(cfg)
    assert all(p.operand != space.p.b for p in sched.pack)
    check(op, sched)


def test_micro_tile_fits_the_shape():
    space = schedule_space(matmul(16, 1024, 64))
    mr, nv = space.micro_tile()
    assert -(-16 // mr) * mr <= 18  # a 12-row tile would compute 24 rows
    big = schedule_space(matmul(1024, 1024, 256))
    mr, nv = big.micro_tile()
    regs = big.target.vector_registers
    assert mr * nv + nv + 1 <= regs
    if regs >= 32:
        assert nv * mr >= 16  # enough independent accumulators to hide the FMA latency


def test_random_swapped_and_unpacked_schedules_match():
    op = weight_grad(n=3, o=13, c=5, r=3, y=7, x=9)  # nothing divides the blocks evenly
    space = schedule_space(op)
    rng = random.Random(5)
    done = 0
    for _ in range(400):
        cfg = {k: rng.choice(v) for k, v in space.params.items()}
        cfg["swap"] = done % 2
        cfg["pack_b"] = 1 if done % 2 == 0 else rng.choice((0, 1))
        if space.is_valid(cfg):
            check(op, space.to_schedule(cfg))
            done += 1
        if done == 4:
            break
    assert done == 4


def test_records_without_the_newer_parameters_are_accepted():
    old = {"mr": 6, "nv": 2, "mc_tiles": 2, "kc": 64, "ku": 4, "pack_a": 0, "parallel": 0}
    assert template_problem(old) == ""
    op = matmul(64, 64, 64)
    assert schedule_problem(op, old) == ""
    assert schedule_space(op).is_valid(old)
    assert set(GEMM_DEFAULTS) == {"pack_b", "swap", "jouter"}
    assert "'swap' = 2" in template_problem({**old, "swap": 2})
    assert "'jouter' = 2" in template_problem({**old, "jouter": 2})
    assert "'pack_b' = 7" in schedule_problem(op, {**old, "pack_b": 7})


def depthwise_stride2(n=2, c=5, h=12, w=12, r=3):
    """out[n, c, i, j] = sum_{r,s} x[n, c, 2i + r - 1, 2j + s - 1] (zero padded) * k[c, r, s]:
    a stride-2 depthwise convolution, read strided along the lanes."""
    from nfc.ir import Binary, Index, Select

    x, k = tensor("x", (n, c, h, w)), tensor("k", (c, r, r))
    oh, ow = (h + 2 - r) // 2 + 1, (w + 2 - r) // 2 + 1
    hi = Binary("-", Binary("+", Binary("*", Const(2), Index("i")), Index("r")), Const(1))
    wi = Binary("-", Binary("+", Binary("*", Const(2), Index("j")), Index("s")), Const(1))
    inside = Binary("and", Binary("and", Binary("<=", Const(0), hi), Binary("<", hi, Const(h))),
                    Binary("and", Binary("<=", Const(0), wi), Binary("<", wi, Const(w))))
    return compute({"n": n, "c": c, "i": oh, "j": ow},
                   Select(inside, ld(x, "n", "c", hi, wi), Const(0.0)) * ld(k, "c", "r", "s"),
                   reduce="sum", raxes={"r": r, "s": r})


@pytest.mark.parametrize("w", [16, 15])  # 15: the last phase is one short (clamped fill)
def test_stride_two_reads_get_a_phase_pack_and_match(w):
    from nfc.codegen.schedule import Schedule

    op = depthwise_stride2(w=w, h=w)
    space = schedule_space(op)
    assert isinstance(space, LoopSpace)
    cfg = space.default()
    assert cfg["vec_axis"] == "j"
    sched = space.to_schedule(cfg)
    phase = [p for p in sched.pack if p.kind == "phase"]
    assert [(p.operand, p.dim, p.factor) for p in phase] == [(0, 3, 2)]
    assert Schedule.from_dict(sched.to_dict()) == sched
    check(op, sched)
    # the lowered loads of the panels are unit-stride along the lanes: no `2 * j` left
    from nfc.codegen.loops import print_loops
    from nfc.codegen.lower import lower

    text = print_loops(lower(op, sched))
    read = text.split("x_phase[", 2)[2].split("]")[0]  # the load in the main nest
    assert "2 *" not in read.split(", ")[-1], read


def test_a_phase_pack_of_an_operand_read_contiguously_changes_nothing():
    from nfc.codegen.schedule import Pack, replace

    op = weight_grad(n=2, o=4, c=3, r=3, y=6, x=8)
    sched = replace(LoopSpace(op).to_schedule(LoopSpace(op).default()),
                    pack=(Pack(1, 5, 2, "phase"),))
    check(op, sched)


@pytest.mark.parametrize("taps", [2, 9])
def test_residue_split_lanes_fit_the_quotient(taps):
    from nfc.ir import Binary, Index, Select

    dy = tensor("dy", (4, 8))
    w, s = Index("w"), Index("s")
    q = Binary("-", Binary("//", Binary("+", w, Const(1)), Const(2)), s)
    cond = Binary("and", Binary("and", Binary("<=", Const(0), q), Binary("<", q, Const(8))),
                  Binary("<", Binary("+", Binary("*", Const(2), s),
                                     Binary("%", Binary("+", w, Const(1)), Const(2))), Const(3)))
    op = compute({"n": 4, "w": 16}, Select(cond, ld(dy, "n", q), Const(0.0)),
                 reduce="sum", raxes={"s": taps})
    cfg = LoopSpace(op).default()
    if taps == 2:
        # a short window read with w: plain lanes over w, the window unrolled whole
        assert cfg["vec_split"] == 1 and cfg["vec_axis"] == "w" and cfg["kunroll"] == 2
    else:  # a window too long to unroll: the residue split, lanes over w // 2
        assert cfg["vec_split"] == 2 and cfg["vec"] <= 8  # w // 2 takes 8 values
    check(op, LoopSpace(op).to_schedule(cfg))


@pytest.mark.parametrize("tail", ["guard", "auto"])
def test_phase_pack_pads_for_a_ragged_tail(tail):
    from nfc.codegen.schedule import Pack, Schedule, Split
    from nfc.ir import Binary, Index

    x, k = tensor("x", (4, 16)), tensor("k", (3,))
    ix = Binary("+", Binary("*", Const(2), Index("j")), Index("s"))
    op = compute({"i": 4, "j": 7}, ld(x, "i", ix) * ld(k, "s"), reduce="sum", raxes={"s": 3})
    sched = Schedule(splits=(Split("j", (8,), tail),), order=("i", "j.0", "s", "j.1"),
                     vectorize="j.1", cache_write="s", pack=(Pack(0, 1, 2, "phase"),))
    kernel = check(op, sched)
    assert kernel.info.workspace_bytes >= 4 * 4 * 2 * 9  # a ninth position per phase
