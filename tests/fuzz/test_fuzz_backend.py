"""Differential fuzzing of the CPU backend against the interpreter (backend_fuzz.py): a fixed
seed and a few dozen cases here; `python scripts/fuzz_backend.py --cases N --seed S` runs
long campaigns. Also checks that the harness sees what it should: a miscompiled intrinsic is
a wrong result, an aborting worker a crash, a stuck one a hang."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
from backend_fuzz import Campaign, check_source
from fuzz_programs import ProgramGen, make_program

pytest.importorskip("nfc.runtime.build", reason="the CPU backend is not available")

SEED = 20261124
CASES = 20   # under a minute on two cores; each case builds a model and a few kernels


def test_fuzz_backend_campaign() -> None:
    campaign = Campaign(seed=SEED, cases=CASES, jobs=2, timeout=300).run()
    reports = "\n\n".join(campaign.reproducer(i, o) for i, o in campaign.failures)
    assert not campaign.failures, f"{campaign.summary()}\n\n{reports}"
    # the generator must mostly produce programs the frontend accepts, or nothing is tested
    assert campaign.counts["ok"] >= CASES // 2, campaign.summary()
    assert campaign.checked > 1000, campaign.checked


def test_generated_programs_are_deterministic_and_mostly_valid() -> None:
    from nfc.diagnostics import CompileError
    from nfc.frontend import compile_source

    assert make_program(3, 7) == make_program(3, 7)
    ok = 0
    for i in range(40):
        text = ProgramGen(random.Random(i)).program()
        try:
            compile_source(text, "fuzz.nf", training=True)
            ok += 1
        except CompileError:
            pass
    assert ok >= 36


TANH_PROGRAM = """
import std.nn
model m() {
  input x: f32[4, 6]
  param w: f32[6, 3] = normal(0.0, 1.0)
  h[i in 0..4, j in 0..3] = tanh(sum(k in 0..6) x[i, k] * w[k, j])
  loss = (sum(i in 0..4, j in 0..3) h[i, j] * h[i, j]) / 12.0
  output h
  minimize loss with sgd(lr = 0.1)
}
"""


@pytest.fixture(autouse=True)
def _no_object_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process builds compile every kernel (a cached object would hide a patched
    emitter) and leave the user's cache alone."""
    monkeypatch.setenv("NFC_OBJECT_CACHE", "0")


def test_a_correct_program_passes() -> None:
    outcome = check_source(TANH_PROGRAM, schedules=3)
    assert outcome.status == "ok", outcome.detail
    assert outcome.unchecked == 0 and outcome.checked > 30


def test_a_slightly_wrong_intrinsic_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """tanh off by 1e-5 relative (about 170 float32 ulp) is outside the error bound."""
    from nfc.codegen.llvm import intrinsics

    real = intrinsics.tanh_f32

    def tanh_off(b, x):  # type: ignore[no-untyped-def]
        r = real(b, x)
        return b.fmul(r, intrinsics.const(r.type, 1.0 + 1e-5))

    monkeypatch.setattr(intrinsics, "tanh_f32", tanh_off)
    outcome = check_source(TANH_PROGRAM, schedules=0)
    assert outcome.status == "wrong", outcome
    assert "outside the bound" in outcome.detail


def test_crashes_and_hangs_are_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NFC_FUZZ_SELFTEST", "ok:0,crash:1,hang:2,ok:3")
    # the timeout counts from the moment the case is sent to a ready worker, and cases 0 and
    # 3 answer at once: 5 s is no race
    campaign = Campaign(seed=SEED, cases=4, jobs=1, timeout=5, schedules=0).run()
    assert campaign.counts["crash"] == 1 and campaign.counts["hang"] == 1, campaign.summary()
    assert sorted(i for i, _ in campaign.failures) == [1, 2]
    assert "rerun: python scripts/fuzz_backend.py --seed" in campaign.reproducer(
        *campaign.failures[0])


def test_bound_is_tight_enough_to_see_small_errors() -> None:
    """The float32 bound of a 64-term dot product is far below 1e-3 relative."""
    from nfc.frontend import compile_source
    from nfc.interp import run
    from nfc.testing import bound_violations, run_bounded

    module = compile_source(TANH_PROGRAM.replace("[4, 6]", "[4, 64]").replace(
        "[6, 3]", "[64, 3]").replace("0..6", "0..64"), "m.nf", training=False)
    func = module.func("forward")
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(a.shape).astype(np.float32) for a in func.args]
    (loss, lv), (h, e) = run_bounded(func, args)
    got = run(func, args)[1]
    assert not bound_violations(got, h, e)[0].any()
    assert bound_violations(got * np.float32(1 + 1e-3), h, e)[0].any()


