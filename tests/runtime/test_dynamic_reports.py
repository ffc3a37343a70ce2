"""Dynamic mode's kernel reports: the training loop samples steps on a profiled twin of the
running library and reports each kernel's time per call and calls per step to the explorer,
which orders its search by them (nfc.runtime.dynamic.session.kernel_report,
explorer.next_kernel).

Nothing here asserts a time: the execution side's reports are checked for their structure
(every kernel of the step, its calls per step), for positive times, for following a kernel
made slow (a delay injected through the swap indirection, and a layer 100x larger than the
others), and the explorer's order is driven by injected reports."""

from __future__ import annotations

import functools
import json
import os
import types
from pathlib import Path

import numpy as np
import pytest
from runtime_lib import ROOT, scratch

from nfc.runtime.dynamic import DynamicOptions
from nfc.runtime.train import TrainConfig, train

MODEL = str(ROOT / "examples" / "mlp.nf")
TINY = ("batch=16", "inputs=32", "hidden1=24", "hidden2=16", "classes=4")
BIG = ("batch=16", "inputs=2048", "hidden1=24", "hidden2=16", "classes=4")
"""The first layer (16x2048 by 2048x24, and its gradient) is 100x the others' work."""
GIVEN = "nfc.runtime.dynamic.explorer:given_libraries"
STEPS = 60


@pytest.fixture(autouse=True)
def _own_caches(monkeypatch):
    monkeypatch.setenv("NFC_CACHE_DIR", str(_cache_dir()))


@functools.cache
def _cache_dir():
    return scratch("dynamic-report-cache")


def _config(settings, **dynamic) -> TrainConfig:
    mode = "dynamic" if dynamic else "static"
    return TrainConfig(source=MODEL, settings=settings, data="synthetic", max_steps=STEPS,
                       epochs=1 << 20, progress=False, evaluate=False, mode=mode,
                       metrics=str(scratch(f"dynamic-report-{mode}") / "metrics.jsonl"),
                       dynamic=DynamicOptions(**dynamic) if dynamic else None)


def _reports(metrics: str) -> list[dict]:
    recs = [json.loads(line) for line in Path(metrics).read_text().splitlines()]
    return [r for r in recs if r.get("event") == "kernel_report"]


def _run(settings, on_step=None):
    """A dynamic run offering nothing (the explorer only builds the running library's
    profiled twin), waited for at step 3, every 10th step sampled (however short the
    steps); the session's reports."""
    sent: list[dict] = []

    def watch(s, step):
        if s.summary.report is not None and (not sent or sent[-1] is not s.summary.report):
            sent.append(s.summary.report)
        if on_step is not None:
            on_step(s, step)

    cfg = _config(settings, candidates=GIVEN, settle_at_step=3, report_every=10,
                  report_seconds=0.0,
                  on_step=watch)
    res = train(cfg)
    return res, sent, cfg.metrics


def _structure(res, rep):
    """Every kernel call of the step is in the report, once, with its calls per step."""
    meta = res.model.functions["train_step"].meta["kernels"]
    calls: dict[str, int] = {}
    for k in meta:
        calls[k["symbol"]] = calls.get(k["symbol"], 0) + 1
    assert {g["symbol"]: g["calls"] for g in rep["kernels"]} == calls
    ops = sorted(op for g in rep["kernels"] for op in g["ops"])
    assert ops == sorted(int(k["label"].split()[0]) for k in meta)
    assert all(g["per_call_ms"] > 0 and g["ms"] > 0 for g in rep["kernels"])
    assert sum(g["share"] for g in rep["kernels"]) == pytest.approx(1.0)
    assert [g["ms"] for g in rep["kernels"]] == sorted((g["ms"] for g in rep["kernels"]),
                                                       reverse=True)
    assert rep["samples"] >= 1 and rep["kernel_ms"] == pytest.approx(
        sum(g["ms"] for g in rep["kernels"]))


