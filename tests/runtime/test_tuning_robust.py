"""The tuning cache against bad input: damaged files, forged or broken exports, invalid
schedules in IR, and speedups from disturbed measurements."""

from __future__ import annotations

import io
import json
import math
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nfc.cli import cache_cmd
from nfc.cli import main as nfc_main
from nfc.codegen.schedule import SCHEDULE_VERSION
from nfc.codegen.space import (
    GemmSpace,
    LoopSpace,
    match_gemm,
    schedule_problem,
    schedule_space,
    template_problem,
)
from nfc.ir import ComputeOp
from nfc.irparser import parse_module
from nfc.runtime.tuning import synthetic
from nfc.runtime.tuning.cache import TuningCache
from nfc.runtime.tuning.category import default_category
from nfc.runtime.tuning.driver import Confirmation, confirm_best
from nfc.runtime.tuning.exchange import MAX_DEPTH, write_jsonl
from nfc.runtime.tuning.kernels import (
    apply_cached_schedules,
    canonical_compute,
    kernel_key,
    time_floor,
)
from nfc.runtime.tuning.measure import MeasureOptions, Measurer, Task
from nfc.runtime.tuning.model import MIN_TIME, CacheDamaged, CacheError, Measurement, Status
from nfc.runtime.tuning.report import IMPLAUSIBLE_SPEEDUP, KernelReport, TuneReport

GEMM_IR = """\
nf.module @m {
  nf.func @f(%a: tensor<64x32xf32>, %b: tensor<32x48xf32>) -> (tensor<64x48xf32>) {
    %c = nf.compute [i: 64, j: 48] sum [k: 32] (%a[i, k] * %b[k, j]) SCHED: tensor<64x48xf32>
    nf.return %c : tensor<64x48xf32>
  }
}
"""
FUSABLE_IR = """\
nf.module @m {
  nf.func @f(%a: tensor<64x32xf32>, %b: tensor<32x48xf32>) -> (tensor<64x48xf32>) {
    %c = nf.compute [i: 64, j: 48] sum [k: 32] (%a[i, k] * %b[k, j]) SCHED: tensor<64x48xf32> \
loc("model.nf":7:3)
    %d = nf.compute [i: 64, j: 48] (max(%c[i, j], 0.0)) : tensor<64x48xf32> loc("model.nf":8:3)
    nf.return %d : tensor<64x48xf32>
  }
}
"""
ROW_SUM_IR = """\
nf.module @m {
  nf.func @f(%a: tensor<64x32xf32>) -> (tensor<64xf32>) {
    %c = nf.compute [i: 64] sum [k: 32] (%a[i, k]) : tensor<64xf32>
    nf.return %c : tensor<64xf32>
  }
}
"""


def _op(text: str) -> ComputeOp:
    op = parse_module(text).funcs[0].body.ops[0]
    assert isinstance(op, ComputeOp)
    return op


def _gemm() -> ComputeOp:
    return canonical_compute(_op(GEMM_IR.replace("SCHED", "")))


def _nudge(cfg: dict[str, Any], space: GemmSpace) -> dict[str, Any]:
    """A valid schedule other than `cfg`."""
    for kc in space.params["kc"]:
        other = {**cfg, "kc": kc}
        if other != cfg and space.is_valid(other):
            return other
    raise AssertionError("no other schedule")


# ---------------------------------------------------------------------------------------------
# schedule checks (codegen/space.py)


def test_template_problem_accepts_what_the_spaces_produce() -> None:
    for op in (_gemm(), canonical_compute(_op(ROW_SUM_IR))):
        space = schedule_space(op)
        assert template_problem(space.default()) == ""
        assert schedule_problem(op, space.default()) == ""


