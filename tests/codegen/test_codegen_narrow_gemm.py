"""GEMMs whose N is narrower than a vector (nfc.codegen.gemm_space, `GemmSpace._narrow_n`): the
capsule convolution of CapsNet, `y[n, p, g, d] = sum_k X[n, k, g] W[p, d, k]` with the capsule
dimension d = 8 as N, used to compute half-empty AVX-512 vectors and to pack W into panels of
16 lanes, twice its size. The default schedule now runs it swapped (lanes along the grid g,
W read as broadcasts, not packed), parallel over the batch loops. Also the 3-vector tiles
(only where 48 divides N or N fits one tile) and `jouter` (B's panels outermost when B is
shared by the batch: CapsNet's weight gradient over stored columns). Every kernel is compared
with the interpreter, and the changed schedules sum in the former order (bit for bit); on an
AVX2 target (8 lanes: N fills them) the narrow swap does not apply, which the same tests
check when run with NFC_CPU_FEATURES=-avx512f,-avx512bw,-avx512dq,-avx512vl,..."""

from __future__ import annotations

import math

import numpy as np
import pytest
from codegen_lib import check, compute, inputs_of, ld, random_inputs, tensor

from nfc.codegen.jit import compile_kernel, lower_kernel
from nfc.codegen.loops import Allocate, Scope
from nfc.codegen.space import GemmSpace, schedule_space


def capsule_conv(n=2, p=3, g=36, d=8, k=70):
    """The primary capsules over stored columns: y[n, p, g, d] = sum_k X[n, k, g] W[p, d, k]
    (W's d is not its last dimension: unswapped, its panels are a transposing pack)."""
    x, w = tensor("X", (n, k, g)), tensor("W", (p, d, k))
    return compute({"n": n, "p": p, "g": g, "d": d}, ld(x, "n", "kk", "g") * ld(w, "p", "d", "kk"),
                   reduce="sum", raxes={"kk": k})


def _allocs(op, sched) -> dict[str, tuple[int, ...]]:
    """Workspace buffers of the lowered kernel: name -> shape."""
    out: dict[str, tuple[int, ...]] = {}

    def walk(s):
        if isinstance(s, Allocate) and s.buffer.scope is Scope.GLOBAL:
            out[s.buffer.name] = tuple(s.buffer.shape)
        for c in s.children():
            walk(c)
    walk(lower_kernel(op, sched).loops.body)
    return out


@pytest.mark.parametrize("g", [36, 20])
def test_weight_panels_are_not_padded_and_the_kernel_matches(g):
    op = capsule_conv(g=g)
    space = schedule_space(op)
    assert isinstance(space, GemmSpace)
    sched = space.to_schedule(space.default())
    wsize = math.prod(op.operands[1].type.shape)
    for name, shape in _allocs(op, sched).items():
        if name.startswith("W"):  # a pack of the weight holds no zero padding
            assert math.prod(shape) <= wsize, (name, shape)
    if space.w > 8:  # AVX-512: swapped, the weight read in place
        cfg = space.default()
        assert cfg["swap"] == 1 and not any(n.startswith("W") for n in _allocs(op, sched))
        assert all(p.operand != 1 for p in sched.pack)
    check(op, sched)


def test_narrow_swap_covers_the_wide_axis_in_one_tile_and_runs_in_parallel():
    op = capsule_conv(n=4, p=8, g=36, d=8, k=512)
    space = schedule_space(op)
    cfg = space.default()
    if space.w <= 8:
        assert cfg["swap"] == 0  # 8 lanes: N = 8 fills them, the schedule is the former one
    else:
        assert cfg["swap"] == 1
        assert cfg["mr"] == 8  # the 8 capsule components are the tile's rows
        assert cfg["nv"] * space.w == 48  # the 36 grid cells in one 3-vector tile
        assert cfg["parallel"] == 1  # over the batch loops n, p (one row tile each)
    check(op, space.to_schedule(cfg))


def test_contiguous_narrow_n_is_not_swapped():
    # B's j is its last dimension: unit-stride rows without a transposing pack, as before
    a, b = tensor("a", (64, 40)), tensor("b", (40, 8))
    op = compute({"i": 64, "j": 8}, ld(a, "i", "k") * ld(b, "k", "j"), reduce="sum",
                 raxes={"k": 40})
    assert schedule_space(op).default()["swap"] == 0
    check(op)


@pytest.mark.parametrize("n", [96, 1024])
def test_three_vector_tiles_only_without_ragged_tails(n):
    # a weight gradient's shape: M = 8 rows, N columns; 3 x 16 lanes where 48 divides N
    a, b = tensor("a", (8, 40)), tensor("b", (40, n))
    op = compute({"i": 8, "j": n}, ld(a, "i", "k") * ld(b, "k", "j"), reduce="sum",
                 raxes={"k": 40})
    space = schedule_space(op)
    mr, nv = space.micro_tile()
    if space.target.vector_registers >= 32:
        assert (nv == 3) == (n % (3 * space.w) == 0)  # 1024 = 21 x 48 + 16: not 3
    check(op, space.to_schedule(space.default()))


def test_swapped_narrow_gemm_sums_in_the_same_order():
    # the orientation and the tile change, not the order of each output's sum over k (the
    # same K blocks, k ascending inside each): bit for bit the former unswapped schedule's
    op = capsule_conv(n=2, p=3, g=36, d=8, k=600)
    space = schedule_space(op)
    cfg = space.default()
    former = {**cfg, "swap": 0, "mr": 12, "nv": 1, "mc_tiles": 3, "pack_a": 1, "pack_b": 1}
    assert space.is_valid(former)
    ins = random_inputs(inputs_of(op), seed=4)
    got = compile_kernel(op, space.to_schedule(cfg))(*ins)
    ref = compile_kernel(op, space.to_schedule(former))(*ins)
    assert np.array_equal(got, ref)
    check(op, space.to_schedule(cfg), inputs=ins)


def capsule_weight_grad(n=2, p=4, g=6, d=8, k=48 * 120):
    """dW[p, d, k] = sum_{n, g} dy[n, p, g, d] cols[n, g, k] (CapsNet's with stored, channel-last
    columns): the columns, indexed by no batch axis (p), are the vector operand."""
    dy, cols = tensor("dy", (n, p, g, d)), tensor("cols", (n, g, k))
    return compute({"p": p, "d": d, "kk": k}, ld(dy, "n", "p", "g", "d") * ld(cols, "n", "g", "kk"),
                   reduce="sum", raxes={"n": n, "g": g})


def test_large_shared_panels_run_outermost_with_the_same_sums():
    op = capsule_weight_grad()  # cols: 2 x 6 x 5760 floats = 276 KB; per p re-read 4 times
    small = schedule_space(op)
    assert small.default()["jouter"] == 0  # B fits an L2: the former order
    op = capsule_weight_grad(n=4, p=6, g=12, k=48 * 120)  # cols 1.3 MB, re-read 6 times
    space = schedule_space(op)
    cfg = space.default()
    assert cfg["jouter"] == 1
    sched = space.to_schedule(cfg)
    jl = f"{space.pattern(bool(cfg['swap'])).j}.0"
    assert sched.order[0] == jl and sched.order[1] == "p"  # panels outside the batch loop
    assert not cfg["parallel"] or sched.parallel == (jl,)
    ins = random_inputs(inputs_of(op), seed=6)
    got = compile_kernel(op, sched)(*ins)
    ref = compile_kernel(op, space.to_schedule({**cfg, "jouter": 0}))(*ins)
    assert np.array_equal(got, ref)  # the same sums in the same order, another loop order
    check(op, sched, inputs=ins)
