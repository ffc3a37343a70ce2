"""Memory accounting and the arena planner (docs/memory.md): the report of a training step adds
up and agrees with the plan, the lower bound is the busiest moment, and the planner never lets
two live buffers overlap nor does worse than greedy by size alone."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from nfc.ir import ReturnOp
from nfc.passes.memplan import (
    LATE_PHASES,
    LiveBuffer,
    check_plan,
    function_buffers,
    function_plan,
    lower_bound,
    memory_report,
    plan_offsets,
    round_up,
)

ROOT = Path(__file__).resolve().parents[2]
MLP = ROOT / "examples" / "mlp_digits.nf"

lifetimes = st.lists(st.tuples(st.integers(1, 20000), st.integers(0, 40), st.integers(0, 15)),
                     max_size=60)


@settings(max_examples=300, deadline=None)
@given(lifetimes)
def test_random_lifetimes_never_overlap_and_never_beat_the_bound(raw):
    bufs = [LiveBuffer(n, size, start, start + length)
            for n, (size, start, length) in enumerate(raw)]
    plan = plan_offsets(bufs)
    check_plan(bufs, plan)  # any two buffers live at the same time do not share a byte
    for i, a in enumerate(bufs):  # the same, spelled out
        for b in bufs[i + 1:]:
            if a.overlaps(b):
                lo_a, lo_b = plan.offsets[a.key], plan.offsets[b.key]
                assert lo_a + a.size <= lo_b or lo_b + b.size <= lo_a
    busiest = max([sum(round_up(b.size) for b in bufs if b.start <= t <= b.end)
                   for t in range(60)] + [0])
    assert lower_bound(bufs) == busiest
    assert busiest <= plan.peak <= plan.naive
    assert plan.peak <= plan_offsets(bufs, strategies=["size"]).peak


def test_lower_bound_and_a_case_greedy_by_size_loses():
    # greedy by size puts d (192 B, ops 2-4) at 256 beside a, then b and c stack above it;
    # placing in program order packs b and c where a was: the lower bound, 512 B
    bufs = [LiveBuffer("a", 256, 1, 2), LiveBuffer("b", 192, 3, 4), LiveBuffer("c", 128, 3, 3),
            LiveBuffer("d", 192, 2, 4)]
    assert lower_bound(bufs) == 512
    old = plan_offsets(bufs, strategies=["size"])
    new = plan_offsets(bufs)
    check_plan(bufs, old)
    check_plan(bufs, new)
    assert old.peak == 576 and new.peak == 512
    assert lower_bound([]) == 0 and plan_offsets([]).peak == 0


def _train_step():
    from nfc.frontend import compile_source
    from nfc.passmanager import Context, build_pipeline

    module = compile_source(MLP.read_text(), str(MLP))
    for p in build_pipeline("autodiff"):
        p.apply(Context(), module)
    return module.func("train_step")


def test_report_adds_up_and_matches_the_plan():
    f = _train_step()
    rep = memory_report(f)
    roles = [str(a.get("nf.role", "input")) for a in f.arg_attrs]
    params = sum(a.type.nbytes for a, r in zip(f.args, roles, strict=True) if r == "param")
    # 64x128 + 128 + 128x64 + 64 + 64x10 + 10 floats
    assert params == rep.params == 4 * (64 * 128 + 128 + 128 * 64 + 64 + 64 * 10 + 10)
    assert rep.opt_state == params  # sgd with momentum: one velocity per parameter
    assert rep.inputs == 64 * 64 * 4 + 64 * 4
    assert rep.arena == function_plan(f).peak
    assert rep.lower_bound == lower_bound(function_buffers(f)) <= rep.arena <= rep.naive
    assert rep.total == (rep.params + rep.opt_state + rep.state + rep.inputs + rep.outputs
                         + rep.arena)
    # saved activations: forward values read by backward or update ops, by call site
    late = {id(v) for op in f.body.ops if op.attrs.get("nf.phase") in LATE_PHASES
            for v in op.operands}
    fwd = [r for op in f.body.ops if not isinstance(op, ReturnOp)
           and op.attrs.get("nf.phase") not in LATE_PHASES for r in op.results]
    assert rep.saved_total == sum(r.type.nbytes for r in fwd if id(r) in late) > 0
    assert all(site.startswith(str(MLP)) or "mlp_digits.nf" in site for site in rep.saved)
    # the two hidden layers' relu outputs (64x128, 64x64 floats) are saved at their sites
    relu1 = [s for s in rep.saved if s.endswith(":13:8")]
    assert relu1 and rep.saved[relu1[0]] >= 64 * 128 * 4
    text = "\n".join(rep.lines())
    assert f"{rep.arena:,} B" in text and f"{rep.params:,} B" in text


def test_stats_memory_cli():
    out = subprocess.run([sys.executable, "-m", "nfc", "stats", str(MLP), "--pass", "autodiff",
                          "--memory"], capture_output=True, text=True, cwd=ROOT, check=True)
    rep = memory_report(_train_step())
    assert "@train_step memory" in out.stdout
    assert f"{rep.arena:,} B" in out.stdout and f"{rep.saved_total:,} B" in out.stdout
    assert "lower bound" in out.stdout and "saved activations" in out.stdout
