"""Schedules: JSON round trips, the spaces' defaults, and random schedules from the spaces
checked against the interpreter."""

from __future__ import annotations

import json
import random
import zlib

import numpy as np
import pytest
from codegen_lib import check, compute, ld, matmul, tensor

from nfc.codegen.lower import ScheduleError, lower
from nfc.codegen.schedule import (
    SCHEDULE_VERSION,
    GroupSchedule,
    Pack,
    Schedule,
    Split,
    schedule_from_dict,
)
from nfc.codegen.space import GemmSpace, LoopSpace, default_schedule, match_gemm, schedule_space
from nfc.ir import Binary, Call, Const, Index, Select


def _conv():
    x, k = tensor("x", (2, 3, 9, 11)), tensor("k", (5, 3, 3, 3))
    hh, ww = Index("p") + Index("r") - 1, Index("q") + Index("s") - 1
    ok = Binary("and", Binary("and", Binary("<=", Const(0), hh), Binary("<", hh, Const(9))),
                Binary("and", Binary("<=", Const(0), ww), Binary("<", ww, Const(11))))
    return compute({"b": 2, "o": 5, "p": 9, "q": 11},
                   Select(ok, ld(x, "b", "c", hh, ww), Const(0.0)) * ld(k, "o", "c", "r", "s"),
                   reduce="sum", raxes={"c": 3, "r": 3, "s": 3})


def _ops():
    x = tensor("x", (13, 45))
    b = tensor("b", (45,))
    return {
        "ew": compute({"i": 13, "j": 45}, Call("tanh", (ld(x, "i", "j") + ld(b, "j"),))),
        "rowsum": compute({"i": 13}, ld(x, "i", "k") * ld(x, "i", "k"), reduce="sum",
                          raxes={"k": 45}),
        "colmax": compute({"j": 45}, ld(x, "i", "j"), reduce="max", raxes={"i": 13}),
        "conv": _conv(),
    }


def test_schedule_roundtrip_json():
    s = Schedule(splits=(Split("i", (64, 8)), Split("k", (4,))),
                 order=("i.0", "k.0", "i.1", "k.1", "i.2"), vectorize="i.2",
                 unroll=("k.1",), parallel=("i.0",), cache_write="k.0",
                 pack=(Pack(1, 1, 16),))
    d = json.loads(json.dumps(s.to_dict()))
    assert Schedule.from_dict(d) == s
    assert schedule_from_dict(d) == s
    g = GroupSchedule(inline=(0,), stages=(s, None))
    assert schedule_from_dict(json.loads(json.dumps(g.to_dict()))) == g
    with pytest.raises(ValueError, match="version"):
        Schedule.from_dict({**d, "version": "nfc-cpu-sched-0"})
    assert d["version"] == SCHEDULE_VERSION


def test_gemm_pattern_recognition():
    assert isinstance(schedule_space(matmul(8, 8, 8)), GemmSpace)
    p = match_gemm(matmul(8, 8, 8))
    assert p is not None and (p.i, p.j, p.k, p.a, p.b) == ("i", "j", "k", 0, 1)
    for op in _ops().values():
        assert isinstance(schedule_space(op), LoopSpace)


@pytest.mark.parametrize("name", ["ew", "rowsum", "colmax", "conv"])
def test_spaces_are_json_and_defaults_valid(name):
    space = schedule_space(_ops()[name])
    json.dumps(space.params)
    cfg = space.default()
    assert space.is_valid(cfg)
    assert json.loads(json.dumps(cfg)) == cfg
    space.to_schedule(cfg)


def _random_valid(space, rng: random.Random, n: int):
    out, tries = [], 0
    while len(out) < n and tries < 5000:
        tries += 1
        cfg = {k: rng.choice(v) for k, v in space.params.items()}
        if space.is_valid(cfg) and cfg not in out:
            out.append(cfg)
    return out


@pytest.mark.parametrize("name", ["ew", "rowsum", "colmax", "conv"])
def test_random_loop_schedules(name):
    op = _ops()[name]
    space = schedule_space(op)
    for cfg in _random_valid(space, random.Random(zlib.crc32(name.encode())), 5):
        check(op, space.to_schedule(cfg), atol=1e-4)


def test_random_gemm_schedules():
    op = matmul(29, 37, 41)
    space = schedule_space(op)
    assert isinstance(space, GemmSpace)
    for cfg in _random_valid(space, random.Random(7), 8):
        check(op, cfg, atol=1e-4)  # a parameter dict is accepted as a schedule too


def test_hand_written_schedule_blocked_reduction():
    # reduction split outside the accumulator: the write-back adds to earlier k blocks
    op = matmul(10, 12, 50)
    s = Schedule(splits=(Split("k", (16,)), Split("j", (4,))),
                 order=("k.0", "i", "j.0", "k.1", "j.1"), vectorize="j.1",
                 cache_write="k.1")
    check(op, s, atol=1e-4)


def test_invalid_schedules_are_refused():
    op = matmul(8, 8, 8)
    with pytest.raises(ScheduleError):
        lower(op, Schedule(order=("k", "i")))
    with pytest.raises(ScheduleError):
        lower(op, Schedule(vectorize="i"))
    with pytest.raises(ScheduleError):
        lower(op, Schedule(parallel=("k",), order=("k", "i", "j")))
    with pytest.raises(ScheduleError):
        lower(op, Schedule(splits=(Split("i", (4, 3)),)))


def test_default_gemm_schedule_shape():
    s = default_schedule(matmul(256, 256, 256))
    assert s.pack and s.pack[0].operand == 1  # B in vector panels
    assert s.vectorize is not None and s.parallel
    loops = lower(matmul(256, 256, 256))
    assert loops.workspace_bytes >= 256 * 256 * 4


def test_reduction_identity_and_padding():
    # ragged vectorized reduction: padded lanes must not contribute
    x = tensor("x", (3, 13))
    for red in ("sum", "prod", "max", "min"):
        op = compute({"i": 3}, ld(x, "i", "k") * Const(0.5) + Const(1.0), reduce=red,
                     raxes={"k": 13})
        s = Schedule(splits=(Split("k", (8,)),), order=("i", "k.0", "k.1"), vectorize="k.1")
        check(op, s, inputs=[np.linspace(0.1, 2, 39, dtype=np.float32).reshape(3, 13)])
