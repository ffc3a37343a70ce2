"""Memory accounting of a built artifact (docs/memory.md): the report of the artifact's own
plan agrees with the library's metadata, counts the kernel workspaces, and `nfc compile` prints
its summary line."""

from __future__ import annotations

import subprocess
import sys

from runtime_lib import MLP_DIGITS, scratch, training_module

from nfc.passes.memplan import check_plan, lower_bound


def test_artifact_report_matches_metadata_and_plan():
    from nfc.codegen.artifact import build_artifact

    module = training_module()
    art = build_artifact(module, functions=["train_step"])
    plan = art.plans["train_step"]
    fm = art.metadata["functions"]["train_step"]
    rep = plan.memory_report()
    check_plan(plan.buffers, plan.memory)
    assert rep.arena == plan.memory.peak == fm["arena_bytes"]
    assert rep.naive == fm["naive_bytes"]
    assert rep.lower_bound == lower_bound(plan.buffers) <= rep.arena
    ws = [b for b in plan.buffers if b.key[0] == "ws"]
    assert rep.workspace == lower_bound(ws) <= rep.arena
    params = sum(a.type.nbytes for a in plan.args if a.role == "param")
    assert rep.params == params > 0 and rep.opt_state == params
    # results updated in place have no output buffer: here only the loss and the logits
    outs = sum(r.type.nbytes for r in plan.results if r.inplace is None)
    assert rep.outputs == outs == 4 + 64 * 10 * 4
    assert rep.saved_total > 0


def test_compile_prints_the_memory_summary():
    out = scratch("memory") / "m.so"
    res = subprocess.run([sys.executable, "-m", "nfc", "compile", str(MLP_DIGITS), "-o", str(out)],
                         capture_output=True, text=True, check=True)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip().startswith("memory: peak")]
    assert len(lines) >= 2, res.stderr  # forward, train_step (and eval)
    assert any("saved activations" in ln and "lower bound" in ln for ln in lines)


def test_bench_memory_table_from_records():
    from nfc.runtime.bench import report

    recs = [{"model": "a", "framework": "nfc", "threads": 1, "status": "ok", "step_ms": 1.0,
             "peak_rss_mb": 130.0, "rss_after_import_mb": 100.0, "planned_mb": 12.5},
            {"model": "a", "framework": "torch", "threads": 1, "status": "ok", "step_ms": 1.0,
             "peak_rss_mb": 400.0, "rss_after_import_mb": 340.0, "step_peak_mb": 60.0},
            {"model": "a", "framework": "jax", "threads": 1, "status": "missing",
             "step_ms": None}]
    assert report.step_peak_mb(recs[0]) == 30.0
    text = report.memory_table(recs)
    row = next(ln for ln in text.splitlines() if ln.startswith("a "))
    assert "12.5" in row and "30.0" in row and "60.0 2.00x" in row and row.rstrip().endswith("-")
    assert "peak memory of the step" in report.cost_table(recs)


def test_bench_reports_a_positive_step_peak_for_every_framework(tmp_path):
    import importlib.util
    import json

    fws = "nfc,torch" if importlib.util.find_spec("torch") is not None else "nfc"
    out = tmp_path / "out.jsonl"
    proc = subprocess.run(
        [sys.executable, "-m", "nfc", "bench", str(MLP_DIGITS), "--quick", "--frameworks", fws,
         "--threads", "1", "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["framework"] for r in recs] == fws.split(",")
    for r in recs:
        if r["status"] != "ok":  # a baseline without a twin is skipped, not measured
            assert r["framework"] != "nfc", r
            continue
        assert r["step_peak_mb"] > 0, r
        assert abs(r["step_peak_mb"] - (r["peak_rss_mb"] - r["rss_after_import_mb"])) < 1e-6
    assert "peak memory of the step" in proc.stdout


def test_remat_shrinks_the_artifact_arena_and_the_library_matches_the_interpreter():
    import numpy as np
    from runtime_lib import ROOT, assert_close, interp_step

    from nfc.codegen.artifact import build_artifact
    from nfc.runtime.build import build_module
    from nfc.runtime.loader import load

    src = str(ROOT / "examples" / "resnet_block.nf")
    base = "im2col,training-functions,inline,canonicalize,cse,dce"
    ref_module, _ = build_module(src, {}, {}, base)
    plain, _ = build_module(src, {}, {}, base + ",fuse")
    remat, _ = build_module(src, {}, {}, base + ",remat,fuse")
    a0 = build_artifact(plain, functions=["train_step"])
    a1 = build_artifact(remat, functions=["train_step"])
    r0, r1 = a0.plans["train_step"].memory_report(), a1.plans["train_step"].memory_report()
    assert r1.arena < r0.arena and r1.saved_total < r0.saved_total
    path = str(scratch("memory") / "remat.so")
    a1.write_shared(path)
    model = load(path)
    model.init(seed=3)
    state = model.state_dict()
    rng = np.random.default_rng(0)
    step = model.functions["train_step"]
    inputs = {}
    for s in step.inputs:
        if s.dtype.kind == "f":
            inputs[s.name] = rng.standard_normal(s.shape).astype(s.dtype)
        else:
            inputs[s.name] = rng.integers(0, 2, s.shape).astype(s.dtype)
    ref = interp_step(ref_module, "train_step", {**state, **inputs})
    out = model.train_step(**inputs)
    assert_close(out["loss"], ref["loss"], what="loss")
    for name, value in ref.items():
        if ":" in name:
            assert_close(model.tensors[name.split(":", 1)[1]], value, what=name)