#: Reproducers of backend bugs the fuzzer found, reduced by hand; each must now pass.
REGRESSIONS = {
    # codegen/llvm/exprs.py: a gather index (a load of an i32 tensor) under a Clamp (the
    # padded tail of a tile) was emitted as i32 and multiplied with an i64 stride:
    # "ValueError: Operands must be the same type, got (i32, i64)"
    "gather_index_in_clamp": """
model fuzz() {
  input ids4: i32[2]
  param w12: f32[8, 2] = normal(0.0, 1.0)
  t10[i0 in 0..1, i1 in 0..14] = sum(k11 in 0..3) (w12[ids4[i1 % 2], k11 % 2])
  loss = (sum(j0 in 0..1, j1 in 0..14) t10[j0, j1]) * 0.00358
  minimize loss with sgd(lr = 0.01)
}
""",
    # codegen/llvm/exprs.py: in a vectorized loop, the lane-by-lane address of a gather whose
    # offset holds a guarded (select) gather index came out as a vector: "assert lhs.type ==
    # rhs.type" in llvmlite (case 5568 of seed 1)
    "gather_offset_in_vector_loop": """
model fuzz() {
  input ids2: i32[4]
  param w5: f32[3, 3] = normal(0.0, 1.0)
  t4[i0 in 0..8, i1 in 0..18] = (w5[ids2[i0 // 2], (i1 + 1) % 3] * w5[(i0 + 1) % 3, i0 // 3])
  t6[i0 in 0..1, i1 in 0..6, i2 in 0..1, i3 in 0..8] = (t4[5 - i1, 5 - i1] * t4[i2, i2])
  loss = (sum(a, b, c, d) t6[a, b, c, d] * t6[a, b, c, d]) * 3.33e-05
  minimize loss with sgd(lr = 0.1)
}
""",
}


@pytest.mark.parametrize("name", sorted(REGRESSIONS))
def test_fuzzer_regressions(name: str) -> None:
    outcome = check_source(REGRESSIONS[name], schedules=3)
    assert outcome.status == "ok", outcome.detail


#: Whole reproducers (tests/fuzz/regressions/*.nf), each must now pass.
#: flat_index_outer_modulo: case 8864 of `scripts/fuzz_backend.py --seed 20261125` (the
#: 10,000-case run of 2026-11-25): codegen/lowering/stage.py `flat_index` stripped a `%` from
#: the outermost index, so `w3[(i1 + 2) % 2, i0 // 2]` of a [2, 1] tensor was read as flat
#: element i1 + 2 (out of bounds for i1 >= 2): half of t13 wrong in the native forward step.
#: flat_index_modulo_after_unit_dims: case 258 of seed 20261126, the same bug where the
#: outermost read dimension follows dimensions of extent 1 (`tmp[0, (i0 + 3) % 4]` of a
#: [1, 4] tensor read as flat element i0 + 3: uninitialised memory, a different loss per run).
REGRESSION_FILES = sorted((Path(__file__).parent / "regressions").glob("*.nf"))


@pytest.mark.parametrize("path", REGRESSION_FILES, ids=lambda p: p.stem)
def test_fuzzer_regression_files(path: Path) -> None:
    outcome = check_source(path.read_text(encoding="utf-8"), schedules=2)
    assert outcome.status == "ok", outcome.detail


def test_flat_index_keeps_the_outer_modulo() -> None:
    from nfc.codegen.lowering.stage import flat_index
    from nfc.ir import Binary, Const, Index

    i, k = Index("i"), Index("k")
    outer_mod = Binary("%", Binary("+", i, Const(2)), Const(2))
    # w[(i + 2) % 2, 0] of a [2, 1] tensor is flat element (i + 2) % 2, not i + 2
    assert flat_index((outer_mod, Const(0)), (2, 1)) == outer_mod
    # the same when the outermost read dimension comes after dimensions of extent 1
    inner_mod = Binary("%", Binary("+", i, Const(3)), Const(4))
    assert flat_index((Const(0), inner_mod), (1, 4)) == inner_mod
    # a flattening reshape inlined: x[k // 10, k % 10] of a [6, 10] tensor is element k
    assert flat_index((Binary("//", k, Const(10)), Binary("%", k, Const(10))), (6, 10)) == k
    # an inner index without its modulo is not a delinearisation
    assert flat_index((Binary("//", k, Const(10)), k), (6, 10)) is None
