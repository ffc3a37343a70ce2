"""Golden tests: every `tests/golden/**/*.nfir` and `*.nf` file is one pytest item.

A golden file carries its own commands in `RUN:` comment lines (lit style):

    // RUN: nfc opt %s -p cse | filecheck %s
    // RUN: nfc opt %s --split-input-file --verify-diagnostics

Each RUN line (a trailing backslash continues it) runs under `bash -c` with `pipefail` after
these substitutions: `%s` the file, `%S` its folder, `%t` a scratch path, `%%` a percent sign;
`nfc` and `filecheck` become this interpreter's console scripts (or `python -m ...`), and
`not CMD` succeeds iff CMD fails. The item fails with the command, its exit code and output.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

# Builds fuse with nfc's built-in device constants unless a test asks for this machine's
# measurement (NFC_DEVICE_PARAMS=measured, as tests/passes/test_passes_fusion_commands.py
# does): the IR of a build must not depend on the machine the suite runs on, and every test
# building under a fresh NFC_CACHE_DIR would otherwise measure the device again (seconds).
os.environ.setdefault("NFC_DEVICE_PARAMS", "builtin")

GOLDEN_ROOT = Path(__file__).parent / "golden"
GOLDEN_SUFFIXES = (".nfir", ".nf")
#: Seconds one RUN line may take.
RUN_TIMEOUT = 300

_RUN_RE = re.compile(r"(?://|#)\s*RUN:\s?(.*)$")
_TOOL_RE = re.compile(r"(?<![\w./%-])(nfc|filecheck)(?![\w./-])")


def _tool(name: str) -> str:
    """The console script `name` next to this interpreter, else `python -m`."""
    script = Path(sys.executable).parent / name
    if script.exists():
        return shlex.quote(str(script))
    module = {"nfc": "nfc", "filecheck": "filecheck"}[name]
    return f"{shlex.quote(sys.executable)} -m {module}"


def run_lines(text: str) -> list[str]:
    """The RUN commands of a golden file, continuation lines joined."""
    cmds: list[str] = []
    pending = ""
    for line in text.split("\n"):
        m = _RUN_RE.search(line)
        if m is None:
            continue
        part = m.group(1).rstrip()
        if part.endswith("\\"):
            pending += part[:-1] + " "
            continue
        cmds.append((pending + part).strip())
        pending = ""
    if pending:
        cmds.append(pending.strip())
    return cmds


def substitute(cmd: str, path: Path, tmp: Path) -> str:
    """A RUN line with its placeholders and tool names replaced."""
    cmd = _TOOL_RE.sub(lambda m: _tool(m.group(1)), cmd)
    subs = {"%s": shlex.quote(str(path)), "%S": shlex.quote(str(path.parent)),
            "%t": shlex.quote(str(tmp)), "%%": "%"}
    return re.sub(r"%[sSt%]", lambda m: subs[m.group()], cmd)


# `not` as in lit: invert the exit status of one command (inside a pipeline too).
_PRELUDE = "set -o pipefail\nnot() { if \"$@\"; then return 1; else return 0; fi; }\n"


class GoldenFailure(Exception):
    """A RUN line failed; carries the report."""


class GoldenItem(pytest.Item):
    """One golden file: run each of its RUN lines in order."""

    def __init__(self, *, commands: list[str], **kw) -> None:  # noqa: ANN003 - pytest's args
        super().__init__(**kw)
        self.commands = commands

    def runtest(self) -> None:
        if not self.commands:
            raise GoldenFailure(f"{self.path}: no RUN: lines")
        env = dict(os.environ)
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        env.setdefault("PYTHONHASHSEED", "0")
        with tempfile.TemporaryDirectory(prefix="nfc-golden-") as scratch:
            for raw in self.commands:
                self._run(raw, env, Path(scratch) / "out")

    def _run(self, raw: str, env: dict[str, str], tmp: Path) -> None:
        cmd = substitute(raw, self.path, tmp)
        try:
            proc = subprocess.run(["bash", "-c", _PRELUDE + cmd], capture_output=True,
                                  text=True, env=env, cwd=self.path.parent, timeout=RUN_TIMEOUT)
        except subprocess.TimeoutExpired:
            raise GoldenFailure(f"RUN: {raw}\n$ {cmd}\ntimed out after {RUN_TIMEOUT} s") \
                from None
        if proc.returncode != 0:
            raise GoldenFailure(
                f"RUN: {raw}\n$ {cmd}\nexit code {proc.returncode}\n"
                f"--- stdout ---\n{proc.stdout}--- stderr ---\n{proc.stderr}")

    def repr_failure(self, excinfo, style=None):  # noqa: ANN001, ANN201 - pytest hook
        if isinstance(excinfo.value, GoldenFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo)

    def reportinfo(self):  # noqa: ANN201 - pytest hook
        return self.path, 0, f"golden: {self.name}"


class GoldenFile(pytest.File):
    """A golden file holds one item."""

    def collect(self):  # noqa: ANN201 - pytest hook
        text = self.path.read_text(encoding="utf-8", errors="replace")
        yield GoldenItem.from_parent(self, name=self.path.name, commands=run_lines(text))


def pytest_collect_file(parent: pytest.Collector, file_path: Path) -> pytest.Collector | None:
    """Collect golden files under tests/golden/."""
    if file_path.suffix in GOLDEN_SUFFIXES and GOLDEN_ROOT in file_path.parents:
        return GoldenFile.from_parent(parent, path=file_path)
    return None