@pytest.mark.parametrize("cfg, message", [
    ({"mr": 99, "nv": 2, "mc_tiles": 3, "kc": 32, "ku": 4, "pack_a": 0, "parallel": 1},
     "'mr' = 99 is not one of"),
    ({"mr": 12}, "missing"),
    ({"mr": 14, "nv": 4, "mc_tiles": 3, "kc": 32, "ku": 4, "pack_a": 0, "parallel": 1},
     "vector registers"),
    ({"mr": 6, "nv": 2, "mc_tiles": 3, "kc": 48, "ku": 32, "pack_a": 0, "parallel": 1},
     "'ku' = 32"),
    ({"vec_axis": "q", "vec": 8, "nvec": 1, "vec_split": 1, "tile_axis": "", "tile": 1,
      "kunroll": 1, "parallel": 0}, "not an axis"),
    ({"vec_axis": "d0", "vec": 8, "nvec": 1, "vec_split": 1, "tile_axis": "d0", "tile": 2,
      "kunroll": 1, "parallel": 0}, "same axis"),
    ({"vec_axis": "d0", "vec": 8.0, "nvec": 1, "vec_split": 1, "tile_axis": "", "tile": 1,
      "kunroll": 1, "parallel": 0}, "'vec' = 8.0"),
])
def test_template_problem_names_what_is_wrong(cfg: dict[str, Any], message: str) -> None:
    assert message in template_problem(cfg)


def test_schedule_problem_checks_the_op_itself() -> None:
    op = _op(ROW_SUM_IR)
    space = schedule_space(op)
    assert isinstance(space, LoopSpace)
    good = space.default()
    assert schedule_problem(op, good) == ""
    assert "not one of" in schedule_problem(op, {**good, "vec_axis": "nope"})
    assert "dictionary" in schedule_problem(op, 7)
    assert "version" in schedule_problem(op, {"kind": "compute", "version": "old"})
    assert "unknown axes" in schedule_problem(op, {
        "kind": "compute", "version": SCHEDULE_VERSION,
        "splits": [{"axis": "zz", "sizes": [4]}]})


@pytest.mark.parametrize("sched, message", [
    ("{mr = 99, nv = 2, mc_tiles = 3, kc = 32, ku = 4, pack_a = 0, parallel = 1}",
     "'mr' = 99 is not one of"),
    ("{mr = 12}", "parameters missing"),
    ('{kind = "compute", version = "' + SCHEDULE_VERSION
     + '", splits = [{axis = "zz", sizes = [4]}]}',
     "unknown axes"),
    ("7", "dictionary"),
])
@pytest.mark.parametrize("argv", [["opt"], ["compile", "--emit=loops"],
                                  ["compile", "--no-fuse", "--emit=loops"]])
def test_a_bad_schedule_in_ir_is_a_located_error(tmp_path: Path, capsys, sched: str,
                                                 message: str, argv: list[str]) -> None:
    # with fusion, the scheduled matmul and the relu after it become one nf.kernel
    text = FUSABLE_IR.replace("SCHED", f"{{nf.schedule = {sched}}} ")
    path = tmp_path / "bad.nfir"
    path.write_text(text)
    code = nfc_main([*argv, str(path), "-o", str(tmp_path / "out")] if argv[0] == "compile"
                    else [*argv, str(path)])
    err = capsys.readouterr().err
    assert code == 1 and "internal error" not in err
    assert "model.nf:7:3: error: invalid 'nf.schedule' of %c" in err and message in err


# ---------------------------------------------------------------------------------------------
# imports: nesting, times, schedules


def _export(records: list[dict[str, Any]]) -> str:
    head = json.dumps({"format": "nfc-tuning-cache", "version": 1})
    return "\n".join([head, *(json.dumps(r) for r in records)]) + "\n"


def _record(cat: dict[str, Any], key: str, schedule: Any, time: Any, **kw: Any
            ) -> dict[str, Any]:
    return {"category": cat, "key": key, "schedule": schedule, "status": "ok", "time": time,
            "spread": 0.0, "workspace": 0, "reproducible": True, "naive": False,
            "timestamp": 1e9, **kw}


