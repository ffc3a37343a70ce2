"""The command line as users meet it: the same option means the same thing in every command
(`--model`, `--function`, `--pass`, `--db`), every option has help text, and the examples in
the help hold."""

from __future__ import annotations

import json
import re

import pytest

from nfc.cli import build_parser, main

TWO_MODELS = """
model small(batch = 2) {
  input  x: f32[batch, 3]
  param  w: f32[3, 2] = normal(0.0, 0.1)
  y[n, j] = sum(k) x[n, k] * w[k, j]
  loss = (sum(n, j) y[n, j] * y[n, j]) / batch
  minimize loss with sgd(lr = 0.1)
}

model wide(batch = 2) {
  input  x: f32[batch, 3]
  param  v: f32[3, 5] = normal(0.0, 0.1)
  y[n, j] = sum(k) x[n, k] * v[k, j]
  loss = (sum(n, j) y[n, j] * y[n, j]) / batch
  minimize loss with sgd(lr = 0.1)
}
"""


@pytest.fixture
def two_models(tmp_path):
    p = tmp_path / "two.nf"
    p.write_text(TWO_MODELS)
    return p


def _subparsers():
    parser = build_parser()
    action = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return action.choices


# ---- --model ---------------------------------------------------------------------------------

def test_several_models_without_model_names_the_flag(two_models, capsys):
    assert main(["opt", str(two_models)]) == 1
    err = capsys.readouterr().err
    assert "has several models (small, wide); choose one with --model NAME" in err
    assert re.search(r"two\.nf:10:1: error:", err), err


@pytest.mark.parametrize("command", [["opt"], ["stats"], ["compile", "--emit=ir"]])
@pytest.mark.parametrize(("model", "param"), [("small", "%w"), ("wide", "%v")])
def test_model_chooses_one(two_models, capsys, command, model, param):
    assert main([*command, str(two_models), "--model", model]) == 0
    out = capsys.readouterr().out
    other = {"%w": "%v", "%v": "%w"}[param]
    if command[0] == "stats":  # %y is 2x2 in 'small', 2x5 in 'wide'
        assert re.search(r"%y\s+forward\s+2x" + ("5" if model == "wide" else "2"), out), out
    else:
        assert param in out and other not in out


def test_unknown_model_is_a_located_error(two_models, capsys):
    assert main(["opt", str(two_models), "--model", "smal"]) == 1
    err = capsys.readouterr().err
    assert "no model named 'smal'" in err and "did you mean 'small'" in err, err


def test_model_flag_is_shared(two_models):
    for name in ("opt", "compile", "train", "run", "stats", "tune", "bench"):
        args = build_parser().parse_args([name, str(two_models), "--model", "wide"])
        assert args.model == "wide", name
        sub = _subparsers()[name]
        flag = next(a for a in sub._actions if "--model" in a.option_strings)
        assert flag.metavar == "NAME" and "several" in flag.help, name


# `nfc tune` and `nfc bench` give the errors of the other commands, before any work
@pytest.mark.parametrize("command", [["tune", "--mode", "heuristic", "--quiet"],
                                     ["bench", "--frameworks", "nfc"]])
def test_tune_and_bench_need_model_for_several(two_models, tmp_path, capsys, command):
    db = ["--db", str(tmp_path / "t.sqlite")] if command[0] == "tune" else []
    assert main([command[0], str(two_models), *command[1:], *db]) == 1
    err = capsys.readouterr().err
    assert "has several models (small, wide); choose one with --model NAME" in err
    assert re.search(r"two\.nf:10:1: error:", err), err
    assert main([command[0], str(two_models), *command[1:], *db, "--model", "smal"]) == 1
    err = capsys.readouterr().err
    assert "no model named 'smal'" in err and "did you mean 'small'" in err, err
    assert re.search(r"two\.nf:2:1: error:", err), err
    assert not (tmp_path / "t.sqlite").exists()  # refused before the cache was opened


@pytest.mark.parametrize(("model", "shape"), [("small", "3x2"), ("wide", "3x5")])
def test_tune_model_chooses_one(two_models, tmp_path, capsys, model, shape):
    assert main(["tune", str(two_models), "--model", model, "--mode", "heuristic", "--quiet",
                 "--db", str(tmp_path / "t.sqlite")]) == 0
    out = capsys.readouterr().out
    other = {"3x2": "3x5", "3x5": "3x2"}[shape]
    assert f"gemm {shape}/2 f32" in out and other not in out, out


def test_bench_model_with_all_is_refused(capsys):
    assert main(["bench", "--all", "--model", "small"]) == 1
    assert "--model chooses the model of the files given" in capsys.readouterr().err