def test_reports_cover_the_step_and_follow_a_kernel_made_slow():
    """The sampled steps run the profiled twin and compute what the plain library does; a
    delay injected into one kernel's record (through the indirection) makes that kernel the
    largest share of the next report."""
    slow: dict[str, int] = {}

    def slow_down(s, step):
        if step == 30:  # the kernel the reports rank last so far
            last = s.summary.report["kernels"][-1]
            slow["symbol"] = last["symbol"]
            slow["calls"] = last["calls"]
            for j, k in enumerate(s.step.kernels()):
                if k["symbol"] == last["symbol"]:
                    s.step.delay[j] = 0.05

    res, sent, metrics = _run(TINY, slow_down)
    assert res.steps == STEPS and np.all(np.isfinite(res.losses))
    assert len(sent) >= 3 and res.dynamic.reports == len(_reports(metrics))
    for rep in sent:
        _structure(res, rep)
        assert rep["library"] == res.model.path
    before = [r for r in sent if r["step"] < 30]
    after = [r for r in sent if r["step"] > 30]
    assert before and after
    assert before[-1]["kernels"][0]["symbol"] != slow["symbol"]
    assert after[-1]["kernels"][0]["symbol"] == slow["symbol"]
    assert after[-1]["kernels"][0]["per_call_ms"] >= 50.0
    # the metrics show the reported shares, and the summary the last report
    top = _reports(metrics)[-1]["kernels"][0]
    assert top["share"] > 0.5 and top["calls"] == slow["calls"]
    assert any("kernel report(s)" in line for line in res.dynamic.lines())
    # the twin's steps computed what the plain library computes
    static = train(_config(TINY))
    np.testing.assert_allclose(res.losses, static.losses, rtol=1e-6)
    for k, v in static.model.tensors.items():
        np.testing.assert_allclose(res.model.tensors[k], v, rtol=1e-5, atol=1e-7)


def test_the_largest_layer_gets_the_largest_reported_share():
    """Real measurements: a layer 100x the others' work (BIG) tops the report, and the
    explorer's times by key (reported_times: the library's fused kernels split into the keys
    the tuner searches) put a kernel of that layer first."""
    from nfc.runtime.dynamic.explorer import next_kernel, plan_sites, reported_times
    from nfc.runtime.tuning.driver import build_model, training_functions
    from nfc.runtime.tuning.kernels import collect_kernels

    res, sent, _ = _run(BIG)
    assert sent
    rep = sent[-1]
    _structure(res, rep)
    meta = res.model.functions["train_step"].meta["kernels"]
    flops: dict[str, float] = {}
    for k in meta:
        flops[k["symbol"]] = flops.get(k["symbol"], 0.0) + float(k["flops"])
    # the top kernel does at least a quarter of the largest kernel's work (the large layer's
    # products are ~100x every kernel of the other layers)
    assert flops[rep["kernels"][0]["symbol"]] >= 0.25 * max(flops.values())
    module = build_model(MODEL, list(BIG), None)
    kernels = collect_kernels(module, training_functions(module))
    sites = plan_sites({"source": MODEL, "settings": list(BIG)}, kernels)
    # every kernel call of the report maps to keys the tuner knows
    assert all(sites.get(op) for g in rep["kernels"] for op in g["ops"])
    times = reported_times(rep, kernels, sites)
    first = next_kernel(kernels, times, {}, top=4, rounds=1)
    assert first is not None and times[first.key] == max(
        times[k.key] for k in kernels if k.tunable) > 0
    assert "2048" in first.desc, first.desc


# -- the explorer's order: injected reports, a fake search ------------------------------------


def _report(seq: int, ms: dict[str, float], kernels, sites) -> dict:
    """A report (session.kernel_report's form) where kernel key -> ms per step (`sites`:
    an unfused library, one key per op)."""
    groups = []
    for k in kernels:
        ops = [n for n, keys in sites.items() if keys == [(k.key, 1.0)]]
        if ops:
            t = ms.get(k.key, 0.001)
            groups.append({"symbol": k.key, "name": k.desc, "ops": ops, "calls": len(ops),
                           "ms": t, "per_call_ms": t / len(ops)})
    return {"seq": seq, "step": seq * 10, "kernels": groups}