def test_deeply_nested_json_is_a_clear_error(tmp_path: Path, capsys) -> None:
    deep = tmp_path / "deep.jsonl"
    deep.write_text(_export([]) + "[" * 100_000 + "]" * 100_000 + "\n")
    nested = tmp_path / "nested.jsonl"
    schedule: Any = 1
    for _ in range(MAX_DEPTH + 2):
        schedule = {"x": schedule}
    nested.write_text(_export([_record(default_category(), "k", schedule, 1e-3)]))
    db = tmp_path / "t.sqlite"
    for path, message in ((deep, "nested too deeply"), (nested, f"more than {MAX_DEPTH}")):
        with pytest.raises(CacheError, match=message):
            TuningCache(db).import_jsonl(io.StringIO(path.read_text()))
        code = cache_cmd.main(["--db", str(db), "import", str(path)])
        err = capsys.readouterr().err
        assert code == 1 and message in err and "Traceback" not in err
    code = cache_cmd.main(["--db", str(db), "import", str(nested), "--category",
                           "[" * 100_000 + "]" * 100_000])
    assert code == 1 and "nested too deeply" in capsys.readouterr().err


def test_import_rejects_implausible_records_and_keeps_the_good_ones(tmp_path: Path,
                                                                   capsys) -> None:
    cat = default_category()
    op = _gemm()
    space = schedule_space(op)
    key = kernel_key(op)
    good = _nudge(space.default(), space)
    bad_schedule = {**good, "mr": 99}
    path = tmp_path / "in.jsonl"
    path.write_text(_export([
        _record(cat, key, space.default(), 2e-3, naive=True),
        _record(cat, key, good, 1e-3),
        _record(cat, key, bad_schedule, 1e-4),                 # not a gemm schedule
        _record(cat, key, {**good, "kc": 16, "ku": 1}, 1e-12),  # faster than physics
        _record(cat, key, {**good, "kc": 32, "ku": 1}, -1.0),
        _record(cat, key, {**good, "kc": 64, "ku": 1}, math.nan),
        _record(cat, key, {**good, "kc": 80, "ku": 1}, 1e-3, spread=-1.0),
    ]))
    db = tmp_path / "t.sqlite"
    code = cache_cmd.main(["--db", str(db), "import", str(path)])
    out, err = capsys.readouterr()
    assert code == 0 and "imported 2 new" in out and "5 rejected" in out
    assert "in.jsonl:4: invalid schedule: as a gemm schedule: 'mr' = 99" in err
    assert "in.jsonl:5: time 1e-12 s is below the 1e-09 s floor" in err
    assert "in.jsonl:7: time nan" in err and "in.jsonl:8: spread -1.0" in err
    with TuningCache(db) as cache:
        best = cache.best(cat, key)
        assert best is not None and best.schedule == good  # not pruned by a forged record
        assert cache.verify() == []
    # records this nfc cannot judge (another schedule space; not a kernel, such as the
    # device benchmarks of nfc.runtime.device_params) keep only the numeric checks
    foreign = {**cat, "schedule_space": "some-other-version"}
    with TuningCache(tmp_path / "f.sqlite") as cache:
        stats = cache.import_jsonl(io.StringIO(_export([
            _record(foreign, key, {"anything": "goes"}, 1e-3),
            _record(cat, "nfc-devbench-1:stream", {"bytes": 1 << 30, "flops": 0}, 0.1),
            _record(foreign, key, {"tile": 2}, 1e-13)])))
        assert cache.verify() == []
    assert stats.added == 2 and len(stats.rejected) == 1 and "floor" in stats.rejected[0]