def test_bench_model_chooses_one(two_models, tmp_path, capsys):
    import numpy as np

    assert main(["bench", str(two_models), "--model", "wide", "--print-pipeline"]) == 0
    assert "apply-tuning" in capsys.readouterr().out
    out = tmp_path / "b.jsonl"
    assert main(["bench", str(two_models), "--model", "wide", "--frameworks", "nfc",
                 "--threads", "1", "--quick", "--min-time", "0.01", "--min-steps", "1",
                 "--json", str(out), "--keep", str(tmp_path / "work")]) == 0
    rec = json.loads(out.read_text().splitlines()[0])
    assert rec["model"] == "wide" and rec["status"] == "ok", rec
    # the case file holds the chosen model's parameters: v (3x5), not small's w
    with np.load(tmp_path / "work" / "wide" / "case.npz") as z:
        assert z["param:v"].shape == (3, 5) and "param:w" not in z.files


def test_compile_model_python_api(two_models):
    from nfc.runtime.build import model_module

    module = model_module(two_models, model="wide")
    assert [a.name for a in module.func("train_step").args][:2] == ["x", "v"]


# ---- --function ------------------------------------------------------------------------------

def test_stats_takes_function_and_the_old_func(two_models, capsys):
    for flag in ("--function", "--func"):
        assert main(["stats", str(two_models), "--model", "small", flag, "forward"]) == 0
        assert "forward" in capsys.readouterr().out
    help_text = _subparsers()["stats"].format_help()
    assert "--function" in help_text and "--func " not in help_text


# ---- help text -------------------------------------------------------------------------------

@pytest.mark.parametrize("command", ["opt", "compile", "train", "run", "stats", "bench",
                                     "tune"])
def test_every_option_has_help(command):
    sub = _subparsers()[command]
    missing = [a.option_strings for a in sub._actions
               if a.option_strings and a.help is None]
    assert not missing, missing


def test_run_and_train_take_model(two_models, capsys):
    assert main(["run", str(two_models), "--model", "small", "--data", "synthetic"]) == 0
    assert "loss" in capsys.readouterr().out
    # train compiles the chosen model, then asks for labels this model does not have
    assert main(["train", str(two_models), "--model", "wide", "--max-steps", "1",
                 "--data", "synthetic", "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "several models" not in err and "needs a label input" in err, err


# ---- nfc compile: --pass, --emit=ir, --db --------------------------------------------------

def test_compile_accepts_pass_like_opt(two_models, capsys):
    assert main(["compile", str(two_models), "--model", "small", "-p", "inline",
                 "--pass", "cse", "--pass", "dce", "--print-pipeline"]) == 0
    assert capsys.readouterr().out == "inline,cse,dce\n"
    assert main(["compile", str(two_models), "--model", "small", "--pass", "cse",
                 "--print-pipeline"]) == 0
    assert capsys.readouterr().out.endswith(",apply-tuning,fuse,cse\n")


def test_compile_emit_ir_runs_apply_tuning(two_models, capsys):
    assert main(["compile", str(two_models), "--model", "small", "--emit=ir",
                 "--print-pipeline"]) == 0
    assert "apply-tuning" in capsys.readouterr().out


def test_compile_db_reaches_apply_tuning(two_models, tmp_path, capsys):
    db = tmp_path / "team.sqlite"
    assert main(["compile", str(two_models), "--model", "small", "--db", str(db),
                 "--print-pipeline"]) == 0
    assert re.search(r'apply-tuning\{db="?' + re.escape(str(db)), capsys.readouterr().out)
    # the IR is built with that cache: an empty file gives default schedules
    assert main(["compile", str(two_models), "--model", "small", "--db", str(db),
                 "--emit=ir"]) == 0
    assert "@train_step" in capsys.readouterr().out
    assert main(["compile", str(two_models), "--model", "small", "--db", str(db),
                 "--no-tuning", "--print-pipeline"]) == 1
    assert "--db: the pipeline has no apply-tuning pass" in capsys.readouterr().err


# ---- a pass name registered twice ------------------------------------------------------------

def test_an_ambiguous_pass_name_fails_only_where_it_is_used(tmp_path):
    import os
    import subprocess
    import sys

    dist = tmp_path / "evil_cse-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: evil-cse\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[nfc.passes]\ncse = evil_cse:CSE\n")
    src = tmp_path / "m.nf"
    src.write_text("model m {\n  input x: f32[4]\n  y = x * 2.0\n  z = x + 1.0\n"
                   "  output y\n}\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path),
                                                       os.environ.get("PYTHONPATH", "")]))

    def nfc(*args):
        return subprocess.run([sys.executable, "-m", "nfc", *args], capture_output=True,
                              text=True, env=env, timeout=120)

    ok = nfc("opt", str(src), "-p", "dce")
    assert ok.returncode == 0, ok.stderr
    assert "nf.func @forward" in ok.stdout
    bad = nfc("opt", str(src), "-p", "dce,cse")
    assert bad.returncode == 1
    assert ("pass 'cse' is registered twice: by evil_cse:CSE (from evil-cse) and by "
            "nfc.passes.cse:CSE (from nfc); uninstall one of them") in bad.stderr