def _write(workdir: Path, rep: dict) -> None:
    tmp = workdir / f".report-{rep['seq']:04d}.tmp"
    tmp.write_text(json.dumps(rep))
    os.replace(tmp, workdir / f"report-{rep['seq']:04d}.json")


def test_the_explorer_searches_in_the_order_of_the_latest_report(monkeypatch, tmp_path):
    """Report 1: B dominates, then C, then A: B is searched first. B's search (and swap) make
    B fast, report 2 says A dominates: A is searched next, not C (report 1's second)."""
    from nfc.runtime.dynamic import explorer
    from nfc.runtime.tuning import driver
    from nfc.runtime.tuning.kernels import collect_kernels

    module = driver.build_model(MODEL, list(TINY), None)
    kernels = collect_kernels(module, driver.training_functions(module))
    job = {"source": MODEL, "settings": list(TINY), "pipeline": None, "workdir": str(tmp_path),
           "report": True, "report_wait": 60.0, "top": 3, "rounds": 1, "fuse": False,
           "db": str(tmp_path / "tuning.sqlite")}
    sites = explorer.plan_sites(job, kernels)
    alone = {keys[0][0] for keys in sites.values() if len(keys) == 1}
    tunable = [k for k in kernels if k.tunable and k.key in alone]
    assert len(tunable) >= 3
    a, b, c = tunable[:3]
    _write(tmp_path, _report(1, {b.key: 10.0, c.key: 5.0, a.key: 1.0}, kernels, sites))
    searched: list[str] = []

    def fake_tune(k, cache, category, options, **kw):
        searched.append(k.key)
        if k.key == b.key:  # the training loop's report after B's swap
            _write(tmp_path, _report(2, {a.key: 10.0, c.key: 5.0, b.key: 0.1}, kernels,
                                     sites))
        res = types.SimpleNamespace(evaluated=0, measured=0, time=None, default_time=None,
                                    speedup=None)
        return res, None

    monkeypatch.setattr(driver, "tune_kernel", fake_tune)
    events: list[dict] = []
    assert list(explorer.tuned_candidates(job, events.append)) == []
    assert searched == [b.key, a.key, c.key]
    ranked = [e for e in events if e["event"] == "ranked"]
    assert [e["by"] for e in ranked] == ["report", "report"]
    assert [e["seq"] for e in ranked] == [1, 2]
    assert ranked[0]["kernels"][0]["key"] == b.key and ranked[1]["kernels"][0]["key"] == a.key
    # `order = cost` ignores the reports (a deterministic order)
    searched.clear()
    events.clear()
    list(explorer.tuned_candidates(dict(job, order="cost"), events.append))
    assert [e["by"] for e in events if e["event"] == "ranked"] == ["cost"]
    assert len(searched) == 3


def test_next_kernel_rounds_and_top():
    K = types.SimpleNamespace
    ks = [K(key=n, tunable=n != "x") for n in ("a", "b", "c", "x")]
    times = {"a": 1.0, "b": 3.0, "c": 2.0, "x": 9.0}
    from nfc.runtime.dynamic.explorer import next_kernel

    assert next_kernel(ks, times, {}, top=2, rounds=2).key == "b"
    assert next_kernel(ks, times, {"b": 1}, top=2, rounds=2).key == "c"
    # each of the top kernels once before any twice
    assert next_kernel(ks, times, {"b": 1, "c": 1}, top=2, rounds=2).key == "b"
    assert next_kernel(ks, times, {"b": 2, "c": 2}, top=2, rounds=2) is None
    # b got fast: a enters the top 2
    assert next_kernel(ks, dict(times, b=0.1), {"b": 2, "c": 2}, top=2, rounds=2).key == "a"
