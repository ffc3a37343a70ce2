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


# ---- zsh, driven for real: an interactive zsh in a pseudo-terminal (zsh/zpty) gets TAB -------

#: Sourced by the interactive zsh: compinit with the generated `_nfc` on $fpath, and TAB bound
#: to a widget that runs completion with `compadd` replaced by one that prints every match
#: between markers instead of inserting it.
ZSH_HARNESS = r"""
PROMPT='' RPROMPT='' PS2=''
fpath=($NFC_COMP_DIR $fpath)
autoload -U compinit && compinit -u -D
zstyle ':completion:*' list-grouped false
zstyle ':completion:*' insert-tab false
compadd () {
  if [[ ${@[1,(i)(-|--)]} == *-(O|A|D)\ * ]]; then
    builtin compadd "$@"; return $?
  fi
  typeset -a __hits
  builtin compadd -A __hits "$@"
  local h
  for h in $__hits; do print -r -- "<<M>>$h"; done
}
zle -C _capture_complete complete-word _main_complete
_capture() { zle _capture_complete; print -r -- "<<DONE>>"; zle kill-whole-line; }
zle -N _capture
bindkey '^I' _capture
"""

#: Run by a non-interactive zsh: start the interactive one, type the words and a TAB, print
#: the matches. $1 the folder of `_nfc`, $2 the harness, $3 the words typed.
ZSH_DRIVER = r"""
zmodload zsh/zpty || exit 3
zpty z NFC_COMP_DIR=$1 zsh -f -i
zpty -w z "source $2"
zpty -w z "print -r -- '<<READ''Y>>'"
local line
while zpty -r z line; do [[ $line == *'<<READY>>'* ]] && break; done
zpty -n -w z "$3"$'\t'
while zpty -r z line; do
  [[ $line == *'<<DONE>>'* ]] && break
  [[ $line == *'<<M>>'* ]] && print -r -- "${line##*<<M>>}"
done
zpty -d z
"""


def _zsh_ready() -> str | None:
    """Why zsh completion cannot be driven here (None: it can)."""
    exe = shutil.which("zsh")
    if exe is None:
        return "zsh is not installed (apt-get install zsh): only the other shells are driven"
    probe = subprocess.run([exe, "-f", "-c", "zmodload zsh/zpty"], capture_output=True,
                           timeout=60)
    if probe.returncode != 0:
        return "this zsh has no zsh/zpty module to drive an interactive shell"
    return None


@pytest.mark.skipif(_zsh_ready() is not None, reason=str(_zsh_ready()))
def test_zsh_completes(tmp_path: Path) -> None:
    (tmp_path / "_nfc").write_text(script("zsh"))
    (tmp_path / "harness.zsh").write_text(ZSH_HARNESS)
    (tmp_path / "driver.zsh").write_text(ZSH_DRIVER)

    def complete(words: str) -> list[str]:
        out = subprocess.run(["zsh", "-f", str(tmp_path / "driver.zsh"), str(tmp_path),
                              str(tmp_path / "harness.zsh"), words], capture_output=True,
                             text=True, timeout=120, cwd=tmp_path, check=True)
        return [w.strip("\r") for w in out.stdout.split("\n") if w.strip("\r")]

    assert complete("nfc ") == list(_subcommands())
    assert complete("nfc fm") == ["fmt"]
    assert complete("nfc compile --emit ") == _emit_choices()
    assert complete("nfc completion ") == ["bash", "zsh", "fish"]
    assert complete("nfc tune --mod") == ["--mode", "--model"]
    # an option's value is skipped when finding where we are
    assert complete("nfc compile -o x.so --emi") == ["--emit"]
    cache = _subcommands()["cache"]
    action = next(a for a in cache._actions if isinstance(a, argparse._SubParsersAction))
    assert complete("nfc cache ") == list(action.choices)
    # elsewhere: file names
    (tmp_path / "model.nf").write_text("")
    assert complete("nfc opt mod") == ["model.nf"]