# ---- help examples and docs that must hold ---------------------------------------------------

def test_bench_help_examples_have_twins(monkeypatch):
    from nfc.runtime.bench.models import ROOT, resolve

    monkeypatch.chdir(ROOT)  # the examples are relative to the repository root
    doc = _subparsers()["bench"].description
    specs = re.findall(r"^\s+nfc bench (\S+\.nf|[a-z_0-9]+)\b", doc, re.M)
    specs = [s for s in specs if not s.startswith("-")]
    assert specs and specs[0] == "examples/mlp.nf", specs
    for spec in specs:
        assert resolve(spec).twin is not None, spec
    monkeypatch.chdir("/")  # and from elsewhere: the repository's examples are found
    assert resolve("examples/mlp.nf").twin == "mlp3"


def test_offline_plugin_install_is_documented():
    from nfc.runtime.bench.models import ROOT

    # the flags tests/ir/test_ir_plugin.py itself needs to install the plugin offline
    flags = "pip install --no-build-isolation --no-deps -e examples/"
    assert flags + "plugin" in (ROOT / "examples/plugin/README.md").read_text()
    assert flags + "intrinsic_plugin" in (ROOT / "examples/intrinsic_plugin/README.md"
                                          ).read_text()
    passes = " ".join((ROOT / "docs/passes.md").read_text().split())
    assert "pip install --no-build-isolation --no-deps -e examples/plugin" in passes
    assert "--no-deps" in (ROOT / "tests/ir/test_ir_plugin.py").read_text()


# ---- docs that must hold ---------------------------------------------------------------------

def test_runtime_doc_arena_figures_are_measured(tmp_path, capsys):
    """runtime.md quotes `nfc compile examples/mlp_digits.nf --no-tuning`: the figures must be
    what that command prints."""
    from nfc.runtime.bench.models import ROOT

    text = " ".join((ROOT / "docs/runtime.md").read_text().split())
    m = re.search(r"`train_step`'s arena is ([\d,]+) bytes instead of ([\d,]+)", text)
    assert m, "runtime.md no longer quotes the MLP-digits arena"
    assert main(["compile", str(ROOT / "examples/mlp_digits.nf"), "--no-tuning", "-o",
                 str(tmp_path / "m.so")]) == 0
    err = capsys.readouterr().err
    assert f"arena {m.group(1)} bytes (without reuse {m.group(2)})" in err, err


def test_docs_do_not_promise_what_does_not_exist():
    from nfc.runtime.bench.models import ROOT

    autodiff = " ".join((ROOT / "docs/autodiff.md").read_text().split())
    stdlib = " ".join((ROOT / "docs/stdlib.md").read_text().split())
    assert "on CPUs and GPUs" not in autodiff
    assert "and f16/bf16" not in stdlib


def test_models_doc_gap_statuses_hold():
    """docs/models.md marks gaps 1, 3, 5 fixed and gap 2 open: each claim, checked."""
    from nfc.diagnostics import CompileError
    from nfc.frontend import compile_source

    cat = """op cat(x: T[N, I], h: T[N, H]) -> T[N, I + H] {
  xh[n, k] = x[n, k] if k < I else h[n, k - I]
  y[n, k] = xh[n, k]
}
model m { input x: f32[2, 3]
 input h: f32[2, 4]
 c = cat(x, h)
 z = zeros<[2, 7]>
 output c, z }"""
    f = compile_source(cat, "cat.nf").func("forward")
    assert f.ret.values[0].shape == (2, 7)
    ln = """import std.nn
model m { input x: f32[2, 3, 4]
 param g: f32[4] = ones
 param b: f32[4] = zeros
 y = layer_norm(x, g, b)
 s = softmax(y)
 output s }"""
    assert compile_source(ln, "ln.nf").func("forward").ret.values[0].shape == (2, 3, 4)
    layer = "op bn(x: T[N, C]) -> T[N, C] {\n  param g: T[C] = ones\n  y = x\n}\n"
    with pytest.raises(CompileError, match="'param' statements are only allowed in a model"):
        compile_source(layer + "model m { input x: f32[2, 3]\n y = bn(x)\n output y }", "l.nf")
