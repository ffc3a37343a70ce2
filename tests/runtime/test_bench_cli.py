"""`nfc bench`: a real smoke run (nfc and PyTorch eager on the MLP, in fresh processes), the
JSON lines it writes, failures reported instead of crashing, and the same first-step loss in
nfc and in the baseline runner."""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from nfc.cli import main
from nfc.runtime.bench import driver, models, timing

ROOT = Path(__file__).resolve().parents[2]
RUNNER = ROOT / "benchmarks" / "run_baseline.py"
HAS_TORCH = importlib.util.find_spec("torch") is not None
HAS_JAX = importlib.util.find_spec("jax") is not None


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """`nfc bench examples/mlp.nf --quick --frameworks nfc,torch --threads 1 --json out`."""
    tmp = tmp_path_factory.mktemp("bench")
    out = tmp / "out.jsonl"
    proc = subprocess.run(
        [sys.executable, "-m", "nfc", "bench", str(ROOT / "examples" / "mlp.nf"), "--quick",
         "--frameworks", "nfc,torch", "--threads", "1", "--json", str(out),
         "--keep", str(tmp / "work")],
        capture_output=True, text=True, timeout=600, cwd=ROOT)
    return proc, [json.loads(line) for line in out.read_text().splitlines()], tmp


def test_smoke_run_writes_one_wellformed_line_per_case(smoke):
    proc, recs, _ = smoke
    assert proc.returncode == 0, proc.stderr
    assert [(r["framework"], r["threads"]) for r in recs] == [("nfc", 1), ("torch", 1)]
    for r in recs:
        assert set(driver.FIELDS) <= set(r)
        assert r["model"] == "mlp3" and r["params"] == {"batch": 16}
    nfc = recs[0]
    assert nfc["status"] == "ok", nfc["error"]
    assert nfc["batch"] == 16 and nfc["steps"] >= 3
    assert 0 < nfc["min_ms"] <= nfc["step_ms"] and nfc["ratio_to_nfc"] == 1.0
    assert nfc["compile_s"] > 0 and nfc["compile_kind"] in ("cold", "cached")
    assert nfc["peak_rss_mb"] > 10 and nfc["gflops"] > 0
    assert "nfc ms" in proc.stdout and "mlp3" in proc.stdout
    assert "[1/2" in proc.stderr and "[2/2" in proc.stderr  # progress


def test_torch_case_or_missing(smoke):
    _, recs, _ = smoke
    torch_rec = recs[1]
    if not HAS_TORCH:
        assert torch_rec["status"] == "missing" and "torch" in torch_rec["error"]
        return
    assert torch_rec["status"] == "ok", torch_rec["error"]
    assert torch_rec["ratio_to_nfc"] == pytest.approx(
        torch_rec["step_ms"] / recs[0]["step_ms"])
    assert torch_rec["compile_s"] is None and torch_rec["version"].startswith("2.")


def test_baseline_runner_first_loss_matches_nfc(smoke):
    if not HAS_TORCH:
        pytest.skip("torch is not installed (optional test dependency)")
    _, recs, _ = smoke
    nfc, torch_rec = recs
    assert np.isfinite(nfc["first_loss"])
    np.testing.assert_allclose(torch_rec["first_loss"], nfc["first_loss"], rtol=1e-4)


def test_jax_runner_first_loss_matches_nfc(smoke):
    if not HAS_JAX:
        pytest.skip("jax is not installed (optional)")
    _, recs, tmp = smoke
    case = tmp / "work" / "mlp3" / "case.npz"
    proc = subprocess.run(
        [sys.executable, str(RUNNER), "--framework", "jax", "--model", "mlp3", "--batch", "16",
         "--data", str(case), "--min-time", "0.01", "--min-steps", "2", "--warmup", "0"],
        capture_output=True, text=True, timeout=300)
    rec = json.loads(proc.stdout.strip().splitlines()[-1])
    assert rec["status"] == "ok", rec.get("error")
    np.testing.assert_allclose(rec["first_loss"], recs[0]["first_loss"], rtol=1e-4)
    assert rec["compile_s"] > 0 and rec["peak_rss_mb"] > rec["rss_after_import_mb"] * 0.5


def test_missing_framework_and_failing_model_are_reported(tmp_path, monkeypatch, capsys):
    bad = tmp_path / "bad.nf"
    bad.write_text("import std.nn\n\nmodel bad(batch = 2) {\n  input x: f32[batch, 3]\n"
                   "  param w: f32[4, 5] = zeros\n  y = linear(x, w, w)\n  output y\n}\n")
    monkeypatch.setitem(driver.PACKAGES, "jax", "nfc_no_such_package_for_tests")
    out = tmp_path / "o.jsonl"
    code = main(["bench", str(bad), "mlp3", "--frameworks", "nfc,jax", "--threads", "1",
                 "--quick", "--json", str(out), "--min-time", "0.01"])
    assert code == 0
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    by = {(r["model"], r["framework"]): r for r in recs}
    assert by["bad", "nfc"]["status"] == "error"
    assert "does not compile" in by["bad", "nfc"]["error"]
    assert by["bad", "jax"]["status"] == "skipped" and "twin" in by["bad", "jax"]["error"]
    assert by["mlp3", "nfc"]["status"] == "ok"
    assert by["mlp3", "jax"]["status"] == "missing"
    assert "nfc_no_such_package_for_tests" in by["mlp3", "jax"]["error"]
    text = capsys.readouterr().out
    assert "missing [" in text and "error [" in text and "not installed" in text