def test_merge_rejects_implausible_records(tmp_path: Path) -> None:
    cat = default_category()
    op = _gemm()
    space = schedule_space(op)
    with TuningCache(tmp_path / "other.sqlite") as other:  # an old cache, written unchecked
        other.put(cat, kernel_key(op), space.default(), 1e-3, naive=True)
        other.put(cat, kernel_key(op), {**space.default(), "mr": 99}, 1e-4)
        other.put(cat, kernel_key(op), _nudge(space.default(), space), 1e-12)
    with TuningCache(tmp_path / "t.sqlite") as cache:
        stats = cache.merge(tmp_path / "other.sqlite")
        assert stats.added == 1 and len(stats.rejected) == 2
        assert any("'mr' = 99" in r for r in stats.rejected)
        assert any("floor" in r for r in stats.rejected)
        assert cache.best(cat, kernel_key(op)).schedule == space.default()


def test_compile_skips_records_it_cannot_use(tmp_path: Path) -> None:
    # a cache written before imports were checked: an invalid schedule with an impossible
    # time pruned the good records; compiling still finds the best usable one
    cat = default_category()
    module = parse_module(GEMM_IR.replace("SCHED", ""))
    op = module.funcs[0].body.ops[0]
    assert isinstance(op, ComputeOp) and match_gemm(op) is not None
    space = schedule_space(canonical_compute(op))
    good = _nudge(space.default(), space)
    key = kernel_key(op)
    assert time_floor(op) >= MIN_TIME
    with TuningCache(tmp_path / "t.sqlite") as cache:
        cache.put(cat, key, space.default(), 2e-3, naive=True)
        cache.put(cat, key, good, 1e-3)
        cache.put(cat, key, {**good, "mr": 99}, 1e-4)
        cache.put(cat, key, {**good, "kc": 16, "ku": 1}, time_floor(op) / 2)
        assert cache.entries(cat, key) != [] and all(
            e.schedule != good for e in cache.entries(cat, key))  # pushed off the front
        use = apply_cached_schedules(module, cache, cat)
    assert use.found == 1 and op.attrs["nf.schedule"] == {
        k: {"d0": "i", "d1": "j", "r0": "k"}.get(v, v) if isinstance(v, str) else v
        for k, v in good.items()}


# ---------------------------------------------------------------------------------------------
# damaged files


def _cache_file(tmp_path: Path) -> tuple[Path, dict[str, Any], str]:
    cat = default_category()
    op = _gemm()
    space = schedule_space(op)
    path = tmp_path / "t.sqlite"
    with TuningCache(path) as cache:
        cache.put(cat, kernel_key(op), space.default(), 2e-3, naive=True)
        cache.put(cat, kernel_key(op), _nudge(space.default(), space), 1e-3)
        for n in range(300):  # a few pages of other kernels
            cache.put(cat, f"nfk1-{n:032x}", space.default(), 1e-3 + n * 1e-6, naive=True)
    return path, cat, kernel_key(op)


def _flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as fp:
        fp.seek(offset)
        byte = fp.read(1)
        fp.seek(offset)
        fp.write(bytes([byte[0] ^ 0xFF]))


