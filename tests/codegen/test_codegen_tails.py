"""Tail strategies (`Split.tail`, nfc.codegen.lowering.tails): what the loops of a ragged axis
do about its last, partial block. Every strategy is checked against the interpreter, and the
loop IR shows the strategy (a `min` extent, guards, a peeled block)."""

from __future__ import annotations

import random

import pytest
from codegen_lib import check, compute, ld, matmul, tensor

from nfc.codegen.loops import For, If, LoopKind, print_loops
from nfc.codegen.lower import ScheduleError, lower
from nfc.codegen.schedule import Pack, Schedule, Split, schedule_from_dict
from nfc.ir import Binary, Call, Const, Index


def _ew(n: int = 3, m: int = 20):
    x = tensor("x", (n, m))
    return compute({"n": n, "j": m}, Call("exp", (ld(x, "n", "j"),)) + 1.0)


def _rowsum(k: int = 21):
    x = tensor("x", (3, k))
    return compute({"n": 3}, ld(x, "n", "k"), reduce="sum", raxes={"k": k})


def _unpool():
    dy, dz = tensor("dy", (2, 9)), tensor("dz", (2, 10))
    w = Index("w")
    body = (ld(dy, "n", Binary("//", w, Const(2)))
            + ld(dz, "n", Binary("//", Binary("+", w, Const(1)), Const(2))))
    return compute({"n": 2, "w": 18}, body)


def _cases(tail: str):
    """(op, schedule) pairs with ragged axes, every split asking for `tail`."""
    yield _ew(), Schedule(splits=(Split("j", (8,), tail),), order=("n", "j.0", "j.1"),
                          vectorize="j.1")
    yield _ew(3, 22), Schedule(splits=(Split("j", (8, 4), tail),),
                               order=("n", "j.0", "j.1", "j.2"), vectorize="j.2")
    yield _ew(5, 19), Schedule(splits=(Split("j", (6, 3), tail), Split("n", (2,), tail)),
                               order=("n.0", "j.0", "n.1", "j.1", "j.2"), unroll=("n.1",))
    yield _rowsum(), Schedule(splits=(Split("k", (8, 4), tail),),
                              order=("n", "k.0", "k.1", "k.2"), unroll=("k.2",))
    yield _rowsum(19), Schedule(splits=(Split("k", (8,), tail),), order=("n", "k.0", "k.1"),
                                vectorize="k.1")
    yield matmul(10, 20, 13), Schedule(
        splits=(Split("i", (4,), tail), Split("j", (8,), tail), Split("k", (8, 4), tail)),
        order=("i.0", "j.0", "k.0", "k.1", "k.2", "i.1", "j.1"), vectorize="j.1",
        unroll=("i.1",), cache_write="k.1", pack=(Pack(1, 1, 8),))
    yield _unpool(), Schedule(splits=(Split("w", (8, 2), tail),),
                              order=("n", "w.0", "w.2", "w.1"), vectorize="w.1")


@pytest.mark.parametrize("tail", ["auto", "shrink", "guard"])
def test_every_tail_strategy_computes_what_the_interpreter_does(tail):
    for op, sched in _cases(tail):
        check(op, sched, atol=1e-5)


def test_peel_matches_the_interpreter_where_it_applies():
    op = _ew()
    sched = Schedule(splits=(Split("j", (8,), "peel"),), order=("n", "j.0", "j.1"),
                     vectorize="j.1")
    check(op, sched)
    check(_unpool(), Schedule(splits=(Split("w", (8, 2), "peel"),),
                              order=("n", "w.0", "w.2", "w.1"), vectorize="w.1"))


def _ifs(f) -> int:
    return sum(isinstance(s, If) for s in f.body.walk())