@pytest.mark.parametrize("argv,needle", [
    (["bench"], "nothing to benchmark"),
    (["bench", "--all", "mlp3"], "not both"),
    (["bench", "mlp3", "--frameworks", "nfc,tensorflow"], "unknown framework"),
    (["bench", "mlp3", "--threads", "0"], "positive integers"),
    (["bench", "no_such_model"], "neither a .nf file"),
    (["bench", "mlp3", "--set", "opt.lr=1"], "model params only"),
])
def test_usage_errors(argv, needle, capsys):
    assert main(argv) == 1
    assert needle in capsys.readouterr().err


def test_every_example_model_is_benchmarked():
    assert models.unlisted_examples() == []
    assert len({m.name for m in models.MODELS}) == len(models.MODELS)
    for m in models.MODELS:
        assert m.file.exists(), m.path


def test_twins_exist_for_named_models():
    torch_text = (ROOT / "benchmarks" / "torch_models.py").read_text()
    jax_text = (ROOT / "benchmarks" / "jax_models.py").read_text()
    for m in models.MODELS:
        if m.twin:
            assert f'"{m.twin}":' in torch_text and f'"{m.twin}":' in jax_text, m.twin


def _rec(model, fw, threads, ms, status="ok", error=None):
    return {"model": model, "framework": fw, "threads": threads, "step_ms": ms,
            "status": status, "error": error, "batch": 8, "compile_s": 1.0,
            "peak_rss_mb": 100.0, "ratio_to_nfc": None if ms is None else ms / 2.0}


def test_report_tables_and_furthest_behind():
    from nfc.runtime.bench import report

    recs = [_rec("a", "nfc", 1, 2.0), _rec("a", "torch", 1, 1.0),
            _rec("a", "jax", 1, None, "missing", "jax is not installed"),
            _rec("b", "nfc", 1, 2.0), _rec("b", "torch", 1, 8.0),
            _rec("c", "nfc", 1, 2.0), _rec("c", "torch", 1, 0.5)]
    text = report.time_table(recs)
    assert "0.50x" in text and "4.00x" in text
    assert "missing [1]" in text and "[1] jax: missing: jax is not installed" in text
    pairs = report.behind(recs)
    assert [(a["model"], b["framework"]) for a, b in pairs] == [("c", "torch"), ("a", "torch")]
    assert "4.0x slower" in report.behind_text(recs)
    assert "peak RSS" in report.cost_table(recs)


def test_list_and_resolve(capsys):
    assert main(["bench", "--list"]) == 0
    assert "capsnet" in capsys.readouterr().out
    assert models.resolve(str(ROOT / "examples" / "lenet5.nf")).name == "lenet5"
    assert models.resolve("bert").int_bounds["ids"] == ("tok", 0)


def _body(fn: ast.FunctionDef) -> str:
    stmts = fn.body[1:] if isinstance(fn.body[0], ast.Expr) else fn.body
    return "\n".join(ast.dump(s) for s in stmts)


def test_runner_times_like_nfc():
    """run_baseline.py carries its own copy of the timing protocol (it must run without nfc);
    it must stay the very same code."""
    def func(path: Path, name: str) -> ast.FunctionDef:
        tree = ast.parse(path.read_text())
        return next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)

    for name in ("measure", "peak_rss_mb", "current_rss_mb"):
        assert _body(func(RUNNER, name)) == _body(func(Path(timing.__file__), name)), name


def test_measure_protocol():
    calls = []

    def step():
        calls.append(1)
        return np.float32(len(calls))

    rec = timing.measure(step, min_time=0.0, min_steps=4, warmup=0.0)
    assert rec["first_loss"] == 1.0 and rec["steps"] == 4 and rec["warmup_steps"] == 1
    assert len(calls) == 1 + 1 + 4


def test_budget_skips_and_reports(tmp_path):
    opts = driver.BenchOptions(models=(models.resolve("mlp3"),), frameworks=("nfc", "torch"),
                               threads=(1, 2), budget=0.0, work_dir=str(tmp_path))
    logs: list[str] = []
    recs = driver.Runner(opts, log=logs.append).run()
    assert [(r["framework"], r["threads"], r["status"]) for r in recs] == [
        ("nfc", 1, "skipped"), ("torch", 1, "skipped"), ("nfc", 2, "skipped"),
        ("torch", 2, "skipped")]
    assert "time budget" in recs[0]["error"] and logs[-1].startswith("finished 4 cases")