def test_a_damaged_cache_is_detected_on_opening_and_repaired(tmp_path: Path, capsys) -> None:
    path, cat, key = _cache_file(tmp_path)
    with TuningCache(path) as cache:
        before = {r.key for r in cache.records()}
    # flip a byte in a b-tree page header of the records table: quick to detect
    with sqlite3.connect(path) as conn:
        root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'records'"
                            ).fetchone()[0]
    _flip(path, (root - 1) * 4096 + 3)
    with pytest.raises(CacheDamaged) as info:
        TuningCache(path)
    text = str(info.value)
    assert str(path) in text and "nfc cache verify" in text and "nfc cache repair" in text
    # compiling warns and falls back to default schedules
    module = parse_module(GEMM_IR.replace("SCHED", ""))
    warnings: list[str] = []
    use = apply_cached_schedules(module, category=cat, db=path, warn=warnings.append)
    assert use.found == 0 and use.problem == "damaged" and "not used" in use.message()
    assert len(warnings) == 1 and str(path) in warnings[0]
    assert "nf.schedule" not in module.funcs[0].body.ops[0].attrs
    # `nfc cache` actions say so and exit 1; verify lists the damage
    for action in (["list"], ["show", key], ["export"], ["prune"]):
        assert cache_cmd.main(["--db", str(path), *action]) == 1
        err = capsys.readouterr().err
        assert "damaged" in err and "Traceback" not in err, action
    assert cache_cmd.main(["--db", str(path), "verify"]) == 1
    out, err = capsys.readouterr()
    assert "problem:" in out and "nfc cache repair" in err
    # repair keeps the damaged file aside and rebuilds what still reads back
    assert cache_cmd.main(["--db", str(path), "repair"]) == 0
    out = capsys.readouterr().out
    assert "rebuilt" in out
    aside = [p for p in tmp_path.glob("t.sqlite.damaged-*")
             if not p.name.endswith(("-wal", "-shm"))]
    assert len(aside) == 1
    with TuningCache(path) as cache:
        assert cache.verify() == []
        after = {r.key for r in cache.records()}
    assert after <= before
    assert cache_cmd.main(["--db", str(path), "repair"]) == 0
    assert "nothing to repair" in capsys.readouterr().out


def test_damage_met_after_opening_is_a_cache_error(tmp_path: Path) -> None:
    path, cat, key = _cache_file(tmp_path)
    with sqlite3.connect(path) as conn:  # garbage a check of the file cannot see
        conn.execute("UPDATE records SET schedule = '{broken' || id WHERE key = ?", (key,))
    with TuningCache(path) as cache, pytest.raises(CacheDamaged, match="does not read back"):
        cache.best(cat, key)
    warnings: list[str] = []
    module = parse_module(GEMM_IR.replace("SCHED", ""))
    use = apply_cached_schedules(module, category=cat, db=path, warn=warnings.append)
    assert use.found == 0 and warnings and "damaged" in warnings[0]


# ---------------------------------------------------------------------------------------------
# speedups


def test_compare_interleaves_schedules_in_one_worker() -> None:
    spec = synthetic.make_spec(48)
    opts = MeasureOptions(repeats=5, min_repeat_time=1e-3, timeout=5)
    with Measurer(Task(synthetic.BUILDER, spec, synthetic.REFERENCE), opts) as measure:
        light, heavy, wrong = measure.compare([{"reps": 1}, {"reps": 8},
                                               {"reps": 1, "fault": "wrong"}])
        crashed = measure.compare([{"reps": 1}, {"reps": 1, "fault": "crash"}])
    assert light.status is heavy.status is Status.OK and heavy.time > light.time
    assert wrong.status is Status.WRONG
    assert all(m.status is Status.FAILED and "SIGSEGV" in m.error for m in crashed)


class _SideBySide:
    """A measure with `compare`: the default takes 2 ms, the other schedule 1 ms."""

    def __init__(self) -> None:
        self.pairs: list[list[dict[str, Any]]] = []

    def __call__(self, cfg: dict[str, Any]) -> Measurement:
        raise AssertionError("the confirmation measures side by side")

    def compare(self, schedules: list[dict[str, Any]]) -> list[Measurement]:
        self.pairs.append(schedules)
        return [Measurement(Status.OK, 2e-3 if s == {"s": 0} else 1e-3) for s in schedules]


