"""`nfc compile`, `nfc run` and `nfc train` from the command line (in process)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from runtime_lib import built_library

from nfc.cli import main

TINY = str(Path(__file__).parent / "models" / "tiny.nf")


@pytest.fixture(scope="module")
def tiny_so():
    return built_library(TINY, profile=True)


def test_compile_writes_a_library_and_reports_memory(capsys, tmp_path):
    out = tmp_path / "tiny.so"
    assert main(["compile", TINY, "-o", str(out), "--function", "train_step",
                 "--no-fuse"]) == 0
    assert "train_step: 20 kernels, arena" in capsys.readouterr().err
    assert main(["run", str(out), "--info"]) == 0
    out = capsys.readouterr().out
    assert "train_step(x: f32[16, 64] (input), y: i32[16] (input))" in out
    assert "param     w: f32[64, 10] = normal(0.0, 0.01)" in out


@pytest.mark.parametrize("emit,needle", [("ir", "nf.func @train_step"), ("loops", "for "),
                                         ("llvm", "define void @nfc_train_step"),
                                         ("header", "#define NFC_TRAIN_STEP_N_ARGS 6")])
def test_emit_forms(emit, needle, capsys, tmp_path):
    out = tmp_path / "out.txt"
    assert main(["compile", TINY, f"--emit={emit}", "-o", str(out), "--set", "batch=8"]) == 0
    assert needle in out.read_text()


def test_run_evaluates_with_a_seed(tiny_so, capsys):
    assert main(["run", tiny_so, "--data", "digits", "--json", "--seed", "1"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["samples"] == 360 and 0.0 <= res["accuracy"] <= 0.5  # untrained


def test_train_profile_table_and_trace(tiny_so, capsys, tmp_path):
    trace = tmp_path / "trace.json"
    ck = tmp_path / "ck"
    assert main(["train", tiny_so, "--data", "digits", "--epochs", "3", "--profile",
                 "--trace", str(trace), "--quiet", "--checkpoint", str(ck)]) == 0
    out = capsys.readouterr().out
    assert "GFLOP/s" in out and "% step" in out and "test accuracy" in out
    acc = float(out.split("test accuracy: ")[1].split("%")[0])
    assert acc > 80.0
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e.get("name", "").startswith("step ") for e in events)
    assert main(["run", tiny_so, "--data", "digits", "--checkpoint", str(ck), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert abs(res["accuracy"] * 100 - acc) < 0.006  # printed with two decimals


def test_train_compiles_a_model_file_with_settings(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("NFC_CACHE_DIR", str(tmp_path))
    assert main(["train", TINY, "--data", "synthetic", "--batch", "32", "--lr", "0.05",
                 "--epochs", "2", "--quiet", "--metrics", str(tmp_path / "m.jsonl")]) == 0
    assert "steps: 128 in 2 epoch(s)" in capsys.readouterr().out
    assert list((tmp_path / "artifacts").glob("*.so")), "the library is cached"


def test_usage_errors(tiny_so, capsys, tmp_path):
    assert main(["compile", str(tmp_path / "missing.nf")]) == 1
    assert "no such file" in capsys.readouterr().err
    assert main(["train", tiny_so, "--set", "batch=3"]) == 1
    assert "--set applies when compiling" in capsys.readouterr().err
    assert main(["train", tiny_so, "--data", "imagenet", "--quiet"]) == 1
    assert "unknown data set 'imagenet'" in capsys.readouterr().err
    assert main(["compile", TINY, "--set", "batch"]) == 1
    assert "key=value" in capsys.readouterr().err
    assert main(["compile", tiny_so, "--emit=ir"]) == 1
    assert "only gives --emit=header" in capsys.readouterr().err


def test_run_picks_the_data_like_train(tiny_so, capsys):
    # no --data: `auto` fits a data set to the model's inputs, as nfc train does
    assert main(["run", tiny_so, "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["data"] == "digits" and res["samples"] == 360
    assert main(["run", tiny_so, "--data", "nope"]) == 1
    assert "unknown data set 'nope'" in capsys.readouterr().err