def test_report_from_json_file(tmp_path, capsys):
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in [
        _rec("a", "nfc", 1, 2.0), _rec("a", "torch", 1, 3.0),
        _rec("a", "jax", 1, None, "error", "boom | bang")]))
    assert main(["bench", "--report", str(path), "--markdown"]) == 0
    out = capsys.readouterr().out
    assert "| a | 8 | 1 | 2.000 | 3.000 (1.50x) | error [1] |" in out
    assert "[1] jax: error: boom / bang" in out
    assert main(["bench", "--report", str(path)]) == 0
    assert "nfc is the fastest" in capsys.readouterr().out


def test_inputs_respect_their_bounds():
    from nfc.runtime.bench.worker import make_inputs

    meta = {"tensors": [{"name": "tok", "shape": [7, 4]}],
            "functions": {"train_step": {
                "args": [{"name": "ids", "role": "input", "shape": [50, 3], "dtype": "i32"},
                         {"name": "y", "role": "input", "shape": [50], "dtype": "i32"},
                         {"name": "x", "role": "input", "shape": [50, 2], "dtype": "f32"},
                         {"name": "tok", "role": "param", "shape": [7, 4], "dtype": "f32"}],
                "results": [{"name": "loss", "shape": []},
                            {"name": "logits", "shape": [50, 3]}]}}}
    ins = make_inputs(meta, {"ids": ("tok", 0)}, seed=0)
    assert set(ins) == {"ids", "y", "x"} and ins["x"].dtype == np.float32
    assert ins["ids"].max() == 6 and ins["ids"].min() == 0     # below the 7 rows of tok
    assert ins["y"].max() == 2 and ins["y"].dtype == np.int32  # below the 3 classes
    again = make_inputs(meta, {"ids": ("tok", 0)}, seed=0)
    assert all(np.array_equal(ins[k], again[k]) for k in ins)


def test_profile_text():
    from nfc.runtime.bench import report

    rec = _rec("a", "nfc", 1, 2.0)
    rec["profile"] = {"kernel_ms": 1.5, "kernels": 3, "steps": 2, "step_ms": 1.6,
                      "groups": {"reductions": {"kernels": 2, "percent": 90.0, "gflops": 1.5}},
                      "top": [{"label": "0 %y [n: 4] sum [k: 8]", "ms": 1.2, "percent": 80.0,
                               "gflops": 2.0, "gbytes": 0.5}]}
    text = report.profile_text([rec, _rec("a", "torch", 1, 1.0)])
    assert "a (1 thread): 1.500 ms in 3 kernel calls" in text
    assert "reductions: 2 kernels, 90.0% of the time, 1.50 GFLOP/s" in text
    assert "80.0%" in text and "%y [n: 4] sum [k: 8]" in text


def test_torch_compile_on_more_threads_runs_last_under_a_budget(tmp_path):
    if not HAS_TORCH:
        pytest.skip("torch is not installed: nothing to defer")
    opts = driver.BenchOptions(models=(models.resolve("mlp3"), models.resolve("lenet5")),
                               frameworks=("nfc", "torch-compile"), threads=(1, 2),
                               budget=0.0, defer=True, work_dir=str(tmp_path))
    recs = driver.Runner(opts, log=lambda s: None).run()
    assert [(r["model"], r["framework"], r["threads"]) for r in recs] == [
        ("mlp3", "nfc", 1), ("mlp3", "torch-compile", 1), ("mlp3", "nfc", 2),
        ("lenet5", "nfc", 1), ("lenet5", "torch-compile", 1), ("lenet5", "nfc", 2),
        ("mlp3", "torch-compile", 2), ("lenet5", "torch-compile", 2)]
    assert {r["status"] for r in recs} == {"skipped"}


def test_case_file_holds_the_logical_state_of_a_laid_out_build(tmp_path):
    """A build whose `layout` pass stores weights blocked writes its case file by the model
    file's names and shapes (what the baselines load), the same state as the default build's."""
    from nfc.runtime.bench.worker import compile_case

    src = str(ROOT / "examples" / "resnet_block.nf")
    cases = {}
    for name, pipe in (("default", None), ("layout", "layout,im2col,training-functions,"
                                          "inline,canonicalize,cse,dce,fuse")):
        rec = compile_case({"source": src, "out": str(tmp_path / name), "pipeline": pipe,
                            "seed": 3, "tuned": False})
        with np.load(rec["case"], allow_pickle=False) as z:
            cases[name] = {k: z[k] for k in z.files}
    base, lay = cases["default"], cases["layout"]
    assert sorted(base) == sorted(lay)
    for k in base:
        assert lay[k].shape == base[k].shape, k
        if not k.startswith("input:"):
            np.testing.assert_array_equal(lay[k], base[k], err_msg=k)