def test_confirmation_remeasures_the_default_and_the_report_uses_it(tmp_path: Path) -> None:
    cat = {"backend": "test", "schedule_space": "t"}
    with TuningCache(tmp_path / "t.sqlite") as cache:
        cache.put(cat, "k", {"s": 0}, 4.347, naive=True)  # one disturbed measurement
        cache.put(cat, "k", {"s": 1}, 1e-3)
        measure = _SideBySide()
        conf = confirm_best(cache, cat, "k", {"s": 0}, measure, rounds=3)
        assert measure.pairs == [[{"s": 0}, {"s": 1}]] * 3
        assert conf == Confirmation(0, 2e-3, 1e-3, 3) and conf.confirmed
        assert cache.lookup(cat, "k", {"s": 0}).time == 4.347  # a held winner: no rewrite
    row = KernelReport("k", "gemm", 1, 1.0, "tuned", conf.default_time, conf.best_time,
                       conf.default_time / conf.best_time, 5, 5, confirmed=True)
    assert "2.00x" in TuneReport("m.nf", ("f",), "t.sqlite", "c", "full", "cost", 1.0,
                                 (row,)).table()


def test_an_implausible_speedup_is_flagged_and_left_out_of_the_totals() -> None:
    odd = KernelReport("a", "gemm", 1, 0.5, "tuned", 4.347, 1e-3, 4347.0, 5, 5)
    fine = KernelReport("b", "map", 1, 0.5, "tuned", 2e-3, 1e-3, 2.0, 5, 5, confirmed=True)
    rep = TuneReport("m.nf", ("f",), "t.sqlite", "c", "full", "cost", 1.0, (odd, fine))
    assert odd.implausible and not fine.implausible and IMPLAUSIBLE_SPEEDUP < 4347
    table = rep.table()
    assert "4347x?" in table and "implausible speedup" in table
    assert rep.estimated_step() == (2e-3, 1e-3)
    assert [k["implausible"] for k in rep.to_json()["kernels"]] == [True, False]


def test_export_of_a_whole_cache_round_trips_through_the_cli(tmp_path: Path, capsys) -> None:
    path, cat, key = _cache_file(tmp_path)
    out = tmp_path / "out.jsonl"
    assert cache_cmd.main(["--db", str(path), "export", "-o", str(out)]) == 0
    capsys.readouterr()
    assert not list(tmp_path.glob(".out.jsonl.*"))  # no temporary left behind
    buf = io.StringIO()
    with TuningCache(path) as cache:
        write_jsonl(buf, cache.records())
    assert out.read_text() == buf.getvalue()


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(1 << 70), max_value=1 << 70)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8)
    | st.sampled_from(["\ud800", "a\x00b", "nfk1-" + "0" * 32]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                max_size=3),
    max_leaves=12)
_FIELDS = ("category", "key", "schedule", "status", "time", "spread", "workspace",
           "reproducible", "naive", "timestamp", "desc", "error")


@settings(max_examples=150, deadline=None)
@given(field=st.sampled_from(_FIELDS), value=_JSON, ours=st.booleans(),
       param=st.sampled_from(["mr", "kc", "vec_axis", "tile_axis", "vec", "x"]))
def test_no_field_value_escapes_as_an_internal_error(field: str, value: Any, ours: bool,
                                                     param: str) -> None:
    """Any JSON value in any field, or in one schedule parameter of this nfc's schedule
    space: the import refuses the file (CacheError), rejects the record, or stores it, and
    what is stored verifies."""
    cat = default_category() if ours else {"backend": "test", "schedule_space": "t"}
    schedule = {**schedule_space(_gemm()).default()} if param in ("mr", "kc") else \
        {**schedule_space(canonical_compute(_op(ROW_SUM_IR))).default()}
    if field == "schedule" and ours:
        schedule[param] = value
    rec = _record(cat, "nfk1-" + "0" * 32, schedule, 1e-3, desc="d", error="")
    if not (field == "schedule" and ours):
        rec[field] = value
    text = _export([rec])
    with TuningCache(":memory:") as cache:
        try:
            stats = cache.import_jsonl(io.StringIO(text))
        except CacheError:
            return
        assert stats.added + len(stats.rejected) == 1
        assert cache.verify() == []
        for r in cache.records():  # and it exports again
            write_jsonl(io.StringIO(), [r])