def test_the_strategies_show_in_the_loop_ir():
    ew = _ew()
    vec = {"order": ("n", "j.0", "j.1"), "vectorize": "j.1"}
    auto = lower(ew, Schedule(splits=(Split("j", (8,)),), **vec))
    peel = lower(ew, Schedule(splits=(Split("j", (8,), "peel"),), **vec))
    shrink = lower(ew, Schedule(splits=(Split("j", (8,), "shrink"),), **vec))
    assert print_loops(auto) == print_loops(peel)
    j0 = [s for s in auto.body.walk() if isinstance(s, For) and s.var == "j.0"]
    assert [s.const_extent for s in j0] == [2, 1]  # full blocks, then the peeled one
    assert len([s for s in shrink.body.walk() if isinstance(s, For) and s.var == "j.0"]) == 1
    assert _ifs(shrink) == 1 and "clamp" in print_loops(shrink)

    serial = {"order": ("n", "j.0", "j.1", "j.2"), "vectorize": "j.2"}
    op = _ew(3, 22)
    auto = lower(op, Schedule(splits=(Split("j", (8, 4)),), **serial))
    guard = lower(op, Schedule(splits=(Split("j", (8, 4), "guard"),), **serial))
    assert "min(" in print_loops(auto)
    assert "min(" not in print_loops(guard)
    assert all(s.const_extent is not None for s in guard.body.walk() if isinstance(s, For))
    assert _ifs(guard) == 1


def test_a_divided_axis_has_no_tail():
    op = _ew(3, 16)
    for tail in ("auto", "shrink", "guard"):
        f = lower(op, Schedule(splits=(Split("j", (8, 4), tail),),
                               order=("n", "j.0", "j.1", "j.2"), vectorize="j.2"))
        text = print_loops(f)
        assert "min(" not in text and "clamp" not in text and _ifs(f) == 0


def test_tail_requests_that_cannot_be_met_are_refused():
    vec = {"order": ("n", "j.0", "j.1"), "vectorize": "j.1"}
    with pytest.raises(ScheduleError, match="unknown tail 'round_up'"):
        lower(_ew(), Schedule(splits=(Split("j", (8,), "round_up"),), **vec))
    with pytest.raises(ScheduleError, match="cannot be peeled"):
        lower(_ew(3, 16), Schedule(splits=(Split("j", (8,), "peel"),), **vec))
    with pytest.raises(ScheduleError, match="cannot be peeled"):  # a reduction
        lower(_rowsum(), Schedule(splits=(Split("k", (8,), "peel"),),
                                  order=("n", "k.0", "k.1"), vectorize="k.1"))
    with pytest.raises(ScheduleError, match="cannot be peeled"):  # not vectorized
        lower(_ew(), Schedule(splits=(Split("j", (8,), "peel"),), order=("n", "j.0", "j.1")))


def test_tail_is_schedule_data():
    s = Schedule(splits=(Split("j", (8,), "guard"), Split("n", (2,))), order=("n.0", "n.1", "j.0",
                 "j.1"), vectorize="j.1")
    d = s.to_dict()
    assert d["splits"] == [{"axis": "j", "sizes": [8], "tail": "guard"},
                           {"axis": "n", "sizes": [2]}]  # `auto` is left out: old keys hold
    assert schedule_from_dict(d) == s


@pytest.mark.parametrize("seed", range(4))
def test_random_splits_and_tails(seed):
    rng = random.Random(seed)
    for _ in range(4):
        m = rng.randint(5, 40)
        inner = rng.choice([1, 2, 4])
        outer = inner * rng.randint(1, 4)
        sizes = (outer, inner) if inner > 1 and outer > inner else (outer,)
        loops = [f"j.{n}" for n in range(len(sizes) + 1)]
        kind = rng.choice(["vectorize", "unroll", "serial"])
        extra = {"vectorize": loops[-1]} if kind == "vectorize" else (
            {"unroll": (loops[-1],)} if kind == "unroll" else {})
        tail = rng.choice(["auto", "shrink", "guard"])
        op = _ew(3, m) if rng.random() < 0.5 else _rowsum_j(m)
        check(op, Schedule(splits=(Split("j", sizes, tail),), order=("n", *loops), **extra),
              atol=1e-5)


def _rowsum_j(k: int):
    x = tensor("x", (3, k))
    return compute({"n": 3}, ld(x, "n", "j"), reduce="sum", raxes={"j": k})


def test_vectorized_loop_kinds_are_kept():
    # guard keeps the vectorized loop whole: one masked vector per block
    f = lower(_ew(3, 22), Schedule(splits=(Split("j", (8,), "guard"),),
                                   order=("n", "j.0", "j.1"), vectorize="j.1"))
    kinds = {s.var: s.kind for s in f.body.walk() if isinstance(s, For)}
    assert kinds["j.1"] is LoopKind.VECTORIZED
