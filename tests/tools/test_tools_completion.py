"""`nfc completion bash|zsh|fish`: scripts generated from the argparse tree."""

from __future__ import annotations

import argparse
import shutil
import subprocess
from pathlib import Path

import pytest

from nfc.cli import build_parser, main
from nfc.cli.completion_cmd import script


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _emit_choices() -> list[str]:
    compile_parser = _subcommands()["compile"]
    emit = next(a for a in compile_parser._actions if "--emit" in a.option_strings)
    assert emit.choices
    return list(emit.choices)


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_script_names_every_subcommand_and_emit_choice(
        shell: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["completion", shell]) == 0
    text = capsys.readouterr().out
    assert text == script(shell)
    for name in _subcommands():
        assert name in text
    for choice in _emit_choices():
        assert choice in text
    assert "--emit" in text and "--check" in text


def _complete(tmp_path: Path, *words: str) -> list[str]:
    """What the bash script offers after `words` (the last one being completed)."""
    path = tmp_path / "nfc.bash"
    path.write_text(script("bash"))
    arr = " ".join(f"'{w}'" for w in words)
    cmd = (f"source {path}; COMP_WORDS=({arr}); COMP_CWORD={len(words) - 1}; "
           "COMPREPLY=(); _nfc; printf '%s\\n' \"${COMPREPLY[@]}\"")
    out = subprocess.run(["bash", "--norc", "-c", cmd], capture_output=True, text=True,
                         cwd=tmp_path, check=True, timeout=60)
    return [w for w in out.stdout.split("\n") if w]


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_bash_completes(tmp_path: Path) -> None:
    subs = _subcommands()
    assert _complete(tmp_path, "nfc", "") == list(subs)
    assert _complete(tmp_path, "nfc", "fm") == ["fmt"]
    emits = _emit_choices()
    assert _complete(tmp_path, "nfc", "compile", "--emit", "") == emits
    # `--emit=l`: bash splits the word at '='
    assert _complete(tmp_path, "nfc", "compile", "--emit", "=", "l") == \
        [c for c in emits if c.startswith("l")]
    # an option's value is skipped when finding where we are
    assert _complete(tmp_path, "nfc", "compile", "-o", "x.so", "--emi") == ["--emit"]
    assert _complete(tmp_path, "nfc", "fmt", "--ch") == ["--check"]
    assert _complete(tmp_path, "nfc", "completion", "") == ["bash", "zsh", "fish"]
    # nested subcommands: `nfc cache <TAB>` and their own options
    cache = _subcommands()["cache"]
    action = next(a for a in cache._actions if isinstance(a, argparse._SubParsersAction))
    assert _complete(tmp_path, "nfc", "cache", "") == list(action.choices)
    assert "--prefix" in _complete(tmp_path, "nfc", "cache", "list", "--")
    # elsewhere: file names
    (tmp_path / "model.nf").write_text("")
    assert _complete(tmp_path, "nfc", "opt", "mod") == ["model.nf"]


@pytest.mark.parametrize("shell", ["zsh", "fish"])
def test_other_shells_parse(shell: str, tmp_path: Path) -> None:
    exe = shutil.which(shell)
    if exe is None:
        pytest.skip(f"no {shell} here")
    path = tmp_path / f"nfc.{shell}"
    path.write_text(script(shell))
    subprocess.run([exe, "-n", str(path)], check=True, timeout=60)


@pytest.mark.skipif(shutil.which("fish") is None, reason="no fish")
def test_fish_completes(tmp_path: Path) -> None:
    path = tmp_path / "nfc.fish"
    path.write_text(script("fish"))

    def complete(line: str) -> list[str]:
        out = subprocess.run(["fish", "--no-config", "-c", f"source {path}; complete -C '{line}'"],
                             capture_output=True, text=True, check=True, timeout=60)
        return sorted(w.split("\t")[0] for w in out.stdout.split("\n") if w)

    assert complete("nfc ") == sorted(_subcommands())
    assert complete("nfc compile --emit ") == sorted(_emit_choices())
    assert complete("nfc fmt --ch") == ["--check"]
    assert complete("nfc completion ") == ["bash", "fish", "zsh"]
