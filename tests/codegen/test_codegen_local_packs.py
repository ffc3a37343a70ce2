"""Panels filled per batch iteration (nfc.codegen.lowering.packing, `local_loops`): a GEMM's
packed operand indexed by its outer batch loops is packed one batch element at a time, into a
workspace of that size; the results are bit for bit those of packing the whole operand first
(the same values read in the same order), and both match the interpreter."""

from __future__ import annotations

import numpy as np
import pytest
from codegen_lib import assert_matches, compute, inputs_of, ld, random_inputs, tensor

from nfc.codegen.jit import compile_kernel, lower_kernel
from nfc.codegen.loops import Allocate, For, LoopKind, Scope, print_loops
from nfc.codegen.lowering import packing
from nfc.codegen.schedule import GroupSchedule, Schedule
from nfc.codegen.space import GemmSpace, match_gemm
from nfc.ir import Block, Call, KernelOp, YieldOp


def _batched(n: int, g: int, o: int, k: int, j: int):
    """C[n, g, o, j] = sum_k W[g, o, k] X[n, g, k, j]: W shared by the batch n, X not."""
    w, x = tensor("W", (g, o, k)), tensor("X", (n, g, k, j))
    return compute({"n": n, "g": g, "o": o, "j": j},
                   ld(w, "g", "o", "kk") * ld(x, "n", "g", "kk", "j"), reduce="sum",
                   raxes={"kk": k})


def _schedule(op, **cfg):
    space = GemmSpace(op, match_gemm(op))
    return space.to_schedule({**space.default(), "swap": 0, "pack_a": 1, "pack_b": 1, **cfg})


def _packs(info):
    """Workspace allocations of a kernel: name -> (shape, names of the loops around it)."""
    out = {}

    def walk(s, around):
        if isinstance(s, Allocate) and s.buffer.scope is Scope.GLOBAL:
            out[s.buffer.name] = (s.buffer.shape, tuple(around))
        if isinstance(s, For):
            around = [*around, s.var]
        for c in s.children():
            walk(c, around)
    walk(info.loops.body, [])
    return out


def _run(op, sched, limit, monkeypatch):
    monkeypatch.setattr(packing, "LOCAL_PACK_BYTES", limit)
    kernel = compile_kernel(op, sched)
    ins = random_inputs(inputs_of(op), seed=3)
    got = kernel(*ins)
    return lower_kernel(op, sched), ins, got


@pytest.mark.parametrize("parallel", [0, 1])
def test_local_panels_are_bit_identical_and_smaller(monkeypatch, parallel):
    # ragged everywhere: o = 125 against 14- or 6-row tiles (AVX-512, AVX2), j = 29 against
    # the vector panels, k = 37 against kc = 16; at least 8 row blocks stay parallel
    op = _batched(3, 2, 125, 37, 29)
    sched = _schedule(op, parallel=parallel, mc_tiles=1, kc=16, ku=1)
    whole, ins, ref = _run(op, sched, 1 << 62, monkeypatch)
    local, _, got = _run(op, sched, 0, monkeypatch)
    assert np.array_equal(got, ref)  # same values in the same order
    assert_matches(op, ins, [got])
    assert local.workspace_bytes < whole.workspace_bytes
    wp, lp = _packs(whole), _packs(local)
    x_whole = next(v for name, v in wp.items() if name.startswith("X"))
    x_local = next(v for name, v in lp.items() if name.startswith("X"))
    w_local = next(v for name, v in lp.items() if name.startswith("W"))
    # X's panels lose the batch dimensions (n, g) and are filled inside those loops
    assert x_whole[1] == () and x_local[1][:2] == ("n", "g")
    assert len(x_local[0]) == len(x_whole[0]) - 2
    # W is not indexed by n, the outermost loop: packed whole, once
    assert w_local[1] == () and w_local[0] == next(
        v for name, v in wp.items() if name.startswith("W"))[0]


def test_local_panels_keep_enough_parallel_loops(monkeypatch):
    # one tile row block: serialising the batch loops would leave no parallel loop
    op = _batched(3, 2, 12, 37, 29)
    sched = _schedule(op, parallel=1, mc_tiles=2, kc=16, ku=1)
    monkeypatch.setattr(packing, "LOCAL_PACK_BYTES", 0)
    info = lower_kernel(op, sched)
    assert all(around == () for _, around in _packs(info).values())
    fors = [s for s in info.loops.body.walk() if isinstance(s, For)]
    assert any(f.kind is LoopKind.PARALLEL for f in fors)


def test_small_packs_stay_whole():
    # the default threshold: a pack of a few KiB is filled once, before the nest
    op = _batched(2, 2, 50, 37, 29)
    info = lower_kernel(op, _schedule(op, mc_tiles=1))
    assert all(around == () for _, around in _packs(info).values())


def test_group_with_a_local_pack_then_a_parallel_stage(monkeypatch):
    # a per-batch pack's pointer exists inside its loop only: a parallel region of a later
    # stage must not capture it (LLVM: "Instruction does not dominate all uses")
    gemm = _batched(3, 2, 125, 37, 29)
    after = compute({"n": 3, "g": 2, "o": 125, "j": 29},
                    Call("exp", (ld(gemm.result, "n", "g", "o", "j"),)), name="e")
    kop = KernelOp(Block([gemm, after, YieldOp([after.result])]))
    gs = GroupSchedule(stages=(_schedule(gemm, parallel=1, mc_tiles=1, kc=16, ku=1),
                               Schedule(parallel=("n", "g", "o"))))
    monkeypatch.setattr(packing, "LOCAL_PACK_BYTES", 0)
    assert "parallel" in print_loops(lower_kernel(kop, gs).loops).split("alloc X_pack")[1]
    kernel = compile_kernel(kop, gs)
    ins = random_inputs(inputs_of(kop), seed=5)
    assert_matches(kop, ins, [kernel(*ins)])
