"""`nfc opt` and `nfc passes`, run in-process (and once through a real shell pipe)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

import nfc.passmanager
from nfc.cli import UsageError, main
from nfc.cli.opt_cmd import is_ir, parse_params, split_input
from nfc.passmanager import PassRegistry

ROOT = Path(__file__).resolve().parents[2]
TEXT = """nf.module @t {
  nf.func @f(%x: tensor<4xf32>) -> (tensor<4xf32>) {
    %y = nf.compute [i: 4] (%x[i] * 2.0) : tensor<4xf32> loc("t.nf":3:3)
    %z = nf.compute [i: 4] (%x[i] * 2.0) : tensor<4xf32> loc("t.nf":4:3)
    %w = nf.compute [i: 4] (%y[i] + %z[i]) : tensor<4xf32> loc("t.nf":5:3)
    nf.return %w : tensor<4xf32>
  }
}
"""
PLUGIN = '''from dataclasses import dataclass
from typing import ClassVar

from nfc.ir import Binary, ComputeOp, Const
from nfc.passmanager import ModulePass


@dataclass(frozen=True)
class Double(ModulePass):
    """Doubles every compute (changes what the program computes)."""

    name: ClassVar[str] = "double"

    def apply(self, ctx, module):
        for f in module.funcs:
            for op in f.walk():
                if isinstance(op, ComputeOp):
                    op.body = Binary("*", op.body, Const(2.0))


@dataclass(frozen=True)
class Warn(ModulePass):
    """Warns about every compute."""

    name: ClassVar[str] = "warn"

    def apply(self, ctx, module):
        for op in module.funcs[0].walk():
            if isinstance(op, ComputeOp):
                ctx.warning("a compute", op.loc)
'''


@pytest.fixture(autouse=True)
def fresh_registry(monkeypatch):
    """Plugins loaded by one test stay out of the others."""
    monkeypatch.setattr(nfc.passmanager, "REGISTRY", PassRegistry())


@pytest.fixture
def nfir(tmp_path):
    def write(text: str, name: str = "t.nfir") -> str:
        path = tmp_path / name
        path.write_text(text)
        return str(path)
    return write


@pytest.fixture
def plugin(tmp_path) -> str:
    path = tmp_path / "cli_plugins.py"
    path.write_text(PLUGIN)
    return str(path)


def opt(capsys, *argv: str, stdin: str | None = None, monkeypatch=None) -> tuple[int, str, str]:
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin.encode())))
    code = main(["opt", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_round_trip_and_pipeline(capsys, nfir):
    path = nfir(TEXT)
    assert opt(capsys, path) == (0, TEXT, "")
    code, out, err = opt(capsys, path, "-p", "cse", "--pass", "dce", "--no-locs")
    assert code == 0 and err == ""
    assert "%z" not in out and "(%y[i] + %y[i])" in out and "loc(" not in out


def test_output_file_and_unreadable_input(capsys, nfir, tmp_path):
    out_path = tmp_path / "o.nfir"
    assert opt(capsys, nfir(TEXT), "-o", str(out_path))[:2] == (0, "")
    assert out_path.read_text() == TEXT
    code, out, err = opt(capsys, str(tmp_path / "missing.nfir"))
    assert code == 1 and out == ""
    assert err == f"nfc: error: cannot read '{tmp_path / 'missing.nfir'}': No such file or " \
                  "directory\n"


def test_stdin_is_sniffed(capsys, monkeypatch):
    assert opt(capsys, "-", stdin="// leading comment\n" + TEXT, monkeypatch=monkeypatch) == (
        0, TEXT, "")
    code, out, _ = opt(capsys, "-", stdin=(ROOT / "examples/mlp.nf").read_text(),
                       monkeypatch=monkeypatch)
    assert code == 0 and out.startswith("nf.module @mlp") and "nf.func @forward" in out
    assert 'loc("<stdin>":' in out
    assert is_ir("\n  // c\nnf.module @m {", "<stdin>") and not is_ir("import std.nn", "-")
    assert not is_ir("nf.func", "x.nf") and is_ir("model x", "x.nfir")


def test_diagnostics_go_to_stderr_with_the_source_line(capsys, nfir):
    path = nfir(TEXT.replace("%y[i] +", "%q[i] +"))
    code, out, err = opt(capsys, path)
    assert code == 1 and out == ""
    assert err.splitlines() == [
        f"{path}:5:29: error: use of undefined value '%q'",
        "      %w = nf.compute [i: 4] (%q[i] + %z[i]) : tensor<4xf32> loc(\"t.nf\":5:3)",
        "                              ^~"]


def test_split_input_file_keeps_line_numbers_and_goes_on_after_errors(capsys, nfir):
    text = TEXT + "// -----\n" + TEXT.replace("%x[i] * 2.0) : tensor<4xf32> loc(\"t.nf\":4:3)",
                                              "%nope[i]) : tensor<4xf32>") + "// -----\n" + TEXT
    code, out, err = opt(capsys, nfir(text), "--split-input-file")
    assert code == 1
    assert out == TEXT + "// -----\n" + TEXT
    assert "t.nfir:13:29: error: use of undefined value '%nope'" in err
    assert split_input("a\n// -----\nb\n  // -----  \nc") == ["a\n", "\n\nb\n", "\n\n\n\nc"]


def test_verify_diagnostics(capsys, nfir):
    good = nfir("nf.func @f() -> (tensor<f32>) {\n"
                "  // expected-error@+1 {{use of undefined value '%v'}}\n"
                "  nf.return %v : tensor<f32>\n}\n", "good.nfir")
    assert opt(capsys, good, "--verify-diagnostics") == (0, "", "")
    # a missing and an unexpected diagnostic are both reported, and the command fails
    bad = nfir("nf.func @f() -> (tensor<f32>) {\n"
               "  // expected-error@+2 {{use of undefined value '%v'}}\n"
               "  nf.return %v : tensor<f32>\n}\n", "bad.nfir")
    code, _, err = opt(capsys, bad, "--verify-diagnostics")
    assert code == 1
    assert "bad.nfir:2:6: error: expected error \"use of undefined value '%v'\" was not " \
           "produced" in err
    assert "bad.nfir:3:13: error: unexpected error: use of undefined value '%v'" in err
    # no directives and no diagnostics: success, and the IR is printed
    assert opt(capsys, nfir(TEXT), "--verify-diagnostics") == (0, TEXT, "")


def test_verify_diagnostics_for_pipelines(capsys, nfir):
    src = "// expected-error@<pipeline> {{unknown pass 'nope'}}\n" + TEXT
    assert opt(capsys, nfir(src), "-p", "nope", "--verify-diagnostics")[:2] == (0, "")
    code, _, err = opt(capsys, nfir(TEXT), "-p", "nope", "--verify-diagnostics")
    assert code == 1 and "error: unexpected error: unknown pass 'nope'" in err


def test_verify_diagnostics_matches_warnings_by_line(capsys, tmp_path, plugin):
    path = tmp_path / "w.nfir"
    here = json.dumps(str(path))
    lines = [
        "nf.module @t {",
        "  nf.func @f(%x: tensor<4xf32>) -> (tensor<4xf32>) {",
        f"    %y = nf.compute [i: 4] (%x[i]) : tensor<4xf32> loc({here}:3:5) "
        "// expected-warning {{a compute}}",
        "    // expected-warning@+1 {{a compute}}",
        f"    %z = nf.compute [i: 4] (%y[i]) : tensor<4xf32> loc({here}:5:5)",
        "    nf.return %z : tensor<4xf32>", "  }", "}", ""]
    path.write_text("\n".join(lines))
    argv = [str(path), "--load-plugin", f"{plugin}:Warn", "-p", "warn", "--verify-diagnostics"]
    code, out, err = opt(capsys, *argv)
    assert (code, err) == (0, "") and "%z = nf.compute" in out  # a warning is no failure
    lines[3] = lines[3].replace("@+1", "@+2")
    path.write_text("\n".join(lines))
    code, _, err = opt(capsys, *argv)
    assert code == 1
    assert f"{path}:4:8: error: expected warning \"a compute\" was not produced" in err
    assert f"{path}:5:5: error: unexpected warning: a compute" in err


def test_print_ir_after_and_time_passes(capsys, nfir):
    code, out, err = opt(capsys, nfir(TEXT), "-p", "cse,dce", "--print-ir-after-all",
                         "--time-passes")
    assert code == 0 and out.count("nf.func") == 1
    assert err.count("// -----// IR Dump After") == 2
    assert "IR Dump After cse" in err and "IR Dump After dce" in err
    assert "Pass execution timing report" in err
    for phase in ("parse", "cse", "dce", "(verify)", "print", "Total"):
        assert f"  {phase}\n" in err
    code, _, err = opt(capsys, nfir(TEXT), "-p", "cse,dce", "--print-ir-after", "dce")
    assert err.count("IR Dump After") == 1 and "After dce" in err
    code, _, err = opt(capsys, nfir(TEXT), "--print-ir-after", "nope")
    assert code == 1 and err.startswith("nfc: error: --print-ir-after: unknown pass 'nope'")


def test_load_plugin_and_eval(capsys, nfir, plugin, monkeypatch, tmp_path):
    path = nfir(TEXT)
    code, out, err = opt(capsys, path, "--load-plugin", f"{plugin}:Double", "-p", "double")
    assert code == 0 and "* 2.0 * 2.0" in out
    # --eval: a pass that changes the results is caught by the interpreter
    code, _, err = opt(capsys, path, "--load-plugin", plugin, "-p", "double", "--eval")
    assert code == 1 and "--eval: the pipeline changed result 0 of @f" in err
    code, _, err = opt(capsys, path, "-p", "cse,dce,canonicalize", "--eval")
    assert code == 0 and "eval: @f: 1 result agree" in err
    (tmp_path / "cli_plugins_by_name.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(nfc.passmanager, "REGISTRY", PassRegistry())
    code, out, err = opt(capsys, path, "--load-plugin", "cli_plugins_by_name:Double", "-p",
                         "double")
    assert code == 0 and "* 2.0 * 2.0" in out, err


def test_model_params():
    assert parse_params(["a=1", "b = 0.5", "c=true", "d=False"]) == {
        "a": 1, "b": 0.5, "c": True, "d": False}
    for bad in ("x", "=1", "x=abc"):
        with pytest.raises(UsageError):
            parse_params([bad])


def test_set_overrides_a_model_parameter(capsys, tmp_path):
    src = tmp_path / "mlp.nf"
    src.write_text((ROOT / "examples/mlp.nf").read_text())
    code, out, _ = opt(capsys, str(src), "--set", "batch=8", "--set", "classes=3", "--no-locs")
    assert code == 0 and "tensor<8x784xf32>" in out and "tensor<8x3xf32>" in out


def test_passes_command(capsys):
    assert main(["passes"]) == 0
    out = capsys.readouterr().out
    for name in ("canonicalize", "cse", "dce", "inline"):
        assert f"\n{name}\n" in f"\n{out}"
    assert "  fast: bool (default false)\n      Allow float rewrites" in out
    assert main(["passes", "inline"]) == 0
    assert "Before:" in capsys.readouterr().out  # the whole docstring
    assert main(["passes", "inlin"]) == 1
    assert "unknown pass 'inlin'; did you mean 'inline'?" in capsys.readouterr().err


def test_shell_pipe_from_source_to_ir():
    nfc = Path(sys.executable).parent / "nfc"
    cmd = [str(nfc)] if nfc.exists() else [sys.executable, "-m", "nfc"]
    first = subprocess.run([*cmd, "opt", str(ROOT / "examples/mlp.nf")], capture_output=True,
                           text=True, check=True)
    second = subprocess.run([*cmd, "opt", "-", "-p", "cse"], input=first.stdout,
                            capture_output=True, text=True, check=True)
    assert second.stdout.startswith("nf.module @mlp") and second.stderr == ""
    assert second.stdout.count("nf.compute") == first.stdout.count("nf.compute")
